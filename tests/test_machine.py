"""The daemon's pure state machine (slurm_ft.failover.machine): Slurm's record of one job + its
journal facts -> actions, from plain values (no Slurm, no journal, no clock)."""

from __future__ import annotations

import json
from dataclasses import replace

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


def act(name, attempt=0, status="done", detail="", created=NOW - 10, target="", kind=None):
    return {"action": name, "attempt": attempt, "status": status, "detail": detail, "created": created,
            "target": target, "kind": kind}


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
    done = [act("failover", detail=json.dumps({"reason": "x", "blamed": ["n2"]}), target="n2", kind="blamed"),
            act("drain", target="n2")]
    out = m.plan(job(nodes="n[1-2]"), facts(state=policy.FAILOVER, actions=done, verdicts=[HW]), view())
    assert kinds(out) == ["DrainLate"] and out[-1].nodes == ("n1",)


def test_user_error_is_final_and_unreopened_without_hardware():
    out = m.plan(job(), facts(verdicts=[USER]), view())
    assert kinds(out) == ["Final"] and out[-1].kind == policy.USER_ERROR
    decided = [act("decide", detail="user-error: the job's own error")]
    assert kinds(m.plan(job(), facts(state=policy.USER_ERROR, actions=decided, verdicts=[USER]), view())) == []


def test_start_time_now_only_while_waiting_on_the_requeue_delay_and_bounded():
    requeued = [act("failover", detail=json.dumps({"reason": "x", "blamed": ["n1"]}), kind="blamed")]
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


HANDOFF = replace(CFG, handoff_wait_s=2.0)


def handoff_view(now=NOW) -> m.View:
    return m.View(now, {}, HANDOFF, top_priority=100)


def test_a_one_node_failure_with_its_epilogs_hardware_verdict_fails_over_while_completing():
    """Issue 23, with the hand-off on: requeued while its epilog runs, a Slurm that makes it
    eligible at once (requeue_delay=-1) restarts it from the epilog-complete RPC."""
    for reason in m.FAILED_REASONS:
        out = m.plan(job(state="COMPLETING", reason=reason), facts(verdicts=[HW]), handoff_view())
        assert kinds(out) == ["Failover"] and out[-1].blamed == ("n1",) and out[-1].slurm_state == "FAILED"
    # the hand-off off (the default): decided once the job has left COMPLETING, as before
    assert kinds(m.plan(job(state="COMPLETING"), facts(verdicts=[HW]), view())) == ["Wake"]


def test_only_proof_of_a_failed_one_node_job_decides_while_completing():
    """Anything short of proof waits for the job to leave COMPLETING, as before: a cancel (its
    reason unchanged), a timeout, an OOM kill; several nodes (another epilog may still post);
    a verdict of another node, a prolog health verdict, no hardware verdict; a decided attempt;
    a decision other than a failover (the retry budget used up)."""
    health = replace(HW, rule=policy.HEALTH_RULE + "gpu-count")
    other = replace(HW, node="n2")
    cases = [(job(state="COMPLETING", reason=r), facts(verdicts=[HW]))
             for r in ("None", "TimeLimit", "OutOfMemory", "")]
    cases += [(job(state="COMPLETING", nodes="n[1-2]"), facts(verdicts=[HW])),
              (job(state="COMPLETING"), facts(verdicts=[other])),
              (job(state="COMPLETING"), facts(verdicts=[health])),
              (job(state="COMPLETING"), facts(verdicts=[USER])),
              (job(state="COMPLETING"), facts(verdicts=[HW], actions=[act("failover")])),
              (job(state="COMPLETING"), replace(facts(verdicts=[HW]), row={"ft_state": policy.RUNNING,
                                                                            "retries": 0}))]
    for j, f in cases:
        assert kinds(m.plan(j, f, handoff_view())) == ["Wake"], (j.reason, j.nodes, f.verdicts, f.actions)


def test_a_requeued_job_still_completing_is_not_decided_again():
    """After the early failover Slurm shows the job COMPLETING with the next restart count: no
    verdict of that attempt exists, nothing is decided, the daemon looks again."""
    done = [act("failover", detail=json.dumps({"reason": "x", "blamed": ["n1"]}), target="n1", kind="blamed")]
    out = m.plan(job(state="COMPLETING", restart=1), facts(state=policy.FAILOVER, actions=done, verdicts=[HW]),
                 handoff_view())
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
    one = [act("failover", detail=json.dumps({"reason": "x", "blamed": ["n1"]}), target="n1", created=NOW - 0.4,
               kind="blamed")]
    out = m.plan(job(**pend, excluded_nodes="n1"), facts(state=policy.FAILOVER, actions=one), view())
    assert kinds(out) == ["ClearDelay", "Wake"]


# ------------------------------------------------------------------ blame needs proof (issue 27)
def _blamed(actions) -> set[str]:
    """Every node an action of the machine blames: drained, excluded or given a Slurm verdict."""
    out: set[str] = set()
    for a in actions:
        if isinstance(a, (m.Failover, m.Final)):
            out |= set(a.blamed) | set(a.node_fail)
        elif isinstance(a, m.DrainLate):
            out |= set(a.nodes)
    return out


TWO = ({"attempt": 0, "nodes": "n[1-2]", "start": NOW - 100, "end": NOW - 50, "state": "FAILED", "exit_code": 1,
        "signal": None},)
SURVIVOR_UNKNOWN = NodeVerdict(7, 0, "unknown", "no-evidence", (), 1, NOW - 40, "n1")


def test_a_two_node_job_that_loses_one_node_blames_only_that_node():
    """Issue 27 item 5: a 2-node job loses n2 (slurmd gone); n1, the survivor, posts ``unknown``.
    Slurm says which node failed (22.05: n2 DOWN + NOT_RESPONDING; 24.11: ``FailedNode=n2``, even
    once n2 answers again): only n2 is blamed. Before: both were (NODE_FAIL blamed every node of
    the job), and the breaker latched on the healthy one."""
    pend = dict(state="PENDING", restart=1, nodes="", reason="BeginTime")
    up, down = node("n1", "allocated"), node("n2", "down", ["NOT_RESPONDING"])
    for j, nodes in ((job(**pend), [up, down]),                                        # 22.05
                     (job(**pend, failed_node="n2"), [up, node("n2", "idle")])):        # 24.11
        out = main(m.plan(j, facts(attempts=TWO, verdicts=[SURVIVOR_UNKNOWN]), view(nodes)))
        assert kinds(out) == ["Failover"]
        assert out[0].blamed == ("n2",) and out[0].node_fail == ("n2",)
    # a job that could not be requeued ends NODE_FAIL: the same
    ended = job(state="NODE_FAIL", nodes="n[1-2]", reason="NodeDown")
    out = main(m.plan(ended, facts(attempts=TWO, verdicts=[SURVIVOR_UNKNOWN]), view([up, down])))
    assert kinds(out) == ["Failover"] and out[0].blamed == ("n2",)


def test_a_multi_node_node_fail_naming_no_node_gets_one_unblamed_retry():
    """Slurm ended the job NODE_FAIL but names no failed node (every node answers, no
    FailedNode): one retry elsewhere, nobody drained; a second such end is not retried."""
    ended = job(state="NODE_FAIL", nodes="n[1-2]", reason="NodeDown")
    fine = [node("n1"), node("n2")]
    out = main(m.plan(ended, facts(attempts=TWO, verdicts=[SURVIVOR_UNKNOWN]), view(fine)))
    assert kinds(out) == ["Failover"] and out[0].blamed == () and out[0].node_fail == ()
    assert policy.NODE_FAIL_UNNAMED_RULE in out[0].reason
    retried = [act("failover", attempt=-1, detail=json.dumps({"reason": "x", "blamed": []}),   # an earlier one
                   kind="unblamed")]
    out = main(m.plan(ended, facts(actions=retried, attempts=TWO), view(fine)))
    assert kinds(out) == ["Final"] and out[0].kind == policy.MAX_RETRIES and _blamed(out) == set()


NAMES = ("n1", "n2", "n3", "n4")
CLASSES = ("hardware", "user", "infra", "hang", "unknown", "ok")
NODE_STATES = (("idle", ()), ("allocated", ()), ("mixed", ("DRAIN",)), ("down", ()), ("down", ("NOT_RESPONDING",)),
               ("idle", ("NOT_RESPONDING",)), ("allocated", ("COMPLETING",)), ("down", ("DRAIN",)))


def _verdict_strategy():
    from hypothesis import strategies as st
    return st.tuples(st.sampled_from(CLASSES), st.sampled_from(("no-evidence", "xid-79", "unverified:xid-79",
                                                                  "nccl-timeout", "slurm-node-fail", "clean-exit")),
                     st.booleans())


def test_blame_is_only_what_slurm_or_trusted_hardware_says():
    """The structural rule, over arbitrary combinations of the job's nodes, each node's verdict
    (any class and rule, or none), each node's Slurm state, the job's FailedNode (any nodes, even
    ones not in the job), how the attempt ended (FAILED, NODE_FAIL, requeued by Slurm), the
    site's ``retry_unknown`` and earlier failovers: a node is blamed only when its own verdict is
    ``hardware`` or Slurm names it failed (down / not responding / FailedNode; a one-node job's
    NODE_FAIL names its node). A survivor, whatever it says short of hardware, is never blamed."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(n=st.integers(1, 4), per_node=st.lists(st.tuples(st.one_of(st.none(), _verdict_strategy()),
                                                            st.sampled_from(NODE_STATES)), min_size=4, max_size=4),
           failed=st.lists(st.sampled_from(NAMES + ("x9",)), max_size=3), how=st.sampled_from(
               ("FAILED", "NODE_FAIL", "requeued", "COMPLETED", "TIMEOUT")),
           retry_unknown=st.booleans(), failovers=st.integers(0, 2), retries=st.integers(0, 3))
    def check(n, per_node, failed, how, retry_unknown, failovers, retries):
        names = NAMES[:n]
        hostlist = m.hostlist(names)
        verdicts, nodes, hardware = [], [], set()
        for name, (v, (state, flags)) in zip(names, per_node):
            nodes.append(node(name, state, flags))
            if v is not None:
                cls, rule, _ = v
                verdicts.append(NodeVerdict(7, 0, cls, rule, (), 1, NOW - 40, name))
                if cls == "hardware":
                    hardware.add(name)
        lost_nodes = {x.name for x in nodes if m.lost(x)}
        named = set(failed) & set(names) if names else set(failed)
        raw = {"failed_node": ",".join(failed)} if failed else {}
        if how == "requeued":
            j = job(state="PENDING", restart=1, nodes="", reason="BeginTime", **raw)
        else:
            j = job(state=how, nodes=hostlist, reason="NodeDown", **raw)
        attempts = ({"attempt": 0, "nodes": hostlist, "start": NOW - 100, "end": NOW - 50, "state": how,
                     "exit_code": 1, "signal": None},)
        done = [act("failover", attempt=-1 - i, detail=json.dumps({"reason": "x", "blamed": []}), kind="unblamed")
                for i in range(failovers)]
        f = m.Facts(7, row={"ft_state": policy.RUNNING, "retries": retries}, actions=tuple(done),
                    verdicts=tuple(verdicts), attempts=attempts, opts=OPTS, seen_ended=NOW - 60)
        cfg = FailoverConfig(retry_unknown=retry_unknown)
        out = m.plan(j, f, m.View(NOW, {x.name: x for x in nodes}, cfg, top_priority=100))
        blamed = _blamed(out)
        slurm_says = lost_nodes | named
        if how in ("NODE_FAIL", "requeued") and n == 1:
            slurm_says |= set(names)          # a one-node job's NODE_FAIL names its node
        assert blamed <= hardware | slurm_says, (blamed, hardware, slurm_says, out)
        survivors = set(names) - hardware - slurm_says
        assert not blamed & survivors

    check()


# ------------------------------------------------------------------ checkpoint acks (issue 27 item 9)
def test_a_saved_ack_counts_only_as_the_answer_to_slurm_fts_signal():
    """A ``saved`` ack buys a continuation only when it answers the checkpoint signal slurm-ft
    journaled (done) for this very attempt. An ack with no signal, before the signal, of another
    attempt, or after a signal nothing caught buys nothing."""
    run = job(state="RUNNING", reason="None", nodes="n1", end_time=0, time_limit=10, start_time=int(NOW - 590))
    at_limit = view(now=NOW)
    note = act("ckpt-notify", detail="time-limit: SIGUSR1 to 1; wait 60 s; time limit near", created=NOW - 20)
    ack = act("ckpt-ack", detail="saved step=3", created=NOW - 10)
    early = act("ckpt-ack", detail="saved step=1", created=NOW - 200)

    def first(actions):
        return kinds(actions)[0] if kinds(actions) else None

    # the answer to slurm-ft's own signal: continued
    out = main(m.plan(run, facts(actions=[note, ack]), at_limit))
    assert kinds(out) == ["RequeueNotFault"] and out[0].kind == policy.CONTINUE
    # no signal at all: the ack buys nothing (the signal goes out now)
    assert first(m.plan(run, facts(actions=[ack]), at_limit)) == "Notify"
    # journaled long before the signal: not an answer
    assert kinds(m.plan(run, facts(actions=[note, early]), at_limit)) == ["Wake"]
    # an ack of another attempt
    other = {**ack, "attempt": 1}
    assert kinds(m.plan(run, facts(actions=[note, other]), at_limit)) == ["Wake"]
    # a signal that nothing caught (skipped): nobody was asked, nobody can answer
    skipped = {**note, "status": "skipped"}
    assert "RequeueNotFault" not in kinds(m.plan(run, facts(actions=[skipped, ack]), at_limit))
    # and when the job ends at its limit: only the answered signal continues it
    ended = job(state="TIMEOUT", nodes="n1", reason="TimeLimit")
    assert kinds(m.plan(ended, facts(actions=[ack]), view())) == ["Final"]
    out = main(m.plan(ended, facts(actions=[note, ack]), view()))
    assert kinds(out) == ["RequeueNotFault"] and out[0].kind == policy.CONTINUE
    # the bound: default 2 continuations
    two = [act("continue", attempt=-1), act("continue", attempt=-2)]
    out = main(m.plan(ended, facts(actions=[*two, note, ack]), view()))
    assert kinds(out) == ["Final"] and out[0].kind == policy.TIMEOUT
    assert CFG.max_continuations == 2


def test_slurms_failed_node_is_read_from_scontrol_show_job():
    """``FailedNode=`` (``scontrol show job``, Slurm >= 23.02; absent on 22.05) is the job's own
    word from slurmctld on which node failed: parsed in one place (slurm_ft.slurm.jobinfo) into
    ``Job.failed_nodes``; 24.11 JSON's ``failed_node`` reads the same."""
    from slurm_ft.slurm.jobinfo import parse_show_job

    text = ("JobId=5 JobName=train\n   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A\n"
            "   JobState=PENDING Reason=BeginTime FailedNode=c1 Dependency=(null)\n"
            "   Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0\n   NodeList=(null)\n")
    assert Job.from_json(parse_show_job(text, 5)).failed_nodes == ["c1"]
    assert Job.from_json(parse_show_job(text.replace(" FailedNode=c1", ""), 5)).failed_nodes == []
    assert job(failed_node="c[1-2]").failed_nodes == ["c1", "c2"]


def test_a_running_copy_its_epilog_already_ended_is_failed_over_after_slurmctlds_grace():
    """A slurmctld state rollback restored attempt 0 as running (22.05: with no node allocated,
    never ended) although n1's epilog ended it with an Xid 79: left to slurmctld for the grace,
    then failed over on that verdict (found by CI's test_lab_repost: nothing happened for 3 min)."""
    running = job(state="RUNNING", reason="None", end_time=0)
    young = replace(HW, time=NOW - 10)
    out = m.plan(running, facts(verdicts=[young]), view())
    assert kinds(out) == ["Wake"] and out[-1].at == NOW - 10 + m.GHOST_GRACE_S
    old = replace(HW, time=NOW - m.GHOST_GRACE_S)
    out = m.plan(running, facts(verdicts=[old]), view())
    assert kinds(out) == ["Failover"] and out[-1].blamed == ("n1",)


def test_verdicts_that_do_not_prove_a_running_attempt_ended_leave_it_running():
    running = job(state="RUNNING", reason="None", end_time=0)
    old = NOW - 10 * m.GHOST_GRACE_S
    not_proof = [
        replace(HW, time=NOW - 200 - 1),                                   # made before the attempt started
        replace(HW, time=old, attempt=1),                                  # another attempt's
        replace(HW, time=old, node="n2"),                                  # a node the attempt does not run on
        replace(USER, time=old),                                           # not a hardware fault
        replace(HW, time=old, rule=policy.HEALTH_RULE + "gpu-ecc"),        # a prolog's refusal
        replace(HW, time=old, source=policy.SLURM_SOURCE),                 # Slurm's, not an epilog's
    ]
    for v in not_proof:
        out = m.plan(job(state="RUNNING", reason="None", end_time=0, start_time=int(NOW - 200)),
                     facts(verdicts=[v]), view())
        assert "Failover" not in kinds(out) and "Wake" not in kinds(out), v
    decided = [act("failover", detail=json.dumps({"reason": "x", "blamed": ["n1"]}), target="n1", kind="blamed")]
    out = m.plan(running, facts(state=policy.FAILOVER, actions=decided, verdicts=[replace(HW, time=old)]), view())
    assert "Failover" not in kinds(out)
