"""A GPU lost mid-job where the epilog cannot read the kernel log (a container, no CAP_SYSLOG):
no Xid to read, only a failed job. The epilog then asks the trusted GPU checks (NVML, read by
root) once, for a GPU job that did not end cleanly; a failing check on one of the job's own GPUs
(or a node-level one) makes the verdict ``hardware`` (``verified:no-kernel-log``, drain,
failover). The missing kernel log is said in the verdict's evidence, counted for
``slurm_ft_kernel_log_unavailable_total`` and by ``slurm-ft doctor`` (tests/test_doctor.py).
Issue 24, item 7; docs/health-checks.md "Without a kernel log"."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, strategies as st

from slurm_ft import config as config_mod
from slurm_ft.node import boundary
from slurm_ft.node import epilog
from slurm_ft.admin import metrics
from slurm_ft.classify import Evidence, classify, sources
from slurm_ft.errors import EvidenceError
from slurm_ft.health import CheckResult
from slurm_ft.node.job import NodeJob
from slurm_ft.nvml import fake
from fake_slurm import FakeSlurm

WHY = "kernel log unreadable (/dev/kmsg: Operation not permitted) and no dmesg in /usr/bin/dmesg, /bin/dmesg"
RULE = "verified:no-kernel-log"


def _no_kmsg(since, **kw):
    raise EvidenceError(WHY)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A node n1 with GPUs 0 and 1 (fake NVML), a fake Slurm of 20 nodes, no kernel log; the
    epilog's verdicts and the trusted-check runs recorded."""
    p = tmp_path / "slurm-ft.toml"
    p.write_text(f'[journal]\npath = "{tmp_path}/d.db"\nnode_path = "{tmp_path}/node-{{node}}.db"\n'
                 f'[node_state]\ndir = "{tmp_path}/state"\nlog = "{tmp_path}/node-{{node}}.log"\n'
                 f'[nvml]\nbackend = "fake"\ninventory = "{tmp_path}/{{node}}.json"\n'
                 f'[health]\nisolation = "thread"\n')
    slurm = FakeSlurm(20)
    monkeypatch.setattr("slurm_ft.slurm.Slurm.from_config", classmethod(lambda cls, c: slurm))
    monkeypatch.setattr(sources, "read_kmsg", _no_kmsg)
    from slurm_ft import health
    real, runs, verdicts = health.run_checks, [], []
    monkeypatch.setattr(health, "run_checks", lambda cfg, node, *a, **k: runs.append(node) or real(cfg, node, *a, **k))
    record = epilog.record_verdict
    monkeypatch.setattr(epilog, "record_verdict", lambda cfg, job, v, **kw: verdicts.append(v) or record(cfg, job, v, **kw))

    def run(lost=(), exit_status=256, gpus="0"):
        fake.write_inventory(str(tmp_path / "n1.json"), "n1", [{"index": i, "lost": i in lost} for i in (0, 1)])
        env = {"SLURM_FT_CONFIG": str(p), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_JOB_RESTART_COUNT": "0",
               "SLURM_JOB_EXIT_CODE": str(exit_status), "SLURM_JOB_UID": str(os.getuid()), "PATH": "/usr/bin:/bin"}
        if gpus is not None:
            env["SLURM_JOB_GPUS"] = gpus
        assert epilog.run(env) == 0
        return verdicts[-1]

    return {"run": run, "runs": runs, "slurm": slurm, "cfg": config_mod.load(p), "tmp": tmp_path}


def test_a_lost_gpu_of_the_failed_job_drains_and_fails_over(site):
    v = site["run"](lost=(0,), exit_status=256, gpus="0")
    assert (v.verdict, v.rule, v.action) == ("hardware", RULE, "drain_node")
    assert v.evidence[0].startswith("trusted check ") and "GPU0 GPU is lost" in v.evidence[0]
    assert f"kernel log unavailable: {WHY}" in v.evidence
    n1 = site["slurm"].node_recs["n1"]
    assert n1.drain and n1.reason.startswith("slurm-ft:"), n1
    assert site["runs"] == ["n1"]                                   # the checks ran once
    log = (site["tmp"] / "node-n1.log").read_text()
    assert "kernel log unavailable" in log and "draining n1" in log


def test_the_missing_kernel_log_is_counted_and_exposed(site):
    site["run"](lost=(), exit_status=0)
    site["run"](lost=(), exit_status=256)
    counts = boundary.read_counts(site["cfg"].node_state.dir, boundary.KERNEL_LOG_FILE)
    assert counts == {"epilog": 2}
    assert boundary.read_counts(site["cfg"].node_state.dir) == {}  # not an internal error
    assert "slurm_ft_kernel_log_unavailable_total 2.0" in metrics.exposition(site["cfg"], None)


def test_another_jobs_lost_gpu_is_not_this_jobs_hardware(site):
    v = site["run"](lost=(0,), exit_status=256, gpus="1")
    assert (v.verdict, v.rule) == ("user", "exit-nonzero")
    assert f"kernel log unavailable: {WHY}" in v.evidence
    assert not site["slurm"].node_recs["n1"].drain and site["runs"] == ["n1"]


@pytest.mark.parametrize("exit_status, gpus", [(0, "0"), (256, None), (256, "")])
def test_a_clean_exit_or_a_cpu_only_job_runs_no_check(site, exit_status, gpus):
    v = site["run"](lost=(0,), exit_status=exit_status, gpus=gpus)
    assert site["runs"] == [] and v.verdict != "hardware" and not site["slurm"].node_recs["n1"].drain


def test_healthy_gpus_leave_the_verdict_unchanged(site):
    v = site["run"](lost=(), exit_status=9, gpus="0,1")           # killed by SIGKILL
    assert site["runs"] == ["n1"] and v.verdict != "hardware" and not site["slurm"].node_recs["n1"].drain
    assert v.evidence[-1] == f"kernel log unavailable: {WHY}"


def test_with_a_kernel_log_nothing_changes(site, monkeypatch):
    """The normal case: the kernel log is read, no Xid in it: no checks, no extra evidence line."""
    monkeypatch.setattr(sources, "read_kmsg", lambda since, **kw: [])
    v = site["run"](lost=(0,), exit_status=256, gpus="0")
    assert (v.verdict, v.rule) == ("user", "exit-nonzero") and site["runs"] == []
    assert not any("kernel log" in line for line in v.evidence)
    assert boundary.read_counts(site["cfg"].node_state.dir, boundary.KERNEL_LOG_FILE) == {}


# ------------------------------------------------------------------ generative: only the job's own GPU blames
@pytest.fixture(scope="module")
def journals(tmp_path_factory):
    d = tmp_path_factory.mktemp("journals")
    return config_mod.from_dict({"journal": {"path": str(d / "d.db"), "node_path": str(d / "node-{node}.db")},
                                 "node_state": {"dir": str(d / "state")}})


_OUTPUT = ("", "RuntimeError: CUDA error: uncorrectable ECC error encountered", "CUDA error: out of memory",
           "NVRM: Xid (PCI:0000:10:00): 79, pid=1, name=p, GPU has fallen off the bus.")


@settings(max_examples=300, deadline=None)
@given(exit_code=st.one_of(st.none(), st.integers(0, 255)), signal=st.one_of(st.none(), st.integers(1, 64)),
       job_gpus=st.one_of(st.none(), st.frozensets(st.integers(0, 7), max_size=4).map(lambda s: tuple(sorted(s)))),
       failing=st.frozensets(st.integers(0, 7), max_size=4), node_level=st.booleans(),
       output=st.sampled_from(_OUTPUT), why=st.text(min_size=1, max_size=600))
def test_only_the_jobs_own_failing_gpu_ever_blames(journals, exit_code, signal, job_gpus, failing, node_level,
                                                   output, why):
    """Whatever the exit, the signal, the job's GPU set, the failing GPUs and the job's output
    (untrusted, even when it forges a kernel line): without a kernel log the verdict is
    ``hardware`` only when a trusted check failed on one of the job's own GPUs or node-wide, the
    checks run only for a GPU job that did not end cleanly (or for output that needs verifying),
    and a non-ok verdict says why the kernel log is missing."""
    if signal is not None:
        exit_code = None
    job = NodeJob(job_id=7, node="n1", attempt=0, uid=1000, gpus=job_gpus, exit_code=exit_code, signal=signal,
                  stdout=None, stderr=None, work_dir=None)
    ev = Evidence(stderr_tail=output, exit_code=exit_code, signal=signal, kernel_records=True,
                  job_bus_ids=frozenset(), kernel_log_error=why)
    results = [CheckResult("row_remap", "fail" if g in failing else "pass", g, f"GPU{g}") for g in range(8)]
    results.append(CheckResult("nvml_responsive", "fail" if node_level else "pass", None, "NVML"))
    runs = []

    def checks(cfg, node):
        runs.append(node)
        return results

    before = classify(ev)
    v = epilog.verify_untrusted(journals, job, before, lambda m: None, run_checks=checks, evidence=ev)
    mine = node_level or bool(failing & set(job_gpus or ()))
    assert len(runs) <= 1
    if v.verdict == "hardware":
        assert mine and runs and v.action == "drain_node" and v.rule.startswith("verified:")
    if before.action != "verify":
        assert bool(runs) == bool(job_gpus and (exit_code or signal))
        if runs and mine:
            assert (v.verdict, v.rule) == ("hardware", RULE)
        elif v.verdict != "hardware":
            assert (v.verdict, v.rule, v.action) == (before.verdict, before.rule, before.action)
    if v.verdict != "ok":
        assert any(line.startswith("kernel log unavailable: ") for line in v.evidence)
        assert all(len(line) <= 500 and "\n" not in line for line in v.evidence) and len(v.evidence) <= 20
    else:
        assert v == before
