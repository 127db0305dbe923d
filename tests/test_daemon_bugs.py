"""Issue 14: each daemon bug, reproduced against the in-memory Slurm (tests/fake_slurm.py)
with real journals. Every test here failed on the daemon before the fix (see the issue report)."""

from __future__ import annotations

import subprocess
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon_world import INFRA, USER, XID79, World
from slurm_ft.failover import effects, mailbox
from slurm_ft.journal import open_journal


@pytest.fixture
def w(tmp_path, monkeypatch):
    return World(tmp_path, nodes=5, monkeypatch=monkeypatch)


def _requeued(w, jid, attempt=0) -> int:
    return w.slurm.requeues.get((jid, attempt), 0)


def _verdict(w, jid, node, kind=XID79, attempt=None):
    job = w.job(jid)
    v, rule, xids = kind
    return mailbox.Record(jid, job.restart if attempt is None else attempt, v, rule, tuple(xids), 1, w.clock())


# ------------------------------------------------------------------ a verdict is never lost
def test_verdict_posted_between_the_node_and_the_job_read_is_acted_on(w):
    """The epilog posts its verdict after the daemon read the mailboxes and before it read the
    jobs; the epilog took 10 s (trusted GPU checks), so Slurm's end time is well past the grace.
    Before: the job was seen ended without a verdict and ended ``failed`` for good."""
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    w.slurm.end(jid, verdicts={node: XID79})          # COMPLETING while the epilog runs
    w.clock.advance(10)
    w.step()                                           # still COMPLETING: nothing to decide
    is_job_read = lambda cmd, args: cmd == "squeue" or args[:2] == ("show", "job")  # noqa: E731
    w.slurm.on(is_job_read, lambda: w.slurm.run_epilogs(jid))
    w.step(n=6)
    assert _requeued(w, jid) == 1
    assert w.ft_state(jid) in ("failover-in-progress", "requeued", "running")
    assert w.job(jid).restart == 1


def test_hardware_verdict_arriving_after_a_no_fault_decision_fails_the_job_over(w):
    """The epilog could not post (slurmctld restarting); its verdict arrives later from the
    node's outbox. Before: the attempt stayed ``failed`` and the verdict was ignored."""
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    w.slurm.end(jid, epilogs=True)                     # no verdict reached Slurm
    w.step(n=12)
    assert w.ft_state(jid) == "failed"
    w.slurm.post(node, _verdict(w, jid, node))         # the late verdict
    w.step(n=6)
    assert _requeued(w, jid) == 1
    assert w.ft_state(jid) in ("failover-in-progress", "requeued", "running")
    assert w.slurm.node_recs[node].drain


def test_grace_counts_from_when_the_daemon_saw_the_end_not_from_slurms_end_time(w):
    """A daemon that was down while the job ended must not decide ``failed`` on its first look:
    a verdict posted in the next second is still waited for."""
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    w.daemon.journal.close()
    w.slurm.end(jid, epilogs=True)
    w.clock.advance(300)                               # the daemon was down for 5 minutes
    w.restart_daemon()
    w.step()
    w.slurm.post(node, _verdict(w, jid, node))
    w.step(n=6)
    assert _requeued(w, jid) == 1


# ------------------------------------------------------------------ locked journals
def test_locked_daemon_journal_neither_stalls_nor_loses_verdicts(w):
    """A reader holds BEGIN IMMEDIATE on the daemon journal while jobs end (3 with a real Xid 79).
    Before: every write waited 10 s and failed; no verdict row, no failover."""
    hw = [w.start() for _ in range(3)]
    usr = [w.start() for _ in range(2)]
    w.step()
    lock = w.lock()
    for jid in hw:
        w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: XID79}, epilogs=True)
    for jid in usr:
        w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: USER}, epilogs=True)
    for _ in range(8):
        t0 = time.monotonic()
        w.step()
        assert time.monotonic() - t0 < 1.5, "a cycle stalled on the locked journal"
    assert all(_requeued(w, jid) == 1 for jid in hw)
    assert not any(_requeued(w, jid) for jid in usr)
    w.restart_daemon()                                 # killed and restarted while still locked
    w.step(n=4)
    lock.rollback()
    lock.close()
    w.step(n=4)
    assert all(_requeued(w, jid) == 1 for jid in hw)   # never twice
    with w.journal() as j:
        for jid in hw:
            assert [v["verdict"] for v in j.verdicts(jid, 0)] == ["hardware"]
            assert [a["status"] for a in j.actions(jid, 0) if a["action"] == "failover"] == ["done"]
        for jid in usr:
            assert [v["verdict"] for v in j.verdicts(jid, 0)] == ["user"]
            assert j.job(jid)["ft_state"] == "user-error"
        assert j.pending_intents() == []


def test_epilog_with_a_locked_node_journal_drains_and_posts_at_once(w, monkeypatch):
    """Before: the epilog waited out SQLite's 10 s busy timeout before draining and posting; the
    verdict row was lost. Now: drain and post first; the row waits in the journal's spool."""
    from slurm_ft import slurm as slurm_mod
    from slurm_ft.node import epilog
    from slurm_ft.classify.model import Verdict, XidEvent
    from slurm_ft.node.job import NodeJob

    monkeypatch.setattr(slurm_mod.Slurm, "from_config", classmethod(lambda cls, cfg: w.slurm))
    path = w.cfg.node_journal_path("n1")
    open_journal(path).close()
    lock = w.lock(path)
    job = NodeJob(7, "n1", 0, 1000, (0,), 1, None, None, None, None)
    xid = XidEvent(79, "0000:10:00", 0, "NVRM: Xid (PCI:0000:10:00): 79")
    verdict = Verdict("hardware", "xid-79", (xid,), ("NVRM: Xid (PCI:0000:10:00): 79",), "drain_node")
    t0 = time.monotonic()
    epilog.record_verdict(w.cfg, job, verdict, start=None, log=lambda *_: None)
    assert time.monotonic() - t0 < 3.0
    assert w.slurm.node_recs["n1"].drain
    assert [r.key for r in mailbox.parse(w.slurm.node_recs["n1"].extra)] == ["7.0"]
    lock.rollback()
    lock.close()
    with open_journal(path) as j:                     # the next writer replays the spool
        assert [v["rule"] for v in j.verdicts(7, 0)] == ["xid-79"]


# ------------------------------------------------------------------ isolation
def test_a_refused_requeue_does_not_stop_other_failovers(w):
    a, b = w.start(), w.start()
    w.step()
    w.slurm.fail(lambda cmd, args: args[:2] == ("requeue", str(a)), count=1000)
    for jid in (a, b):
        w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: XID79}, epilogs=True)
    w.step(n=6)
    assert _requeued(w, b) == 1 and w.job(b).restart == 1
    w.step(n=60)      # a refusal is retried with the daemon's backoff, REQUEUE_TRIES times in all
    assert w.ft_state(a) == "internal-error"
    assert sum(1 for c in w.slurm.calls if c.args[:2] == ("requeue", str(a))) == effects.REQUEUE_TRIES


def test_a_requeue_refused_while_slurmctld_restarts_is_retried_not_internal_error(w):
    """Found by test_lab_ctld (kill -9 of slurmctld right after the drain): the daemon's requeue
    met the restarting slurmctld ("Unexpected message received") and booked the failover
    ``internal-error``, final: the job was never failed over. A refusal now leaves the failover's
    intent open; the daemon resumes it after its backoff, and the job is not planned meanwhile."""
    jid = w.start()
    w.step()
    w.slurm.fail(lambda cmd, args: args[:2] == ("requeue", str(jid)), count=2)
    w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: XID79}, epilogs=True)
    for _ in range(40):
        w.step()
        if w.job(jid).state == "RUNNING" and w.job(jid).restart == 1:
            break
    assert w.job(jid).restart == 1 and w.job(jid).state == "RUNNING", w.job(jid)
    assert w.ft_state(jid) == "running"
    with w.journal() as j:
        acts = j.actions(jid)
        assert [a["status"] for a in acts if a["action"] == "requeue"] == ["failed", "failed", "done"]
        assert [a["status"] for a in acts if a["action"] == "failover"] == ["done"]


def test_a_drain_refused_while_slurmctld_restarts_is_retried_before_the_requeue(w):
    """Found by test_lab_ctld (kill -9 of slurmctld right after the node-side drain): the daemon's
    drain met the dying slurmctld and was booked failed, the requeue then reached the restarted
    one, whose rolled-back state had lost the epilog's drain too: the faulty node stayed in
    service. A refused drain now leaves the failover open; it is resumed, drain first."""
    jid = w.start()
    w.step()
    node = w.job(jid).nodes[0]
    w.slurm.fail(lambda cmd, args: args[:2] == ("show", "node"), count=2)
    w.slurm.end(jid, verdicts={node: XID79}, epilogs=True)
    for _ in range(40):
        w.step()
        if w.job(jid).state == "RUNNING" and w.job(jid).restart == 1:
            break
    assert w.job(jid).restart == 1 and w.job(jid).nodes != [node], w.job(jid)
    rec = w.slurm.node_recs[node]
    assert rec.drain and rec.reason.startswith("slurm-ft: Xid 79"), (rec.drain, rec.reason)
    with w.journal() as j:
        acts = j.actions(jid)
        assert [a["status"] for a in acts if a["action"] == "drain"] == ["failed", "failed", "done"], \
            [(a["action"], a["status"]) for a in acts]
        assert [a["status"] for a in acts if a["action"] == "failover"] == ["done"]
        assert [a["status"] for a in acts if a["action"] == "requeue"] == ["done"]


def test_an_unfinished_failover_that_cannot_be_resumed_does_not_block_others(w):
    """A crash leaves job A's failover as an intent; on restart Slurm refuses every read of A.
    Before the reconcile isolation, that stopped every later failover."""
    from fake_slurm import Crash

    a = w.start()
    w.step()
    w.slurm.end(a, verdicts={w.job(a).nodes[0]: XID79}, epilogs=True)
    w.slurm.crash_at = (w.slurm.mutations + 2, False)   # dies between the drain and the requeue
    with pytest.raises(Crash):
        w.step(n=6)
    b = w.start()
    w.slurm.fail(lambda cmd, args: str(a) in args or f"JobId={a}" in args or args[-1:] == (str(a),), count=10**6)
    w.restart_daemon()
    w.step()
    w.slurm.end(b, verdicts={w.job(b).nodes[0]: XID79}, epilogs=True)
    w.step(n=6)
    assert _requeued(w, b) == 1


def test_run_survives_unexpected_errors(w, monkeypatch):
    """A bug (any Exception) in a cycle is logged and the loop goes on (no crash loop under systemd)."""
    calls = []

    def cycle():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("bug")
        w.daemon._stop = True

    monkeypatch.setattr(w.daemon, "cycle", cycle)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    w.daemon.run()
    assert len(calls) == 3


# ------------------------------------------------------------------ hostlists, priority
def test_targets_are_hostlists(w):
    jid = w.start(node_count=2)
    nodes = w.job(jid).nodes
    assert len(nodes) == 2
    w.step()
    w.slurm.end(jid, verdicts={n: XID79 for n in nodes}, epilogs=True)
    w.step(n=6)
    exc = [a for c in w.slurm.calls for a in c.args if a.startswith("ExcNodeList=")]
    assert exc and exc[0] == "ExcNodeList=n[1-2]"
    with w.journal() as j:
        fo = [a for a in j.actions(jid, 0) if a["action"] == "failover"]
    assert fo[0]["target"] == "n[1-2]"


def test_prolog_refusal_keeps_the_jobs_place_in_the_queue(w):
    """Before: the released job got top + boost, and with nothing else running top was 0: its
    priority fell from ~4294901760 to 1000, below every job submitted after it."""
    jid = w.start(ft=False)
    before = w.job(jid).priority
    w.step()                                           # the daemon's start-up scan sees it
    w.slurm.prolog_fail(jid)
    w.step(dt=2.0, n=3)                                # a plain job's refusal: seen by the node poll
    later = w.slurm.submit(ft=False)
    w.step()
    assert w.job(jid).priority >= before > w.job(later).priority
    assert w.job(jid).state == "RUNNING" and w.job(jid).restart == 1


def test_failed_over_job_outranks_jobs_raised_since_the_last_full_scan(w):
    """Before: the boost was taken above the top priority of the last full scan (up to
    ``scan_interval_s`` = 60 s old); waiting jobs whose priority an admin raised since then
    (or that came after a scan that saw an empty queue: top 0) stayed ahead of the failed-over
    job. Found on the lab right after a slurmctld restart forced a scan of an empty queue."""
    jid = w.start()
    w.step()                                            # the start-up full scan
    waiting = [w.slurm.submit(ft=False) for _ in range(3)]
    top = max(w.job(x).priority for x in [jid, *waiting])
    for x in waiting:
        w.job(x).priority = top + 2000                  # raised after the scan (scontrol update)
    w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: XID79}, epilogs=True)
    w.step(n=4)
    assert w.job(jid).restart == 1
    assert w.job(jid).priority > max(w.job(x).priority for x in waiting)


# ------------------------------------------------------------------ cost
@pytest.mark.parametrize("why", ["held", "dependency"])
def test_an_ineligible_failed_over_job_costs_bounded_calls(w, why):
    """Its owner holds it (or it waits on a dependency): StartTime=now cannot help. Before: one
    scontrol call and one journal row every cycle, forever."""
    dep = w.start(ft=False)
    jid = w.start()
    w.step()
    w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: XID79}, epilogs=True)
    w.clock.advance(0.5)
    w.daemon.cycle()                                    # failed over: requeued, StartTime=now
    job = w.job(jid)
    assert job.state == "PENDING" and job.restart == 1
    if why == "held":
        job.held, job.priority, job.reason = "user", 0, "JobHeldUser"
    else:
        job.dependency, job.reason = f"afterok:{dep}", "Dependency"
    w.slurm.run_epilogs()
    t0 = w.clock()
    with w.journal() as j:
        rows0 = len(j.actions(jid))
    w.step(dt=1.0, n=600)                               # ten minutes
    starts = [c for c in w.slurm.calls if c.t > t0 and c.job_id == jid and "StartTime=now" in c.args]
    assert len(starts) <= 5
    with w.journal() as j:
        assert len(j.actions(jid)) - rows0 <= 5


def test_daemon_cost_follows_faults_not_the_queue(w):
    """4,000 held jobs of another user: the daemon must not read the whole queue every cycle.
    Before: one full job-info RPC (squeue --json) every 0.5 s."""
    for _ in range(4000):
        w.slurm.submit(ft=False, hold=True, user="bob")
    jid = w.start()
    w.step(n=4)
    t0 = w.clock()
    w.step(n=120)                                       # one minute, no fault
    assert w.slurm.rpc_count(since=t0, kinds=("REQUEST_JOB_INFO",)) <= 2
    assert w.slurm.rpc_count(since=t0) <= 60
    node = w.job(jid).nodes[0]
    w.slurm.end(jid, verdicts={node: XID79})          # COMPLETING while the epilog runs
    t_fault = w.clock()
    w.step(dt=0.25)
    w.slurm.run_epilogs()                              # the epilog took 0.25-0.5 s
    for _ in range(7):
        w.step(dt=0.25)
        if w.job(jid).state == "RUNNING":
            break
    assert w.job(jid).state == "RUNNING" and w.job(jid).restart == 1
    assert w.clock() - t_fault <= 2.0


# ------------------------------------------------------------------ evacuation never blocks the loop
def test_health_evacuation_is_a_non_blocking_state(w, monkeypatch):
    """Before: ``slurm-ft drain --checkpoint`` ran as a child process of the daemon."""
    def no_child(*a, **k):
        raise AssertionError("the daemon started a child process")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    w.slurm.drain_by_node(node, "slurm-ft: ecc_volatile_uncorrected: GPU0 3 uncorrected")
    w.step(dt=2.0, n=3)                                # seen within [failover] node_poll_s
    with w.journal() as j:
        assert [a["action"] for a in j.actions(jid, 0) if a["action"] in ("evacuate", "ckpt-notify")] == \
            ["evacuate", "ckpt-notify"]
    assert w.job(jid).state == "RUNNING"               # waiting for its checkpoint, loop not blocked
    w.slurm.ack(jid, "saved")
    w.step(dt=1.0, n=3)
    w.slurm.run_epilogs()
    w.step(n=4)
    job = w.job(jid)
    assert job.restart == 1 and job.state == "RUNNING" and job.nodes != [node]
    assert w.ft_state(jid) == "running"
    with w.journal() as j:
        assert [a["status"] for a in j.actions(jid, 0) if a["action"] == "evacuation"] == ["done"]


def test_health_evacuation_requeues_after_the_wait_without_an_ack(w):
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    w.slurm.drain_by_node(node, "slurm-ft: ecc_volatile_uncorrected: GPU0 3 uncorrected")
    w.step(dt=2.0, n=3)
    assert w.job(jid).restart == 0
    w.step(dt=5.0, n=13)                               # ckpt_wait=60 s passes
    w.slurm.run_epilogs()
    w.step(n=3)
    assert w.job(jid).restart == 1 and _requeued(w, jid) == 1


# ------------------------------------------------------------------ attempts
def test_epilog_files_the_verdict_under_the_attempt_that_ran(tmp_path, w, monkeypatch):
    """A job requeued while running (an evacuation, a continuation): by the time the epilog
    runs, Slurm's restart count is already the next attempt's. Before: the node journal (and the
    mailbox) filed the ended attempt's verdict under the next attempt number."""
    from slurm_ft import slurm as slurm_mod
    from slurm_ft.node import epilog
    from slurm_ft.classify.model import Verdict
    from slurm_ft.node.job import NodeJob, pop_start_marker, write_start_marker

    monkeypatch.setattr(slurm_mod.Slurm, "from_config", classmethod(lambda cls, cfg: w.slurm))
    state = w.cfg.node_state.dir
    write_start_marker(state, NodeJob(9, "n2", 0, 1000, (0,), None, None, None, None, None))
    ended = NodeJob(9, "n2", 1, 1000, (0,), 1, None, None, None, None)   # SLURM_JOB_RESTART_COUNT=1
    marker = pop_start_marker(state, ended)
    job = epilog.attempt_that_ran(ended, marker)
    assert job.attempt == 0
    epilog.record_verdict(w.cfg, job, Verdict("user", "python-traceback", (), (), "none"),
                          start=None, log=lambda *_: None)
    with open_journal(w.cfg.node_journal_path("n2")) as j:
        assert [v["attempt"] for v in j.verdicts(9)] == [0]
    assert [r.attempt for r in mailbox.parse(w.slurm.node_recs["n2"].extra)] == [0]


def test_infra_retry_keeps_slurms_delay_and_fast_fail_spares_hardware(w):
    """Kept behaviour: two hardware faults on two nodes fail over twice (no fast-fail); two
    identical infra failures stop (fast-fail)."""
    jid = w.start()
    for attempt in range(2):
        w.step()
        w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: XID79}, epilogs=True)
        w.step(n=4)
        w.slurm.run_epilogs()
        w.step(n=4)
    assert w.job(jid).restart == 2 and w.job(jid).state == "RUNNING"
    other = w.start()
    w.step()
    w.slurm.end(other, verdicts={w.job(other).nodes[0]: INFRA}, epilogs=True)
    w.step(n=4)
    assert w.job(other).restart == 1
    assert w.job(other).eligible > w.clock() + 60       # unblamed: Slurm's requeue delay kept


# ------------------------------------------------------------------ crash safety (fake Slurm twin of the lab test)
@pytest.mark.parametrize("crash_at", range(1, 7))
@pytest.mark.parametrize("after", [False, True])
def test_daemon_killed_at_each_call_resumes_once(w, crash_at, after):
    """SIGKILL at the n-th state-changing call of a failover (before or after Slurm applied it),
    then a fresh daemon: the failover completes exactly once."""
    from fake_slurm import Crash

    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    w.slurm.end(jid, verdicts={node: XID79}, epilogs=True)
    w.slurm.crash_at = (w.slurm.mutations + crash_at, after)
    try:
        w.step(n=6)
    except Crash:
        w.clock.advance(130)                            # dead long enough for Slurm's delay to pass
        w.slurm.schedule()
        w.restart_daemon()
    w.step(n=8)
    job = w.job(jid)
    assert job.restart == 1 and job.state == "RUNNING" and job.nodes != [node]
    assert w.slurm.requeues == {(jid, 0): 1}
    assert node in job.excluded and w.slurm.node_recs[node].drain
    assert w.ft_state(jid) == "running"
    with w.journal() as j:
        assert j.pending_intents() == []
        assert [a["status"] for a in j.actions(jid, 0) if a["action"] == "failover"] == ["done"]


def _burst_of_ends_and_a_fault(tmp_path, monkeypatch, jobs: int = 25):
    """``jobs`` running jobs on 30 nodes; all end at once, the last with an Xid 79 verdict."""
    w = World(tmp_path, nodes=30, monkeypatch=monkeypatch)
    ids = [w.start() for _ in range(jobs)]
    w.step()
    faulted = ids[-1]
    for jid in ids[:-1]:
        w.slurm.end(jid, "COMPLETED", 0, epilogs=True)
    w.slurm.end(faulted, verdicts={w.job(faulted).nodes[0]: XID79}, epilogs=True)
    return w, ids, faulted


def test_a_burst_of_ordinary_ends_does_not_delay_a_failover(tmp_path, monkeypatch):
    """2,000 short jobs on 64 nodes (benchmarks/daemon_fleet.py): a cycle with dozens of jobs
    completing handled them in job-id order, a failover after all of them (5 s late under load).
    Faults come first; a finished job's final state costs no scontrol call (Slurm refuses it)."""
    w, ids, faulted = _burst_of_ends_and_a_fault(tmp_path, monkeypatch)
    t0 = w.clock()
    w.step()
    with w.journal() as j:
        order = [r[0] for r in j.db.execute("SELECT job_id FROM actions WHERE action IN ('failover', 'decide') "
                                            "ORDER BY id").fetchall()]
    assert order[0] == faulted and len(order) == 25
    assert not [c for c in w.slurm.calls if c.t > t0 and c.job_id in ids[:-1] and c.args[:1] == ("update",)]


def test_a_requeue_that_timed_out_after_taking_effect_is_no_internal_error(w):
    """Found by the stateful test: ``scontrol requeue`` timed out after slurmctld had requeued the
    job. Before: the failover was marked refused (``internal-error``, final) and the next
    attempt's hardware fault was never failed over."""
    jid = w.start()
    w.step()
    w.slurm.fail(lambda cmd, args: args[:2] == ("requeue", str(jid)), count=1, mode="timeout-after")
    w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: XID79}, epilogs=True)
    w.step(n=6)
    assert w.slurm.requeues == {(jid, 0): 1} and w.job(jid).state == "RUNNING"
    assert w.ft_state(jid) == "running"
    w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: XID79}, epilogs=True)
    w.step(n=6)
    assert w.slurm.requeues.get((jid, 1)) == 1 and w.job(jid).restart == 2


def test_routine_events_wait_behind_a_fault_and_are_read_within_a_budget(tmp_path, monkeypatch):
    """benchmarks/daemon_fleet.py (64 nodes, 2,000 jobs, ~5 starts and ends a second): every
    event cost a ``scontrol show job`` before anything else, so under load a hardware fault's
    job was read (and failed over) tens of seconds late. Now starts and clean ends (the hook's
    ``exit=0``) are read after the jobs that failed, at most MAX_SCAN_READS per cycle, and all
    of them within a few cycles."""
    from slurm_ft.failover import daemon as daemon_mod
    monkeypatch.setattr(daemon_mod, "MAX_SCAN_READS", 5)
    w, ids, faulted = _burst_of_ends_and_a_fault(tmp_path, monkeypatch)
    reads = len(w.slurm.calls)
    w.step()
    with w.journal() as j:
        assert [a["status"] for a in j.actions(faulted, 0) if a["action"] == "failover"] == ["done"]
        decided = {jid for jid in ids[:-1] if any(a["action"] == "decide" for a in j.actions(jid, 0))}
    assert len(decided) <= 5
    shows = [c.job_id for c in w.slurm.calls[reads:] if c.args[:2] == ("show", "job") and c.job_id != faulted]
    assert len(shows) <= 5, shows
    w.step(n=6)
    with w.journal() as j:
        assert all(any(a["action"] == "decide" for a in j.actions(jid, 0)) for jid in ids[:-1])


# ------------------------------------------------------------------ blame needs proof (issue 27)
@pytest.mark.parametrize("slurm_version", ["22.05", "24.11"])
def test_a_two_node_job_that_loses_one_node_blames_only_that_node(tmp_path, monkeypatch, slurm_version):
    """Issue 27 item 5: a 2-node job loses n2 (its slurmd is killed); the survivor n1's epilog
    says ``unknown``. 22.05: Slurm marks n2 DOWN (no FailedNode); 24.11: the job's record says
    ``FailedNode=n2`` (here n2 answers again before the daemon looks, so that is the only fact).
    Only n2 is drained and excluded; n1 is untouched; the shipped breaker defaults never open;
    the job runs again. Before: both nodes were blamed, the breaker refused n1 and latched."""
    w = World(tmp_path, nodes=3, monkeypatch=monkeypatch, breaker="", failed_node=slurm_version == "24.11")
    jid = w.start(node_count=2)
    assert w.job(jid).nodes == ["n1", "n2"]
    w.step()
    w.job(jid).verdicts["n1"] = mailbox.Record(jid, 0, "unknown", "no-evidence", (), 1, w.clock())
    w.slurm.node_fail("n2")
    if slurm_version == "24.11":
        w.slurm.node_up("n2")
    w.step(n=4)
    w.slurm.run_epilogs()                              # the survivor's epilog posts "unknown"
    for _ in range(40):
        w.step()
        if w.job(jid).state == "RUNNING":
            break
    job = w.job(jid)
    assert job.state == "RUNNING" and job.restart == 1 and "n2" not in job.nodes
    assert w.slurm.node_recs["n2"].drain and w.slurm.node_recs["n2"].reason.startswith("slurm-ft:")
    assert not w.slurm.node_recs["n1"].drain and job.excluded == {"n2"}
    with w.journal() as j:
        acts = j.actions(jid)
        assert [a["target"] for a in acts if a["action"] == "drain"] == ["n2"]
        assert not [a for a in acts if a["action"] == "breaker-open"] and j.breaker_latched() is None
        assert {(v["node"], v["verdict"]) for v in j.verdicts(jid, 0)} == {("n1", "unknown"), ("n2", "hardware")}


# ------------------------------------------------------------------ checkpoint acks (issue 27 item 9)
def _to_limit(w, jid, attempt):
    """Time passes until slurm-ft answered the attempt's time limit (a ``ckpt-notify`` row, sent
    or refused), the job still running."""
    for _ in range(200):
        w.step(dt=5.0)
        with w.journal() as j:
            if any(a["action"] == "ckpt-notify" for a in j.actions(jid, attempt)):
                return
    raise AssertionError("no checkpoint signal near the time limit")


def test_forged_saved_acks_buy_no_more_continuations_than_the_bound(w):
    """Issue 27 item 9: a job that answers every time-limit signal with ``saved`` without saving
    gets at most ``max_continuations`` (default 2) more time limits, not 10 (11x its wall time)."""
    jid = w.start(time_limit_min=10)
    for attempt in range(6):
        job = w.job(jid)
        assert job.state == "RUNNING" and job.restart == attempt
        _to_limit(w, jid, attempt)
        w.slurm.ack(jid, "saved", step=attempt)       # forged: nothing was saved
        w.step(n=4)
        if w.job(jid).restart == attempt:             # not continued: the limit ends it
            w.slurm.end(jid, "TIMEOUT", exit_code=0, epilogs=True)
            w.step(n=10)
            break
        w.slurm.run_epilogs()
        for _ in range(20):
            w.step(dt=1.0)
            if w.job(jid).state == "RUNNING":
                break
    assert w.job(jid).restart == 2 and w.ft_state(jid) == "timeout"
    with w.journal() as j:
        assert len([a for a in j.actions(jid) if a["action"] == "continue" and a["status"] == "done"]) == 2


def test_a_saved_ack_without_slurm_fts_request_buys_nothing(w):
    """An ack that answers no checkpoint signal slurm-ft journaled for the attempt (written
    before any signal, or after a signal nothing caught) buys no continuation: the job ends
    ``timeout`` at its limit."""
    jid = w.start(time_limit_min=10, catches_signal=False)
    w.step()
    w.slurm.ack(jid, "saved", step=1)                 # unasked, at the start
    _to_limit(w, jid, 0)
    with w.journal() as j:
        assert [a["status"] for a in j.actions(jid, 0) if a["action"] == "ckpt-notify"] == ["skipped"]
    w.slurm.ack(jid, "saved", step=2)                 # nobody caught the signal: not an answer
    w.step(n=6)
    assert w.job(jid).restart == 0 and w.job(jid).state == "RUNNING"
    w.slurm.end(jid, "TIMEOUT", exit_code=0, epilogs=True)
    w.step(n=10)
    assert w.job(jid).restart == 0 and w.ft_state(jid) == "timeout"
    with w.journal() as j:
        assert not [a for a in j.actions(jid) if a["action"] == "continue"]


# ------------------------------------------------------------------ drain reasons (issue 27 item 9)
def test_a_trusted_fault_on_a_job_that_exited_0_names_the_fault(w, monkeypatch):
    """The driver's own record says the job's GPU fell off the bus, yet the job exited 0: the
    node is drained (trusted hardware evidence) with a reason naming the fault, not
    ``clean-exit``."""
    from slurm_ft import slurm as slurm_mod
    from slurm_ft.node import epilog
    from slurm_ft.classify.engine import classify
    from slurm_ft.classify.model import Evidence
    from slurm_ft.node.job import NodeJob

    monkeypatch.setattr(slurm_mod.Slurm, "from_config", classmethod(lambda cls, cfg: w.slurm))
    record = "NVRM: GPU 0000:10:00.0: GPU has fallen off the bus."
    verdict = classify(Evidence(kernel_lines=[record], exit_code=0, slurm_state="COMPLETED",
                                job_bus_ids=frozenset({"0000:10:00"}), kernel_records=True))
    assert (verdict.verdict, verdict.rule, verdict.action) == ("ok", "clean-exit", "drain_node")
    job = NodeJob(7, "n1", 0, 1000, (0,), 0, None, None, None, None)
    epilog.record_verdict(w.cfg, job, verdict, start=None, log=lambda *_: None)
    reason = w.slurm.node_recs["n1"].reason
    assert w.slurm.node_recs["n1"].drain and reason.startswith("slurm-ft:")
    assert "clean-exit" not in reason and verdict.cause in reason and reason.endswith("(job 7)")


# ------------------------------------------------------------------ one evacuation protocol (issue 27)
def _bounded(w, **failover):
    """The world's daemon with these ``[failover]`` settings (the config is one typed dataclass)."""
    import dataclasses
    w.cfg = dataclasses.replace(w.cfg, failover=dataclasses.replace(w.cfg.failover, **failover))
    w.restart_daemon()


def _drain_checkpoint(w, node, timeout_s=None, **kw):
    """What ``slurm-ft drain NODE --checkpoint`` does, the daemon cycling while it follows the journal."""
    from slurm_ft.failover import evacuation
    with open_journal(w.cfg.journal.path) as j:
        line, requests, left = evacuation.request(w.slurm, j, node, w.cfg.failover, clock=w.clock, **kw)
        lines: list[str] = []
        outcomes = evacuation.follow(j, requests, timeout_s or evacuation.default_timeout_s(requests),
                                     report=lines.append, clock=w.clock, sleep=lambda s: w.step(dt=s))
    return line, outcomes, left, lines


def test_drain_checkpoint_is_the_daemons_evacuation(w):
    """Before: ``drain --checkpoint`` ran its own blocking copy of the evacuation
    (checkpoint/evacuate.py): it ignored ``priority_ceiling``, read the whole queue with
    ``squeue --json`` every 0.5 s and had no bound on its StartTime loop. Now it journals a
    request and the daemon's state machine carries it out, within the daemon's bounds."""
    jid = w.start()
    ceiling = w.job(jid).priority + 5                   # far below top + priority_boost (1000)
    _bounded(w, max_evacuations=1, priority_ceiling=ceiling)
    node = w.job(jid).nodes[0]
    w.step()
    calls = len(w.slurm.calls)
    acked = []
    w.slurm.on(lambda cmd, args: args[:2] == ("show", "job") and any(     # once signalled, the job saves
        c.cmd == "srun" for c in w.slurm.calls[calls:]) and not acked,
        lambda: acked.append(w.slurm.ack(jid, "saved", step=42)))
    line, (out,), left, lines = _drain_checkpoint(w, node)
    assert line.startswith("drained") and left == []
    assert out.result == "saved" and out.ok and out.step == 42 and out.excluded == node, out
    assert any("checkpoint signal: evacuation: SIGUSR1 to 1 process(es)" in x for x in lines), lines
    assert any(x.endswith(f"requeued excluding {node}") for x in lines), lines
    with w.journal() as j:
        acts = [(a["action"], a["status"]) for a in j.actions(jid, 0)]
    assert ("evacuate-request", "done") in acts and ("evacuate", "done") in acts
    assert ("evacuation", "done") in acts and ("ckpt-ack", "done") in acts
    assert not any(c.args[:1] == ("--json",) for c in w.slurm.calls[calls:])   # never the whole queue as JSON
    w.slurm.run_epilogs()
    w.step(n=6)
    job = w.job(jid)
    assert job.restart == 1 and job.state == "RUNNING" and node not in job.nodes
    assert job.priority == ceiling                                         # the site's ceiling holds
    assert w.slurm.requeues == {(jid, 0): 1}
    # the site's bound of evacuations: a second request is answered, not carried out
    node2 = job.nodes[0]
    line, (out,), _, lines = _drain_checkpoint(w, node2)
    assert out.result == "refused" and not out.ok and "max_evacuations" in out.detail, out
    assert w.job(jid).state == "RUNNING" and w.job(jid).restart == 1       # it runs on
    with w.journal() as j:
        assert [a["status"] for a in j.actions(jid, 1) if a["action"] == "evacuate-request"] == ["skipped"]
        assert not [a for a in j.actions(jid, 1) if a["action"] in ("ckpt-notify", "evacuate")]


def test_drain_checkpoint_cli(w, monkeypatch, tmp_path):
    from click.testing import CliRunner

    from slurm_ft.cli import main as cli
    from slurm_ft.failover import evacuation
    from slurm_ft.slurm import Slurm
    jid = w.start()
    other = w.start(ft=False)
    node = w.job(jid).nodes[0]
    w.slurm.jobs_by_id[other].nodes = [node]              # a plain job beside it is left alone
    w.step()
    monkeypatch.setattr(Slurm, "from_config", lambda cfg: w.slurm)
    saved = []

    def pause(s):                                          # time passes, the daemon cycles
        w.step(dt=s)
        if w.slurm.calls and any(c.cmd == "srun" for c in w.slurm.calls) and not saved:
            saved.append(w.slurm.ack(jid, "saved", step=7))

    monkeypatch.setattr(evacuation, "_pause", pause)
    conf = str(tmp_path / "slurm-ft.toml")
    r = CliRunner().invoke(cli.main, ["drain", node, "--checkpoint", "--reason", "PSU swap", "--config", conf])
    assert r.exit_code == 0, r.output
    assert f"{node}: drained (slurm-ft: PSU swap)" in r.output
    assert f"job {other}: left running: not ft-enabled" in r.output
    assert f"job {jid}: checkpoint saved step=7" in r.output
    assert f"job {jid}: evacuated after its exit checkpoint; requeued excluding {node}" in r.output
    assert w.slurm.node_recs[node].reason == "slurm-ft: PSU swap"
    r = CliRunner().invoke(cli.main, ["drain", "--help"])
    assert "--timeout" in r.output and "--wait" not in r.output


def test_drain_checkpoint_reports_a_job_that_never_saves_within_its_wait(w, monkeypatch, tmp_path):
    """The job catches the signal and never acks: the daemon requeues it at its --ft-ckpt-wait
    (60 s here), and the command says so and exits 3, without a traceback; a daemon that never
    answers within --timeout is reported too."""
    from click.testing import CliRunner

    from slurm_ft.cli import main as cli
    from slurm_ft.failover import evacuation
    from slurm_ft.slurm import Slurm
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    monkeypatch.setattr(Slurm, "from_config", lambda cfg: w.slurm)
    monkeypatch.setattr(evacuation, "_pause", lambda s: w.step(dt=max(s, 1.0)))
    conf = str(tmp_path / "slurm-ft.toml")
    t0 = w.clock()
    r = CliRunner().invoke(cli.main, ["drain", node, "--checkpoint", "--config", conf])
    assert r.exit_code == 3, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert "Traceback" not in r.output
    assert f"job {jid}: checkpoint timeout: no saved/failed ack within 60 s" in r.output
    assert f"job {jid}: evacuated without a checkpoint: it did not save within its wait" in r.output
    assert 60 <= w.clock() - t0 < 90
    w.slurm.run_epilogs()
    w.step(n=6)
    assert w.job(jid).restart == 1 and node not in w.job(jid).nodes
    # the daemon is down: the request stays journaled, the command gives up at --timeout and says why
    jid2 = w.start()
    node2 = w.job(jid2).nodes[0]
    w.step()
    monkeypatch.setattr(evacuation, "_pause", lambda s: w.clock.advance(s))
    r = CliRunner().invoke(cli.main, ["drain", node2, "--checkpoint", "--timeout", "5", "--config", conf])
    assert r.exit_code == 3 and "Traceback" not in r.output, r.output
    assert f"job {jid2}: no answer from the daemon in time" in r.output and "slurm-ft daemon" in r.output
    w.step(n=2)                                           # the daemon back: it carries the request out
    with w.journal() as j:
        assert [a["status"] for a in j.actions(jid2, 0) if a["action"] == "evacuate-request"] == ["done"]
        assert [a["action"] for a in j.actions(jid2, 0) if a["action"] in ("evacuate", "ckpt-notify")] == \
            ["evacuate", "ckpt-notify"]


# ------------------------------------------------------------------ a suspect node (issue 22)
def test_a_suspect_node_is_avoided_by_the_retry_but_neither_drained_nor_blamed(w):
    """Issue 22: a node crashing jobs of several users (``unverified:node-crash-recurring``: the
    trusted checks passed) gets the job an unblamed retry *elsewhere*: this job's ExcNodeList
    names the node; the node is not drained; no drain is journaled. (As every unblamed retry, it
    keeps the job's priority and Slurm's requeue delay.)"""
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    suspect = ("unknown", "unverified:node-crash-recurring", ())
    w.slurm.end(jid, verdicts={node: suspect}, epilogs=True)
    for _ in range(80):      # an unblamed retry keeps Slurm's requeue delay (machine._restart_at)
        w.step(dt=2.0)
        if w.job(jid).state == "RUNNING" and w.job(jid).restart == 1:
            break
    job = w.job(jid)
    assert job.state == "RUNNING" and job.restart == 1 and node not in job.nodes, job
    assert node in job.excluded and not w.slurm.node_recs[node].drain
    with w.journal() as j:
        acts = j.actions(jid)
        assert not [a for a in acts if a["action"] == "drain"]
        fo = [a for a in acts if a["action"] == "failover"]
        assert fo and fo[0]["target"] in ("", None) and node in fo[0]["detail"]


def test_a_suspect_node_the_job_cannot_run_without_is_kept(tmp_path, monkeypatch):
    """The avoidance never holds a job: with one node in the partition, the retry keeps it."""
    w = World(tmp_path, nodes=1, monkeypatch=monkeypatch)
    jid = w.start()
    w.step()
    w.slurm.end(jid, verdicts={"n1": ("unknown", "unverified:node-crash-recurring", ())}, epilogs=True)
    for _ in range(80):      # an unblamed retry keeps Slurm's requeue delay (machine._restart_at)
        w.step(dt=2.0)
        if w.job(jid).state == "RUNNING" and w.job(jid).restart == 1:
            break
    job = w.job(jid)
    assert job.state == "RUNNING" and job.restart == 1 and job.nodes == ["n1"] and not job.excluded


@given(rules=st.lists(st.one_of(st.text(max_size=30), st.sampled_from(
    ["unverified:node-crash-recurring", "unverified:cuda-ecc", "node-crash-recurring", "unverified:"])), max_size=6),
    nodes=st.lists(st.sampled_from(["n1", "n2", ""]), max_size=6))
def test_only_cross_job_suspicion_names_nodes_to_avoid(rules, nodes):
    """policy.avoided_by: a node is avoided only by its own unverified verdict of a cross-job
    (recurrence) rule; a job's own hardware-looking output (``unverified:<row>``), any other rule
    text, or a verdict without a node avoids nothing."""
    from slurm_ft.failover import policy
    verdicts = [{"node": n, "verdict": "unknown", "rule": r} for n, r in zip(nodes, rules)]
    want = {v["node"] for v in verdicts if v["node"] and v["rule"] == "unverified:node-crash-recurring"}
    assert set(policy.avoided_by(verdicts)) == want


def test_a_health_drain_lifted_before_the_job_started_evacuates_nothing(w):
    """The daemon reads the node list every ``[failover] node_poll_s`` and the jobs every cycle.
    A health drain it saw, lifted by an admin (or a test's clean-up) before a new job started on
    the node, must not evacuate that job from a node view older than the job. Before: CI's lab saw
    a job killed 0.06 s after its start, ``evacuated without a checkpoint``, by the previous
    test's row-remap drain (``tests/test_lab_health.py``)."""
    node = w.slurm.node_names[0] if hasattr(w.slurm, "node_names") else sorted(w.slurm.node_recs)[0]
    w.slurm.drain_by_node(node, "slurm-ft: row_remap: GPU0 row remap pending")
    w.step(dt=6.0)                                      # past node_poll_s: the daemon sees the drain
    w.slurm._update_node(node, {"State": "RESUME"})     # the admin resumes it
    jid = w.start(required=(node,))                     # a new job lands there at once
    w.step(dt=0.5, n=4)                                 # within node_poll_s of the drained view
    w.step(dt=2.0, n=4)
    with w.journal() as j:
        assert not [a for a in j.actions(jid, 0) if a["action"] in ("evacuate", "ckpt-notify")]
    job = w.job(jid)
    assert job.state == "RUNNING" and job.restart == 0 and _requeued(w, jid) == 0
