"""Reconciliation with Slurm after a slurmctld restart with state rollback (issue 20,
slurm_ft/failover/reconcile.py), against the in-memory Slurm and a real journal."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings, strategies as st

from daemon_world import XID79, World
from slurm_ft.failover import policy, reconcile
from slurm_ft.history.query import history
from slurm_ft.slurm import parse_boot_time


def _fault_and_failover(w: World, jid: int) -> str:
    """Xid 79 on the job's node: the epilog drains it and posts the verdict; the daemon fails
    the job over. Returns the faulty node."""
    node = w.job(jid).nodes[0]
    w.slurm.drain_by_node(node, f"slurm-ft: Xid 79 GPU 0000:10:00 (job {jid})")
    w.slurm.end(jid, "FAILED", 1, verdicts={node: XID79}, epilogs=True)
    for _ in range(20):
        w.step()
        if w.job(jid).state == "RUNNING" and w.job(jid).restart == 1:
            break
    assert w.job(jid).restart == 1 and w.job(jid).nodes != [node], w.job(jid)
    return node


def _settle(w: World, jid: int, restart: int, n: int = 40) -> None:
    for _ in range(n):
        w.step(1.0)
        j = w.slurm.jobs_by_id.get(jid)
        if j is not None and j.state == "RUNNING" and j.restart == restart:
            return


def _reconciles(w: World, jid: int) -> list[dict]:
    with w.journal() as j:
        return [{**reconcile.parse_detail(a["detail"]), "status": a["status"], "target": a["target"]}
                for a in j.actions(jid) if a["action"] == "reconcile"]


def _failovers(w: World, jid: int) -> list[dict]:
    with w.journal() as j:
        return [a for a in j.actions(jid) if a["action"] == "failover"]


def test_failover_slurm_rolled_back_is_redone_once(tmp_path):
    w = World(tmp_path)
    jid = w.start()
    w.step(n=2)
    saved = w.slurm.saved_state()          # as slurmctld saved it before the fault
    node = _fault_and_failover(w, jid)
    restarted = w.clock()
    w.slurm.restart_ctld(2.0, state=saved)  # back: RUNNING on the faulty node, restart count 0, node idle
    assert w.job(jid).restart == 0 and not w.slurm.node_recs[node].drain
    _settle(w, jid, 1)
    job = w.job(jid)
    assert job.state == "RUNNING" and job.restart == 1 and node not in job.nodes and node in job.excluded
    assert w.slurm.node_recs[node].drain and w.slurm.node_recs[node].reason.startswith("slurm-ft: Xid 79")
    # exactly once: one start since the restart, one requeue of attempt 0 in Slurm's timeline,
    # one failover row (the redo is a reconcile row and costs no retry)
    assert [s for s in w.slurm.starts if s[0] == jid and s[2] > restarted] == [(jid, 1, job.start)]
    assert w.slurm.requeues == {(jid, 0): 1}
    assert len(_failovers(w, jid)) == 1
    redone = [r for r in _reconciles(w, jid) if r["kind"] == "failover-redone"]
    assert len(redone) == 1 and redone[0]["status"] == "done"
    with w.journal() as j:
        h = history(j, jid)
        assert j.failovers_done(jid) == 1
    assert h["ft_state"] == policy.RUNNING
    assert "reconcile: Slurm lost the failover of attempt 0" in h["attempts"][0]["action"]
    for _ in range(5):   # nothing more happens
        w.step(1.0)
    assert w.slurm.requeues == {(jid, 0): 1}
    assert [r["kind"] for r in _reconciles(w, jid)].count("failover-redone") == 1


def test_redo_does_not_spend_the_retry_budget_twice(tmp_path):
    w = World(tmp_path)
    jid = w.start(retries=1)
    w.step(n=2)
    saved = w.slurm.saved_state()
    _fault_and_failover(w, jid)
    w.slurm.restart_ctld(2.0, state=saved)
    _settle(w, jid, 1)
    assert w.job(jid).restart == 1 and w.job(jid).state == "RUNNING"
    # the second (real) fault exceeds the budget of 1: one failover was spent, not two
    node = w.job(jid).nodes[0]
    w.slurm.end(jid, "FAILED", 1, verdicts={node: XID79}, epilogs=True)
    w.step(n=10)
    assert w.ft_state(jid) == policy.MAX_RETRIES
    assert len(_failovers(w, jid)) == 1


def _restart_from_a_save_before_the_drain(w: World, node: str, drain: bool = False, reason: str = "") -> None:
    """slurmctld restarts 30 s later from a state saved before ``node``'s drain: the node comes
    back as that save holds it (``drain``, ``reason``: not drained, or drained by Slurm's own
    reason)."""
    saved = w.slurm.saved_state()
    r = saved["nodes"][node]
    r.drain, r.reason, r.reason_time = drain, reason, 0.0
    w.clock.advance(30)
    w.slurm.restart_ctld(2.0, state=saved)


def test_forgotten_drain_is_reapplied_with_its_reason_and_time(tmp_path):
    w = World(tmp_path)
    jid = w.start()
    w.step(n=2)
    node = _fault_and_failover(w, jid)
    reason = w.slurm.node_recs[node].reason
    drained_at = w.slurm.node_recs[node].reason_time
    _restart_from_a_save_before_the_drain(w, node)
    assert not w.slurm.node_recs[node].drain
    for _ in range(10):
        w.step(1.0)
    rec = w.slurm.node_recs[node]
    assert rec.drain and rec.reason == reason
    again = [x for x in _reconciles(w, jid) if x["kind"] == reconcile.DRAIN_REAPPLIED]
    assert len(again) == 1 and again[0]["status"] == "done" and again[0]["target"] == node
    assert abs(again[0]["drained_at"] - drained_at) < 5 and again[0]["reason"] == reason
    assert w.job(jid).state == "RUNNING" and w.slurm.requeues == {(jid, 0): 1}


@pytest.mark.parametrize("drained_by", ["failover", "epilog"])
def test_a_resume_by_an_admin_is_not_undone(tmp_path, drained_by):
    """Whether the daemon's failover drained the node or (a job that completed) its epilog did."""
    w = World(tmp_path)
    jid = w.start()
    w.step(n=2)
    node = (_fault_and_failover if drained_by == "failover" else _clean_exit_on_a_faulty_gpu)(w, jid)
    w.slurm.resume(node)                      # the admin repaired it (no controller restart)
    w.clock.advance(61)
    w.step()                                  # a full scan: drain-lifted, once
    w.slurm.restart_ctld(1.0)                 # a later restart without state loss
    for _ in range(70):
        w.step(1.0)
    assert not w.slurm.node_recs[node].drain
    kinds = [x["kind"] for x in _reconciles(w, jid)]
    assert kinds == [reconcile.DRAIN_LIFTED]


def test_a_job_slurm_purged_is_booked_lost(tmp_path):
    w = World(tmp_path)
    saved = w.slurm.saved_state()             # before the job was submitted
    jid = w.start()
    w.step(n=2)
    _fault_and_failover(w, jid)
    w.slurm.restart_ctld(2.0, state=saved)
    assert jid not in w.slurm.jobs_by_id
    w.step(61.0)                              # the next full scan (nothing else names the job)
    w.step(1.0)
    assert w.ft_state(jid) == policy.LOST
    lost = [x for x in _reconciles(w, jid) if x["kind"] == reconcile.LOST]
    assert len(lost) == 1 and "no longer knows" in lost[0]["why"]
    with w.journal() as j:
        assert history(j, jid)["ft_state"] == "lost"
        assert jid not in j.active_ft_jobs()


def test_a_restart_is_noticed_and_reconciled_before_the_next_scan(tmp_path):
    w = World(tmp_path)
    jid = w.start()
    w.step(n=2)
    node = _fault_and_failover(w, jid)
    saved = w.slurm.saved_state()
    saved["nodes"][node].drain = False
    saved["nodes"][node].reason = ""
    w.step()
    w.slurm.restart_ctld(2.0, state=saved)
    w.slurm.submit(ft=False)                  # something to read while slurmctld is down: errors seen
    w.daemon.wake(jid, w.clock())
    for _ in range(8):                        # well within one scan interval (60 s)
        w.step(1.0)
    assert w.slurm.node_recs[node].drain


def test_no_boot_time_no_drain_guess(tmp_path):
    w = World(tmp_path)
    jid = w.start()
    w.step(n=2)
    node = _fault_and_failover(w, jid)
    w.slurm.boot_time = lambda: None          # a Slurm that prints no BOOT_TIME
    w.daemon.reconciler.boot = None
    w.slurm.node_recs[node].drain = False
    w.clock.advance(61)
    w.step()
    assert not w.slurm.node_recs[node].drain and _reconciles(w, jid) == []


def test_boot_time_of_scontrol_show_config():
    t = parse_boot_time("2026-12-02T02:43:00")
    assert t == time.mktime((2026, 12, 2, 2, 43, 0, 0, 0, -1))
    assert parse_boot_time("") is None and parse_boot_time("(null)") is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_boot_time_parse_never_raises(text):
    t = parse_boot_time(text)
    assert t is None or isinstance(t, float)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 4_000_000_000 - 86400 * 400))
def test_boot_time_round_trips(epoch):
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))
    back = parse_boot_time(text)
    assert back is not None and abs(back - epoch) <= 3600   # a DST hour is ambiguous in local time


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=60),
                 st.dictionaries(st.text(max_size=5), st.integers()).map(json.dumps)))
def test_reconcile_detail_parse_never_raises(text):
    assert isinstance(reconcile.parse_detail(text), dict)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["drain", "reconcile"]), st.sampled_from(["n1", "n2", ""]),
                          st.sampled_from(["done", "skipped", "failed", "intent"]),
                          st.sampled_from(["slurm-ft: x (job 1)", "already-drained: slurm-ft: y (job 2)",
                                           "kept-admin-reason: slurm-ft: z", reconcile.DRAIN_REAPPLIED,
                                           reconcile.DRAIN_LIFTED, "lost"])), max_size=12))
def test_newest_drain_fact_wins(rows):
    """Whatever the journal holds, each node's fact is its newest row that left it drained by
    slurm-ft, re-drained it, or recorded an admin's resume; a node with none has no fact."""
    journal = []
    for i, (action, node, status, text) in enumerate(rows):
        detail = text
        if action == "reconcile":
            detail = reconcile.detail(text, "why", reason="slurm-ft: r (job 3)", drained_at=float(i))
        journal.append({"id": i, "job_id": 1, "attempt": 0, "action": action, "target": node, "status": status,
                        "detail": detail, "created": float(i)})
    facts = reconcile.drain_facts(journal)
    for node in ("n1", "n2", ""):
        counted = [r for r in journal if r["target"] == node and node and (
            (r["action"] == "drain" and reconcile._ours(r))
            or (r["action"] == "reconcile" and reconcile.parse_detail(r["detail"])["kind"] == reconcile.DRAIN_LIFTED)
            or (r["action"] == "reconcile" and r["status"] == "done"
                and reconcile.parse_detail(r["detail"])["kind"] == reconcile.DRAIN_REAPPLIED))]
        if not counted:
            assert node not in facts
        else:
            assert facts[node]["row"] is counted[-1]
            if facts[node]["kind"] != reconcile.DRAIN_LIFTED:
                assert facts[node]["reason"].startswith("slurm-ft:")


def test_a_forgotten_drain_under_slurms_own_reason_gets_its_reason_back(tmp_path):
    """After the rollback slurmctld drained the faulty node by a reason of its own (the rolled-back
    copy's kill failed there): the node is out of service, but an admin reading ``Kill task
    failed`` would resume a dead GPU. slurm-ft's reason is put back; an admin's reason never is
    replaced."""
    for theirs, replaced in (("Kill task failed", True), ("PSU swap, ticket 7", False)):
        (tmp_path / theirs.split()[0]).mkdir()
        w = World(tmp_path / theirs.split()[0])
        jid = w.start()
        w.step(n=2)
        node = _fault_and_failover(w, jid)
        reason = w.slurm.node_recs[node].reason
        _restart_from_a_save_before_the_drain(w, node, drain=True, reason=theirs)
        for _ in range(10):
            w.step(1.0)
        rec = w.slurm.node_recs[node]
        assert rec.drain and rec.reason == (reason if replaced else theirs), (theirs, rec.reason)
        again = [x for x in _reconciles(w, jid) if x["kind"] == reconcile.DRAIN_REAPPLIED]
        assert len(again) == int(replaced), again


def _clean_exit_on_a_faulty_gpu(w: World, jid: int) -> str:
    """The job exits 0, but its node's epilog finds an Xid 79 of its GPU: it drains the node and
    posts a hardware verdict; the daemon books the job completed (no failover, no drain of its
    own). Returns the node."""
    node = w.job(jid).nodes[0]
    w.slurm.drain_by_node(node, f"slurm-ft: Xid 79 GPU 0000:10:00 (job {jid})")
    w.slurm.end(jid, "COMPLETED", 0, verdicts={node: XID79}, epilogs=True)
    for _ in range(10):
        w.step(1.0)
    with w.journal() as j:
        assert j.job(jid)["ft_state"] == policy.COMPLETED
        assert not [a for a in j.actions(jid) if a["action"] in ("drain", "failover")]
    return node


def test_an_epilogs_drain_that_slurm_forgot_is_reapplied(tmp_path):
    """Found on the lab: slurmctld restarted from a state saved before the fault, and the node
    whose epilog had drained it for an Xid 79 came back idle; with no failover of the daemon's
    there was no ``drain`` row to reconcile, and the next job ran on the dead GPU."""
    w = World(tmp_path)
    jid = w.start()
    w.step(n=2)
    node = _clean_exit_on_a_faulty_gpu(w, jid)
    reason = w.slurm.node_recs[node].reason
    _restart_from_a_save_before_the_drain(w, node)
    for _ in range(10):
        w.step(1.0)
    rec = w.slurm.node_recs[node]
    assert rec.drain and rec.reason == reason
    again = [x for x in _reconciles(w, jid) if x["kind"] == reconcile.DRAIN_REAPPLIED]
    assert len(again) == 1 and again[0]["status"] == "done" and again[0]["target"] == node


def test_epilog_drains_are_slurm_fts_reasons_and_never_health_refusals():
    rows = reconcile.epilog_drains([
        {"job_id": 5, "attempt": 0, "node": "n1", "created": 10.0, "rule": "xid-79",
         "xids": [{"xid": 79, "bus_id": "0000:10:00"}]},
        {"job_id": 6, "attempt": 1, "node": "n2", "created": 11.0, "rule": "health:gpu-count", "xids": []},
        {"job_id": 7, "attempt": 0, "node": "", "created": 12.0, "rule": "xid-79", "xids": []},
    ])
    assert [(r["target"], r["detail"]) for r in rows] == [("n1", "slurm-ft: Xid 79 GPU 0000:10:00 (job 5)")]
    facts = reconcile.drain_facts(rows)
    assert facts["n1"]["kind"] == "drain" and facts["n1"]["drained_at"] == 10.0
