"""End-to-end failover on the real lab cluster (issue 2's demo scenario and its variants)."""

from __future__ import annotations

import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import ckpt_step, job_gpu_index, run_demo, submit_training, wait_for, wait_started
from slurm_ft.lab.inject import inject_xid

pytestmark = pytest.mark.lab


def test_demo_xid79_fails_over_and_resumes(lab, slurm):
    assert run_demo(str(lab.lay.dir), log=lambda *_: None)


def test_xid13_is_user_fault_not_requeued(lab, slurm, ft_history):
    job = submit_training(lab, steps=200)
    first = wait_started(slurm, job)
    wait_for(lambda: ckpt_step(job.ckpt) >= 5, 60, "checkpoint")
    inject_xid(first.nodes, 13, job_gpu_index(slurm, job.job_id))
    h = ft_history(job.job_id, lambda h: h["ft_state"] == "user-error")
    assert h["attempts"][0]["verdict"] == "user"
    assert any(x.startswith("13@") for x in h["attempts"][0]["xids"])
    time.sleep(1.0)
    after = slurm.job(job.job_id)
    assert after.state == "FAILED" and after.restart_count == 0
    assert not any(n.drained for n in slurm.nodes() if n.name == first.nodes)


def test_xid_on_other_jobs_gpu_fails_over_only_that_job(lab, slurm):
    # Two 1-GPU jobs share n1 (the other nodes are held out while they start); the Xid names
    # the PCI bus id of job B's GPU only.
    for n in ("n2", "n3"):
        slurm.drain(n, "test: keep free")
    a = submit_training(lab, steps=400)
    b = submit_training(lab, steps=400)
    try:
        for s in (a, b):
            assert wait_started(slurm, s).nodes == "n1"
    finally:
        for n in ("n2", "n3"):
            slurm.resume(n)
    gpu_b = job_gpu_index(slurm, b.job_id)
    assert gpu_b != job_gpu_index(slurm, a.job_id)
    inject_xid("n1", 79, gpu_b)
    again = slurm.wait_job(b.job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 60)
    assert again is not None and again.nodes != "n1"
    job_a = slurm.job(a.job_id)
    assert job_a.state == "RUNNING" and job_a.restart_count == 0
    with open_journal(config_mod.load(lab.lay.ft_conf).journal.path) as j:
        assert j.verdicts(a.job_id) == []
    for s in (a, b):
        slurm.run("scancel", str(s.job_id))


def test_xid_on_another_nodes_gpu_changes_nothing(lab, slurm, ft_history):
    job = submit_training(lab, steps=24, step_time=0.25)
    first = wait_started(slurm, job)
    other = next(n for n in ("n1", "n2", "n3") if n != first.nodes)
    inject_xid(other, 79, 0, kill=False)
    final = slurm.wait_job(job.job_id, lambda j: j.ended, 60, 0.5)
    assert final.state == "COMPLETED" and final.restart_count == 0
    h = ft_history(job.job_id, lambda h: h["ft_state"] == "completed")
    assert len(h["attempts"]) == 1 and h["attempts"][0]["xids"] == []
