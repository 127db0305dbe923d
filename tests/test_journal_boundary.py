"""The journal boundary (issue 27, item 8): text is made storable once, where it enters the
journal; a spooled write the database refuses is set aside in ``dead_letters``, never retried
forever; an update finds its action by the ``uid`` stored in the row; only JournalError escapes.

Before: a lone surrogate in a checkpoint-delivery report went into a spooled write, every later
daemon cycle failed (``UnicodeEncodeError`` while binding it) and a restarted daemon crash-looped;
with 4 concurrent writers and a held lock 1-4 of 1,200 ``finish()`` updates were lost (their
spooled update named its row by an id only the process that applied the insert knew)."""

import json
import multiprocessing
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.admin import doctor
from slurm_ft.errors import JournalError
from slurm_ft.failover import policy
from slurm_ft.journal import boundary, open_journal

#: Any text: every code point, lone surrogates included, NUL and controls; any bytes; huge ones.
ANY_CHAR = st.characters(codec=None, categories=None)
HOSTILE = st.one_of(
    st.text(ANY_CHAR, max_size=40),
    st.binary(max_size=40),
    st.builds(lambda c, n: c * n, st.sampled_from(["\udcff", "\x00", "é", "\U0001f600", "a"]),
              st.integers(0, 3 * boundary.MAX_TEXT)),
)


def lock(path):
    conn = sqlite3.connect(str(path), timeout=0.1, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def _stored_text(path) -> list:
    """Every value of every table, straight from SQLite (bytes, as they are on disk)."""
    conn = sqlite3.connect(str(path))
    conn.text_factory = bytes
    out = []
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        for row in conn.execute(f"SELECT * FROM {table.decode()}"):
            out += [v for v in row if isinstance(v, bytes)]
    conn.close()
    return out


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


_COUNTER = iter(range(1, 10**9))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=st.lists(HOSTILE, min_size=12, max_size=12), held=st.booleans())
def test_any_text_through_every_public_write_keeps_the_journal_readable(scratch, s, held):
    jid = next(_COUNTER)
    path = scratch / f"j{jid}.db"
    j = open_journal(path, spool=True, busy_timeout_s=0.02)
    other = lock(path) if held else None      # the queued (spooled) path, then the direct one
    try:
        j.upsert_job(jid, name=s[0], user=s[1], ft_enabled=1, retries=2, ft_state=s[2], excluded_nodes=s[3],
                     ft_options=s[4])
        j.set_ft_state(jid, s[5])
        j.upsert_attempt(jid, 0, nodes=s[6], state=s[7], start=1.0)
        j.upsert_attempt(jid, 1, nodes=s[6], state=s[7], start=2.0)
        j.close_attempts_before(jid, 1)
        assert j.add_verdict(jid, 0, s[8], s[9], s[10], [{"xid": 79, "bus_id": s[11]}], [s[0], s[1]], s[2],
                             1, source=s[3])
        assert not j.add_verdict(jid, 0, s[8], "hardware", "xid-79")      # the same node, cleaned alike
        aid = j.intend(jid, 0, s[4], s[5], s[6])
        j.finish(aid, "done", s[7])
        j.record(jid, 1, "update", s[8], f"Priority=1 {s[9]!r}")
        j.add_health(s[10], [{"check": s[11], "status": s[0], "measurement": s[1], "value": s[2], "detail": s[3]}],
                     job_id=jid)
        j.mark_mailbox_seen(s[4], s[5])
        assert (j.spooled > 0) == held
        # the daemon-facing reads work, with the writes still queued or not
        for reader in (j,):
            assert reader.job(jid)["ft_state"] == boundary.value(s[5])
            assert [a["state"] for a in reader.attempts(jid)] == ["REQUEUED", boundary.value(s[7])]
            assert [v["node"] for v in reader.verdicts(jid)] == [boundary.value(s[8])]
            assert reader.node_verdicts(jid)[0].xids == ((79, boundary.text(s[11], boundary.MAX_ITEM_TEXT)),)
            assert [a["status"] for a in reader.actions(jid)] == ["done", "done"]
            assert reader.failovers_done(jid) == 0 and jid in reader.boosted_jobs()
            reader.active_ft_jobs()       # the database only (checked below, once flushed)
            assert not any(i["job_id"] == jid for i in reader.pending_intents())
            assert reader.mailbox_seen(s[4], s[5])
            reader.breaker_latched()
            reader.recent_xid_verdicts(0.0)
    finally:
        if other is not None:
            other.rollback()
            other.close()
    assert j.flush() and j.spooled == 0
    assert (jid in j.active_ft_jobs()) == (boundary.value(s[5]) not in policy.FINAL_STATES)
    j.close()
    with open_journal(path, readonly=True) as r:         # a reader sees all of it, once, done
        assert [a["status"] for a in r.actions(jid)] == ["done", "done"]
        assert len(r.verdicts(jid)) == 1 and r.mailbox_seen(s[4], s[5])
        assert r.dead_letter_count() == 0                # any text is storable: nothing set aside
    for v in _stored_text(path):                         # on disk: valid UTF-8, no NUL, bounded
        t = v.decode("utf-8")
        assert "\x00" not in t and len(t) <= boundary.MAX_TEXT


@settings(max_examples=300, deadline=None)
@given(v=st.one_of(st.text(ANY_CHAR), st.binary(), st.integers(), st.floats(), st.none(), st.booleans(),
                   st.lists(st.text(ANY_CHAR), max_size=3)))
def test_the_boundary_makes_any_value_storable_or_raises_journal_error(v):
    try:
        out = boundary.value(v)
    except JournalError:
        assert isinstance(v, int) and not -(1 << 63) <= v < (1 << 63)
        return
    conn = sqlite3.connect(":memory:")
    assert conn.execute("SELECT ?", [out]).fetchone()[0] == out or out != out    # NaN
    if isinstance(out, str):
        assert boundary.value(out) == out and len(out) <= boundary.MAX_TEXT     # idempotent, bounded
    assert json.loads(boundary.json_text([v])) is not None


def test_a_lone_surrogate_spooled_by_an_older_writer_no_longer_crash_loops_a_restart(tmp_path):
    """The wedge as it was: a spool line holding ``\\udcff`` (json.dumps writes it as an escape).
    Opening the journal (a restarted daemon) applies it, cleaned, and every later write works."""
    path = tmp_path / "j.db"
    open_journal(path).close()
    line = {"op": "insert", "table": "actions", "uid": "u1", "tmp": -1, "row": {
        "job_id": 5, "attempt": 0, "action": "ckpt-notify", "target": "n1", "status": "done",
        "detail": "evacuation: SIGUSR1 to 1 process(es); n1: python\udcff[42]", "created": 1.0}}
    (tmp_path / "j.db.spool").write_text(json.dumps(line) + "\n")
    j = open_journal(path, spool=True, busy_timeout_s=0.1)        # before: UnicodeEncodeError here
    assert j.flush() and not (tmp_path / "j.db.spool").exists()
    [a] = j.actions(5)
    assert a["detail"].endswith("python\ufffd[42]") and a["uid"] == "u1"
    j.record(5, 0, "failover", "n1")
    assert [a["action"] for a in j.actions(5)] == ["ckpt-notify", "failover"]
    assert j.dead_letter_count() == 0
    j.close()


def test_a_refused_queued_write_is_set_aside_once_and_the_next_write_works(tmp_path, monkeypatch):
    path = tmp_path / "j.db"
    j = open_journal(path, spool=True, busy_timeout_s=0.02)
    held = lock(path)
    j.upsert_job(1, ft_state="running")
    aid = j.intend(1, 0, "drain", "n1")
    j.finish(aid)
    with open(tmp_path / "j.db.spool", "a") as fh:            # what another writer left: a torn
        fh.write('{"op": "insert", "table": "acti\n')            # line, and an update of an action
        fh.write(json.dumps({"op": "update", "table": "actions", "ref": "nope", "uid": "x",  # nobody has
                             "fields": {"status": "done"}}) + "\n")
    j.record(1, 0, "poison", "n1")                               # refused by the database (below)
    j.set_ft_state(1, "failover-in-progress")
    real = type(j)._apply_op

    def refuse(self, conn, op):
        if op.get("row", {}).get("action") == "poison":
            raise sqlite3.IntegrityError("CHECK constraint failed")
        return real(self, conn, op)
    monkeypatch.setattr(type(j), "_apply_op", refuse)
    assert not j.flush()                                        # still locked: kept, not set aside
    held.rollback()
    held.close()
    assert j.flush() and j.spooled == 0                         # the rest applied, in order
    assert j.job(1)["ft_state"] == "failover-in-progress"
    assert [(a["action"], a["status"]) for a in j.actions(1)] == [("drain", "done")]
    dead = j.dead_letters()
    assert len(dead) == 4 and j.dead_letter_count() == 4   # torn line, unknown action, poison insert + its update
    assert sorted(d["error"].split(":")[0] for d in dead) == ["IntegrityError", "JournalError", "LookupError",
                                                              "LookupError"]
    assert j.flush() and j.dead_letter_count() == 4             # exactly once: never retried
    j.record(1, 0, "failover", "n2")                            # the next write works
    assert [a["action"] for a in j.actions(1)] == ["drain", "failover"]
    j.close()
    again = open_journal(path, spool=True)                      # and a restart is clean
    assert again.dead_letter_count() == 4 and again.spooled == 0
    again.close()
    check = doctor._journal_check("journal", path)
    assert check.status == "WARN" and "4 spooled write(s)" in check.detail and "dead_letters" in check.fix


def test_a_direct_write_refused_raises_journal_error_only(tmp_path):
    j = open_journal(tmp_path / "j.db")
    with pytest.raises(JournalError, match="64-bit"):
        j.upsert_job(1 << 70, name="x")
    with pytest.raises(JournalError, match="64-bit"):
        j.job(1 << 70)
    j.upsert_job(1, name="fine")                                 # nothing left half-done
    assert j.job(1)["name"] == "fine" and j.dead_letter_count() == 0
    j.close()


def _writer(path: str, w: int, n: int, go) -> None:
    go.wait()
    j = open_journal(path, spool=True, busy_timeout_s=0.02)
    for i in range(n):
        j.finish(j.intend(w, i, "failover", f"n{w}"))
    while not j.flush():
        time.sleep(0.01)
    j.close()


def test_concurrent_writers_under_a_held_lock_lose_no_finish(tmp_path):
    """4 writer processes x 300 intend+finish while another connection takes and drops the write
    lock: every action ends ``done`` (before: 1-4 of 1,200 stayed in ``intent``)."""
    path = str(tmp_path / "j.db")
    open_journal(path).close()
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(path, w, 300, go)) for w in range(4)]
    for p in procs:
        p.start()
    held = sqlite3.connect(path, timeout=5, isolation_level=None)
    t0 = time.monotonic()
    go.set()
    rounds = 0
    while any(p.is_alive() for p in procs) and time.monotonic() - t0 < 60:
        held.execute("BEGIN IMMEDIATE")
        time.sleep(0.05)
        held.execute("ROLLBACK")
        time.sleep(0.02)
        rounds += 1
    for p in procs:
        p.join(30)
    held.close()
    elapsed = time.monotonic() - t0
    assert all(p.exitcode == 0 for p in procs)
    with open_journal(path) as j:
        assert j.flush()
        counts = dict(j.db.execute("SELECT status, count(*) FROM actions GROUP BY status").fetchall())
        assert counts == {"done": 1200}, counts
        assert j.pending_intents() == [] and j.dead_letter_count() == 0
        assert j.db.execute("SELECT count(DISTINCT uid) FROM actions").fetchone()[0] == 1200
    assert rounds >= 1 and elapsed < 20
