"""Typed read/write helpers over the journal database."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import json
import logging
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any, Iterable

from slurm_ft.errors import ConfigError, JournalError
from slurm_ft.journal import boundary, migrations, trouble
from slurm_ft.journal.trouble import Trouble

log = logging.getLogger(__name__)

#: SQLite's side files of a database; they hold the same data and get the same permissions.
SIDE_FILES = ("-wal", "-shm", "-journal")


def open_journal(path: str | os.PathLike, *, readonly: bool = False, read_group: str = "",
                 spool: bool = False, busy_timeout_s: float = 10.0) -> "Journal":
    """Open (creating and migrating if needed) the journal at ``path``; with ``readonly`` (readers
    such as ft-history and the report) open an existing journal without writing anything.

    A writer creates the journal (and its -wal/-shm files) root-only, 0600, in directories created
    0700; with ``read_group`` (the daemon's journal, ``[journal] read_group``) 0640 and 0750,
    group ``read_group``. A writer running as root also puts those permissions back on an
    existing journal. Node journals (job output excerpts) are always opened without a group.

    Raises :class:`JournalError` if the file is missing or unreadable (readonly), a symlink, not a
    SQLite database, not a slurm-ft journal, corrupted, or written by a newer slurm-ft (unknown
    migrations); :class:`ConfigError` if ``read_group`` names no group of this host.

    ``spool`` (writers that must never wait on another process's lock: the daemon, the
    prolog/epilog): a write the database refuses as locked within ``busy_timeout_s``, or that its
    storage refuses (a full disk, a read-only remount, an I/O error: :mod:`.trouble`), waits, read
    back by this connection, in ``<journal>.spool`` (JSON lines, fsync'd, same permissions) or in
    memory (at most :data:`MAX_UNWRITTEN`), and is applied in order later: the write rule of
    :class:`Journal`, whose :attr:`Journal.trouble` says what refused it (logged once per change).
    """
    return Journal(path, readonly=readonly, read_group=read_group, spool=spool, busy_timeout_s=busy_timeout_s)


def open_daemon_journal(cfg, *, readonly: bool = False, spool: bool = False,
                        busy_timeout_s: float = 10.0) -> "Journal":
    """The daemon's journal (``[journal] path``), readable by ``[journal] read_group`` if set."""
    return open_journal(cfg.journal.path, readonly=readonly, read_group=cfg.journal.read_group, spool=spool,
                        busy_timeout_s=busy_timeout_s)


def open_node_journal(cfg, node: str, *, readonly: bool = False, spool: bool = False,
                      busy_timeout_s: float = 10.0) -> "Journal":
    """A compute node's own journal (``[journal] node_path``): root-only, always."""
    return open_journal(cfg.node_journal_path(node), readonly=readonly, spool=spool, busy_timeout_s=busy_timeout_s)


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
    from slurm_ft import pathtrust   # no symlink, a regular file; owner and mode are repaired below

    why = pathtrust.judge(st, pathtrust.Rule(owners=None, forbid=0, kind=pathtrust.FILE))
    if why == pathtrust.SYMLINK:
        raise JournalError(f"{path}: is a symlink; refusing to write a journal through it")
    if why is not None:
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


#: Columns of the tables written through :meth:`Journal._write` (schema: migrations.py).
COLUMNS = {
    "jobs": ("job_id", "name", "user", "ft_enabled", "retries", "ft_state", "excluded_nodes", "created", "updated",
             "ft_options", "account"),
    "attempts": ("job_id", "attempt", "nodes", "start", "end", "exit_code", "signal", "state", "updated"),
    "verdicts": ("job_id", "attempt", "node", "verdict", "rule", "xids", "evidence", "action", "exit_code", "source",
                 "created", "uid"),
    "actions": ("job_id", "attempt", "action", "target", "detail", "status", "created", "finished", "uid", "kind",
                "restart", "restart_of"),
    "health": ("node", "job_id", "check_name", "status", "gpu", "measurement", "value", "detail", "created"),
    "mailbox_seen": ("node", "key", "seen"),
    "job_identity": ("job_id", "array_job_id", "array_task_id", "seen", "first_seen", "updated"),  # identity.py
}
PKS = {"jobs": ("job_id",), "attempts": ("job_id", "attempt"), "job_identity": ("job_id",)}
#: The kinds of write :meth:`Journal._write` applies, and the parts of an op that carry a row.
OPS = ("insert", "insert_ignore", "upsert", "update", "close_before")
ROW_PARTS = ("row", "first", "fields")
#: Columns a written row must carry (the spool's overlay and the reads key on them).
REQUIRED = {"jobs": ("job_id",), "attempts": ("job_id", "attempt"), "verdicts": ("job_id", "attempt", "node"),
            "actions": ("job_id", "attempt", "action", "status", "uid"), "health": ("node",),
            "mailbox_seen": ("node", "key"), "job_identity": ("job_id",)}


#: Writes one connection keeps in memory while its journal's storage refuses them and its spool
#: cannot be written either (a full disk): beyond this a write raises :class:`JournalError`.
MAX_UNWRITTEN = 20000


def _the_journals_fault(exc: BaseException) -> bool:
    """True when ``exc`` says the database itself cannot take writes now (locked, disk full, I/O
    error, corrupt): the write is kept and tried again. Anything else (a constraint, a value, a
    malformed op) is the one write's fault: it is set aside (:meth:`Journal.flush`)."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(
        exc, (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError, sqlite3.ProgrammingError))


def _json_list(text: Any) -> list:
    """A JSON list column as a list ([] for NULL, or for a row another tool wrote that is not one)."""
    try:
        v = json.loads(text or "[]")
    except (TypeError, ValueError):
        return []
    return v if isinstance(v, list) else []


def _decode_text(b: bytes) -> str:
    """How the journal reads TEXT: a row written by another tool with bytes that are not UTF-8
    still reads (U+FFFD), never a sqlite3 'Could not decode' error."""
    return b.decode("utf-8", "replace")


class _Database:
    """:attr:`Journal.db`: the connection at once (``.conn``), a ``sqlite_utils.Database`` over it
    for anything else, made on first use (tests/test_epilog_speed.py: a hook imports no
    sqlite_utils)."""

    __slots__ = ("conn", "_real")

    def __init__(self, conn: sqlite3.Connection):
        self.conn, self._real = conn, None

    def _database(self):
        if self._real is None:
            import sqlite_utils
            self._real = sqlite_utils.Database(self.conn, execute_plugins=False)
        return self._real

    def __getattr__(self, name: str):
        return getattr(self._database(), name)

    def __getitem__(self, name: str):
        return self._database()[name]


def _dict_rows(cur: sqlite3.Cursor) -> list[dict]:
    """A query's rows as dicts keyed by column name (what ``sqlite_utils.Database.query`` gives)."""
    names = [d[0] for d in cur.description or ()]
    return [dict(zip(names, row)) for row in cur]


class Journal:
    """One connection to the journal at ``path``: the typed reads and writes below.

    **Writes follow one rule.** Every write is an op (``insert``, ``insert_ignore``, ``upsert``,
    ``update`` or ``close_before`` of one table of :data:`COLUMNS`), passed through the journal
    boundary when it is made (:meth:`_clean`: an unstorable value raises :class:`JournalError` at
    the call). Ops not yet in the database wait in order (:attr:`spooled`) and this connection's
    reads include them. A write is applied at once when nothing waits; :meth:`flush` (each daemon
    cycle, and any writer opening the journal) applies all that wait, the spool file's included,
    in order, in one transaction. On a **database fault** (locked, disk full, read-only, I/O error:
    :attr:`.trouble.Trouble.transient`) a spooling writer keeps the ops waiting, in the spool file
    or, when that cannot be written either, in memory (:attr:`unwritten`); the next flush retries
    them, and later writes wait behind them. A waiting op refused for its **content** is set aside
    in ``dead_letters`` and the ops behind it go on. Any other fault, and every fault of a writer
    without a spool, is raised as :class:`JournalError` to the caller of that write, and nothing
    of it is kept."""

    def __init__(self, path: str | os.PathLike, *, readonly: bool = False, read_group: str = "",
                 spool: bool = False, busy_timeout_s: float = 10.0):
        self.path = Path(path)
        self.clock = time.time
        self.busy_timeout_s = busy_timeout_s
        self._spool = None if readonly else Path(f"{self.path}.spool")
        self._spooling = spool and not readonly
        self._pending: list[dict] = []     # this connection's writes not yet in the database, in order
        self._unspooled: list[dict] = []   # the tail of _pending that only memory holds (spool unwritable)
        #: what keeps writes out of the journal now (None: it takes them); see slurm_ft.journal.trouble
        self.trouble: Trouble | None = None
        self._uids: dict[int, str] = {}    # temporary action id (negative, still spooled) -> its row uid
        self._next_tmp = -1
        self._mode, self._gid = 0o600, None
        if readonly:
            conn = self._connect_readonly()
        else:
            self._gid = resolve_group(read_group)
            self._mode = 0o600 if self._gid is None else 0o640
            conn = self._connect_writer(self._gid)
        conn.text_factory = _decode_text
        try:
            # no sqlite-utils plugins: scanning every installed package's entry points cost the prolog
            # and epilog ~20 ms each, and would run third-party code as root (issue 24)
            self._conn, self._db = conn, None   # sqlite_utils only on first use of .db (issue 22)
            if readonly and not conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'").fetchone():
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
        if self._spooling:
            self._load_spool()      # read-your-writes across a restart while the journal was locked
        if self._spool is not None and (self._spooling or self._spool.exists()):
            # any writer applies what a locked moment left spooled, waiting at most a moment
            conn.execute(f"PRAGMA busy_timeout = {int(min(self.busy_timeout_s, 0.2) * 1000)}")
            try:
                self.flush()
            except JournalError as exc:
                log.warning("%s", exc)
            finally:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")

    def _db_error(self, exc: Exception) -> JournalError:
        t = trouble.diagnose(exc, self.path)
        return JournalError(f"{self.path}: cannot open journal: {t} ({exc}): {t.advice}")

    def _error(self, exc: BaseException) -> JournalError:
        """The one-line JournalError for a failed write, naming the real trouble."""
        if isinstance(exc, (sqlite3.Error, OSError)):
            t = trouble.diagnose(exc, self.path)
            if t.kind != "other":
                return JournalError(f"{self.path}: {t}: {t.advice}")
        return JournalError(f"{self.path}: {exc}")

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
            conn = sqlite3.connect(str(self.path), timeout=self.busy_timeout_s, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=wal")
            migrations.apply(conn)
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
        """Close; rows only memory holds are written first if the journal takes them now, else
        to the spool if it can be written, else reported (logged with their count)."""
        if self._unspooled:
            with contextlib.suppress(JournalError):
                self.flush()
        try:
            while self._unspooled:
                self._spool_append(self._unspooled[0])
                self._unspooled.pop(0)
        except OSError as exc:
            log.error("journal %s: %d row(s) could not be written (%s) and are lost with this process",
                      self.path, len(self._unspooled), trouble.diagnose(exc, self.path))
        self._conn.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def db(self) -> "_Database":
        """This journal's database: ``.conn`` is its ``sqlite3`` connection; everything else of a
        ``sqlite_utils.Database`` (``query``, ``execute``, ``db["table"]``...) works too, made (and
        sqlite_utils imported) at first use. The prolog and epilog use plain ``sqlite3`` only and
        never pay sqlite_utils' import (~25 ms of the epilog's start, issue 22)."""
        if self._db is None or self._db.conn is not self._conn:
            self._db = _Database(self._conn)
        return self._db

    def _guard(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            raise JournalError(f"{self.path}: {exc}") from None

    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[dict]:
        """The rows of one query; its parameters pass the boundary (:func:`boundary.params`)."""
        bound = boundary.params(args)
        return self._guard(lambda: _dict_rows(self._conn.execute(sql, bound)))

    # -- writes: the rule of the class docstring ----------------------------------------------
    @property
    def spooled(self) -> int:
        """Writes of this connection not in the database yet (0: everything is there)."""
        return len(self._pending)

    @property
    def unwritten(self) -> int:
        """The tail of those that only this connection's memory holds (the spool could not be
        written either: a full disk); :meth:`flush` writes them when it can."""
        return len(self._unspooled)

    @property
    def waiting_rows(self) -> int:
        """Rows not in the database yet that a reader should be told of (0: none): this
        connection's own waiting writes (:attr:`spooled`; its reads include them), else, for a
        read-only connection, the lines waiting in ``<journal>.spool`` for a writer to apply
        (:func:`.trouble.waiting_rows`; its reads do not include them)."""
        if self._pending or self._spool is not None:
            return len(self._pending)
        return trouble.waiting_rows(self.path)

    def _clean(self, op: Any) -> dict:
        """``op`` with every row it carries passed through the journal boundary
        (:func:`boundary.clean_row`) and its shape checked. Raises :class:`JournalError` for a
        malformed op (a torn or foreign spool line) or a value that cannot be stored."""
        def int_(v):
            return isinstance(v, int) and not isinstance(v, bool)

        bad = JournalError(f"{self.path}: malformed journal write")
        if not isinstance(op, dict) or op.get("op") not in OPS or op.get("table") not in COLUMNS \
                or not isinstance(op.get("uid"), str) or ("tmp" in op and not int_(op["tmp"])):
            raise bad
        table, kind = op["table"], op["op"]
        out = {**op, "uid": boundary.text(op["uid"], 64)}
        for part in ROW_PARTS:
            if part in op:
                if not isinstance(op[part], dict):
                    raise bad
                out[part] = boundary.clean_row(table, op[part], COLUMNS[table])
        if table == "actions" and kind == "insert" and "row" in out:
            out["row"].setdefault("uid", out["uid"])    # updates find the row by it, whoever applied it
        if kind in ("insert", "insert_ignore", "upsert"):
            if not all(k in out.get("row", {}) for k in REQUIRED[table]) or (kind == "upsert" and table not in PKS):
                raise bad
        elif kind == "update":
            by_ref = isinstance(op.get("ref"), str)
            if table != "actions" or not out.get("fields") or not (by_ref or int_(op.get("id"))):
                raise bad
            out.update({"ref": boundary.text(op["ref"], 64)} if by_ref else {"id": boundary.value(op["id"])})
        elif table != "attempts" or not all(isinstance(op.get(k), (int, float)) and not isinstance(op.get(k), bool)
                                            for k in ("job_id", "attempt", "t")):
            raise bad           # close_before
        else:
            out.update({k: boundary.value(op[k]) for k in ("job_id", "attempt", "t")})
        return out

    def _write(self, op: dict) -> int | None:
        """Make ``op`` (insert / insert_ignore / upsert / update / close_before, with its ``uid``
        set here) and apply it by the rule of the class docstring. Returns the new row's id when
        an insert was applied at once, None when it waits. Raises :class:`JournalError` only."""
        import uuid

        op["uid"] = uuid.uuid4().hex
        op = self._clean(op)
        if not (self._spooling and self._pending):     # else it waits behind them
            try:
                return self._apply([op]).get(op["uid"])
            except Exception as exc:  # noqa: BLE001 - the boundary: JournalError only
                if not (self._spooling and self._fault(exc)):
                    raise self._error(exc) from None
        if not self._unspooled:
            try:
                self._spool_append(op)
                self._pending.append(op)
                return None
            except OSError as exc:
                if not self._fault(exc):
                    t = trouble.diagnose(exc, self.path)
                    raise JournalError(f"{self._spool}: cannot spool a write: {t}: {t.advice}") from None
        if len(self._unspooled) >= MAX_UNWRITTEN:
            raise JournalError(f"{self.path}: {self.trouble or 'not writable'}: {len(self._unspooled)} rows "
                               f"already wait in memory; this one is refused")
        self._pending.append(op)
        self._unspooled.append(op)
        return None

    def _fault(self, exc: BaseException) -> bool:
        """True when ``exc`` is a database fault (:attr:`.trouble.Trouble.transient`: locked,
        full, read-only, I/O error), i.e. the write is kept and retried. Such a fault other than
        a lock becomes :attr:`trouble`, logged once per change of kind."""
        t = trouble.diagnose(exc, self.path) if isinstance(exc, (sqlite3.Error, OSError)) else None
        if t is None or not t.transient:
            return False
        if t.kind != "busy":
            if self.trouble is None or self.trouble.kind != t.kind:
                log.error("%s (writes are kept, in order, and applied when it takes them again)", t.message())
            self.trouble = t
        return True

    def flush(self) -> bool:
        """Apply every waiting write (this connection's and the spool's, any process's), in
        order, in one transaction; True when nothing waits any more, False on a database fault
        (they wait on). Never blocks longer than the busy timeout. A waiting write refused for
        its content goes to ``dead_letters`` (logged; ``slurm-ft doctor`` reports them). Raises
        :class:`JournalError` only, for any other fault."""
        if self._spool is None:
            return True
        ops: list = []
        try:
            if self._spool.exists():
                with self._spool_lock():
                    spooled = self._read_spool()     # [] when another writer applied it meanwhile
                    ops = spooled + self._unspooled
                    self._apply(ops, set_aside=True)
                    if spooled:
                        os.unlink(self._spool)
            elif self._unspooled:   # only memory holds them: no other process can be applying them
                ops = list(self._unspooled)
                self._apply(ops, set_aside=True)
        except Exception as exc:  # noqa: BLE001 - the boundary: JournalError only
            if self._fault(exc):
                return False
            if isinstance(exc, OSError):
                t = trouble.diagnose(exc, self.path)
                raise JournalError(f"{self._spool}: {t}: {exc.strerror or exc}") from None
            raise self._error(exc) from None
        self._pending, self._unspooled = [], []
        if self.trouble is not None:
            log.warning("journal %s: writable again (was %s): %d waiting row(s) written", self.path,
                        self.trouble, len(ops))
            self.trouble = None
        return True

    def _apply(self, ops: list, *, set_aside: bool = False) -> dict[str, int]:
        """All ``ops`` in one transaction (BEGIN IMMEDIATE: waits at most the busy timeout), each
        in a savepoint; returns {op uid: new row id} of the inserts. With ``set_aside`` an op
        refused for its content goes to ``dead_letters``; anything else raised ends the
        transaction (rolled back) and is raised."""
        conn, ids = self._conn, {}
        if not ops:
            return ids
        conn.execute("BEGIN IMMEDIATE")
        try:
            for op in ops:
                conn.execute("SAVEPOINT one_write")
                try:
                    op = self._clean(op)
                    rowid = self._apply_op(conn, op)
                except Exception as exc:  # noqa: BLE001 - set aside, whatever it is
                    if not set_aside or _the_journals_fault(exc) or not conn.in_transaction:
                        raise
                    conn.execute("ROLLBACK TO one_write")
                    self._set_aside(conn, op, exc)
                    rowid = None
                conn.execute("RELEASE one_write")
                if rowid is not None:
                    ids[op["uid"]] = rowid
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return ids

    def _rollback(self) -> None:
        """End a failed transaction, leaving a connection that takes the next write: SQLite may
        have ended it already (a full disk can), and a connection whose ROLLBACK fails is
        replaced."""
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = sqlite3.connect(str(self.path), timeout=self.busy_timeout_s, isolation_level=None)
            self._conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            self._conn.text_factory = _decode_text

    def _set_aside(self, conn: sqlite3.Connection, op: Any, exc: BaseException) -> None:
        """Keep a refused waiting write in ``dead_letters`` (bounded, valid text) and log it."""
        error = boundary.text(f"{type(exc).__name__}: {exc}", 1024)
        conn.execute("INSERT INTO dead_letters (created, op, error) VALUES (?, ?, ?)",
                     [self.clock(), boundary.text(json.dumps(op, sort_keys=True, default=str)), error])
        log.warning("%s: a spooled write was refused and set aside in dead_letters (%s); "
                    "see `slurm-ft doctor`", self.path, error)

    def _apply_op(self, conn: sqlite3.Connection, op: dict) -> int | None:
        """Run one cleaned op on ``conn`` (inside :meth:`_apply`'s transaction); the new row's id
        for an insert. Raises ``sqlite3.Error``, or LookupError for an update of an action by a
        ``uid`` that no row has."""
        table, kind = op["table"], op["op"]
        if kind == "close_before":
            conn.execute("UPDATE attempts SET end = ?, state = 'REQUEUED', updated = ? "
                         "WHERE job_id = ? AND attempt < ? AND end IS NULL",
                         [op["t"], op["t"], op["job_id"], op["attempt"]])
            return None
        if kind == "update":
            key, ref = ("uid", op["ref"]) if op.get("ref") else ("id", op.get("id"))
            cur = conn.execute(f"UPDATE {table} SET {', '.join(f'{k} = ?' for k in op['fields'])} WHERE {key} = ?",
                               [*op["fields"].values(), ref])
            if cur.rowcount == 0 and key == "uid":
                raise LookupError(f"update of action {ref}, which is not in the journal")
            return None
        row = {**op.get("first", {}), **op["row"]}
        sql = f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})"
        if kind == "upsert":
            pk = PKS[table]
            sets = ", ".join(f"{k} = excluded.{k}" for k in op["row"] if k not in pk) or f"{pk[0]} = {pk[0]}"
            sql += f" ON CONFLICT({', '.join(pk)}) DO UPDATE SET {sets}"
        elif table == "actions":    # a spool applied twice (a crash between commit and unlink) adds nothing
            sql += " ON CONFLICT(uid) DO NOTHING"
        elif kind == "insert_ignore":
            sql = "INSERT OR IGNORE" + sql[len("INSERT"):]
        cur = conn.execute(sql, list(row.values()))
        if kind != "insert" or table != "actions" or cur.rowcount:
            return cur.lastrowid if kind == "insert" else None
        return conn.execute("SELECT id FROM actions WHERE uid = ?", [row["uid"]]).fetchone()[0]

    # -- the spool file ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _spool_lock(self):
        """Hold ``<journal>.spool.lock`` (flock): one process at a time appends to or applies
        the spool."""
        fd = os.open(f"{self._spool}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, self._mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _load_spool(self) -> None:
        """Take what waits in the spool as this connection's own waiting writes (their temporary
        action ids too), so its reads see them before they reach the database. Lines that do not
        pass the boundary are left for :meth:`flush` to set aside."""
        try:
            with self._spool_lock():
                ops = self._read_spool()
        except OSError:
            return
        self._pending = []
        for op in ops:
            try:
                op = self._clean(op)
            except JournalError:
                continue
            self._pending.append(op)
            if "tmp" in op:
                self._uids[op["tmp"]] = op["uid"]
                self._next_tmp = min(self._next_tmp, op["tmp"] - 1)

    def _read_spool(self) -> list:
        """Every line of the spool, in order: a write (a dict with a ``uid``), or, for a line
        that is not one (torn by a crash, foreign), a dict :meth:`flush` sets aside."""
        import uuid

        try:
            fd = os.open(self._spool, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        ops = []
        with os.fdopen(fd, "rb") as fh:
            for raw in filter(bytes.strip, fh):
                try:
                    op = json.loads(raw)
                except ValueError:
                    op = None
                if not isinstance(op, dict) or not isinstance(op.get("uid"), str):
                    op = {"op": "unreadable", "line": boundary.text(raw, 4096), "uid": uuid.uuid4().hex}
                ops.append(op)
        return ops

    def _spool_append(self, op: dict) -> None:
        """Append one write to the spool (fsync'd). Raises OSError, the file left as it was (a
        line cut short by a full disk is cut off again)."""
        data = (json.dumps(op) + "\n").encode()
        with self._spool_lock():
            fd = os.open(self._spool, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         self._mode)
            try:
                size = os.fstat(fd).st_size
                try:
                    if os.write(fd, data) != len(data):
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    os.fsync(fd)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, size)
                    raise
            finally:
                os.close(fd)
        _secure_path(self._spool, self._mode, self._gid, create=False)

    def _overlay(self, table: str, match) -> list[dict]:
        """This connection's waiting writes to ``table`` whose op satisfies ``match``."""
        return [op for op in self._pending if op["table"] == table and match(op)]

    # -- dead letters ------------------------------------------------------------------------
    def dead_letters(self, limit: int = 100) -> list[dict]:
        """Spooled writes the database refused and :meth:`flush` set aside, newest first:
        ``[{id, created, op, error}]`` (``op``: the write as JSON text). [] for a journal from
        before dead letters existed."""
        if "dead_letters" not in self._guard(self.db.table_names):
            return []
        return self._rows("SELECT * FROM dead_letters ORDER BY id DESC LIMIT ?", [int(limit)])

    def dead_letter_count(self) -> int:
        """How many writes have been set aside (``slurm-ft doctor`` warns when any have)."""
        if "dead_letters" not in self._guard(self.db.table_names):
            return 0
        return self._guard(lambda: self.db.execute("SELECT count(*) FROM dead_letters").fetchone()[0])

    # -- jobs --------------------------------------------------------------------------
    def upsert_job(self, job_id: int, **fields: Any) -> None:
        now = self.clock()
        self._write({"op": "upsert", "table": "jobs", "row": {"job_id": job_id, "updated": now, **fields},
                     "first": {"created": now}})

    def job(self, job_id: int) -> dict | None:
        rows = self._rows("SELECT * FROM jobs WHERE job_id = ?", [job_id])
        row = rows[0] if rows else None
        for op in self._overlay("jobs", lambda o: o["row"]["job_id"] == job_id):
            base = row if row is not None else {c: None for c in COLUMNS["jobs"]} | op.get("first", {})
            row = {**base, **op["row"]}
        return row

    def set_ft_state(self, job_id: int, state: str) -> None:
        self.upsert_job(job_id, ft_state=state)

    # -- attempts ------------------------------------------------------------------------
    def upsert_attempt(self, job_id: int, attempt: int, **fields: Any) -> None:
        row = {"job_id": job_id, "attempt": attempt, "updated": self.clock(),
               **{k: v for k, v in fields.items() if v is not None}}
        self._write({"op": "upsert", "table": "attempts", "row": row})

    def close_attempts_before(self, job_id: int, attempt: int) -> None:
        """Attempts before ``attempt`` still open (the daemon never saw them end: a lost node, a
        requeue by Slurm or an admin) are closed as REQUEUED, now."""
        if not any(a["attempt"] < attempt and a.get("end") is None for a in self.attempts(job_id)):
            return
        self._write({"op": "close_before", "table": "attempts", "job_id": job_id, "attempt": attempt,
                     "t": self.clock()})

    def attempts(self, job_id: int) -> list[dict]:
        rows = {r["attempt"]: r for r in self._rows("SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt",
                                                     [job_id])}
        for op in self._pending:
            if op["table"] != "attempts":
                continue
            if op["op"] == "upsert" and op["row"]["job_id"] == job_id:
                a = op["row"]["attempt"]
                rows[a] = {**(rows.get(a) or {c: None for c in COLUMNS["attempts"]}), **op["row"]}
            elif op["op"] == "close_before" and op["job_id"] == job_id:
                for a, r in rows.items():
                    if a < op["attempt"] and r.get("end") is None:
                        rows[a] = {**r, "end": op["t"], "state": "REQUEUED", "updated": op["t"]}
        return [rows[a] for a in sorted(rows)]

    # -- verdicts ------------------------------------------------------------------------
    def add_verdict(self, job_id: int, attempt: int, node: str, verdict: str, rule: str,
                    xids: Iterable[dict] = (), evidence: Iterable[str] = (), action: str = "none",
                    exit_code: int | None = None, source: str = "epilog", created: float | None = None,
                    uid: int | None = None) -> bool:
        """Record one node's verdict for one attempt. Returns False if it was already recorded.
        ``uid``: the job's owner as slurmd gave the epilog (``SLURM_JOB_UID``), None if unknown."""
        clean_node = boundary.value(node)
        if any(v["node"] == clean_node for v in self.verdicts(job_id, attempt)):
            return False
        row = {"job_id": job_id, "attempt": attempt, "node": node, "verdict": verdict, "rule": rule,
               "xids": list(xids), "evidence": list(evidence), "action": action,
               "exit_code": exit_code, "source": source, "created": created or self.clock()}
        if uid is not None:
            row["uid"] = uid
        self._write({"op": "insert_ignore", "table": "verdicts", "row": row})
        return True

    def add_node_verdict(self, v, uid: int | None = None) -> bool:
        """Record a :class:`slurm_ft.failover.verdict.NodeVerdict` (the one typed verdict);
        ``uid``: the job's owner (:meth:`add_verdict`)."""
        return self.add_verdict(v.job_id, v.attempt, v.node, v.verdict, v.rule,
                                [{"xid": x, "bus_id": b or None} for x, b in v.xids], list(v.evidence), v.action,
                                v.exit_code, source=v.source, created=v.time, uid=uid)

    def node_verdicts(self, job_id: int, attempt: int | None = None) -> list:
        """The verdicts of a job (one attempt) as :class:`~slurm_ft.failover.verdict.NodeVerdict`."""
        from slurm_ft.failover.verdict import NodeVerdict
        return [NodeVerdict.from_row(r) for r in self.verdicts(job_id, attempt)]

    def verdicts(self, job_id: int, attempt: int | None = None) -> list[dict]:
        sql = "SELECT * FROM verdicts WHERE job_id = ?"
        args: list[Any] = [job_id]
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        rows = self._rows(sql + " ORDER BY attempt, node", args)
        pending = [dict(op["row"]) for op in self._overlay(
            "verdicts", lambda o: o["row"]["job_id"] == job_id and (attempt is None or o["row"]["attempt"] == attempt))]
        if pending:
            have = {(r["attempt"], r["node"]) for r in rows}
            rows += [r for r in pending if (r["attempt"], r["node"]) not in have]
            rows.sort(key=lambda r: (r["attempt"], r["node"]))
        for r in rows:
            r["xids"], r["evidence"] = _json_list(r["xids"]), _json_list(r["evidence"])
        return rows

    def recent_xid_verdicts(self, since: float, *, limit: int = 1000, scan: int = 10000) -> list[dict]:
        """Verdicts recorded at or after ``since`` (epoch seconds) that hold Xids, newest first:
        ``[{job_id, attempt, node, created, xids}]`` (``xids`` decoded).  Bounded for the epilog:
        only the ``scan`` newest verdict rows (a range of the integer primary key) are looked at
        and at most ``limit`` are returned."""
        sql = ("SELECT job_id, attempt, node, created, xids FROM verdicts"
               " WHERE id > (SELECT COALESCE(MAX(id), 0) FROM verdicts) - ? AND created >= ?"
               " AND xids IS NOT NULL AND xids NOT IN ('', '[]') ORDER BY id DESC LIMIT ?")
        rows = self._rows(sql, [int(scan), float(since), int(limit)])
        for r in rows:
            r["xids"] = _json_list(r["xids"])
        return rows

    def drain_verdicts(self, since: float, *, scan: int = 10000) -> list[dict]:
        """Hardware verdicts whose node drained itself (action ``drain_node``: the epilog drains
        before it posts) recorded at or after ``since`` (epoch seconds), oldest first:
        ``[{job_id, attempt, node, created, rule, xids}]`` (``xids`` decoded). Bounded like
        :meth:`recent_xid_verdicts` (the ``scan`` newest rows); for the daemon's reconciliation,
        which puts back the drains a slurmctld state rollback lost (slurm_ft.failover.reconcile)."""
        sql = ("SELECT job_id, attempt, node, created, rule, xids FROM verdicts"
               " WHERE id > (SELECT COALESCE(MAX(id), 0) FROM verdicts) - ? AND created >= ?"
               " AND verdict = 'hardware' AND action = 'drain_node' ORDER BY created, id")
        rows = self._rows(sql, [int(scan), float(since)])
        for r in rows:
            r["xids"] = _json_list(r["xids"])
        return rows

    def recent_rule_verdicts(self, since: float, rules: Iterable[str], *, limit: int = 1000,
                             scan: int = 10000) -> list[dict]:
        """Verdicts recorded at or after ``since`` (epoch seconds) whose ``rule`` is one of
        ``rules`` (exact ids, e.g. ``segfault`` or ``unverified:segfault``), newest first:
        ``[{job_id, attempt, created, rule, uid}]`` (``uid`` None where unknown).  Bounded like
        :meth:`recent_xid_verdicts` (the ``scan`` newest rows, at most ``limit`` returned); for the
        epilog's recurrence rule (slurm_ft.classify.recurrence)."""
        sql = ("SELECT job_id, attempt, created, rule, uid FROM verdicts"
               " WHERE id > (SELECT COALESCE(MAX(id), 0) FROM verdicts) - ? AND created >= ?"
               " AND rule IN (SELECT value FROM json_each(?)) ORDER BY id DESC LIMIT ?")
        return self._rows(sql, [int(scan), float(since), json.dumps(sorted(set(rules))), int(limit)])

    # -- actions -------------------------------------------------------------------------
    def intend(self, job_id: int, attempt: int, action: str, target: str = "", detail: str = "", *,
               kind: str | None = None, restart: int | None = None, restart_of: int | None = None) -> int:
        """Record an action about to be taken (status 'intent'); returns its id (a negative,
        temporary one while the row waits in the spool; :meth:`finish` takes either).
        ``kind``, ``restart``, ``restart_of``: the row's typed columns, given by the writers of
        the actions that have them (:data:`migrations.TYPED_ACTIONS`: a ``failover``'s kind, an
        ``inplace-restart``'s K of M); a None is not written.

        The row carries a unique ``uid`` (a fresh UUID): an update of a row still in the spool
        finds it by that, whichever process applies the insert (by row id it could not: the id
        exists only once some process has applied the insert, and that process may be another).
        Raises :class:`JournalError`."""
        op = {"op": "insert", "table": "actions", "row": {
            "job_id": job_id, "attempt": attempt, "action": action, "target": target, "detail": detail,
            "status": "intent", "created": self.clock(),
            **{k: v for k, v in (("kind", kind), ("restart", restart), ("restart_of", restart_of)) if v is not None}}}
        op["tmp"] = tmp = self._next_tmp     # its id while it waits in the spool
        rowid = self._write(op)
        if rowid is None:
            self._next_tmp -= 1
            self._uids[tmp] = op["uid"]
            return tmp
        return rowid

    def finish(self, action_id: int, status: str = "done", detail: str | None = None) -> None:
        """Set the status (``done``, ``failed``, ``skipped``...) of action ``action_id`` (from
        :meth:`intend`, or a row's ``id``): a temporary id updates the row by its ``uid``, a row
        id by the row's own primary key. Raises :class:`JournalError`."""
        fields: dict[str, Any] = {"status": status, "finished": self.clock()}
        if detail is not None:
            fields["detail"] = detail
        op: dict[str, Any] = {"op": "update", "table": "actions", "fields": fields}
        if action_id in self._uids:
            op["ref"] = self._uids[action_id]
        else:
            op["id"] = boundary.value(action_id)
        self._write(op)

    def record(self, job_id: int, attempt: int, action: str, target: str = "", detail: str = "",
               status: str = "done", *, kind: str | None = None, restart: int | None = None,
               restart_of: int | None = None) -> int:
        """Record an action already taken (or decided) in one step (typed columns: :meth:`intend`)."""
        aid = self.intend(job_id, attempt, action, target, detail, kind=kind, restart=restart, restart_of=restart_of)
        self.finish(aid, status)
        return aid

    def _pending_actions(self, match) -> tuple[list[dict], list[dict]]:
        """(rows spooled by this connection that satisfy ``match``, spooled updates)."""
        rows, updates = [], []
        for op in self._pending:
            if op["table"] != "actions":
                continue
            if op["op"] == "insert" and match(op["row"]):
                rows.append({"id": op.get("tmp", 0), "finished": None, **op["row"]})
            elif op["op"] == "update":
                updates.append(op)
        return rows, updates

    def _with_pending(self, rows: list[dict], match) -> list[dict]:
        if not self._pending:
            return rows
        extra, updates = self._pending_actions(match)
        by_uid = {r["uid"]: r for r in rows + extra if r.get("uid")}
        by_id = {r["id"]: r for r in rows}
        for op in updates:
            target = by_uid.get(op["ref"]) if op.get("ref") else by_id.get(op.get("id"))
            if target is not None:
                target.update(op["fields"])
        have = {r.get("uid") for r in rows}
        return rows + [r for r in extra if r["uid"] not in have]

    @staticmethod
    def _typed(rows: list[dict]) -> list[dict]:
        """``rows`` (action rows, changed in place) with every typed column present; those of a
        row written without them (by a writer that gave none: an older version's spool line
        applied after migration 011) read from its text as the migration filled old rows
        (:func:`migrations.typed_from_text`)."""
        for r in rows:
            cols = migrations.TYPED_ACTIONS.get(r["action"], ())
            if cols and all(r.get(c) is None for c in cols):
                r.update(migrations.typed_from_text(r["action"], r.get("detail")))
            for c in ("kind", "restart", "restart_of"):
                r.setdefault(c, None)
        return rows

    def actions(self, job_id: int, attempt: int | None = None) -> list[dict]:
        sql = "SELECT * FROM actions WHERE job_id = ?"
        args: list[Any] = [job_id]
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        rows = self._rows(sql + " ORDER BY id", args)
        return self._typed(self._with_pending(rows, lambda r: r["job_id"] == job_id
                                              and (attempt is None or r["attempt"] == attempt)))

    def actions_named(self, names: Iterable[str], since: float = 0.0) -> list[dict]:
        """Every job's actions whose name is in ``names`` created at or after ``since`` (epoch
        seconds), oldest first, this connection's spooled rows included (slurm_ft.failover.reconcile)."""
        names = sorted(set(names))
        rows = self._rows(f"SELECT * FROM actions WHERE action IN ({', '.join('?' * len(names))}) AND created >= ? "
                          "ORDER BY id", [*names, float(since)])
        return self._typed(self._with_pending(rows, lambda r: r["action"] in names and (r["created"] or 0) >= since))

    def active_ft_jobs(self) -> set[int]:
        """ft-enabled jobs on record whose ft state is not final (the daemon watches them)."""
        from slurm_ft.failover import policy

        finals = sorted(policy.FINAL_STATES)
        rows = self._guard(lambda: self.db.execute(
            f"SELECT job_id FROM jobs WHERE ft_enabled = 1 AND (ft_state IS NULL OR ft_state NOT IN "
            f"({', '.join('?' * len(finals))}))", finals).fetchall())
        return {r[0] for r in rows}

    def failovers_done(self, job_id: int) -> int:
        """Failovers spent from the job's retry budget (``failover`` actions done)."""
        return sum(1 for a in self.actions(job_id) if a["action"] == "failover" and a["status"] == "done")

    def pending_intents(self) -> list[dict]:
        rows = self._rows("SELECT * FROM actions WHERE status = 'intent' ORDER BY id")
        rows = self._with_pending(rows, lambda r: True)
        return [r for r in rows if r["status"] == "intent"]

    def boosted_jobs(self) -> set[int]:
        """Jobs whose priority slurm-ft raised (a failover's ``update`` with ``Priority=``, or a
        prolog-refusal ``release``): they never count as "the highest waiting job" again, so
        boosts do not ratchet."""
        rows = self._guard(lambda: self.db.execute(
            "SELECT DISTINCT job_id FROM actions WHERE (action = 'update' AND detail LIKE "
            "'%Priority=%') OR action = 'release'").fetchall())
        extra, _ = self._pending_actions(lambda r: (r["action"] == "update" and "Priority=" in (r["detail"] or ""))
                                         or r["action"] == "release")
        return {r[0] for r in rows} | {r["job_id"] for r in extra}

    def breaker_latched(self) -> str | None:
        """When the circuit breaker opened (the detail of the newest ``breaker-open`` action not
        followed by a ``breaker-reset``), or None when it is closed."""
        row = self._guard(lambda: self.db.execute(
            "SELECT action, detail, created FROM actions WHERE action IN "
            "('breaker-open', 'breaker-reset') ORDER BY id DESC LIMIT 1").fetchone())
        extra, _ = self._pending_actions(lambda r: r["action"] in ("breaker-open", "breaker-reset"))
        if extra:
            row = (extra[-1]["action"], extra[-1]["detail"], extra[-1]["created"])
        if row is None or row[0] != "breaker-open":
            return None
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(row[2] or 0))

    # -- health ----------------------------------------------------------------------------
    def add_health(self, node: str, results: Iterable[dict], job_id: int | None = None) -> None:
        now = self.clock()
        for r in results:
            self._write({"op": "insert", "table": "health", "row": {
                "node": node, "job_id": job_id, "check_name": r.get("check"), "status": r.get("status"),
                "gpu": r.get("gpu"), "measurement": r.get("measurement"),
                "value": None if r.get("value") is None else str(r.get("value")),
                "detail": r.get("detail", ""), "created": now}})

    # -- mailbox bookkeeping (daemon side) -------------------------------------------------
    def mailbox_seen(self, node: str, key: str) -> bool:
        node, key = boundary.value(node), boundary.value(key)
        if self._overlay("mailbox_seen", lambda o: o["row"]["node"] == node and o["row"]["key"] == key):
            return True
        return bool(self._rows("SELECT 1 FROM mailbox_seen WHERE node = ? AND key = ?", [node, key]))

    def mark_mailbox_seen(self, node: str, key: str) -> None:
        self._write({"op": "insert_ignore", "table": "mailbox_seen", "row": {"node": node, "key": key,
                                                                             "seen": self.clock()}})
