"""Job identity across job-id reuse (slurm_ft.journal.identity, issue 20 item 2): a new job with a
used id gets its own record, the old one is retired (never merged); a requeue, a slurmctld state
rollback or anything a user can edit never starts a new record. Real SQLite journals."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from slurm_ft.failover import policy
from slurm_ft.journal import identity, open_journal
from slurm_ft.slurm import Job

T0 = 1_800_000_000


def job(job_id=41, restarts=0, submit=T0, comment="ft:retries=2", admin="", name="train", array=None) -> Job:
    raw = {"job_id": job_id, "name": name, "user_name": "alice", "job_state": "RUNNING", "restart_cnt": restarts,
           "submit_time": submit, "comment": comment, "admin_comment": admin, "nodes": "n1"}
    if array:
        raw["array_job_id"], raw["array_task_id"] = array
    return Job.from_json(raw)


def old_job_on_record(j, job_id=41, state=policy.REQUEUED):
    """Job 41: attempt 0 failed over from n1 (verdict, drain, failover), attempt 1 submitted."""
    assert identity.observe(j, job(job_id, 0, T0)) is None
    j.upsert_job(job_id, name="train", user="alice", ft_enabled=1, retries=2, ft_state=state, excluded_nodes="n1")
    j.upsert_attempt(job_id, 0, nodes="n1", start=T0 + 1, end=T0 + 50, state="FAILED")
    j.add_verdict(job_id, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:3b:00"}])
    j.record(job_id, 0, "failover", "n1", "{}")
    assert identity.observe(j, job(job_id, 1, T0 + 51)) is None   # the requeue: new SubmitTime, Restarts 1


# ------------------------------------------------------------------------------- same_job
def test_requeue_rollback_and_reuse_are_told_apart():
    seen = [(0, T0), (1, T0 + 51)]
    assert identity.same_job(seen, 1, T0 + 51)          # the same attempt again
    assert identity.same_job(seen, 2, T0 + 99)          # requeued once more
    assert identity.same_job(seen, 0, T0)               # slurmctld rolled back to its saved state
    assert not identity.same_job(seen, 0, T0 + 500)     # a new job with the old id
    assert identity.same_job(seen, 1, T0 + 500)         # rolled back to attempt 0, then requeued again
    assert identity.same_job([], 0, T0) and identity.same_job(seen, 0, None)


chains = st.lists(st.integers(1, 10_000), min_size=1, max_size=8).map(
    lambda gaps: [(i, float(T0 + sum(gaps[:i + 1]))) for i in range(len(gaps))])


@settings(max_examples=200, deadline=None)
@given(chains, st.data())
def test_every_attempt_of_a_requeue_chain_is_the_same_job(chain, data):
    """Whatever prefix of a job's attempts the daemon saw, every attempt of it (seen or not, newer
    or rolled back to) continues the same job."""
    k = data.draw(st.integers(1, len(chain)))
    seen = chain[:k]
    for restarts, submit in chain:
        if restarts >= k - 1 or (restarts, submit) in seen:
            assert identity.same_job(seen, restarts, submit)


@settings(max_examples=200, deadline=None)
@given(chains, st.integers(1, 10**6))
def test_a_new_first_attempt_is_a_new_job(chain, later):
    assert not identity.same_job(chain, 0, chain[-1][1] + later)
    assert not identity.same_job(chain[-1:], 0, chain[-1][1] + later)


# ------------------------------------------------------------------------------- observe / retire
def test_a_reused_id_gets_its_own_record_and_the_old_one_is_retired(tmp_path):
    with open_journal(tmp_path / "j.db") as j:
        old_job_on_record(j)
        intent = j.intend(41, 1, "requeue", "41")             # the daemon was mid-action for the old job
        key = identity.observe(j, job(41, 0, T0 + 900))       # purged; a new job 41 (MaxJobId wrapped)
        assert key == -1
        assert j.job(41) is None and j.attempts(41) == [] and j.verdicts(41) == [] and j.actions(41) == []
        assert j.failovers_done(41) == 0                      # the new job's budget is whole
        assert j.add_verdict(41, 0, "n1", "hardware", "xid-79")   # its own Xid gets recorded (not merged)
        old = j.job(key)
        assert old["ft_state"] == policy.LOST and old["name"] == "train"
        assert [a["attempt"] for a in j.attempts(key)] == [0] and j.failovers_done(key) == 1
        assert {a["action"]: a["status"] for a in j.actions(key)} == {
            "failover": "done", "requeue": "skipped", "retire": "done"}
        assert intent not in {i["id"] for i in j.pending_intents()}
        (r,) = identity.retired(j).values()
        assert r["job_id"] == 41 and "reused" in r["reason"]
        assert identity.observe(j, job(41, 0, T0 + 900)) is None   # seen again: the same new job
        assert identity.observe(j, job(41, 1, T0 + 990)) is None   # and its own requeue
        assert identity.observe(j, job(41, 0, T0 + 2000)) == -2    # reused once more
        assert set(identity.retired(j)) == {-1, -2}


def test_a_final_state_is_kept_when_retired(tmp_path):
    with open_journal(tmp_path / "j.db") as j:
        old_job_on_record(j, state=policy.COMPLETED)
        key = identity.observe(j, job(41, 0, T0 + 900))
        assert j.job(key)["ft_state"] == policy.COMPLETED


def test_a_state_rollback_is_not_a_new_job(tmp_path):
    with open_journal(tmp_path / "j.db") as j:
        old_job_on_record(j)
        assert identity.observe(j, job(41, 0, T0)) is None    # slurmctld restarted from older state
        assert j.failovers_done(41) == 1 and identity.retired(j) == {}


@settings(max_examples=60, deadline=None)
@given(comment=st.text(max_size=40), admin=st.text(max_size=40), name=st.text(max_size=20))
def test_what_a_user_can_edit_never_makes_a_new_job(tmp_path_factory, comment, admin, name):
    """Comment, name (and the admin comment, for good measure) are not part of a job's identity:
    editing them can neither reset a retry budget nor merge jobs."""
    with open_journal(tmp_path_factory.mktemp("j") / "j.db") as j:
        old_job_on_record(j)
        assert identity.observe(j, job(41, 1, T0 + 51, comment=comment, admin=admin, name=name)) is None
        assert j.failovers_done(41) == 1 and identity.retired(j) == {}


def test_a_record_from_before_identity_is_judged_by_its_attempts(tmp_path):
    with open_journal(tmp_path / "j.db") as j:
        j.upsert_job(41, name="train", ft_enabled=1, retries=2, ft_state=policy.REQUEUED)
        j.upsert_attempt(41, 0, nodes="n1", start=T0 + 1, end=T0 + 50, state="FAILED")
        j.upsert_job(42, name="train", ft_enabled=1, retries=2, ft_state=policy.REQUEUED)
        j.upsert_attempt(42, 0, nodes="n1", start=T0 + 1, end=T0 + 50, state="FAILED")
        assert identity.observe(j, job(41, 1, T0 + 51)) is None       # its requeue: adopted
        assert identity.observe(j, job(42, 0, T0 + 900)) == -1       # submitted after attempt 0 ended
        assert j.job(42) is None and j.job(-1)["name"] == "train"


def test_array_task_ids_are_recorded(tmp_path):
    with open_journal(tmp_path / "j.db") as j:
        identity.observe(j, job(52, 0, T0, array=(50, 2)))
        identity.observe(j, job(41, 0, T0))
        assert identity.arrays(j) == {52: (50, 2)}


def test_a_locked_journal_delays_the_retirement_never_merges(tmp_path):
    import sqlite3

    path = tmp_path / "j.db"
    with open_journal(path, spool=True, busy_timeout_s=0.05) as j:
        old_job_on_record(j)
        other = sqlite3.connect(str(path), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            j.record(41, 1, "note")                               # spooled behind the lock
            try:
                identity.observe(j, job(41, 0, T0 + 900))
                raise AssertionError("retired while locked")
            except identity.JournalError as exc:
                assert "locked" in str(exc)
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert identity.observe(j, job(41, 0, T0 + 900)) == -1
        assert [a["action"] for a in j.actions(-1)][-2:] == ["note", "retire"]


def test_job_array_fields_from_scontrol_and_json():
    assert (job(52, array=(50, 2)).array_job_id, job(52, array=(50, 2)).array_task_id) == (50, 2)
    assert job(41).array_job_id is None and job(41).array_task_id is None
    pending = job(50, array=(50, "1-5%2"))
    assert pending.array_job_id is None and pending.array_task_id is None
    wrapped = Job.from_json({"job_id": 7, "job_state": "RUNNING", "array_job_id": {"set": True, "number": 6},
                             "array_task_id": {"set": True, "number": 1}})
    assert (wrapped.array_job_id, wrapped.array_task_id) == (6, 1)
    unset = Job.from_json({"job_id": 7, "job_state": "RUNNING", "array_job_id": {"set": True, "number": 0},
                           "array_task_id": {"set": False, "number": 0}})
    assert unset.array_job_id is None and unset.array_task_id is None


def test_an_identity_seen_while_the_journal_is_locked_waits_in_the_spool(tmp_path):
    """First sight of a job while another process holds the journal: nothing waits (the row is
    spooled), and the identity still tells the next job with that id apart."""
    import sqlite3

    path = tmp_path / "j.db"
    with open_journal(path, spool=True, busy_timeout_s=0.05) as j:
        other = sqlite3.connect(str(path), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            assert identity.observe(j, job(41, 0, T0)) is None
            j.upsert_job(41, name="train", ft_enabled=1, retries=2, ft_state=policy.FAILED)
            assert identity.observe(j, job(41, 1, T0 + 60)) is None
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert identity.observe(j, job(41, 0, T0 + 900)) == -1
        assert identity.retired(j)[-1]["job_id"] == 41


def test_node_posts_are_filed_under_the_job_they_were_made_for(tmp_path):
    """The mailbox key of a node post is JOB.ATTEMPT: the new job's own posts must be read (the
    old job's seen keys go with it), and a late post made for the old job stays with the old one."""
    with open_journal(tmp_path / "j.db") as j:
        old_job_on_record(j)
        j.mark_mailbox_seen("n1", "41.0")
        j.mark_mailbox_seen("n1", "410.0")
        key = identity.observe(j, job(41, 0, T0 + 900))
        assert not j.mailbox_seen("n1", "41.0") and j.mailbox_seen("n1", "410.0")
        assert identity.record_for(j, 41, T0 + 950) == 41          # made for the new job
        assert identity.record_for(j, 41, T0 + 40) == key          # made for the old one, posted late
        assert identity.record_for(j, 41, 0) == 41 and identity.record_for(j, 7, T0) == 7


def test_the_daemon_fails_over_a_new_job_with_a_used_id_on_the_same_node(tmp_path):
    """The lab's case (issue 20 item 2) against the in-memory Slurm: job 1 failed over from n1,
    then cancelled and purged; a new job 1 runs on n1, attempt 0 again, and posts the same
    mailbox key ``1.0`` while the old post is still in n1's field: the new job's own Xid 79 gets
    its own failover, the old record keeps its own."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from daemon_world import XID79, World

    w = World(tmp_path, nodes=2)
    s = w.slurm
    jid = w.start(retries=2)
    assert s.jobs_by_id[jid].nodes == ["n1"]
    s.end(jid, "FAILED", 1, verdicts={"n1": XID79}, epilogs=True)
    w.step(n=6)
    assert s.jobs_by_id[jid].restart == 1 and s.node_recs["n1"].drain
    w.step(dt=130.0)
    s.jobs_by_id[jid].state, s.jobs_by_id[jid].end = "CANCELLED", s.clock()
    s.jobs_by_id[jid].completing = set()
    w.step(n=3)
    s.node_recs["n1"].drain, s.node_recs["n1"].reason = False, ""
    s.purge(jid)
    s.node_recs["n2"].drain = True                      # the new job lands on n1 again
    w.clock.advance(5.0)
    assert w.start(retries=2, job_id=jid) == jid and s.jobs_by_id[jid].nodes == ["n1"]
    s.node_recs["n2"].drain = False
    w.step(n=2)
    s.end(jid, "FAILED", 1, verdicts={"n1": XID79}, epilogs=True)
    w.step(n=6)
    assert s.jobs_by_id[jid].restart == 1, "the new job's own Xid 79 got no failover"
    with w.journal() as j:
        assert j.failovers_done(jid) == 1 and [v["node"] for v in j.verdicts(jid)] == ["n1"]
        (old,) = identity.retired(j)
        assert j.failovers_done(old) == 1 and j.job(old)["ft_state"] in (policy.CANCELLED, policy.LOST)
