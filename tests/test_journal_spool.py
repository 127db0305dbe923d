"""The journal's spool (issue 14): a writer that must never wait on another process's lock (the
daemon, the prolog/epilog) puts its writes in ``<journal>.spool`` while the database is locked,
reads them back at once, and they reach the database in order, once."""

import sqlite3
import time

from slurm_ft.journal import open_journal


def lock(path):
    conn = sqlite3.connect(str(path), timeout=0.1, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_locked_writes_are_spooled_read_back_and_applied_in_order(tmp_path):
    path = tmp_path / "j.db"
    j = open_journal(path, spool=True, busy_timeout_s=0.1)
    j.upsert_job(1, ft_state="running", retries=3)
    held = lock(path)
    t0 = time.monotonic()
    aid = j.intend(1, 0, "failover", "n1", "{}")
    j.add_verdict(1, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": None}])
    j.set_ft_state(1, "failover-in-progress")
    j.finish(aid)
    j.mark_mailbox_seen("n1", "1.0")
    assert time.monotonic() - t0 < 1.0                 # one lock wait, not one per write
    assert aid < 0 and j.spooled == 5 and (tmp_path / "j.db.spool").exists()
    # this connection reads its own writes
    assert [(a["action"], a["status"]) for a in j.actions(1, 0)] == [("failover", "done")]
    assert j.job(1)["ft_state"] == "failover-in-progress" and j.failovers_done(1) == 1
    assert [v["rule"] for v in j.verdicts(1, 0)] == ["xid-79"] and j.mailbox_seen("n1", "1.0")
    assert j.pending_intents() == []
    # a reader sees only the database
    with open_journal(path, readonly=True) as r:
        assert r.actions(1) == [] and r.job(1)["ft_state"] == "running"
    assert not j.flush()                                # still locked
    held.rollback()
    held.close()
    assert j.flush() and j.spooled == 0 and not (tmp_path / "j.db.spool").exists()
    with open_journal(path, readonly=True) as r:
        assert [(a["action"], a["status"]) for a in r.actions(1, 0)] == [("failover", "done")]
        assert r.job(1)["ft_state"] == "failover-in-progress" and r.job(1)["retries"] == 3
        assert r.mailbox_seen("n1", "1.0") and len(r.verdicts(1)) == 1
    j.finish(aid, "done", "again")                       # the temporary id still names the row
    with open_journal(path, readonly=True) as r:
        assert r.actions(1, 0)[0]["detail"] == "again"
    j.close()


def test_a_restarted_writer_sees_the_spool_and_applies_it_once(tmp_path):
    path = tmp_path / "j.db"
    open_journal(path).close()
    held = lock(path)
    j = open_journal(path, spool=True, busy_timeout_s=0.1)
    aid = j.intend(5, 0, "failover", "n2")
    j.close()                                           # killed with the journal still locked
    again = open_journal(path, spool=True, busy_timeout_s=0.1)
    assert [(a["id"], a["status"]) for a in again.pending_intents()] == [(aid, "intent")]
    again.finish(aid)                                   # resumed and done, still locked
    held.rollback()
    held.close()
    other = open_journal(path)                          # any writer that opens it applies the spool
    assert [(a["action"], a["status"]) for a in other.actions(5)] == [("failover", "done")]
    assert again.flush()                                # already applied: nothing twice
    assert len(other.actions(5)) == 1
    other.close()
    again.close()
