"""End-to-end: the SPANK --ft options and checkpoint-before-exit on the real lab (issue 6).

Runs against the lab of ``SLURM_FT_LAB_DIR`` (default /var/tmp/slurm-ft-lab), whose slurm.conf
enables the plugin, cli_filter.lua and job_submit.lua (slurm_ft/lab/spank.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_ft.slurm import split_nodes

from slurm_ft import config as config_mod
from slurm_ft.checkpoint import channel
from slurm_ft.failover import evacuation
from slurm_ft.history.query import history
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import wait_for
from slurm_ft.lab.spank import plugin_path
from spank_ranks import rank_workdir

pytestmark = pytest.mark.lab

@pytest.fixture
def spank_lab(lab):
    if not plugin_path().exists():
        pytest.skip("spank/slurm_ft_spank.so not built (make -C spank)")
    conf = lab.lay.slurm_conf.read_text()
    if "PlugStackConfig=" not in conf:
        pytest.skip("the running lab predates the SPANK wiring: restart it (slurm-ft lab down; lab up)")
    return lab


def _workdir(lab) -> Path:
    return rank_workdir(lab.lay.jobs_dir)


def _sbatch(lab, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["/usr/bin/sbatch", "--parsable", *args], capture_output=True, text=True, timeout=30,
                          env=lab.env())
    if check and proc.returncode != 0:
        raise AssertionError(f"sbatch failed: {proc.stderr}")
    return proc


def _submit_ranks(lab, d: Path, *opts: str, nodes: int = 2, mode: str = "trap") -> int:
    script = f"srun --kill-on-bad-exit=0 {d}/rank.sh {d} {sys.executable} {mode}"
    proc = _sbatch(lab, f"--output={d}/out.log", f"--nodes={nodes}", f"--ntasks={nodes}", *opts,
                   f"--wrap={script}")
    return int(proc.stdout.strip().split(";")[0])


def _journal(lab):
    return open_journal(config_mod.load(lab.lay.ft_conf).journal.path)


def _evacuate(lab, slurm, node: str, job_id: int) -> evacuation.Outcome:
    """``slurm-ft drain NODE --checkpoint --job J``: the request, carried out by the lab's daemon."""
    cfg = config_mod.load(lab.lay.ft_conf)
    with open_journal(cfg.journal.path) as journal:
        _, requests, _ = evacuation.request(slurm, journal, node, cfg.failover, only_jobs=[job_id])
        assert [r.job_id for r in requests] == [job_id]
        (out,) = evacuation.follow(journal, requests, evacuation.default_timeout_s(requests))
    return out


def _notify_detail(lab, job_id: int) -> str:
    with _journal(lab) as journal:
        return next(a["detail"] for a in journal.actions(job_id, 0) if a["action"] == "ckpt-notify")


def test_drain_checkpoint_every_rank_saves_requeue_resume(spank_lab, slurm):
    lab = spank_lab
    d = _workdir(lab)
    job_id = _submit_ranks(lab, d, "--ft", "--ft-retries=2", "--ft-ckpt-signal=USR2", "--ft-ckpt-wait=60")
    job = slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 60)
    assert job is not None
    assert "ft:retries=2,ckpt_signal=USR2,ckpt_wait=60" in job.comment and job.requeue
    wait_for(lambda: (d / "out.log").exists() and (d / "out.log").read_text().count("attempt 0") >= 2, 30,
             "both ranks up")
    time.sleep(1.0)
    node = split_nodes(job.nodes)[0]
    t0 = time.monotonic()
    out = _evacuate(lab, slurm, node, job_id)
    took = time.monotonic() - t0
    assert out.result == "saved" and out.requeued, out
    assert out.step and out.step > 0 and out.path == str(d)
    assert sorted(p.name for p in d.glob("rank*.a0.saved")) == ["rank0.a0.saved", "rank1.a0.saved"]
    again = slurm.wait_job(job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 60, 0.2)
    assert again is not None and node not in split_nodes(again.nodes) and node in split_nodes(again.excluded_nodes)
    wait_for(lambda: "resuming from step" in (d / "out.log").read_text(), 30, "ranks to resume")
    text = (d / "out.log").read_text()
    assert "attempt 0" in text and "attempt 1" in text, "output not in append mode"
    assert f"resuming from step {out.step}" in text
    with _journal(lab) as journal:
        h = history(journal, job_id)
    first = h["attempts"][0]
    assert first["checkpoint"]["result"] == "saved" and first["checkpoint"]["step"] == out.step
    actions = [a["action"] for a in first["actions"]]
    assert "ckpt-notify" in actions and "ckpt-ack" in actions and "requeue" in actions
    print(f"drain --checkpoint: ack+requeue in {took:.2f} s (ack after {out.waited_s:.2f} s)")
    slurm.run("scancel", str(job_id))


def test_job_ignoring_signal_times_out_and_is_requeued(spank_lab, slurm):
    lab = spank_lab
    d = _workdir(lab)
    job_id = _submit_ranks(lab, d, "--ft-ckpt-signal=USR2", "--ft-ckpt-wait=3", nodes=1, mode="noack")
    job = slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 60)
    wait_for(lambda: (d / "out.log").exists() and "attempt 0" in (d / "out.log").read_text(), 30, "rank up")
    out = _evacuate(lab, slurm, job.nodes, job_id)
    assert out.result == "timeout" and out.requeued and not out.ok, out
    assert "SIGUSR2 to 1 process(es)" in _notify_detail(lab, job_id)
    assert 3.0 <= out.waited_s < 8.0          # the wait, then the daemon's next look (every 2 s)
    with _journal(lab) as journal:
        h = history(journal, job_id)
    assert h["attempts"][0]["checkpoint"]["result"] == "timeout"
    again = slurm.wait_job(job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 60, 0.2)
    assert again is not None and again.nodes != job.nodes
    slurm.run("scancel", str(job_id))


def test_job_ignoring_signal_is_not_signalled_and_requeued_at_once(spank_lab, slurm):
    """A program that ignores (or has no handler for) the checkpoint signal is not sent it: it
    cannot save, so it is requeued at once as evacuated without a checkpoint, never killed."""
    lab = spank_lab
    d = _workdir(lab)
    job_id = _submit_ranks(lab, d, "--ft-ckpt-signal=USR2", "--ft-ckpt-wait=30", nodes=1, mode="ignore")
    job = slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 60)
    wait_for(lambda: (d / "out.log").exists() and "attempt 0" in (d / "out.log").read_text(), 30, "rank up")
    out = _evacuate(lab, slurm, job.nodes, job_id)
    assert out.result == "unprepared" and out.requeued, out
    assert "SIGUSR2 to 0 process(es)" in _notify_detail(lab, job_id)
    again = slurm.wait_job(job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 60, 0.2)
    assert again is not None and again.nodes != job.nodes
    with _journal(lab) as journal:
        h = history(journal, job_id)
        assert journal.failovers_done(job_id) == 0      # an evacuation is not a fault
    assert h["ft_state"] in ("evacuated", "running")
    slurm.run("scancel", str(job_id))


@pytest.mark.parametrize("option, word", [("--ft-retries=-1", "--ft-retries"),
                                          ("--ft-ckpt-signal=BOGUS", "--ft-ckpt-signal"),
                                          ("--ft-ckpt-wait=3601", "--ft-ckpt-wait"),
                                          ("--ft-hang-timeout=5", "--ft-hang-timeout")])
def test_bad_values_fail_at_submit(spank_lab, option, word):
    proc = _sbatch(spank_lab, option, "--wrap=true", check=False)
    assert proc.returncode != 0
    assert f"slurm_ft: {word}=" in proc.stderr


def test_time_limit_signal_before_limit_save_and_continue(spank_lab, slurm, ft_history):
    """Two ranks under srun, --time=1, --ft-ckpt-wait=5: the daemon signals both ranks (their bash
    traps) 15 s before the limit, rank 0 acks after the job's own barrier, and the job is
    requeued at once (a continuation: no retry spent) and resumes from the saved step."""
    lab = spank_lab
    d = _workdir(lab)
    job_id = _submit_ranks(lab, d, "--ft-ckpt-signal=USR2", "--ft-ckpt-wait=5", "--time=1", nodes=2)
    first = slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 60)
    assert first
    started = time.monotonic()
    wait_for((d / "rank0.a0.saved").exists, 100, "the time-limit checkpoint signal", interval_s=0.5)
    at = time.monotonic() - started
    assert (d / "rank1.a0.saved").exists()
    again = slurm.wait_job(job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 60, 0.2)
    assert again is not None
    wait_for(lambda: "resuming from step" in (d / "out.log").read_text(), 30, "ranks to resume")
    saved = int((d / "saved-step").read_text())
    assert f"resuming from step {saved}" in (d / "out.log").read_text()
    h = ft_history(job_id, lambda h: h["attempts"] and h["attempts"][0]["checkpoint"], 15)
    assert h["attempts"][0]["checkpoint"]["result"] == "saved"
    assert h["failovers"] == 0
    assert 30 <= at < 60
    print(f"time-limit signal {at:.0f} s after start of a 60 s job; continued")
    slurm.run("scancel", str(job_id))