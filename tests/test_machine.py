"""The daemon's pure state machine (slurm_ft.failover.machine): Slurm's record of one job + its
journal facts -> actions, from plain values (no Slurm, no journal, no clock)."""

from __future__ import annotations

import json

from slurm_ft.config import FailoverConfig
from slurm_ft.failover import machine as m, policy
from slurm_ft.failover.jobspec import FtOptions
from slurm_ft.failover.verdict import NodeVerdict
from slurm_ft.slurm import Job, Node

NOW = 1_800_000_000.0
OPTS = FtOptions(True, 3, "USR1", 60)
CFG = FailoverConfig()


def job(state="FAILED", restart=0, nodes="n1", reason="NonZeroExitCode", **raw) -> Job:
    return Job.from_json({"job_id": 7, "name": "train", "user_name": "alice", "job_state": state,
                          "state_reason": reason, "nodes": nodes, "restart_cnt": restart, "exit_code": 256,
                          "start_time": int(NOW - 100), "end_time": int(NOW - 50), "priority": 10, **raw})


def node(name="n1", state="idle", flags=(), reason="") -> Node:
    return Node.from_json({"name": name, "state": state, "state_flags": list(flags), "reason": reason})


def facts(state=policy.RUNNING, actions=(), verdicts=(), attempts=None, seen=NOW - 1, **kw) -> m.Facts:
    attempts = attempts if attempts is not None else ({"attempt": 0, "nodes": "n1", "start": NOW - 100,
                                                       "end": NOW - 50, "state": "FAILED", "exit_code": 1,
                                                       "signal": None},)
    return m.Facts(7, row={"ft_state": state, "retries": 3}, actions=tuple(actions), verdicts=tuple(verdicts),
                   attempts=tuple(attempts), opts=OPTS, seen_ended=seen, **kw)


def view(nodes=(), now=NOW) -> m.View:
    return m.View(now, {n.name: n for n in nodes}, CFG, top_priority=100)


def act(name, attempt=0, status="done", detail="", created=NOW - 10, target=""):
    return {"action": name, "attempt": attempt, "status": status, "detail": detail, "created": created,
            "target": target}


HW = NodeVerdict(7, 0, "hardware", "xid-79", ((79, "0000:10:00"),), 1, NOW - 40, "n1")
USER = NodeVerdict(7, 0, "user", "python-traceback", (), 1, NOW - 40, "n1")


def main(actions):
    return [a for a in actions if not isinstance(a, (m.RecordAttempt, m.CloseAttempts))]


def kinds(actions):
    return [type(a).__name__ for a in main(actions)]


def test_hardware_verdict_fails_over_blaming_the_node():
    out = m.plan(job(), facts(verdicts=[HW]), view())
    assert kinds(out) == ["Failover"]
    assert out[-1].blamed == ("n1",) and out[-1].attempt == 0


def test_no_verdict_waits_for_the_grace_from_the_daemons_first_sight():
    """Slurm's end time is 50 s ago; the daemon first saw the end 1 s ago: wait, not ``failed``."""
    out = m.plan(job(), facts(seen=NOW - 1), view())
    assert kinds(out) == ["Wake"] and out[-1].at == NOW - 1 + 3.0
    out = m.plan(job(), facts(seen=NOW - 5), view())
    assert kinds(out) == ["Final"] and out[-1].kind == policy.FAILED


def test_a_late_hardware_verdict_reopens_a_no_fault_decision():
    decided = [act("decide", detail="failed: no hardware fault found")]
    out = m.plan(job(), facts(state=policy.FAILED, actions=decided, verdicts=[HW]), view())
    assert kinds(out) == ["Failover"]
    # a decision that already accounted for hardware is not reopened: the late node is drained
    done = [act("failover", detail=json.dumps({"reason": "x", "blamed": ["n2"]}), target="n2"),
            act("drain", target="n2")]
    out = m.plan(job(nodes="n[1-2]"), facts(state=policy.FAILOVER, actions=done, verdicts=[HW]), view())
    assert kinds(out) == ["DrainLate"] and out[-1].nodes == ("n1",)


def test_user_error_is_final_and_unreopened_without_hardware():
    out = m.plan(job(), facts(verdicts=[USER]), view())
    assert kinds(out) == ["Final"] and out[-1].kind == policy.USER_ERROR
    decided = [act("decide", detail="user-error: the job's own error")]
    assert kinds(m.plan(job(), facts(state=policy.USER_ERROR, actions=decided, verdicts=[USER]), view())) == []


def test_start_time_now_only_while_waiting_on_the_requeue_delay_and_bounded():
    requeued = [act("failover", detail=json.dumps({"reason": "x", "blamed": ["n1"]}))]
    pend = dict(state="PENDING", restart=1, nodes="", reason="BeginTime", eligible_time=int(NOW + 100))
    out = m.plan(job(**pend), facts(state=policy.FAILOVER, actions=requeued), view())
    assert kinds(out) == ["ClearDelay", "Wake"]
    # held by its owner, or waiting on a dependency: StartTime=now cannot help; nothing at all
    for reason, prio in (("JobHeldUser", 0), ("Dependency", 10)):
        j = job(**{**pend, "state_reason": reason, "priority": prio, "eligible_time": 0})
        assert m.plan(j, facts(state=policy.FAILOVER, actions=requeued), view()) == []
    # three tries per attempt at most
    tries = [act("start-now", attempt=1, created=NOW - 30 + i) for i in range(3)]
    assert m.plan(job(**pend), facts(state=policy.FAILOVER, actions=requeued + tries), view()) == []
    # out of the delay: requeued
    out = m.plan(job(**{**pend, "eligible_time": int(NOW)}), facts(state=policy.FAILOVER, actions=requeued), view())
    assert kinds(out) == ["Eligible", "Wake"]   # looked at again each second until it runs


def test_restart_waits_until_the_requeuer_has_set_the_exclusions():
    """`slurm-ft drain --checkpoint` requeued it (decide row) but has not finished: no StartTime."""
    pend = dict(state="PENDING", restart=1, nodes="", reason="BeginTime", eligible_time=int(NOW + 100))
    decided = [act("decide", detail="evacuate: checkpoint-before-exit")]
    assert kinds(m.plan(job(**pend), facts(state=policy.EVACUATED, actions=decided), view())) == ["Wake"]


def test_completing_jobs_are_looked_at_again_not_decided():
    out = m.plan(job(state="COMPLETING"), facts(verdicts=[]), view())
    assert kinds(out) == ["Wake"]


def test_node_fail_requeue_by_slurm_is_a_hardware_fault():
    pend = job(state="PENDING", restart=1, nodes="", reason="BeginTime")
    out = m.plan(pend, facts(), view([node("n1", "down", ["NOT_RESPONDING"])]))
    assert kinds(out) == ["Failover"] and out[-1].node_fail == ("n1",)
    # the node is fine: an admin requeued it
    assert kinds(m.plan(pend, facts(), view([node("n1")]))) == ["AdminRequeue"]


def test_prolog_refusal_releases_any_job():
    health = NodeVerdict(7, 0, "hardware", "health:gpu_count", (), None, NOW, "n1")
    pend = job(state="PENDING", restart=1, nodes="", reason="launch_failed_requeued_held", priority=0)
    out = m.plan(pend, m.Facts(7, verdicts=(health,)), view())
    assert kinds(out) == ["Release"] and out[0].blamed == ("n1",)


def test_health_evacuation_is_notify_then_requeue_on_ack_or_deadline():
    run = job(state="RUNNING", reason="None", nodes="n1", end_time=0)
    drained = node("n1", "mixed", ["DRAIN"], "slurm-ft: ecc_volatile_uncorrected: 3 uncorrected")
    out = m.plan(run, facts(), view([drained]))
    assert kinds(out) == ["StartEvacuation", "Notify", "Wake"]
    started = [act("evacuate", target="n1"), act("ckpt-notify", detail="evacuation: SIGUSR1 to 1", created=NOW - 5)]
    assert kinds(m.plan(run, facts(actions=started), view([drained]))) == ["Wake"]
    acked = started + [act("ckpt-ack", detail="saved step=3", created=NOW - 2)]
    out = main(m.plan(run, facts(actions=acked), view([drained])))
    assert kinds(out) == ["RequeueNotFault"] and out[0].kind == policy.EVACUATE
    late = m.plan(run, facts(actions=started), view([drained], now=NOW + 60))
    assert kinds(late) == ["EvacuationTimeout", "RequeueNotFault"]
    skipped = [act("evacuate", target="n1"), act("ckpt-notify", status="skipped", detail="evacuation: nothing")]
    assert kinds(m.plan(run, facts(actions=skipped), view([drained]))) == ["RequeueNotFault"]


def test_time_limit_wakes_at_the_notify_time():
    run = job(state="RUNNING", reason="None", nodes="n1", end_time=0, time_limit=10, start_time=int(NOW - 60))
    out = m.plan(run, facts(), view())
    assert kinds(out) == ["Wake"] and out[-1].at == NOW - 60 + 600 - 70
    out = main(m.plan(run, facts(), view(now=NOW + 500)))
    assert kinds(out) == ["Notify", "Wake"] and out[0].purpose == policy.NOTIFY_TIME_LIMIT


def test_plain_jobs_cost_nothing():
    plain = m.Facts(7, opts=None)
    assert m.plan(job(state="RUNNING", reason="None"), plain, view()) == []
    assert kinds(m.plan(job(), plain, view())) == ["NotConfigured"]


INFRA = NodeVerdict(7, 0, "infra", "ib-completion-error", (), 1, NOW - 40, "n1")
INFRA2 = NodeVerdict(7, 0, "infra", "ib-completion-error", (), 1, NOW - 40, "n2")


def bisect_view(auto=True) -> m.View:
    return m.View(NOW, {}, CFG, top_priority=100, bisect_auto=auto)


def test_auto_bisect_starts_once_for_an_unblamed_multi_node_failure():
    """``[bisect] auto``: an infra failure on two nodes with no node blamed is failed over (a
    retry) and a bisect is started on its nodes, once per attempt; off by default."""
    two = job(nodes="n[1-2]")
    out = m.plan(two, facts(verdicts=[INFRA, INFRA2]), bisect_view())
    assert kinds(out) == ["Failover", "StartBisect"] and out[-1].nodes == ("n1", "n2")
    assert kinds(m.plan(two, facts(verdicts=[INFRA, INFRA2]), bisect_view(auto=False))) == ["Failover"]
    # reopened or looked at again: a bisect already started for the attempt is not started again
    started = [act("bisect-start", target="n[1-2]")]
    assert "StartBisect" not in kinds(m.plan(two, facts(actions=started, verdicts=[INFRA, INFRA2]), bisect_view()))


def test_auto_bisect_not_for_one_node_a_blamed_node_or_a_users_bug():
    assert kinds(m.plan(job(), facts(verdicts=[INFRA]), bisect_view())) == ["Failover"]
    hw2 = NodeVerdict(7, 0, "ok", "", (), 1, NOW - 40, "n2")
    assert kinds(m.plan(job(nodes="n[1-2]"), facts(verdicts=[HW, hw2]), bisect_view())) == ["Failover"]
    user2 = NodeVerdict(7, 0, "user", "python-traceback", (), 1, NOW - 40, "n2")
    assert kinds(m.plan(job(nodes="n[1-2]"), facts(verdicts=[USER, user2]), bisect_view())) == ["Final"]


def test_inplace_restart_record_in_the_comment_is_journaled():
    """The ``slurm-ft run`` wrapper's record in the job's comment -> ``RecordRestarts`` (ft-history
    shows each restart); no record, no action."""
    rec = "slurm-ft-run:attempt=0,restarts=1,of=2,state=restarted,verdict=infra,rule=x,t=1.0"
    out = m.plan(job("RUNNING", reason="None", comment=rec), facts(), view())
    assert "RecordRestarts" in kinds(out)
    assert "RecordRestarts" not in kinds(m.plan(job("RUNNING", reason="None", comment="hello"), facts(), view()))


def test_a_restart_that_may_reuse_a_node_it_left_waits_for_the_revoked_credential():
    """CI (tests/test_spank_lab.py): a 2-node job on n[1-2] evacuated off n1 (excluded) was
    given StartTime=now 0.4 s after the requeue, landed on n[2-3] and n2's slurmd refused it
    ("Killing non-startable batch job: Job credential revoked"): the job ended FAILED. Only a
    restart whose nodes were all excluded starts at once; the others wait REQUEUE_SETTLE_S."""
    pend = dict(state="PENDING", restart=1, nodes="", reason="BeginTime", eligible_time=int(NOW + 100))
    two = ({"attempt": 0, "nodes": "n[1-2]", "start": NOW - 100, "end": NOW - 1, "state": "REQUEUED"},)
    evac = [act("evacuation", target="n1", created=NOW - 0.4)]
    out = m.plan(job(**pend, excluded_nodes="n1"), facts(state=policy.EVACUATED, actions=evac, attempts=two), view())
    assert kinds(out) == ["Wake"] and out[-1].at == NOW - 0.4 + m.REQUEUE_SETTLE_S
    later = m.plan(job(**pend, excluded_nodes="n1"), facts(state=policy.EVACUATED, actions=evac, attempts=two),
                   view(now=NOW + 2))
    assert kinds(later) == ["ClearDelay", "Wake"]
    # every node it left is excluded (a one-node failover): at once
    one = [act("failover", detail=json.dumps({"reason": "x", "blamed": ["n1"]}), target="n1", created=NOW - 0.4)]
    out = m.plan(job(**pend, excluded_nodes="n1"), facts(state=policy.FAILOVER, actions=one), view())
    assert kinds(out) == ["ClearDelay", "Wake"]
