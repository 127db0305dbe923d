"""Observe-only rollout on the real lab (issue 24): with ``[failover] mode = "observe"`` a real
Xid 79 is classified and journaled, each action slurm-ft would take is recorded as observed, and
nothing in Slurm changes: the node is not drained, the job is not requeued."""

from __future__ import annotations

import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import ckpt_step, job_gpu_index, submit_training, wait_for, wait_started
from slurm_ft.lab.inject import inject_xid

pytestmark = pytest.mark.lab


def _observed(lab, job_id: int) -> list[dict]:
    with open_journal(config_mod.load(lab.lay.ft_conf).journal.path, readonly=True) as j:
        return [a for a in j.actions(job_id) if a.get("status") == "observed"]


def test_observe_mode_changes_nothing_in_slurm_and_journals_what_it_would_do(lab, slurm, ft_history):
    conf = lab.lay.ft_conf
    original = conf.read_text()
    assert "\n[failover]\n" in original
    job = None
    try:
        conf.write_text(original.replace("\n[failover]\n", '\n[failover]\nmode = "observe"\n', 1))
        assert config_mod.load(conf).failover.mode == "observe"
        lab.daemon_start()                     # the daemon reads its mode at start
        job = submit_training(lab, steps=400)
        first = wait_started(slurm, job)
        wait_for(lambda: ckpt_step(job.ckpt) >= 3, 60, "checkpoint")
        inject_xid(first.nodes, 79, job_gpu_index(slurm, job.job_id))

        h = ft_history(job.job_id, lambda h: h["attempts"] and h["attempts"][0]["verdict"] == "hardware", 60)
        assert any(x.startswith("79@") for x in h["attempts"][0]["xids"])
        rows = wait_for(lambda: [a for a in _observed(lab, job.job_id)
                                 if "requeue" in f"{a.get('action')} {a.get('detail')}"], 60,
                        "the daemon's would-be requeue, journaled as observed")
        assert rows
        # Nothing happened in Slurm, and nothing happens later either.
        for _ in range(10):
            after = slurm.job(job.job_id)
            assert after is None or (after.restart_count == 0 and after.state != "RUNNING"), after
            node = next(n for n in slurm.nodes() if n.name == first.nodes)
            assert not node.drained, (node.name, node.reason)
            time.sleep(0.5)
    finally:
        conf.write_text(original)
        lab.daemon_start()
        if job is not None:
            slurm.run("scancel", str(job.job_id), check=False)
