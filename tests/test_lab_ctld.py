"""slurmctld crashes with state rollback on the real lab (issue 20): ``kill -9`` of slurmctld right
after a failover's requeue, and right after the faulty node's drain, restarted from the state it
had saved before the fault (``Lab.restart_ctld(lose_state_s=...)``). The daemon must notice and
reconcile (slurm_ft/failover/reconcile.py): the job runs again exactly once, away from the faulty
node, which is drained again, and ft-history says what happened."""

from __future__ import annotations

import re
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import ckpt_step, job_gpu_index, submit_training, wait_for, wait_started
from slurm_ft.lab.inject import inject_xid

pytestmark = pytest.mark.lab

START = re.compile(r"^attempt (\d+) on (\S+) \(GPU [^)]*\): (?:starting|resuming)", re.M)


def _starts(sub) -> list[tuple[int, str]]:
    """Every start of the job's code (train.py prints ``attempt N on NODE`` first), in order."""
    try:
        return [(int(a), n) for a, n in START.findall(sub.out.read_text(errors="replace"))]
    except OSError:
        return []


def _journal_actions(lab, job_id: int) -> list[dict]:
    with open_journal(config_mod.load(lab.lay.ft_conf).journal.path, readonly=True) as j:
        return j.actions(job_id)


def _saved_since(lab, t: float) -> bool:
    """slurmctld has written its job state to StateSaveLocation after ``t``."""
    try:
        return (lab.lay.dir / "state" / "job_state").stat().st_mtime > t
    except OSError:
        return False


def _crash_after(lab, slurm, ft_history, when: str) -> None:
    job = submit_training(lab, steps=160, step_time=0.25)
    first = wait_started(slurm, job)
    bad = first.nodes
    wait_for(lambda: ckpt_step(job.ckpt) >= 3, 60, "a checkpoint")
    wait_for(lambda: _saved_since(lab, first.start_time + 1), 60, "slurmctld to save the running job")
    lab.snapshot_ctld()                       # what slurmctld had saved before the fault
    saved_at = time.time()
    inject_xid(bad, 79, job_gpu_index(slurm, job.job_id))
    if when == "requeue":
        wait_for(lambda: any(a["action"] == "requeue" and a["status"] == "done"
                             for a in _journal_actions(lab, job.job_id)), 60, "the failover's requeue")
    else:
        wait_for(lambda: any(n.name == bad and n.drained for n in slurm.nodes())
                 and any(a["action"] == "drain" for a in _journal_actions(lab, job.job_id)), 60, "the drain")
    # the failover was done (journaled) when slurmctld died: Slurm loses it, the daemon redoes it;
    # else the daemon's own failover, resumed after the restart, simply happens then
    failed_over = any(a["action"] == "failover" and a["status"] == "done" for a in _journal_actions(lab, job.job_id))
    up = lab.restart_ctld(lose_state_s=time.time() - saved_at, log=lambda *_: None)
    seen = len(_starts(job))

    def running_again():
        j = slurm.job(job.job_id)
        if j is None or j.state != "RUNNING" or j.restart_count < 1 or j.nodes == bad:
            return None
        return j if len(_starts(job)) > seen else None
    again = wait_for(running_again, 120, f"job {job.job_id} to run again after the controller restart")
    print(f"ctld_restart_to_running_s={time.time() - up:.2f} (kill after {when})")
    # the faulty node is drained again (the failover's redo, or the next full scan: 60 s)
    wait_for(lambda: any(n.name == bad and n.drained and n.reason.startswith("slurm-ft:") for n in slurm.nodes()),
             90, f"{bad} drained again")
    final = slurm.wait_job(job.job_id, lambda j: j.ended, 120, 0.5)
    assert final is not None and final.state == "COMPLETED", final
    after = _starts(job)[seen:]
    assert len(after) == 1 and after[0][1] != bad, after           # ran again exactly once, elsewhere
    assert again.nodes == after[0][1]
    h = ft_history(job.job_id, lambda h: h["ft_state"] == "completed", timeout_s=60)
    acts = [a for att in h["attempts"] for a in att["actions"]]
    assert sum(a["action"] == "failover" for a in acts) == 1, acts   # one failover, one retry spent
    if failed_over:
        assert any(a["action"] == "reconcile" and "failover-redone" in a["detail"] for a in acts), acts
    print(f"failover done before the crash: {failed_over}; journal: "
          f"{[(a['action'], a['status']) for a in acts if a['action'] in ('failover', 'reconcile', 'drain')]}")
    assert any(n.name == bad and n.drained for n in slurm.nodes())


def test_ctld_killed_after_the_requeue_loses_it_and_the_daemon_redoes_it(lab, slurm, ft_history):
    _crash_after(lab, slurm, ft_history, "requeue")


def test_ctld_killed_after_the_drain_loses_it_and_the_daemon_redoes_it(lab, slurm, ft_history):
    _crash_after(lab, slurm, ft_history, "drain")
