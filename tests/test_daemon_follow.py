"""Issue 23: a failure is followed closely (slurm_ft.failover.daemon FOLLOW_*) and the loop wakes
on it (slurm_ft.failover.wake), at a cost per failure: the in-memory Slurm, real journals."""

from __future__ import annotations

import pytest

from daemon_world import XID79, World
from slurm_ft.failover import daemon as daemon_mod


@pytest.fixture
def w(tmp_path, monkeypatch):
    return World(tmp_path, nodes=8, monkeypatch=monkeypatch)


def _early_cycle(w, dt=daemon_mod.FOLLOW_POLL_S):
    w.clock.advance(dt)
    w.slurm.schedule()
    w.daemon._early = True
    w.daemon.cycle()
    w.daemon._early = False


def _node_reads(w, since):
    return sum(1 for c in w.slurm.calls if c.t >= since and c.cmd == "sinfo")


def test_a_failed_job_is_looked_at_every_follow_poll_and_fails_over_as_its_epilog_ends(w):
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    w.slurm.end(jid, verdicts={node: XID79})       # COMPLETING: the epilog runs
    w.step(dt=0.01)                                 # the end event: followed from now on
    now = w.clock()
    assert w.daemon._watch[jid] == pytest.approx(now + daemon_mod.FOLLOW_POLL_S)
    t = w.clock()
    _early_cycle(w)                                 # still COMPLETING: one job read, no node list
    assert _node_reads(w, t + 0.001) == 0
    assert w.slurm.requeues.get((jid, 0), 0) == 0
    w.slurm.run_epilogs(jid)                        # the epilog posts and ends
    _early_cycle(w)                                 # the next early look: nodes, verdict, failover
    assert w.slurm.requeues.get((jid, 0), 0) == 1
    assert w.ft_state(jid) in ("failover-in-progress", "requeued")


def test_at_most_follow_max_jobs_are_followed_and_the_window_ends(w):
    jids = [w.start() for _ in range(daemon_mod.FOLLOW_MAX + 2)]
    w.step()
    for jid in jids:
        w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: XID79})
    w.step(dt=0.01)
    now = w.clock()
    followed = [j for j in jids if w.daemon._follow.get(j, 0) > now]
    assert len(followed) == daemon_mod.FOLLOW_MAX
    for j in set(jids) - set(followed):              # the others keep the poll interval
        assert w.daemon._watch[j] == pytest.approx(now + w.cfg.failover.poll_interval_s)
    w.step(dt=daemon_mod.FOLLOW_WINDOW_S + 0.1)
    assert not any(until > w.clock() for until in w.daemon._follow.values())


def test_a_clean_end_is_not_followed_and_an_early_cycle_leaves_routine_reads_for_later(w):
    jid = w.start()
    w.step()
    w.slurm.end(jid, state="COMPLETED", exit_code=0, epilogs=True)
    t = w.clock()
    _early_cycle(w)
    assert jid not in w.daemon._follow
    assert not any(c.job_id == jid for c in w.slurm.calls if c.t > t)   # a routine end waits for a regular cycle
    w.step()
    assert any(c.job_id == jid for c in w.slurm.calls if c.t > t)


class _Waker:
    fd = 1

    def __init__(self, woken=False):
        self.waits, self.woken = [], woken

    def wait(self, timeout_s):
        self.waits.append(timeout_s)
        return self.woken


def test_the_loop_sleeps_to_the_next_regular_cycle_or_a_followed_jobs_look(w, monkeypatch):
    import time

    d = w.daemon
    d._waker = _Waker()
    t0 = time.monotonic()
    d._pause(t0)                                      # nothing followed: the poll interval
    assert d._waker.waits[-1] == pytest.approx(w.cfg.failover.poll_interval_s, abs=0.05)
    assert d._early is False
    d._follow[7] = w.clock() + 2.0
    d._watch[7] = w.clock() + 0.1
    d._pause(time.monotonic())
    assert d._waker.waits[-1] <= 0.1 + 1e-6
    assert d._early is True
    # an early cycle never moves the regular one: a flood of events does not starve it
    regular = d._regular_at
    d._watch[7] = w.clock() + 0.05
    d._pause(time.monotonic())
    assert d._regular_at == regular
