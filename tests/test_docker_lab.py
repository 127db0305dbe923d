"""End-to-end suite on the Docker lab (issue 12): one controller container, three compute
containers, no shared filesystem but /shared; Slurm 22.05 or 24.11 (``SLURM_FT_LAB_SLURM``).

Run: ``SLURM_FT_LAB_SLURM=24.11 .venv/bin/python -m pytest -m docker`` (as root, dockerd running).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from slurm_ft.failover import evacuation
from slurm_ft.history.query import history
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import ckpt_step, job_gpu_index, wait_for, wait_started
from slurm_ft.slurm import split_nodes
from spank_ranks import rank_workdir

pytestmark = pytest.mark.docker


def _history(lab, job_id, pred=lambda h: True, timeout_s=30):
    def probe():
        with open_journal(lab.daemon_journal()) as j:
            try:
                h = history(j, job_id)
            except Exception:
                return None
        return h if pred(h) else None
    return wait_for(probe, timeout_s, f"ft-history of job {job_id}", 0.3)


def _others(lab, node):
    return [n for n in lab.nodes() if n != node]


def test_lab_runs_the_requested_slurm_version(docker_lab, dslurm):
    assert docker_lab.slurm_version().startswith(docker_lab.version + ".")
    assert sorted(n.name for n in dslurm.nodes()) == docker_lab.nodes()


def test_demo_xid79_fails_over_and_resumes(docker_lab, dslurm):
    lab, slurm = docker_lab, dslurm
    job = lab.submit_training()
    first = wait_started(slurm, job)
    wait_for(lambda: ckpt_step(job.ckpt) >= 10, 60, "checkpoint at step 10")
    done = lab.inject_xid(first.nodes, 79, job_gpu_index(slurm, job.job_id))
    assert done["killed"], "the job's processes in the node's container were not found"
    t0 = time.monotonic()
    again = slurm.wait_job(job.job_id, lambda j: j.state == "RUNNING" and j.restart_count >= 1, 120, 0.1)
    assert again is not None, f"not failed over (see {lab.log('ctl', 'daemon.log')})"
    took = time.monotonic() - t0
    assert again.nodes != first.nodes
    final = slurm.wait_job(job.job_id, lambda j: j.ended, 120, 0.5)
    assert final.state == "COMPLETED"
    out = job.out.read_text(errors="replace")
    resumed = [int(s) for s in re.findall(r"resuming from step (\d+)", out)]
    assert resumed and resumed[-1] > 0
    assert slurm.show_node(first.nodes)["Reason"].startswith("slurm-ft: Xid 79")
    h = _history(lab, job.job_id, lambda h: len(h["attempts"]) >= 2)
    assert h["attempts"][0]["verdict"] == "hardware"
    print(f"docker {lab.version}: failover in {took:.2f} s")


def test_multi_node_job_fails_over_without_the_faulty_node(docker_lab, dslurm):
    lab, slurm = docker_lab, dslurm
    job = lab.submit_training(steps=400, extra=["--nodes=2"])
    first = wait_started(slurm, job)
    nodes = split_nodes(first.nodes)
    assert len(nodes) == 2
    batch = nodes[0]   # the batch script (train.py) runs on the job's first node
    lab.inject_xid(batch, 79, job_gpu_index(slurm, job.job_id))
    again = wait_started(slurm, job, 1, timeout_s=90)
    assert batch not in split_nodes(again.nodes) and len(split_nodes(again.nodes)) == 2
    assert batch in split_nodes(again.excluded_nodes)
    h = _history(lab, job.job_id, lambda h: len(h["attempts"]) >= 2)
    assert h["attempts"][0]["verdict"] == "hardware"
    slurm.run("scancel", str(job.job_id))


def test_xid_on_another_nodes_gpu_changes_nothing(docker_lab, dslurm):
    lab, slurm = docker_lab, dslurm
    job = lab.submit_training(steps=24, step_time=0.25)
    first = wait_started(slurm, job)
    lab.inject_xid(_others(lab, first.nodes)[0], 79, 0, kill=False)
    final = slurm.wait_job(job.job_id, lambda j: j.ended, 60, 0.5)
    assert final.state == "COMPLETED" and final.restart_count == 0
    h = _history(lab, job.job_id, lambda h: h["ft_state"] == "completed")
    assert len(h["attempts"]) == 1 and h["attempts"][0]["xids"] == []


def test_partitioned_node_fails_over_and_stale_copy_is_fenced(docker_lab, dslurm):
    """``docker network disconnect``: slurmd is unreachable, the old copy keeps running on the
    cut-off node and writing to /shared; the requeued copy's checkpoint wins (fenced by attempt)."""
    lab, slurm = docker_lab, dslurm
    sub = lab.submit_training(steps=600, step_time=0.1)
    first = wait_started(slurm, sub)
    wait_for(lambda: ckpt_step(sub.ckpt) >= 5, 60, "checkpoint")
    lab.partition_node(first.nodes)
    again = wait_started(slurm, sub, 1, timeout_s=120)
    assert again.nodes != first.nodes
    h = _history(lab, sub.job_id, lambda h: len(h["attempts"]) >= 2)
    assert h["attempts"][0]["verdict"] == "hardware" and h["attempts"][0]["rule"] == "slurm-node-fail"
    wait_for(lambda: json.loads(sub.ckpt.read_text()).get("attempt") == 1, 30, "attempt 1 checkpoint")
    wait_for(lambda: "attempt 0: not saving" in sub.out.read_text(), 30, "stale copy to be fenced")
    assert json.loads(sub.ckpt.read_text())["attempt"] == 1
    assert slurm.show_node(first.nodes)["Reason"].startswith("slurm-ft:")
    lab.heal_node(first.nodes)


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_lost_node_fails_over(docker_lab, dslurm, fault):
    """``docker kill`` (node and job die) and ``docker pause`` (a hung node): Slurm marks the
    node DOWN after SlurmdTimeout, slurm-ft requeues the job elsewhere at once."""
    lab, slurm = docker_lab, dslurm
    sub = lab.submit_training(steps=600, step_time=0.1)
    first = wait_started(slurm, sub)
    wait_for(lambda: ckpt_step(sub.ckpt) >= 5, 60, "checkpoint")
    booted = lab.boots(first.nodes)
    (lab.kill_node if fault == "kill" else lab.pause_node)(first.nodes)
    t0 = time.monotonic()
    again = wait_started(slurm, sub, 1, timeout_s=120)
    assert again.nodes != first.nodes
    if fault == "kill":   # a manual stop: the restart policy (which reboots use) does not bring it back
        assert lab.container(first.nodes).status == "exited" and lab.boots(first.nodes) == booted
    h = _history(lab, sub.job_id, lambda h: len(h["attempts"]) >= 2)
    assert h["attempts"][0]["rule"] == "slurm-node-fail"
    wait_for(lambda: "resuming from step" in sub.out.read_text(), 30, "resume from checkpoint")
    print(f"docker {lab.version}: {fault} -> running elsewhere in {time.monotonic() - t0:.1f} s")
    lab.restart_node(first.nodes)   # a reboot: the node comes back (ReturnToService=2)
    wait_for(lambda: any(n.name == first.nodes and not n.state.lower().startswith(("down", "unk"))
                         for n in slurm.nodes()), 60, "rebooted node to register", 0.5)


def test_prolog_health_failure_drains_and_job_runs_elsewhere(docker_lab, dslurm):
    from slurm_ft.nvml import fake
    lab, slurm = docker_lab, dslurm
    fake.set_gpu_field(str(lab.inventory("n1")), 0, "row_remap_pending", "true")
    for n in ("n2", "n3"):
        slurm.drain(n, "test: keep free")
    job = lab.submit_training(steps=8, step_time=0.1)
    # Slurm (22.05 and 24.11) reports a failed prolog in two RPCs from slurmd: "prolog done, rc 1"
    # first (the job stays RUNNING on n1, its reason no longer Prolog), then the requeue (restart
    # count 1, launch_failed_requeued_held); on a loaded host the two can be a second apart. So
    # "RUNNING past its prolog" proves nothing here: the requeue (or the job's end, had the prolog
    # let it run) is what to wait for, and the job's own output is what shows where it ran.
    held = slurm.wait_job(job.job_id, lambda j: j.restart_count >= 1 or j.ended, 40, 0.1)
    for n in ("n2", "n3"):
        slurm.resume(n)
    assert held is not None and held.restart_count == 1 and not held.ended, \
        f"the prolog must refuse the sick node and Slurm requeue the job: {held}"
    ran = slurm.wait_job(job.job_id, lambda j: (j.state == "RUNNING" and j.reason != "Prolog")
                         or j.state == "COMPLETED", 40, 0.1)
    assert ran is not None and ran.nodes != "n1", ran
    assert slurm.show_node("n1")["Reason"].startswith("slurm-ft: row_remap:")
    final = slurm.wait_job(job.job_id, lambda j: j.ended, 60, 0.5)
    assert final.state == "COMPLETED"
    out = job.out.read_text(errors="replace")   # --open-mode=append: every attempt's lines
    assert "attempt 0 on" not in out and f"attempt 1 on {final.nodes}" in out, out
    with open_journal(lab.node_journal("n1")) as j:
        rows = list(j.db.query("SELECT * FROM health WHERE job_id = ? AND status = 'fail'", [job.job_id]))
    assert any(r["check_name"] == "row_remap" and r["gpu"] == 0 for r in rows)


def test_verdicts_travel_by_node_journal_and_slurm_mailbox(docker_lab, dslurm):
    """The node's epilog journals its verdict in the node's own /lab (no shared file system) and
    hands it to the controller through Slurm (the node's Extra field)."""
    lab, slurm = docker_lab, dslurm
    sub = lab.submit_training(steps=400)
    first = wait_started(slurm, sub)
    lab.inject_xid(first.nodes, 79, job_gpu_index(slurm, sub.job_id))
    wait_started(slurm, sub, 1, timeout_s=90)
    with open_journal(lab.node_journal(first.nodes)) as nj:
        local = nj.verdicts(sub.job_id, 0)
    with open_journal(lab.daemon_journal()) as dj:
        central = dj.verdicts(sub.job_id, 0)
    assert local and local[0]["source"] == "epilog" and any("Xid" in line for line in local[0]["evidence"])
    assert central and central[0]["source"] == "mailbox" and central[0]["xids"][0]["xid"] == 79
    assert not lab.node_journal(first.nodes).with_name("daemon.db").exists()
    slurm.run("scancel", str(sub.job_id))


# -- SPANK options + checkpoint before exit (the ranks of tests/spank_ranks.py) -------------------
def test_spank_options_and_checkpoint_before_exit(docker_lab, dslurm):
    from slurm_ft.lab.docker_engine import SHARED, VENV
    lab, slurm = docker_lab, dslurm
    d = rank_workdir(lab.jobs_dir)
    cd = f"{SHARED}/jobs/{d.name}"
    proc = lab.sbatch(f"--output={cd}/out.log", "--nodes=2", "--ntasks=2", "--ft", "--ft-retries=2",
                      "--ft-ckpt-signal=USR2", "--ft-ckpt-wait=60",
                      f"--wrap=srun --kill-on-bad-exit=0 {cd}/rank.sh {cd} {VENV}/bin/python trap")
    job_id = int(proc.stdout.strip().split(";")[0])
    job = slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 60)
    assert job is not None
    assert "ft:retries=2,ckpt_signal=USR2,ckpt_wait=60" in job.comment and job.requeue
    wait_for(lambda: (d / "out.log").exists() and (d / "out.log").read_text().count("attempt 0") >= 2, 30,
             "both ranks up")
    assert "signal USR2 retries 2" in (d / "out.log").read_text()
    time.sleep(1.0)
    node = split_nodes(job.nodes)[0]
    from slurm_ft.config import FailoverConfig
    with open_journal(lab.daemon_journal()) as journal:   # `slurm-ft drain --checkpoint`: the ctl's daemon acts
        _, requests, _ = evacuation.request(slurm, journal, node, FailoverConfig(), only_jobs=[job_id])
        (out,) = evacuation.follow(journal, requests, evacuation.default_timeout_s(requests))
    assert out.result == "saved" and out.requeued, out
    assert out.step and out.step > 0 and out.path == cd
    assert sorted(p.name for p in d.glob("rank*.a0.saved")) == ["rank0.a0.saved", "rank1.a0.saved"]
    again = slurm.wait_job(job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 60, 0.2)
    assert again is not None and node not in split_nodes(again.nodes)
    wait_for(lambda: "resuming from step" in (d / "out.log").read_text(), 30, "ranks to resume")
    text = (d / "out.log").read_text()
    assert "attempt 0" in text and "attempt 1" in text, "output not in append mode (cli_filter)"
    assert f"resuming from step {out.step}" in text
    h = _history(lab, job_id, lambda h: h["attempts"] and h["attempts"][0]["checkpoint"])
    assert h["attempts"][0]["checkpoint"]["result"] == "saved"
    slurm.run("scancel", str(job_id))


@pytest.mark.parametrize("option, word", [("--ft-retries=-1", "--ft-retries"),
                                          ("--ft-ckpt-signal=BOGUS", "--ft-ckpt-signal")])
def test_spank_bad_values_fail_at_submit(docker_lab, option, word):
    proc = docker_lab.sbatch(option, "--wrap=true", check=False)
    assert proc.returncode != 0
    assert f"slurm_ft: {word}=" in proc.stderr
