"""Issue 20, item 3: journal trouble never stops failovers. A full disk, a read-only remount or an
I/O error is named as such (slurm_ft.journal.trouble), the writes wait in memory, in order, the
daemon keeps failing jobs over (its durable record in the job's AdminComment:
slurm_ft.failover.intent), and the rows reach the journal when it takes writes again, once each.

Two ways to fill a disk: a real small tmpfs (root only: ``mount -t tmpfs``; those tests say why
they skip elsewhere) and :class:`Disk`, which makes every journal write and spool append of this
process fail the way a full disk makes them fail (``SQLITE_FULL``, ``ENOSPC``), deterministic and
fast, for the daemon and the generative tests."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from daemon_world import XID79, World
from slurm_ft.errors import JournalError
from slurm_ft.failover import intent, mailbox
from slurm_ft.journal import open_journal, store, trouble


# ------------------------------------------------------------------ the two disks
def sqlite_error(kind: str) -> sqlite3.Error:
    """The error SQLite raises for ``kind`` (message and result code as the library sets them)."""
    text, code, cls = {"disk_full": ("database or disk is full", 13, sqlite3.OperationalError),
                       "io_error": ("disk I/O error", 10 | (3 << 8), sqlite3.OperationalError),
                       "read_only": ("attempt to write a readonly database", 8, sqlite3.OperationalError),
                       "busy": ("database is locked", 5, sqlite3.OperationalError),
                       "corrupted": ("database disk image is malformed", 11, sqlite3.DatabaseError)}[kind]
    exc = cls(text)
    exc.sqlite_errorcode = code
    return exc


class Disk:
    """Makes this process's journal writes fail like ``kind`` (default a full disk) while
    :attr:`db` / :attr:`spool` are set: the database refuses the write, the spool cannot be
    appended to (the same filesystem). An insert of an action named in :attr:`poison` is refused
    for its content (a constraint), whatever the disk does."""

    def __init__(self, monkeypatch):
        self.db = self.spool = False
        self.poison: set[str] = set()
        self.kind = "disk_full"
        apply_op, spool_append = store.Journal._apply_op, store.Journal._spool_append
        disk = self

        def failing_apply(self, conn, op):
            if disk.db:
                raise sqlite_error(disk.kind)
            if op["op"] == "insert" and op["row"].get("action") in disk.poison:
                raise sqlite3.IntegrityError("CHECK constraint failed: poison")
            return apply_op(self, conn, op)

        def failing_spool(self, op):
            if disk.spool:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return spool_append(self, op)

        monkeypatch.setattr(store.Journal, "_apply_op", failing_apply)
        monkeypatch.setattr(store.Journal, "_spool_append", failing_spool)

    def fill(self) -> None:
        self.db = self.spool = True

    def free(self) -> None:
        self.db = self.spool = False


@pytest.fixture
def disk(monkeypatch):
    return Disk(monkeypatch)


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs at ``tmp_path/fs`` (root only), unmounted afterwards."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path) -> Path:
    """Fill the filesystem at ``mnt`` to the last block; returns the filler file."""
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


# ------------------------------------------------------------------ one classification
@pytest.mark.parametrize("exc, kind, said", [
    (OSError(errno.ENOSPC, "No space left on device"), "disk_full", "disk full (ENOSPC)"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk_full", "disk full (EDQUOT)"),
    (OSError(errno.EROFS, "Read-only file system"), "read_only", "read-only filesystem (EROFS)"),
    (OSError(errno.EIO, "Input/output error"), "io_error", "I/O error (EIO)"),
    (sqlite_error("disk_full"), "disk_full", "disk full (ENOSPC)"),
    (sqlite_error("io_error"), "io_error", "I/O error"),
    (sqlite_error("read_only"), "read_only", "read-only filesystem"),
    (sqlite_error("busy"), "busy", "locked by another process"),
    (sqlite_error("corrupted"), "corrupted", "corrupted"),
    (sqlite3.OperationalError("database or disk is full"), "disk_full", "disk full (ENOSPC)"),
    (sqlite3.DatabaseError("file is not a database"), "corrupted", "corrupted"),
    (sqlite3.IntegrityError("UNIQUE constraint failed"), "other", "cannot be written"),
])
def test_each_error_is_named_for_what_it_is(tmp_path, exc, kind, said):
    t = trouble.diagnose(exc, tmp_path / "j.db")
    assert t.kind == kind and str(t).startswith(said)
    assert ("aside" in t.advice) == (kind == "corrupted")      # "move it aside" only for corruption
    assert t.transient == (kind in ("disk_full", "read_only", "io_error", "busy"))


def test_a_corrupted_journal_is_the_only_one_to_move_aside(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(JournalError, match="corrupted.*move it aside"):
        open_journal(bad)


# ------------------------------------------------------------------ a real full disk
def test_a_full_tmpfs_keeps_the_writes_names_the_error_once_and_catches_up(tmpfs, caplog):
    path = tmpfs / "j" / "journal.db"
    j = open_journal(path, spool=True, busy_timeout_s=0.1)
    j.upsert_job(1, ft_state="running", retries=3)
    filler = fill(tmpfs)
    caplog.set_level(logging.WARNING, logger="slurm_ft.journal.store")
    ids = []
    for job in range(2, 40):
        j.add_verdict(job, 0, "n1", "hardware", "xid-79", evidence=["NVRM: Xid 79" * 40] * 8)
        ids.append(j.intend(job, 0, "failover", "n1"))
        j.finish(ids[-1])
    assert j.unwritten > 0 and j.trouble is not None and j.trouble.kind == "disk_full"
    assert not j.flush() and not j.flush()                      # still full: no error, no second log line
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and f"journal {path}: disk full (ENOSPC)" in errors[0] and "aside" not in errors[0]
    assert trouble.check_writable(path) is not None and trouble.check_writable(path).kind == "disk_full"
    assert j.failovers_done(5) == 1 and [v["rule"] for v in j.verdicts(5)] == ["xid-79"]   # reads see them
    filler.unlink()
    assert j.flush() and j.unwritten == 0 and j.trouble is None
    assert any("writable again" in r.getMessage() for r in caplog.records)
    j.upsert_job(1, ft_state="failover-in-progress")            # the connection takes the next write
    with open_journal(path, readonly=True) as r:
        rows = r.db.execute("SELECT job_id, status FROM actions ORDER BY id").fetchall()
        assert rows == [(job, "done") for job in range(2, 40)]
        assert r.db.execute("SELECT count(*) FROM verdicts").fetchone()[0] == 38
        assert r.job(1)["ft_state"] == "failover-in-progress"
    j.close()


def test_opening_a_journal_on_a_full_tmpfs_says_disk_full_not_corrupted(tmpfs):
    fill(tmpfs)
    with pytest.raises(JournalError) as err:
        open_journal(tmpfs / "new" / "journal.db")
    assert "aside" not in str(err.value) and ("disk full" in str(err.value) or "No space" in str(err.value))


def test_a_failed_commit_leaves_the_connection_usable(tmpfs):
    """Before: "cannot rollback - no transaction is active" at every later write."""
    path = tmpfs / "journal.db"
    j = open_journal(path)
    filler = fill(tmpfs)
    with pytest.raises(JournalError, match="disk full"):
        for job in range(200):
            j.add_verdict(job, 0, "n1", "hardware", "xid-79", evidence=["x" * 2000] * 8)
    assert not j.db.conn.in_transaction
    filler.unlink()
    j.upsert_job(7, ft_state="running")
    assert j.job(7)["ft_state"] == "running"
    j.close()


def test_doctor_metrics_and_ft_history_name_a_full_journal_disk(tmpfs, tmp_path):
    from click.testing import CliRunner

    from daemon_world import write_config
    from slurm_ft import config as config_mod
    from slurm_ft.admin import doctor
    from slurm_ft.admin import metrics
    from slurm_ft.cli.history import command

    path = tmpfs / "journal" / "daemon.db"
    open_journal(path).close()
    cfg = config_mod.load(write_config(tmp_path))
    cfg = dataclasses.replace(cfg, journal=dataclasses.replace(cfg.journal, path=str(path)))
    assert doctor._writable_check("journal-writable", path).status == "OK"
    assert 'slurm_ft_journal_ok{kind="ok"} 1.0' in metrics.exposition(cfg)
    filler = fill(tmpfs)
    check = doctor._writable_check("journal-writable", path)
    assert check.status == "FAIL" and "disk full (ENOSPC)" in check.detail and "aside" not in check.fix
    assert 'slurm_ft_journal_ok{kind="disk_full"} 0.0' in metrics.exposition(cfg)
    r = CliRunner().invoke(command, ["-j", "1", "--journal", str(path)])
    assert "warning: journal" in r.stderr and "disk full (ENOSPC)" in r.stderr
    filler.unlink()
    r = CliRunner().invoke(command, ["-j", "1", "--journal", str(path)])
    assert "warning: journal" not in r.stderr


# ------------------------------------------------------------------ the daemon on a full disk
@pytest.fixture
def w(tmp_path, monkeypatch):
    return World(tmp_path, nodes=5, monkeypatch=monkeypatch)


def test_the_daemon_fails_over_on_a_full_disk_logs_it_once_and_catches_up(w, disk, caplog):
    a, b = w.start(), w.start()
    w.step()
    caplog.set_level(logging.INFO)
    disk.fill()
    node = w.job(a).nodes[0]
    w.slurm.end(a, verdicts={node: XID79}, epilogs=True)
    w.step(n=12)
    assert w.slurm.requeues.get((a, 0)) == 1 and w.job(a).restart == 1
    assert w.job(a).state == "RUNNING" and node not in w.job(a).nodes      # running elsewhere
    assert w.slurm.node_recs[node].drain
    assert intent.parse(w.job(a).admin_comment) == intent.Record(0, 1)      # the durable record
    said = [r.getMessage() for r in caplog.records if "disk full (ENOSPC)" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"journal {w.cfg.journal.path}: disk full (ENOSPC)")
    assert w.daemon.journal.unwritten > 0
    with w.journal() as j:
        assert j.actions(a) == []                                    # nothing reached the database yet
    disk.free()
    w.step(n=2)
    assert w.daemon.journal.unwritten == 0 and w.daemon.journal.trouble is None
    with w.journal() as j:
        fo = [x for x in j.actions(a, 0) if x["action"] == "failover"]
        assert [x["status"] for x in fo] == ["done"]                 # once, not doubled
        assert [v["verdict"] for v in j.verdicts(a, 0)] == ["hardware"]
        assert any(x["action"] == "drain" and x["target"] == node for x in j.actions(a, 0))
        assert j.failovers_done(b) == 0


def test_a_daemon_restarted_on_a_still_full_disk_does_not_fail_over_twice(w, disk):
    a = w.start()
    w.step()
    disk.fill()
    w.slurm.end(a, verdicts={w.job(a).nodes[0]: XID79}, epilogs=True)
    w.step(n=3)
    assert w.slurm.requeues.get((a, 0)) == 1
    w.restart_daemon()                      # its memory (the unwritten rows) is gone; the disk still full
    w.step(n=8)
    assert w.slurm.requeues.get((a, 0)) == 1 and w.job(a).restart == 1
    assert w.daemon.journal.failovers_done(a) == 1
    disk.free()
    w.step(n=2)
    with w.journal() as j:
        fo = [x for x in j.actions(a) if x["action"] == "failover"]
        assert len(fo) == 1 and fo[0]["attempt"] == 0 and intent.RECOVERED in fo[0]["detail"]


def test_the_intent_word_is_typed_and_read_only_from_its_own_shape():
    assert intent.parse("slurm-ft:failover ft:retries=3,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0 "
                        "slurm-ft-fo=2:3") == intent.Record(2, 3)
    for text in ("", None, "slurm-ft-fo=", "slurm-ft-fo=1", "slurm-ft-fo=a:b", "xslurm-ft-fo=1:1",
                 "slurm-ft-fo=1:1x", "slurm-ft-fo=-1:2", "slurm-ft-fo=1234567890:1"):
        assert intent.parse(text) is None
    assert intent.word([]) == ""
    assert intent.word([{"action": "failover", "attempt": 0, "status": "done"},
                        {"action": "drain", "attempt": 1, "status": "done"},
                        {"action": "failover", "attempt": 1, "status": "intent"}]) == "slurm-ft-fo=1:2"


def test_an_epilog_on_a_full_node_disk_names_it_and_still_posts_the_verdict(w, disk, monkeypatch):
    from slurm_ft import slurm as slurm_mod
    from slurm_ft.node import epilog
    from slurm_ft.classify.model import Verdict
    from slurm_ft.node.job import NodeJob

    monkeypatch.setattr(slurm_mod.Slurm, "from_config", classmethod(lambda cls, cfg: w.slurm))
    open_journal(w.cfg.node_journal_path("n1")).close()
    disk.fill()
    lines: list[str] = []
    job = NodeJob(7, "n1", 0, 0, (0,), 0, None, None, None, None)
    epilog.record_verdict(w.cfg, job, Verdict("ok", "clean-exit", (), ("exit 0",), "none"), start=None,
                          log=lines.append)
    said = " ".join(lines)
    assert "disk full (ENOSPC)" in said and "aside" not in said and "exit 0" in said
    assert [r.key for r in mailbox.parse(w.slurm.node_recs["n1"].extra)] == ["7.0"]   # posted for the daemon


# ------------------------------------------------------------------ generative: every row once, in order
class TroubleMachine(RuleBasedStateMachine):
    """Random interleavings of writes, failing storage (each kind, database and spool apart),
    writes refused for their content, flushes and recoveries: reads always see every write, and
    once the storage takes writes again every accepted row is in the database exactly once, in
    the order written, or (refused for its content while it waited) in ``dead_letters`` exactly
    once, in order; one refused at once is raised to its caller and kept nowhere."""

    def __init__(self):
        super().__init__()
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="slurm-ft-trouble-")
        self.j = open_journal(Path(self.dir) / "j.db", spool=True, busy_timeout_s=0.05)
        self.actions: list[tuple[int, str, str]] = []      # (job, action, status) in write order
        self.health: list[str] = []
        self.verdicts: dict[tuple[int, str], str] = {}
        self.states: dict[int, str] = {}
        self.ids: list[tuple[int, int]] = []                 # (index in actions, id from intend)
        self.dead: list[str] = []                            # poisoned writes accepted, in order
        self.disk.poison = set()
        self.n = 0

    @rule(db=st.sampled_from(["disk_full", "io_error", "read_only", "busy"]), db_fails=st.booleans(),
          spool_fails=st.booleans())
    def storage(self, db, db_fails, spool_fails):
        self.disk.kind, self.disk.db, self.disk.spool = db, db_fails, spool_fails

    @rule(job=st.integers(1, 4), status=st.sampled_from(["intent", "done"]))
    def act(self, job, status):
        self.n += 1
        aid = self.j.intend(job, 0, f"a{self.n}", "n1")
        self.actions.append((job, f"a{self.n}", "intent"))
        if status == "done":
            self.j.finish(aid)
            self.actions[-1] = (job, f"a{self.n}", "done")
        else:
            self.ids.append((len(self.actions) - 1, aid))

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def finish_later(self, data):
        i, aid = self.ids.pop(data.draw(st.integers(0, len(self.ids) - 1)))
        self.j.finish(aid, "failed")
        self.actions[i] = (*self.actions[i][:2], "failed")

    @rule(job=st.integers(1, 4), node=st.sampled_from(["n1", "n2"]), rule_=st.sampled_from(["xid-79", "user"]))
    def verdict(self, job, node, rule_):
        self.j.add_verdict(job, 0, node, "hardware", rule_)
        self.verdicts.setdefault((job, node), rule_)

    @rule(job=st.integers(1, 4), state=st.sampled_from(["running", "failover-in-progress", "requeued"]))
    def state(self, job, state):
        self.j.set_ft_state(job, state)
        self.states[job] = state

    @rule()
    def health_row(self):
        self.n += 1
        self.j.add_health("n1", [{"check": f"c{self.n}", "status": "ok"}])
        self.health.append(f"c{self.n}")

    @rule(finish=st.booleans())
    def poisoned(self, finish):
        self.n += 1
        name = f"p{self.n}"
        self.disk.poison.add(name)
        at_once = not self.j.spooled and not self.disk.db      # else it waits behind others / the fault
        try:
            aid = self.j.intend(9, 0, name, "n1")
        except JournalError as exc:
            assert at_once and "CHECK constraint failed" in str(exc)
            return
        assert not at_once and aid < 0
        self.dead.append(f"insert {name}")
        if finish:
            self.j.finish(aid)                                  # its update waits too: set aside with it
            self.dead.append("update")

    @precondition(lambda self: not (self.disk.db and self.disk.spool))    # else memory's rows die with it
    @rule()
    def restart(self):
        """The process ends and another opens the journal: close puts the rows only memory held
        into the spool, the new connection reads the spool back; outstanding intents are found
        again through pending_intents(), as the daemon finds them."""
        self.j.close()
        self.j = open_journal(Path(self.dir) / "j.db", spool=True, busy_timeout_s=0.05)
        by_name = {a["action"]: a["id"] for a in self.j.pending_intents()}
        self.ids = [(i, by_name[self.actions[i][1]]) for i, _ in self.ids]

    @rule()
    def flush(self):
        ok = self.j.flush()
        assert ok == (not self.j._pending)

    @invariant()
    def reads_see_every_write(self):
        for job in range(1, 5):
            got = [(x["job_id"], x["action"], x["status"]) for x in self.j.actions(job)]
            assert got == [x for x in self.actions if x[0] == job]
            assert {(v["job_id"], v["node"]): v["rule"] for v in self.j.verdicts(job)} == \
                {k: v for k, v in self.verdicts.items() if k[0] == job}
            if job in self.states:
                assert self.j.job(job)["ft_state"] == self.states[job]

    def teardown(self):
        import shutil
        try:
            self.disk.free()
            assert self.j.flush() and self.j.unwritten == 0 and self.j.spooled == 0
            db = self.j.db
            assert [tuple(r) for r in db.execute("SELECT job_id, action, status FROM actions ORDER BY id")] == \
                self.actions
            assert [r[0] for r in db.execute("SELECT check_name FROM health ORDER BY id")] == self.health
            assert {(r[0], r[1]): r[2] for r in db.execute("SELECT job_id, node, rule FROM verdicts")} == \
                self.verdicts
            assert {r[0]: r[1] for r in db.execute("SELECT job_id, ft_state FROM jobs")} == self.states
            assert [r[0] for r in db.execute("SELECT job_id FROM actions WHERE job_id = 9")] == []
            dead = [json.loads(r[0]) for r in db.execute("SELECT op FROM dead_letters ORDER BY id")]
            assert [f"insert {d['row']['action']}" if d["op"] == "insert" else d["op"] for d in dead] == self.dead
            assert self.j.flush() and self.j.dead_letter_count() == len(self.dead)     # never retried
            self.j.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def test_random_interleavings_of_failing_and_working_storage_lose_and_double_nothing(disk):
    TroubleMachine.disk = disk
    run = TroubleMachine.TestCase
    run.settings = settings(max_examples=150, stateful_step_count=30, deadline=None,
                            suppress_health_check=list(HealthCheck))
    run().runTest()
