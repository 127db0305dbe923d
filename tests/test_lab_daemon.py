"""The requeue daemon on the real lab (issue 5): budgets, fast-fail, exclusion accumulation,
priority, states, crash safety, per-node journals, lost nodes and fencing."""

from __future__ import annotations

import json
import signal
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.failover.daemon import Daemon
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import ckpt_step, job_gpu_index, submit_training, wait_for, wait_started
from slurm_ft.lab.inject import inject_xid
from slurm_ft.slurm import Slurm, split_nodes

pytestmark = pytest.mark.lab


def _cfg(lab):
    return config_mod.load(lab.lay.ft_conf)


def _fault(slurm, sub, xid, attempt):
    job = wait_started(slurm, sub, attempt)
    inject_xid(job.nodes, xid, job_gpu_index(slurm, sub.job_id))
    return job.nodes


def test_budget_exhaustion_accumulates_exclusions_and_drains(lab, slurm, ft_history):
    sub = submit_training(lab, steps=400, comment="ft:retries=2")
    n0 = _fault(slurm, sub, 79, 0)
    n1 = _fault(slurm, sub, 48, 1)
    assert n1 != n0
    assert split_nodes(slurm.job(sub.job_id).excluded_nodes) == [n0]
    n2 = _fault(slurm, sub, 94, 2)
    assert n2 not in (n0, n1)
    h = ft_history(sub.job_id, lambda h: h["ft_state"] == "max-retries-exceeded")
    assert [a["verdict"] for a in h["attempts"]] == ["hardware"] * 3
    assert split_nodes(h["excluded_nodes"]) == split_nodes([n0, n1])
    final = slurm.job(sub.job_id)
    assert final.state == "FAILED" and final.restart_count == 2
    for n in (n0, n1, n2):
        assert slurm.show_node(n)["Reason"].startswith("slurm-ft: Xid")


def test_budget_zero_never_requeues(lab, slurm, ft_history):
    sub = submit_training(lab, steps=400, comment="ft:retries=0")
    _fault(slurm, sub, 79, 0)
    h = ft_history(sub.job_id, lambda h: h["ft_state"] == "max-retries-exceeded")
    assert len(h["attempts"]) == 1
    time.sleep(1)
    assert slurm.job(sub.job_id).restart_count == 0


def test_two_hardware_faults_on_two_nodes_are_not_fast_failed(lab, slurm, ft_history):
    """Fast-fail is for faults that would repeat anywhere; a second Xid 79 on another node is bad
    luck (the first node is excluded): the job fails over again within its budget."""
    sub = submit_training(lab, steps=400, comment="ft:retries=3")
    n0 = _fault(slurm, sub, 79, 0)
    n1 = _fault(slurm, sub, 79, 1)
    assert n0 != n1
    again = wait_started(slurm, sub, 2)
    assert again.nodes not in (n0, n1)
    h = ft_history(sub.job_id, lambda h: len(h["attempts"]) == 3)
    assert h["ft_state"] in ("running", "requeued", "failover-in-progress")
    slurm.run("scancel", str(sub.job_id))


def test_failed_over_job_runs_before_waiting_jobs(lab, slurm, ft_history):
    sub = submit_training(lab, steps=400)
    first = wait_started(slurm, sub)
    # every other GPU busy with a long filler, then three waiting jobs that outrank the ft job
    from slurm_ft.lab.layout import GPUS_PER_NODE
    fillers = [submit_training(lab, steps=4000, comment="filler")
               for _ in range(len(lab.nodes()) * GPUS_PER_NODE - 1)]
    for f in fillers:
        wait_started(slurm, f)
    waiting = [submit_training(lab, steps=10, comment="waiting") for _ in range(3)]
    top = max(slurm.job(sub.job_id).priority, *(slurm.job(w.job_id).priority for w in waiting))
    for w in waiting:
        slurm.update_job(w.job_id, Priority=str(top + 10))
    inject_xid(first.nodes, 79, job_gpu_index(slurm, sub.job_id))
    ft_history(sub.job_id, lambda h: h["ft_state"] == "requeued")
    pending = slurm.job(sub.job_id)
    # "slurm-ft:requeued <what happened, for the owner> ft:retries=..." (slurm_ft/failover/options.py)
    assert pending.state == "PENDING" and pending.admin_comment.startswith("slurm-ft:requeued ")
    assert " ft:retries=" in pending.admin_comment
    assert pending.priority > max(slurm.job(w.job_id).priority for w in waiting)
    victim = next(f for f in fillers if slurm.job(f.job_id).nodes != first.nodes)
    slurm.run("scancel", str(victim.job_id))
    again = wait_started(slurm, sub, 1)
    assert again.nodes != first.nodes
    assert all(slurm.job(w.job_id).state == "PENDING" for w in waiting)


def test_not_configured_state_for_failed_plain_job(lab, slurm, ft_history):
    sub = submit_training(lab, steps=400, comment="plain")
    _fault(slurm, sub, 79, 0)
    ft_history(sub.job_id, lambda h: h["ft_state"] == "not-configured")
    time.sleep(1)
    assert slurm.job(sub.job_id).restart_count == 0


def test_verdicts_reach_the_daemon_through_slurm_not_files(lab, slurm):
    sub = submit_training(lab, steps=400)
    node = _fault(slurm, sub, 79, 0)
    wait_started(slurm, sub, 1)
    cfg = _cfg(lab)
    assert cfg.journal.path != cfg.node_journal_path(node)
    with open_journal(cfg.node_journal_path(node)) as nj:
        local = nj.verdicts(sub.job_id, 0)
    with open_journal(cfg.journal.path) as dj:
        central = dj.verdicts(sub.job_id, 0)
    assert local[0]["source"] == "epilog" and any("Xid" in line for line in local[0]["evidence"])
    assert central[0]["source"] == "mailbox" and central[0]["xids"][0]["xid"] == 79


class Crash(BaseException):
    """Stands for SIGKILL: the daemon stops dead between two Slurm calls, nothing else runs."""


class CrashingSlurm(Slurm):
    """Dies at the N-th state-changing Slurm call about ``job`` or ``node``, before or after it
    took effect (calls about jobs of earlier tests, still ending, do not count)."""

    MUTATING = ("update", "requeue", "requeuehold", "release", "hold")

    def __init__(self, conf, crash_at, after, job=None, node=None):
        super().__init__(conf=conf)
        self.crash_at, self.after, self.calls = crash_at, after, 0
        self.about = {str(job), f"JobId={job}", f"NodeName={node}"} if job else None

    def run(self, cmd, *args, **kw):
        mutating = cmd == "scontrol" and args and args[0] in self.MUTATING and (
            self.about is None or bool(self.about & set(args)))
        if mutating:
            self.calls += 1
            if self.calls == self.crash_at and not self.after:
                raise Crash()
        out = super().run(cmd, *args, **kw)
        if mutating and self.calls == self.crash_at and self.after:
            raise Crash()
        return out


@pytest.fixture
def no_lab_daemon(lab):
    lab.daemon_stop()
    yield
    lab.daemon_start()


@pytest.mark.parametrize("crash_at, after", [(1, False), (1, True), (2, False), (2, True), (3, False),
                                             (3, True), (4, True)])
def test_daemon_killed_at_each_step_resumes_once(lab, slurm, no_lab_daemon, crash_at, after):
    cfg = _cfg(lab)
    sub = submit_training(lab, steps=400)
    node = _fault(slurm, sub, 79, 0)
    wait_for(lambda: slurm.job(sub.job_id).ended, 30, "job to end")
    crashing = Daemon(cfg, CrashingSlurm(str(lab.lay.slurm_conf), crash_at, after, sub.job_id, node))
    with pytest.raises(Crash):
        for _ in range(40):
            crashing.cycle()
            time.sleep(0.2)
    crashing.journal.close()
    fresh = Daemon(cfg, Slurm(conf=str(lab.lay.slurm_conf)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        fresh.cycle()
        job = slurm.job(sub.job_id)
        if job.state == "RUNNING" and job.restart_count == 1 and job.reason != "Prolog":
            break
        time.sleep(0.2)
    for _ in range(5):  # more cycles must not requeue again
        fresh.cycle()
        time.sleep(0.2)
    job = slurm.job(sub.job_id)
    assert job.restart_count == 1 and job.state == "RUNNING" and job.nodes != node
    assert node in split_nodes(job.excluded_nodes)
    assert slurm.show_node(node)["Reason"].startswith("slurm-ft: Xid 79")
    assert fresh.journal.pending_intents() == []
    fresh.journal.close()


def test_sigkilled_daemon_process_resumes(lab, slurm):
    sub = submit_training(lab, steps=400)
    first = wait_started(slurm, sub)
    lab.daemon_stop(signal.SIGKILL)
    inject_xid(first.nodes, 79, job_gpu_index(slurm, sub.job_id))
    wait_for(lambda: slurm.job(sub.job_id).ended, 30, "job to end")
    lab.daemon_start()
    again = wait_started(slurm, sub, 1)
    assert again.nodes != first.nodes and again.restart_count == 1


def test_lost_node_fails_over_and_stale_copy_is_fenced(lab, slurm, ft_history):
    sub = submit_training(lab, steps=400, step_time=0.1)
    first = wait_started(slurm, sub)
    wait_for(lambda: ckpt_step(sub.ckpt) >= 5, 60, "checkpoint")
    lab.slurmd_kill(first.nodes)        # the node's slurmd stops answering; its job keeps running
    try:
        again = wait_started(slurm, sub, 1, timeout_s=90)
        assert again.nodes != first.nodes
        h = ft_history(sub.job_id, lambda h: len(h["attempts"]) >= 2)
        assert h["attempts"][0]["verdict"] == "hardware" and h["attempts"][0]["rule"] == "slurm-node-fail"
        wait_for(lambda: json.loads(sub.ckpt.read_text()).get("attempt") == 1, 30, "attempt 1 checkpoint")
        # the stale attempt-0 copy is still running on the lost node and tries to save: fenced
        wait_for(lambda: "attempt 0: not saving" in sub.out.read_text(), 30, "stale copy to be fenced")
        assert json.loads(sub.ckpt.read_text())["attempt"] == 1
        assert slurm.show_node(first.nodes)["Reason"].startswith("slurm-ft:")
    finally:
        lab.slurmd_start(first.nodes)


def test_two_node_job_losing_one_node_blames_only_that_node(lab, slurm, ft_history, workdir):
    """Issue 27 item 5, for real (Slurm 22.05: no ``FailedNode``, the lost node goes DOWN after
    ``SlurmdTimeout``): the lab's ordinary user runs a 2-node ft job with a task on each node;
    one node's slurmd is killed once the job's task runs there. Only that node is drained and
    excluded; the survivor (its epilog finds no hardware fault of its own) is neither drained nor
    blamed; the breaker stays closed; the job runs again (on the survivor and the third node).
    Before: NODE_FAIL blamed every node of the job. Takes about 40 s."""
    from slurm_ft.lab.users import LAB_USER, ensure_user, run_as

    ensure_user()
    script = workdir / "two-node.sh"
    script.write_text("#!/bin/sh\nexec srun --ntasks-per-node=1 sh -c "
                      "'echo \"attempt ${SLURM_RESTART_COUNT:-0} task on $SLURMD_NODENAME\"; exec sleep 600'\n")
    script.chmod(0o755)
    proc = run_as(LAB_USER, ["/usr/bin/sbatch", "--parsable", "--nodes=2", "--gres=gpu:1", "--requeue", "--ft",
                             "--ft-retries=3",
                             f"--output={workdir}/%j.out", "--open-mode=append", str(script)],
                  lab.env(), cwd=str(workdir))
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip().split(";")[0])
    out = workdir / f"{job_id}.out"
    text = lambda: out.read_text(errors="replace") if out.exists() else ""  # noqa: E731

    def running(attempt):
        """The job's attempt once its task runs on each of its nodes (a node lost before its task
        launched fails the step instead: srun's launch failure, an infra fault of the job)."""
        job = slurm.job(job_id)
        ok = job is not None and job.state == "RUNNING" and job.restart_count == attempt and \
            all(f"attempt {attempt} task on {n}" in text() for n in split_nodes(job.nodes))
        return job if ok else None

    first = wait_for(lambda: running(0), 90, f"job {job_id} to start")
    nodes = split_nodes(first.nodes)
    assert len(nodes) == 2
    survivor, victim = nodes        # the batch host survives; the other node is lost
    lab.slurmd_kill(victim)
    try:
        # SlurmdTimeout (10 s in the lab): DOWN and requeued by Slurm after ~25 s, then slurm-ft
        again = wait_for(lambda: running(1), 180, f"job {job_id} to run again")
        assert victim not in split_nodes(again.nodes)
        h = ft_history(job_id, lambda h: len(h["attempts"]) >= 2 and h["attempts"][0]["verdict"] == "hardware",
                       timeout_s=60)
        assert h["attempts"][0]["rule"] == "slurm-node-fail"
        assert split_nodes(slurm.job(job_id).excluded_nodes) == [victim]
        states = {n.name: n for n in slurm.nodes()}
        assert states[victim].reason.startswith("slurm-ft:"), states[victim].reason
        assert not states[survivor].drained and not states[survivor].reason.startswith("slurm-ft:")
        with open_journal(_cfg(lab).journal.path) as j:
            acts = j.actions(job_id)
            assert [(a["target"], a["status"]) for a in acts if a["action"] == "drain"] == [(victim, "done")]
            assert not [a for a in acts if a["action"] == "breaker-open"]
            assert j.breaker_latched() is None
            hardware = {v["node"] for v in j.verdicts(job_id, 0) if v["verdict"] == "hardware"}
            assert hardware == {victim}
    finally:
        slurm.run("scancel", str(job_id), check=False)
        lab.slurmd_start(victim)        # the `slurm` fixture then resumes it and waits until every node is idle
