"""Typed read/write helpers over the journal database."""

from __future__ import annotations

import errno
import grp
import json
import logging
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any, Iterable

import sqlite_utils

from ..errors import ConfigError, JournalError
from . import migrations

log = logging.getLogger(__name__)

#: SQLite's side files of a database; they hold the same data and get the same permissions.
SIDE_FILES = ("-wal", "-shm", "-journal")


def open_journal(path: str | os.PathLike, *, readonly: bool = False, read_group: str = "") -> "Journal":
    """Open (creating and migrating if needed) the journal at ``path``; with ``readonly`` (readers
    such as ft-history and the report) open an existing journal without writing anything.

    A writer creates the journal (and its -wal/-shm files) root-only, 0600, in directories created
    0700; with ``read_group`` (the daemon's journal, ``[journal] read_group``) 0640 and 0750,
    group ``read_group``. A writer running as root also puts those permissions back on an
    existing journal. Node journals (job output excerpts) are always opened without a group.

    Raises :class:`JournalError` if the file is missing or unreadable (readonly), a symlink, not a
    SQLite database, not a slurm-ft journal, corrupted, or written by a newer slurm-ft (unknown
    migrations); :class:`ConfigError` if ``read_group`` names no group of this host.
    """
    return Journal(path, readonly=readonly, read_group=read_group)


def open_daemon_journal(cfg, *, readonly: bool = False) -> "Journal":
    """The daemon's journal (``[journal] path``), readable by ``[journal] read_group`` if set."""
    return open_journal(cfg.journal.path, readonly=readonly, read_group=cfg.journal.read_group)


def open_node_journal(cfg, node: str, *, readonly: bool = False) -> "Journal":
    """A compute node's own journal (``[journal] node_path``): root-only, always."""
    return open_journal(cfg.node_journal_path(node), readonly=readonly)


def resolve_group(name: str) -> int | None:
    """gid of ``[journal] read_group`` (None for ""). Raises :class:`ConfigError` if unknown."""
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"journal.read_group: no group {name!r} on this host") from None


def _no_access(path: Path) -> JournalError:
    return JournalError(f"{path}: permission denied: the journal is readable by root only, or by the group "
                        f"named in [journal] read_group (ask an admin)")


def _secure_path(path: Path, mode: int, gid: int | None, *, create: bool) -> None:
    """Give ``path`` owner root (when we are root), group ``gid`` and ``mode``, never through a
    symlink; create it (``O_EXCL|O_NOFOLLOW``) when missing and ``create``.

    Path-based on purpose: opening and closing a descriptor of a database file would drop every
    POSIX lock SQLite holds on it in this process (fcntl locks belong to the process), which
    corrupts a journal another connection of the same process has open.  The directory is
    root-only, so nobody can swap the file between the lstat and the chmod."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            return _secure_path(path, mode, gid, create=False)
        os.close(fd)  # a file nobody has open yet: no lock to lose
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise JournalError(f"{path}: is a symlink; refusing to write a journal through it")
    if not stat.S_ISREG(st.st_mode):
        raise JournalError(f"{path}: not a regular file")
    euid = os.geteuid()
    if euid == 0:
        want_gid = 0 if gid is None else gid
        if (st.st_uid, st.st_gid) != (0, want_gid):
            os.chown(path, 0, want_gid, follow_symlinks=False)
    elif st.st_uid != euid:
        return  # someone else's file: leave it (opening it as this user will tell)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def _make_dirs(directory: Path, mode: int, gid: int | None) -> None:
    """Create the missing directories above a journal with ``mode`` (group ``gid`` when root).
    Existing directories are left alone; with a group, one it cannot search is reported."""
    missing = []
    d = directory
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue
        if gid is not None and os.geteuid() == 0:
            os.chown(d, 0, gid, follow_symlinks=False)
        os.chmod(d, mode)  # a directory we just made (mkdir's mode is cut by the umask)
    if gid is not None and not missing:
        st = os.stat(directory)
        if not (st.st_mode & stat.S_IXOTH or (st.st_gid == gid and st.st_mode & stat.S_IXGRP)):
            log.warning("%s: group %s cannot search this directory, so [journal] read_group cannot read "
                        "the journal in it (chgrp %s and chmod g+x it, or move the journal)",
                        directory, grp.getgrgid(gid).gr_name, grp.getgrgid(gid).gr_name)


class Journal:
    def __init__(self, path: str | os.PathLike, *, readonly: bool = False, read_group: str = ""):
        self.path = Path(path)
        if readonly:
            conn = self._connect_readonly()
        else:
            conn = self._connect_writer(resolve_group(read_group))
        try:
            self.db = sqlite_utils.Database(conn)
            if readonly and "_migrations" not in self.db.table_names():
                raise JournalError(f"{self.path}: not a slurm-ft journal")
            newer = {r[0] for r in conn.execute("SELECT name FROM _migrations")} - migrations.known()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise self._db_error(exc) from None
        except JournalError:
            conn.close()
            raise
        if newer:
            conn.close()
            raise JournalError(f"{self.path}: written by a newer slurm-ft (migrations {sorted(newer)})")

    def _db_error(self, exc: Exception) -> JournalError:
        return JournalError(f"{self.path}: cannot open journal ({exc}); if it is corrupted, move it "
                            f"aside and slurm-ft will start a new one")

    def _connect_writer(self, gid: int | None) -> sqlite3.Connection:
        """Create or open the journal for writing with its permissions (see :func:`open_journal`):
        the process umask is narrowed while SQLite may create files, the file itself is created
        (O_NOFOLLOW) and, when we are root, its owner, group and mode are put right, -wal/-shm too."""
        mode, dir_mode = (0o600, 0o700) if gid is None else (0o640, 0o750)
        old_umask = os.umask(0o077 if gid is None else 0o027)
        conn = None
        try:
            _make_dirs(self.path.parent, dir_mode, gid)
            _secure_path(self.path, mode, gid, create=True)
            for side in SIDE_FILES:  # a stale side file through a symlink would be written by root
                _secure_path(Path(f"{self.path}{side}"), mode, gid, create=False)
            conn = sqlite3.connect(str(self.path), timeout=10.0, isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 10000")
            db = sqlite_utils.Database(conn)
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.enable_wal()
            migrations.apply(db)
            for side in SIDE_FILES:
                _secure_path(Path(f"{self.path}{side}"), mode, gid, create=False)
            return conn
        except sqlite3.DatabaseError as exc:
            if conn is not None:
                conn.close()
            raise self._db_error(exc) from None
        except OSError as exc:
            if conn is not None:
                conn.close()
            raise JournalError(f"{self.path}: cannot open journal: {exc.strerror}") from None
        finally:
            os.umask(old_umask)

    def _connect_readonly(self) -> sqlite3.Connection:
        """Open an existing journal read-only; a reader without access gets a one-line error."""
        try:
            st = os.stat(self.path)
        except PermissionError:
            raise _no_access(self.path) from None
        except OSError:
            raise JournalError(f"{self.path}: no journal here (check [journal] path or --journal)") from None
        if not stat.S_ISREG(st.st_mode):
            raise JournalError(f"{self.path}: no journal here (check [journal] path or --journal)")
        if not os.access(self.path, os.R_OK):
            raise _no_access(self.path)
        uri = self.path.resolve().as_uri()
        try:
            conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=10.0, isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 10000")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as exc:
            # A group reader of a WAL journal whose writer is not running: SQLite wants to create
            # the -shm file and the directory is not ours. With no -wal file every committed
            # row is in the main file, which can then be read as an immutable snapshot.
            if os.path.exists(f"{self.path}-wal") or os.access(self.path.parent, os.W_OK):
                raise self._db_error(exc) from None
        except sqlite3.DatabaseError as exc:
            raise self._db_error(exc) from None
        try:
            conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=10.0, isolation_level=None)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.DatabaseError as exc:
            raise self._db_error(exc) from None

    def close(self) -> None:
        self.db.conn.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _guard(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{self.path}: {exc}") from None

    # -- jobs --------------------------------------------------------------------------
    def upsert_job(self, job_id: int, **fields: Any) -> None:
        now = time.time()
        existing = self.job(job_id)
        row = {"job_id": job_id, "updated": now, **fields}
        if existing is None:
            row.setdefault("created", now)
        self._guard(self.db["jobs"].upsert, row, pk="job_id")

    def job(self, job_id: int) -> dict | None:
        rows = list(self.db.query("SELECT * FROM jobs WHERE job_id = ?", [job_id]))
        return rows[0] if rows else None

    def set_ft_state(self, job_id: int, state: str) -> None:
        self.upsert_job(job_id, ft_state=state)

    # -- attempts ------------------------------------------------------------------------
    def upsert_attempt(self, job_id: int, attempt: int, **fields: Any) -> None:
        row = {"job_id": job_id, "attempt": attempt, "updated": time.time(),
               **{k: v for k, v in fields.items() if v is not None}}
        self._guard(self.db["attempts"].upsert, row, pk=("job_id", "attempt"))

    def has_attempt(self, job_id: int, attempt: int) -> bool:
        return bool(list(self.db.query("SELECT 1 FROM attempts WHERE job_id = ? AND attempt = ?", [job_id, attempt])))

    def close_attempts_before(self, job_id: int, attempt: int) -> None:
        """Attempts before ``attempt`` still open (the daemon never saw them end: a lost node, a
        requeue by Slurm or an admin) are closed as REQUEUED, now."""
        self._guard(self.db.execute,
                    "UPDATE attempts SET end = ?, state = 'REQUEUED', updated = ? "
                    "WHERE job_id = ? AND attempt < ? AND end IS NULL", [time.time(), time.time(), job_id, attempt])

    def attempts(self, job_id: int) -> list[dict]:
        return list(self.db.query("SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt", [job_id]))

    # -- verdicts ------------------------------------------------------------------------
    def add_verdict(self, job_id: int, attempt: int, node: str, verdict: str, rule: str,
                    xids: Iterable[dict] = (), evidence: Iterable[str] = (), action: str = "none",
                    exit_code: int | None = None, source: str = "epilog", created: float | None = None) -> bool:
        """Record one node's verdict for one attempt. Returns False if it was already recorded."""
        row = {"job_id": job_id, "attempt": attempt, "node": node, "verdict": verdict, "rule": rule,
               "xids": json.dumps(list(xids)), "evidence": json.dumps(list(evidence)), "action": action,
               "exit_code": exit_code, "source": source, "created": created or time.time()}
        before = self.db.conn.total_changes
        self._guard(self.db["verdicts"].insert, row, ignore=True)
        return self.db.conn.total_changes > before

    def verdicts(self, job_id: int, attempt: int | None = None) -> list[dict]:
        sql = "SELECT * FROM verdicts WHERE job_id = ?"
        args: list[Any] = [job_id]
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        rows = list(self.db.query(sql + " ORDER BY attempt, node", args))
        for r in rows:
            r["xids"] = json.loads(r["xids"] or "[]")
            r["evidence"] = json.loads(r["evidence"] or "[]")
        return rows

    def recent_xid_verdicts(self, since: float, *, limit: int = 1000, scan: int = 10000) -> list[dict]:
        """Verdicts recorded at or after ``since`` (epoch seconds) that hold Xids, newest first:
        ``[{job_id, attempt, node, created, xids}]`` (``xids`` decoded).  Bounded for the epilog:
        only the ``scan`` newest verdict rows (a range of the integer primary key) are looked at
        and at most ``limit`` are returned."""
        sql = ("SELECT job_id, attempt, node, created, xids FROM verdicts"
               " WHERE id > (SELECT COALESCE(MAX(id), 0) FROM verdicts) - ? AND created >= ?"
               " AND xids IS NOT NULL AND xids NOT IN ('', '[]') ORDER BY id DESC LIMIT ?")
        rows = self._guard(lambda: list(self.db.query(sql, [int(scan), float(since), int(limit)])))
        for r in rows:
            try:
                r["xids"] = json.loads(r["xids"] or "[]")
            except ValueError:
                r["xids"] = []
        return rows

    # -- actions -------------------------------------------------------------------------
    def intend(self, job_id: int, attempt: int, action: str, target: str = "", detail: str = "") -> int:
        """Record an action about to be taken (status 'intent'); returns its id."""
        table = self.db["actions"]
        self._guard(table.insert, {"job_id": job_id, "attempt": attempt, "action": action, "target": target,
                                   "detail": detail, "status": "intent", "created": time.time()})
        return table.last_pk

    def finish(self, action_id: int, status: str = "done", detail: str | None = None) -> None:
        fields: dict[str, Any] = {"status": status, "finished": time.time()}
        if detail is not None:
            fields["detail"] = detail
        self._guard(self.db["actions"].update, action_id, fields)

    def record(self, job_id: int, attempt: int, action: str, target: str = "", detail: str = "",
               status: str = "done") -> int:
        """Record an action already taken (or decided) in one step."""
        aid = self.intend(job_id, attempt, action, target, detail)
        self.finish(aid, status)
        return aid

    def actions(self, job_id: int, attempt: int | None = None) -> list[dict]:
        sql = "SELECT * FROM actions WHERE job_id = ?"
        args: list[Any] = [job_id]
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        return list(self.db.query(sql + " ORDER BY id", args))

    def failovers_done(self, job_id: int) -> int:
        """Failovers spent from the job's retry budget (``failover`` actions done)."""
        return self.db.execute("SELECT count(*) FROM actions WHERE job_id = ? AND action = 'failover' "
                               "AND status = 'done'", [job_id]).fetchone()[0]

    def pending_intents(self) -> list[dict]:
        return list(self.db.query("SELECT * FROM actions WHERE status = 'intent' ORDER BY id"))

    def boosted_jobs(self) -> set[int]:
        """Jobs whose priority slurm-ft raised (a failover's ``update`` with ``Priority=``, or a
        prolog-refusal ``release``): they never count as "the highest waiting job" again, so
        boosts do not ratchet."""
        rows = self.db.execute("SELECT DISTINCT job_id FROM actions WHERE (action = 'update' AND detail LIKE "
                               "'%Priority=%') OR action = 'release'").fetchall()
        return {r[0] for r in rows}

    def breaker_latched(self) -> str | None:
        """When the circuit breaker opened (the detail of the newest ``breaker-open`` action not
        followed by a ``breaker-reset``), or None when it is closed."""
        row = self.db.execute("SELECT action, detail, created FROM actions WHERE action IN "
                              "('breaker-open', 'breaker-reset') ORDER BY id DESC LIMIT 1").fetchone()
        if row is None or row[0] != "breaker-open":
            return None
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(row[2] or 0))

    # -- health ----------------------------------------------------------------------------
    def add_health(self, node: str, results: Iterable[dict], job_id: int | None = None) -> None:
        now = time.time()
        rows = [{"node": node, "job_id": job_id, "check_name": r.get("check"), "status": r.get("status"),
                 "gpu": r.get("gpu"), "measurement": r.get("measurement"),
                 "value": None if r.get("value") is None else str(r.get("value")),
                 "detail": r.get("detail", ""), "created": now} for r in results]
        if rows:
            self._guard(self.db["health"].insert_all, rows)

    # -- mailbox bookkeeping (daemon side) -------------------------------------------------
    def mailbox_seen(self, node: str, key: str) -> bool:
        return bool(list(self.db.query("SELECT 1 FROM mailbox_seen WHERE node = ? AND key = ?", [node, key])))

    def mark_mailbox_seen(self, node: str, key: str) -> None:
        self._guard(self.db["mailbox_seen"].insert, {"node": node, "key": key, "seen": time.time()}, ignore=True)
