"""Job-id reuse after a slurmctld state loss, on the real lab (issue 20, item 2).

A job is failed over and finishes; slurmctld then crashes and comes back from state saved before
that job was submitted (``Lab.restart_ctld(lose_state_s=...)``), so Slurm hands its id out again
(22.05's sbatch has no ``--jobid``: a state loss is how a site meets a reused id). The new job with
the old id gets a real Xid 79: it must get its own decision and be failed over, the old record
retired, never merged (slurm_ft.journal.identity), and ``ft-history -j ID`` shows both.

The new job's output file is the old one's (``%j.out``, ``--open-mode=append``): its start is
read past the old job's lines (``Submitted.out_from``), else the Xid lands before the new job's
code runs and kills nothing.
"""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from slurm_ft import config as config_mod
from slurm_ft.cli.history import command as ft_history_cmd
from slurm_ft.lab.demo import ckpt_step, job_gpu_index, submit_training, wait_for, wait_started
from slurm_ft.lab.inject import inject_xid

pytestmark = pytest.mark.lab


def _job_state_saved_since(lab, t: float) -> bool:
    try:
        return (lab.lay.dir / "state" / "job_state").stat().st_mtime > t
    except OSError:
        return False


def _snapshot_with_next_id(lab, slurm) -> tuple[int, float]:
    """Snapshot slurmctld's saved state once it holds the id sequence as it is now: a held job
    submitted and cancelled, then a job-state save after that. Returns (the next job id Slurm
    hands out, the snapshot's time)."""
    since = time.time()
    held = int(slurm.run("sbatch", "--parsable", "--hold", "--job-name=id-reuse-mark", "--output=/dev/null",
                         "--wrap=true").stdout.strip().split(";")[0])
    slurm.run("scancel", str(held))
    wait_for(lambda: _job_state_saved_since(lab, since), 60, "slurmctld to save its job state", 0.2)
    lab.snapshot_ctld()
    return held + 1, time.time()


def _fail_over(slurm, sub) -> tuple[str, str, float]:
    """Xid 79 on the GPU of the running attempt 0 of ``sub`` once it has checkpointed; returns
    (faulty node, node it runs on again, seconds from the Xid to RUNNING again)."""
    first = wait_started(slurm, sub)
    wait_for(lambda: ckpt_step(sub.ckpt) >= 3, 60, f"job {sub.job_id}'s first checkpoint")
    done = inject_xid(first.nodes, 79, job_gpu_index(slurm, sub.job_id))
    t_fault = time.monotonic()
    assert done["killed"] and {k["job"] for k in done["killed"]} == {str(sub.job_id)}, done
    again = slurm.wait_job(sub.job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 90, 0.05)
    assert again is not None, f"job {sub.job_id} was not failed over: {slurm.job(sub.job_id)}"
    assert again.nodes != first.nodes
    return first.nodes, again.nodes, time.monotonic() - t_fault


def _ft_history_json(lab, job_id: int):
    path = config_mod.load(lab.lay.ft_conf).journal.path
    r = CliRunner().invoke(ft_history_cmd, ["--journal", path, "-j", str(job_id), "--json"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    return json.loads(r.output)


def test_a_reused_job_id_after_a_state_loss_gets_its_own_record_and_failover(lab, slurm, ft_history):
    next_id, snap_at = _snapshot_with_next_id(lab, slurm)
    old = submit_training(lab, steps=60, step_time=0.2)
    assert old.job_id == next_id, (old.job_id, next_id)        # nothing else submitted meanwhile
    new = None
    try:
        bad, _, old_failover_s = _fail_over(slurm, old)
        final = slurm.wait_job(old.job_id, lambda j: j.ended, 90, 0.5)
        assert final is not None and final.state == "COMPLETED", final
        ft_history(old.job_id, lambda h: h["ft_state"] == "completed" and h["failovers"] == 1, timeout_s=60)

        # slurmctld crashes and comes back from the state saved before the old job existed
        up = lab.restart_ctld(lose_state_s=time.time() - snap_at, log=lambda *_: None)
        # Slurm forgot the drain of the faulty node with its node state: the daemon re-applies it
        wait_for(lambda: any(n.name == bad and n.drained and n.reason.startswith("slurm-ft:")
                             for n in slurm.nodes()), 90, f"{bad} drained again", 0.5)
        redrain_s = time.time() - up

        new = submit_training(lab, steps=400, step_time=0.25)
        assert new.job_id == old.job_id, f"Slurm did not hand out job id {old.job_id} again ({new.job_id})"
        assert new.out_from > 0                                   # the old job's lines are in its %j.out
        faulty, moved_to, failover_s = _fail_over(slurm, new)
        assert faulty != bad
        print(f"id_reuse_failover_s={failover_s:.2f} (job {new.job_id} reused; old job's failover "
              f"{old_failover_s:.2f} s; {bad} drained again {redrain_s:.1f} s after slurmctld answered)")

        # the new job's own record: its Xid got a decision and one failover spent from its budget
        h = ft_history(new.job_id, lambda h: h["failovers"] == 1 and len(h["attempts"]) >= 2
                       and h["attempts"][1]["nodes"] is not None, timeout_s=60)
        assert h["attempts"][0]["attempt"] == 0 and h["attempts"][0]["verdict"] == "hardware", h["attempts"][0]
        assert h["attempts"][0]["nodes"] == faulty and h["attempts"][1]["nodes"] == moved_to
        assert not h.get("retired")

        # ft-history -j ID: both jobs, the earlier one retired (never merged), each with its own attempts
        both = _ft_history_json(lab, new.job_id)
        assert isinstance(both, list) and len(both) == 2, both
        earlier, current = both
        assert earlier["job_id"] == current["job_id"] == new.job_id
        assert earlier["retired"] and "reused" in earlier["retired"]["reason"], earlier["retired"]
        assert earlier["ft_state"] == "completed" and earlier["failovers"] == 1
        assert [a["nodes"] for a in earlier["attempts"]][0] == bad and len(earlier["attempts"]) == 2
        assert current["retired"] is None and current["failovers"] == 1
        assert [a["attempt"] for a in current["attempts"]] == [0, 1]
    finally:
        for sub in (new, old):
            if sub is not None:
                slurm.run("scancel", str(sub.job_id), check=False)
