"""The epilog's hand-off (slurm_ft.node.handoff): it waits for the daemon's requeue of a failed
1-node ft job, bounded, and nothing a user sets makes it wait."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from slurm_ft.errors import SlurmCommandError
from slurm_ft.node import handoff
from slurm_ft.slurm import Job

FT = "slurm-ft:submitted ft:retries=3,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0"


def record(restart=0, state="COMPLETING", nodes="n1", admin=FT, comment="ft"):
    return Job.from_json({"job_id": 7, "job_state": state, "nodes": nodes, "restart_cnt": restart,
                          "admin_comment": admin, "comment": comment})


class Slurm:
    """Answers ``job()`` from a list of records (the last one repeats); counts the reads."""

    def __init__(self, *records):
        self.records, self.reads = list(records), 0

    def job(self, job_id):
        self.reads += 1
        r = self.records[min(self.reads - 1, len(self.records) - 1)]
        if isinstance(r, Exception):
            raise r
        return r


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def wait(slurm, bound=2.0, attempt=0):
    c = Clock()
    return handoff.wait_for_requeue(slurm, 7, attempt, bound, clock=c, sleep=c.sleep), c.t


def test_it_returns_once_slurm_shows_the_job_requeued():
    s = Slurm(record(), record(), record(restart=1))
    assert wait(s) == ("requeued", 2 * handoff.POLL_S) and s.reads == 3


def test_it_waits_at_most_its_bound_and_not_at_all_when_off():
    why, spent = wait(Slurm(record()), bound=1.0)
    assert why == "timeout" and 1.0 <= spent <= 1.0 + handoff.POLL_S
    s = Slurm(record())
    assert wait(s, bound=0) == ("off", 0.0) and s.reads == 0


def test_it_never_waits_for_what_the_daemon_will_not_requeue_now():
    assert wait(Slurm(record(admin="")))[0] == "not ft"
    assert wait(Slurm(record(admin="slurm-ft:submitted ft:bogus")))[0] == "not ft"   # malformed: not acted on
    assert wait(Slurm(record(nodes="n[1-2]")))[0] == "several nodes"
    assert wait(Slurm(None))[0] == "gone"
    assert wait(Slurm(record(state="FAILED")))[0] == "not completing"
    assert wait(Slurm(SlurmCommandError("slurmctld down")))[0] == "unreadable"


@settings(max_examples=200)
@given(comment=st.text(max_size=80), admin=st.text(max_size=80))
def test_nothing_the_owner_writes_makes_the_epilog_wait(comment, admin):
    """The owner writes the Comment (any text); the AdminComment is Slurm's and job_submit.lua's,
    and text without slurm-ft's record in it never counts as an ft job."""
    if "slurm-ft:" in admin:
        admin = ""
    why, spent = wait(Slurm(record(comment=comment, admin=admin)))
    assert why == "not ft" and spent == 0.0


def test_the_epilog_waits_only_with_the_handoff_on(monkeypatch):
    """``[failover] handoff_wait_s = 0`` (the default) asks Slurm nothing; on, the epilog waits
    for the daemon's requeue of this attempt and logs how long it waited."""
    from dataclasses import replace

    from slurm_ft import config as config_mod
    from slurm_ft.node import epilog
    from slurm_ft.node.job import NodeJob

    calls, lines = [], []
    monkeypatch.setattr(handoff, "wait_for_requeue", lambda slurm, jid, attempt, bound: calls.append(
        (jid, attempt, bound)) or "requeued")
    cfg = config_mod.from_dict({})
    job = NodeJob(job_id=7, node="n1", attempt=2, uid=1000, gpus=(0,), exit_code=1, signal=None,
                  stdout=None, stderr=None, work_dir=None)
    epilog.hand_off(cfg, job, lines.append)
    assert calls == [] and lines == []
    epilog.hand_off(replace(cfg, failover=replace(cfg.failover, handoff_wait_s=1.5)), job, lines.append)
    assert calls == [(7, 2, 1.5)] and lines[0].startswith("hand-off: requeued after ")
