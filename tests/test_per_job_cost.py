"""The prolog's per-job cost (issue 24). A passing job's health rows are journaled by a child
detached from the prolog, so Slurm starts the job without waiting for the journal; a failing
check is still journaled, and the node drained, before the prolog exits non-zero.

The detached child must leave the prolog's session (slurmd kills the prolog's process group) and
its stdout/stderr (slurmd reads them until EOF), and its errors must be reported, never returned.

The health gate's worker is a forked copy of the prolog (no new interpreter) when the process has
one thread: same verdicts, same deadline, and it holds none of the caller's descriptors."""

from __future__ import annotations

import functools
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_ft.node import prolog
from slurm_ft.errors import JournalError
from slurm_ft.journal import open_journal
from slurm_ft.nvml.fake import write_inventory

ROOT = Path(__file__).resolve().parents[1]


#: Set in the environment of a test re-run by :func:`fresh_interpreter` (the test's name).
_INNER = "SLURM_FT_FRESH_INTERPRETER"


def fresh_interpreter(test):
    """Run ``test`` in a pytest process of its own. The forked worker is used only by a
    single-threaded process (as a prolog is); in the whole suite, threads that earlier tests left
    running would make the runner spawn the worker instead, and forking beside them is unsafe."""
    @functools.wraps(test)
    def outer(*args, **kwargs):
        if os.environ.get(_INNER) == test.__name__:
            return test(*args, **kwargs)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"{__file__}::{test.__name__}"], env={**os.environ, _INNER: test.__name__},
                              cwd=str(ROOT), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return outer


def _wait_for(cond, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    return cond()


def _site(root: Path) -> dict[str, str]:
    """A GPU node n1 (Slurm's record: gres/gpu:2; fake NVML with 2 GPUs); scontrol calls other
    than ``show node`` are recorded in ``calls`` and fail."""
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    script = (f"#!/bin/sh\necho \"$*\" >> {root}/calls\n"
              "if [ \"$1 $2 $3\" = 'show node -o' ]; then\n"
              "  echo \"NodeName=$4 Gres=gpu:2 Partitions=gpu State=IDLE\"; exit 0\nfi\nexit 1\n")
    for cmd in ("scontrol", "sinfo", "squeue"):
        (bindir / cmd).write_text(script)
        (bindir / cmd).chmod(0o755)
    write_inventory(str(root / "nvml-n1.json"), "n1", [{}, {}])
    cfg = root / "slurm-ft.toml"
    cfg.write_text(f'[journal]\npath = "{root}/journal.db"\nnode_path = "{root}/node-{{node}}.db"\n'
                   f'[slurm]\nbin_dir = "{bindir}"\n[nvml]\nbackend = "fake"\ninventory = "{root}/nvml-{{node}}.json"\n'
                   f'[node_state]\ndir = "{root}/state"\nlog = "{root}/node.log"\n'
                   f'[health]\nnvml_timeout_s = 10\n')
    return {"SLURM_FT_CONFIG": str(cfg), "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0",
            "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_PARTITION": "gpu", "PATH": "/usr/bin:/bin"}


def _health_rows(root: Path, job_id: int) -> list[dict]:
    try:   # the detached child may be creating the journal right now
        with open_journal(root / "node-n1.db", readonly=True) as j:
            return list(j.db.query("SELECT check_name, status FROM health WHERE job_id = ?", [job_id]))
    except (JournalError, sqlite3.OperationalError):   # created, its tables not yet ("no such table")
        return []


def _run_prolog(env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -I -m slurm_ft.node.prolog`` as the wrapper runs it; returns once its stdout and stderr
    are closed (as slurmd waits for them)."""
    return subprocess.run([sys.executable, "-I", "-m", "slurm_ft.node.prolog"], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)


def test_a_passing_prologs_health_rows_arrive_after_it_exited(tmp_path):
    env = _site(tmp_path)
    _run_prolog({**env, "SLURM_JOB_ID": "41"})          # creates the journal
    assert _wait_for(lambda: _health_rows(tmp_path, 41))
    spool = tmp_path / "node-n1.db.spool"
    # Hold the node journal's write lock throughout the prolog: journaling inline would wait up to
    # its busy timeout (1 s) and spool *before* the prolog exits; the detached child spools later.
    lock = sqlite3.connect(str(tmp_path / "node-n1.db"), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        proc = _run_prolog(env)
        assert proc.returncode == 0, proc.stderr
        assert not spool.exists() and not _health_rows(tmp_path, 42)
        assert _wait_for(spool.exists)          # the child, still running after the prolog's exit
    finally:
        lock.execute("ROLLBACK")
        lock.close()

    def landed() -> set[str]:
        if spool.exists():      # the next writer applies what the child spooled
            with open_journal(tmp_path / "node-n1.db", spool=True):
                pass
        return {r["check_name"] for r in _health_rows(tmp_path, 42)}
    assert _wait_for(lambda: landed() >= {"nvml_responsive", "gpu_count"})


def test_the_detached_child_leaves_the_session_and_the_output_pipes(tmp_path):
    out = tmp_path / "child"

    def work():
        out.write_text(f"{os.getsid(0)} {os.readlink('/proc/self/fd/1')} {os.readlink('/proc/self/fd/2')}")

    def slow():
        time.sleep(1.5)

    t0 = time.monotonic()
    prolog.after_exit([slow, work], None, lambda m: None)
    assert time.monotonic() - t0 < 1.0           # returned without waiting for the work
    text = _wait_for(lambda: out.exists() and out.read_text())
    sid, fd1, fd2 = text.split()
    assert int(sid) != os.getsid(0)
    assert fd1 == fd2 == os.devnull


def test_an_error_in_the_detached_work_is_reported_not_returned(tmp_path, monkeypatch):
    import dataclasses
    import syslog

    from slurm_ft import config as config_mod
    from slurm_ft.node import boundary

    monkeypatch.setattr(syslog, "openlog", lambda *a, **k: None)
    monkeypatch.setattr(syslog, "syslog", lambda *a: None)
    logged = tmp_path / "log"

    def boom():
        raise RuntimeError("journal on fire")

    def log(msg):
        with open(logged, "a") as fh:
            fh.write(msg + "\n")

    cfg = config_mod.Config()
    cfg = dataclasses.replace(cfg, node_state=dataclasses.replace(cfg.node_state, dir=str(tmp_path / "state")))
    prolog.after_exit([boom], cfg, log)          # returns, never raises
    assert "journal on fire" in _wait_for(lambda: logged.exists() and logged.read_text())
    assert _wait_for(lambda: boundary.read_counts(str(tmp_path / "state")).get("prolog") == 1)


def test_a_failing_check_is_journaled_and_refused_before_the_prolog_exits(tmp_path):
    env = _site(tmp_path)
    write_inventory(str(tmp_path / "nvml-n1.json"), "n1", [{}])      # Slurm says 2 GPUs, NVML sees 1
    proc = _run_prolog(env)
    assert proc.returncode == 3                  # boundary.EXIT_DRAIN: the wrapper exits 1 for it
    rows = _health_rows(tmp_path, 42)            # no waiting: written before the exit
    assert rows and any(r.get("status") == "fail" for r in rows)


_gpu = st.fixed_dictionaries({}, optional={
    "lost": st.booleans(), "temperature_c": st.integers(0, 120),
    "ecc_volatile_uncorrected": st.integers(0, 5), "row_remap_pending": st.booleans(),
    "retired_pages_dbe": st.integers(0, 100), "retired_pages_pending": st.booleans()})


@settings(max_examples=30, deadline=None)
@given(inventory=st.lists(_gpu, max_size=3), job_gpus=st.sampled_from([None, "0", "0-1"]))
def test_detaching_never_changes_the_gate_nor_the_rows(inventory, job_gpus):
    """Whatever the GPUs say: the prolog's exit status with the detached journal is the one it has
    journaling inline, and the same health rows reach the journal."""
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        for detach in (False, True):
            root = Path(tmp) / str(detach)
            env = _site(root)
            write_inventory(str(root / "nvml-n1.json"), "n1", inventory)
            if job_gpus is None:
                env.pop("SLURM_JOB_GPUS")
            else:
                env["SLURM_JOB_GPUS"] = job_gpus
            rc = prolog.run(env, detach=detach)
            # the detached child writes row by row: wait for as many rows as the inline run wrote
            want = len(outcomes[0][1]) if outcomes else 1
            rows = _wait_for(lambda: (got := sorted((r["check_name"], r["status"]) for r in _health_rows(root, 42)))
                             and len(got) >= want and got)
            outcomes.append((rc, rows))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1], "every run journals its health results"


# ------------------------------------------------------------------ the forked health worker
def _health_cfg(tmp_path: Path, **health):
    from slurm_ft.config import from_dict

    write_inventory(str(tmp_path / "n1.json"), "n1", [{"index": i} for i in range(2)])
    return from_dict({"nvml": {"backend": "fake", "inventory": str(tmp_path / "{node}.json")},
                      "health": {"isolation": "subprocess", **health}})


@fresh_interpreter
def test_the_forked_worker_gives_the_spawned_workers_verdicts(tmp_path, monkeypatch):
    from slurm_ft.health import run_checks, runner
    from slurm_ft.nvml import fake

    cfg = _health_cfg(tmp_path, expected_gpus=2)
    fake.set_gpu_field(str(tmp_path / "n1.json"), 1, "row_remap_pending", "true")
    started = []
    real = runner.ForkedWorker
    monkeypatch.setattr(runner, "ForkedWorker", lambda req: started.append(1) or real(req))
    forked = run_checks(cfg, "n1")
    assert started == [1]
    monkeypatch.setattr(runner, "FORK_WORKER", False)
    spawned = run_checks(cfg, "n1")
    key = [(r.check, r.status, r.gpu) for r in forked if r.check != "nvml_responsive"]
    assert key == [(r.check, r.status, r.gpu) for r in spawned if r.check != "nvml_responsive"]
    assert ("row_remap", "fail", 1) in key and forked[0].check == "nvml_responsive"


@fresh_interpreter
def test_a_hung_forked_worker_is_killed_and_holds_no_caller_descriptor(tmp_path):
    from slurm_ft.health import run_checks, runner
    from slurm_ft.health.config import from_config
    from slurm_ft.nvml import fake

    cfg = _health_cfg(tmp_path, nvml_timeout_s=0.5)
    fake.set_node_field(str(tmp_path / "n1.json"), "nvml_hang_s", "30")
    t0 = time.monotonic()
    results = run_checks(cfg, "n1")
    assert time.monotonic() - t0 < 5
    assert [(x.check, x.status) for x in results] == [("nvml_responsive", "fail")]
    assert "did not answer within 0.5 s" in results[0].measurement

    r, w = os.pipe()      # like slurmd's pipe of the prolog's output: EOF once we close our end
    request = {"backend": "fake", "inventory": str(tmp_path / "n1.json"), "node": "n1", "names": ["gpu_count"],
               "expected_gpus": 0, "health": runner._cfg_table(from_config(cfg.health))}
    worker = runner.ForkedWorker(request)      # hangs in nvmlInit for 30 s
    try:
        os.close(w)
        os.set_blocking(r, False)
        assert b"nvmlInit" in worker.stdout.read(200)   # in collect(): its descriptors are sorted out
        assert worker.poll() is None           # still running...
        assert os.read(r, 1) == b""            # ...and it does not hold the caller's descriptor
    finally:
        os.close(r)
        worker.kill()
        worker.wait(5)


@fresh_interpreter
def test_a_crashing_forked_worker_is_a_fail_with_its_traceback(tmp_path, monkeypatch):
    from slurm_ft.health import run_checks, runner

    def boom(*a, **k):
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(runner, "collect", boom)   # the child runs the parent's copy: the patch applies
    results = run_checks(_health_cfg(tmp_path), "n1")
    assert [(x.check, x.status) for x in results] == [("nvml_responsive", "fail")]
    assert "status 1" in results[0].measurement and "driver exploded" in results[0].detail
