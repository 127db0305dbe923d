"""The steps of one daemon cycle (slurm_ft.failover.daemon.Daemon.cycle), each driven alone: the
in-memory Slurm (tests/fake_slurm.py), real journals under tmp_path, a fake clock."""

from __future__ import annotations

import pytest

from daemon_world import World
from slurm_ft.failover import daemon as daemon_mod
from slurm_ft.failover.events import Event


class _Events:
    """An event spool that hands out the given events once."""

    def __init__(self, events):
        self.events = list(events)

    def read(self):
        out, self.events = self.events, []
        return out


@pytest.fixture
def w(tmp_path, monkeypatch):
    return World(tmp_path, nodes=8, monkeypatch=monkeypatch)


def _job_reads(w, since):
    return [c.job_id for c in w.slurm.calls if c.t >= since and c.cmd == "scontrol" and c.args[:2] == ("show", "job")]


# ---------------------------------------------------------------- _targets
def test_targets_are_failure_events_due_wakeups_and_intents_less_those_backing_off(w):
    d, now = w.daemon, w.clock()
    d.events = _Events([Event("end", 11, 0, "n1", 256),      # a failure end: read first, followed
                        Event("start", 12, 0, "n2"),         # routine: the backlog
                        Event("end", 13, 0, "n3", 0),        # a clean end: routine
                        Event("end", 31, 0, "n4", 256)])     # a failure end, but backing off
    d._watch = {21: now, 22: now + 1.0}
    d._backoff = {31: now + 5.0, 42: now + 5.0}
    targets = d._targets(now, [{"job_id": 41, "action": "requeue"}, {"job_id": 42, "action": "requeue"}])
    assert targets == {11, 21, 41}
    assert list(d._backlog) == [12, 13]
    assert d._follow == {11: now + daemon_mod.FOLLOW_WINDOW_S, 31: now + daemon_mod.FOLLOW_WINDOW_S}
    assert d._targets(now, []) == {21}          # the spool is read once; the wake-up stays until planned


def test_targets_without_an_event_spool(w):
    d, now = w.daemon, w.clock()
    d.events = None
    d._watch = {5: now - 1.0}
    assert d._targets(now, []) == {5}
    assert not d._backlog and not d._follow


# ---------------------------------------------------------------- _read_routine
def test_routine_reads_stop_at_max_scan_reads_oldest_first(w, monkeypatch):
    monkeypatch.setattr(daemon_mod, "MAX_SCAN_READS", 2)
    jids = [w.start() for _ in range(3)]
    d, now = w.daemon, w.clock()
    d._backlog = dict.fromkeys(jids)
    jobs: dict = {}
    d._read_routine(now, jobs)
    assert sorted(jobs) == jids[:2] and all(jobs[j].job_id == j for j in jids[:2])
    assert list(d._backlog) == [jids[2]]        # the rest wait for the next cycle
    assert _job_reads(w, now) == jids[:2]


def test_routine_reads_skip_jobs_read_already_or_backing_off(w):
    jids = [w.start() for _ in range(3)]
    d, now = w.daemon, w.clock()
    d._backlog = dict.fromkeys(jids)
    d._backoff = {jids[1]: now + 5.0}
    jobs: dict = {jids[0]: None}
    d._read_routine(now, jobs)
    assert set(jobs) == {jids[0], jids[2]} and jobs[jids[0]] is None
    assert not d._backlog                       # both left the backlog unread
    assert _job_reads(w, now) == [jids[2]]


def test_an_early_cycle_reads_no_routine_job(w):
    jids = [w.start() for _ in range(2)]
    d, now = w.daemon, w.clock()
    d._backlog = dict.fromkeys(jids)
    d._early = True
    jobs: dict = {}
    d._read_routine(now, jobs)
    assert jobs == {} and list(d._backlog) == jids
    assert _job_reads(w, now) == []


# ---------------------------------------------------------------- _full_scan
def test_a_failed_full_scan_is_an_error_of_the_cycle_and_retried_later(w):
    d, now = w.daemon, w.clock()
    d._begin_cycle()
    w.slurm.fail(lambda cmd, args: cmd == "squeue")
    assert d._full_scan(now, set()) is False
    assert d._rows is None
    assert d._next_scan == now + daemon_mod.FULL_SCAN_RETRY_S
    assert len(d.cycle_errors) == 1 and d.cycle_errors[0].startswith("full scan: ")


def test_a_full_scan_queues_the_ft_jobs_not_targeted_and_sets_the_next_scan(w):
    jids = [w.start() for _ in range(3)]
    plain = w.start(ft=False)
    d, now = w.daemon, w.clock()
    d._begin_cycle()
    assert d._full_scan(now, {jids[0]}) is True
    assert {r.job_id for r in d._rows} == {*jids, plain}
    assert list(d._backlog) == jids[1:]         # ft jobs changed since the last scan, not targeted
    assert d._next_scan >= now + w.cfg.failover.scan_interval_s
    assert d.cycle_errors == []


# ---------------------------------------------------------------- _plan_jobs
def test_plan_jobs_faults_first_forgets_gone_jobs_and_defers_resumed_ones(w, monkeypatch):
    a, b, c, e, f = (w.start() for _ in range(5))
    w.slurm.end(e, epilogs=True)                # FAILED (out of COMPLETING): urgent
    d, now = w.daemon, w.clock()
    jobs = {j: w.slurm.job(j) for j in (a, b, c, e, f)}
    assert jobs[e].state == "FAILED"
    gone = 999
    jobs[gone] = None
    d._watch = {gone: now, a: now - 1.0, b: now + 10.0}
    d._backoff = {c: now + 5.0}
    planned = []
    monkeypatch.setattr(d, "handle", lambda job: planned.append(job.job_id))
    d._plan_jobs(now, jobs, fresh={f}, resumed={b})
    assert planned == [e, f, a]                 # faults (a failed state, new verdicts) first, then by id
    assert gone not in d._watch                 # forgotten
    assert a not in d._watch                    # its wake-up came: planned now
    assert d._watch[b] == now                   # resumed: planned from a fresh read, next cycle
    assert c not in planned and c in d._backoff


def test_plan_jobs_backs_off_a_job_whose_handling_fails_and_plans_the_others(w, monkeypatch):
    a, b = w.start(), w.start()
    d, now = w.daemon, w.clock()
    planned = []

    def handle(job):
        if job.job_id == a:
            raise RuntimeError("a bug with one job")
        planned.append(job.job_id)

    monkeypatch.setattr(d, "handle", handle)
    d._plan_jobs(now, {a: w.slurm.job(a), b: w.slurm.job(b)}, fresh=set(), resumed=set())
    assert planned == [b]
    assert d._errors == {a: 1} and d._backoff[a] == now + 1.0 and d._watch[a] == now + 1.0


# ------------------------------------------------------------------ issue 23: fault -> eligible
def _job_updates(w, jid, since):
    return [dict(a.split("=", 1) for a in c.args[2:]) for c in w.slurm.calls
            if c.t >= since and c.cmd == "scontrol" and c.args[:1] == ("update",) and c.args[1] == f"JobId={jid}"]


def test_a_failover_that_excludes_every_node_of_the_attempt_clears_the_delay_in_its_one_update(tmp_path, monkeypatch):
    """The exclusion, the priority and ``StartTime=now`` go in one ``scontrol update``: one RPC,
    and no second update for slurmctld to hold while it asks slurmdbd for the new run's index."""
    from daemon_world import XID79, World

    w = World(tmp_path, nodes=3, monkeypatch=monkeypatch)
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    since = w.clock()
    w.slurm.end(jid, verdicts={node: XID79}, epilogs=True)
    w.step(dt=0.05, n=6)
    updates = _job_updates(w, jid, since)
    first = next(u for u in updates if "ExcNodeList" in u)
    assert first["ExcNodeList"] == node and first["StartTime"] == "now" and "Priority" in first
    assert not [u for u in updates if set(u) == {"StartTime"}]      # no second update for it
    assert w.job(jid).state == "RUNNING" and node not in w.job(jid).nodes


def test_a_job_that_may_land_on_a_node_it_just_left_keeps_its_delay_in_that_update(tmp_path, monkeypatch):
    """A 2-node job that lost one node: the other may take it again, whose slurmd refuses a
    credential made in the second the old one was revoked; the update carries no StartTime (the
    daemon clears the delay REQUEUE_SETTLE_S later, as before)."""
    from daemon_world import XID79, World

    w = World(tmp_path, nodes=4, monkeypatch=monkeypatch)
    jid = w.start(node_count=2)
    bad = w.job(jid).nodes[0]
    w.step()
    since = w.clock()
    w.slurm.end(jid, verdicts={bad: XID79}, epilogs=True)
    w.step(dt=0.05, n=6)
    first = next(u for u in _job_updates(w, jid, since) if "ExcNodeList" in u)
    assert first["ExcNodeList"] == bad and "StartTime" not in first


def test_a_failover_imports_nothing_the_daemon_did_not_import_at_start(tmp_path):
    """``effects.warm()`` (called as the daemon starts) leaves no import for the first failover:
    in a fresh interpreter, the cycle that fails a job over loads no new slurm_ft module."""
    import subprocess
    import sys
    from pathlib import Path

    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from pathlib import Path
from daemon_world import XID79, World
from slurm_ft.failover.effects import warm
w = World(Path({str(tmp_path)!r}), nodes=3)
warm()
jid = w.start()
node = w.job(jid).nodes[0]
w.step()
w.slurm.end(jid, verdicts={{node: XID79}}, epilogs=True)
before = set(sys.modules)
w.step(dt=0.05)
assert w.job(jid).restart == 1, w.job(jid)
print(sorted(m for m in set(sys.modules) - before if m.startswith("slurm_ft")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ issue 23: fault -> RUNNING
def test_a_one_node_fault_is_requeued_while_its_epilog_runs(tmp_path, monkeypatch):
    """With the hand-off on (``[failover] handoff_wait_s``), the epilog posts its hardware verdict and holds the job in COMPLETING (slurm_ft.node.handoff):
    the daemon, woken by the end event, reads that one node's mailbox, and requeues, excludes and boosts the job before the epilog ends; once it ends, StartTime=now
    and the job runs on another node."""
    import dataclasses

    from daemon_world import XID79, World
    from slurm_ft.failover import mailbox

    w = World(tmp_path, nodes=3, monkeypatch=monkeypatch)
    w.cfg = dataclasses.replace(w.cfg, failover=dataclasses.replace(w.cfg.failover, handoff_wait_s=2.0))
    w.daemon = w.new_daemon()
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    w.slurm.end(jid)                                        # COMPLETING: the epilog runs
    v, rule, xids = XID79
    w.slurm.post(node, mailbox.Record(jid, 0, v, rule, tuple(xids), 1, w.clock()))
    since = w.clock()
    for _ in range(10):
        w.step(dt=0.05)
        if w.job(jid).restart:
            break
    job = w.job(jid)
    assert job.restart == 1 and job.completing == {node}   # requeued while its epilog still runs
    assert node in job.excluded and w.ft_state(jid) == "failover-in-progress"
    assert w.clock() - since <= 0.2                         # within a few 50 ms looks
    w.slurm.run_epilogs(jid)
    w.step(dt=0.05, n=4)
    assert w.job(jid).state == "RUNNING" and node not in w.job(jid).nodes
