"""The epilog's answer to untrusted hardware evidence (docs/security.md, attack 1): the trusted
GPU checks decide; job output alone never drains."""

from __future__ import annotations

from slurm_ft import config as config_mod
from slurm_ft.classify import Evidence, classify
from slurm_ft.node.epilog import verify_untrusted
from slurm_ft.errors import SlurmFTError
from slurm_ft.health import CheckResult
from slurm_ft.node.job import NodeJob

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def _cfg(tmp_path):
    return config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db"), "node_path": str(tmp_path / "node-{node}.db")}})


def _job(gpus=(1,)):
    return NodeJob(job_id=7, node="n1", attempt=0, uid=1000, gpus=gpus, exit_code=1, signal=None,
                   stdout=None, stderr=None, work_dir=None)


def _untrusted():
    v = classify(Evidence(stderr_tail=ECC, exit_code=1, kernel_records=True))
    assert (v.verdict, v.action) == ("hardware", "verify")
    return v


def _checks(*results):
    def run(cfg, node):
        return list(results)
    return run


def test_a_failing_trusted_check_on_the_jobs_gpu_confirms(tmp_path):
    bad = CheckResult("ecc_volatile", "fail", 1, "GPU1 2 volatile uncorrectable ECC errors")
    v = verify_untrusted(_cfg(tmp_path), _job(), _untrusted(), print, run_checks=_checks(bad))
    assert (v.verdict, v.rule, v.action) == ("hardware", "verified:cuda-ecc-uncorrectable", "drain_node")
    assert "ecc_volatile" in v.evidence[0]


def test_healthy_gpus_mean_no_drain_and_no_blame(tmp_path):
    ok = CheckResult("ecc_volatile", "pass", 1, "GPU1 0 errors")
    other_gpu = CheckResult("temperature", "fail", 0, "GPU0 97 C")  # not the job's GPU
    v = verify_untrusted(_cfg(tmp_path), _job(), _untrusted(), print, run_checks=_checks(ok, other_gpu))
    assert (v.verdict, v.rule, v.action) == ("unknown", "unverified:cuda-ecc-uncorrectable", "retry")


def test_checks_that_cannot_run_never_confirm(tmp_path):
    def broken(cfg, node):
        raise SlurmFTError("[health] bad table")
    v = verify_untrusted(_cfg(tmp_path), _job(), _untrusted(), print, run_checks=broken)
    assert (v.verdict, v.action) == ("unknown", "retry")


def test_trusted_verdicts_are_left_alone(tmp_path):
    v = classify(Evidence(kernel_lines=["NVRM: Xid (PCI:0000:10:00): 79, pid=1, name=p, GPU has fallen off the bus."],
                          exit_code=1, kernel_records=True))
    called = []
    assert verify_untrusted(_cfg(tmp_path), _job(), v, print, run_checks=lambda *a: called.append(a)) is v
    assert not called
