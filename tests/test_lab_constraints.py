"""A failover that would leave the job unable to run (issue 15, item 1), on the real lab.

The job is pinned to the lab's last node (``-w nN``): with three nodes that is n3. A private lab
started with more nodes than any other lab on the host (``SLURM_FT_LAB_NODES=4``, see
tests/conftest.py) pins to a node name, and so to GPU bus ids in the one shared kernel log, that
no other lab has: the injected Xid cannot reach another lab's jobs.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from slurm_ft.journal import open_journal
from slurm_ft.failover import steps
from slurm_ft.lab.demo import job_gpu_index, submit_training, wait_for, wait_started
from slurm_ft.lab.inject import inject_xid
from slurm_ft.slurm import split_nodes

pytestmark = pytest.mark.lab


def test_pinned_job_is_held_with_a_clear_reason_not_bad_constraints(lab, slurm, ft_history):
    node = lab.nodes()[-1]
    sub = submit_training(lab, steps=400, comment="pinned", extra=["--ft", "--ft-retries=2", "-w", node])
    try:
        first = wait_started(slurm, sub)
        assert first.nodes == node and first.raw["required_nodes"] == node
        inject_xid(node, 79, job_gpu_index(slurm, sub.job_id))
        h = ft_history(sub.job_id, lambda h: h["ft_state"] == "held", timeout_s=60)
        reason = f"{node} excluded after Xid 79; the job requires it (--nodelist={node})"
        holds = [a for at in h["attempts"] for a in at["actions"] if a["action"] == "hold"]
        assert [a["detail"] for a in holds] == [reason]
        assert h["attempts"][0]["verdict"] == "hardware"
        # held by slurm-ft (an admin decides), still pinned, not excluded: never BadConstraints
        job = slurm.wait_job(sub.job_id, lambda j: j.state == "PENDING" and not j.completing, 30)
        assert job is not None and job.restart_count == 1
        assert job.admin_comment.startswith(f"slurm-ft: held: {reason} ft:retries=2,")
        assert node not in split_nodes(job.excluded_nodes)
        time.sleep(3)  # a few scheduling passes later
        job = slurm.job(sub.job_id)
        assert job.state == "PENDING" and job.reason == "JobHeldAdmin", job.reason
        assert job.raw["required_nodes"] == node
        assert reason in lab.lay.log("daemon").read_text(errors="replace")
    finally:
        slurm.run("scancel", str(sub.job_id), check=False)


def test_relax_clears_the_pin_after_a_real_requeue(lab, slurm, tmp_path):
    """Mode ``relax`` (the daemon does not pass it yet): exclude_and_boost driven directly on a
    job that is not ft-enabled (the lab's daemon leaves it alone), after a real requeue."""
    node = lab.nodes()[-1]
    proc = subprocess.run(["/usr/bin/sbatch", "--parsable", "--requeue", "-w", node, "-o", "/dev/null",
                           "--wrap", "sleep 300"], capture_output=True, text=True, timeout=30, env=lab.env())
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip().split(";")[0])
    try:
        assert slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 30) is not None
        with open_journal(tmp_path / "j.db") as j:
            assert steps.requeue_in_place(slurm, j, job_id, 0) is None
            out = steps.exclude_and_boost(slurm, j, job_id, 0, [node], nodes=slurm.nodes(), top=0,
                                          priority_boost=0, unsatisfiable="relax")
            assert out == "requeued"
            fresh = slurm.job(job_id)
            assert fresh.raw["required_nodes"] == "" and split_nodes(fresh.excluded_nodes) == [node]
            relax = [a for a in j.actions(job_id) if a["action"] == "relax"]
            assert [a["status"] for a in relax] == ["done"]
            assert relax[0]["detail"].startswith(f"ReqNodeList -> (none) (dropped {node}: {node} excluded after")

            def elsewhere():
                job = slurm.job(job_id)
                if job.state == "PENDING":
                    steps.clear_requeue_delay(slurm, j, job)
                return job if job.state == "RUNNING" and job.restart_count == 1 else None
            running = wait_for(elsewhere, 60, f"job {job_id} to run elsewhere", interval_s=0.3)
            assert running.nodes != node
    finally:
        slurm.run("scancel", str(job_id), check=False)


def test_pinned_job_refused_by_the_prolog_is_held_not_bad_constraints(lab, slurm, ft_history):
    """Issue 24, item 4: a job pinned (``-w``) to a node whose prolog health check fails was
    released with that node excluded and sat in BadConstraints forever while ft-history said
    ``running``. Now: held with a reason, and ft-history says ``held: <reason>``."""
    import sys

    from slurm_ft.history.query import render_table

    node = lab.nodes()[-1]
    set_gpu = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "lab", "set-gpu", node, "0",
                              "row_remap_pending=true", "--dir", str(lab.lay.dir)],
                             capture_output=True, text=True, timeout=60)
    assert set_gpu.returncode == 0, set_gpu.stderr
    sub = submit_training(lab, steps=8, step_time=0.1, comment="pinned-refused",
                          extra=["--ft", "--ft-retries=2", "-w", node])
    try:
        reason = f"{node} excluded after a failed health check (row_remap); the job requires it (--nodelist={node})"
        h = ft_history(sub.job_id, lambda h: h["ft_state"] == "held", timeout_s=90)
        holds = [a for at in h["attempts"] for a in at["actions"] if a["action"] == "hold"]
        assert [a["detail"] for a in holds] == [reason]
        assert f"ft state held: {reason}" in render_table(h)
        job = slurm.wait_job(sub.job_id, lambda j: j.admin_comment.startswith("slurm-ft: held:"), 30, 0.2)
        assert job is not None and job.state == "PENDING" and job.priority == 0, job
        assert job.admin_comment.startswith(f"slurm-ft: held: {reason} ft:retries=2,")
        assert node not in split_nodes(job.excluded_nodes) and job.raw["required_nodes"] == node
        assert slurm.show_node(node)["Reason"].startswith("slurm-ft: row_remap:")
        # still held a few scheduling passes later: never released into BadConstraints
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            job = slurm.job(sub.job_id)
            assert job.state == "PENDING" and job.priority == 0 and job.reason != "BadConstraints", job.reason
            time.sleep(0.5)
        assert reason in lab.lay.log("daemon").read_text(errors="replace")
    finally:
        slurm.run("scancel", str(sub.job_id), check=False)
