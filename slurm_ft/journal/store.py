"""Typed read/write helpers over the journal database."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable

import sqlite_utils

from ..errors import JournalError
from . import migrations


def open_journal(path: str | os.PathLike, *, readonly: bool = False) -> "Journal":
    """Open (creating and migrating if needed) the journal at ``path``; with ``readonly`` (readers
    such as ft-history and the report) open an existing journal without writing anything.

    Raises :class:`JournalError` if the file is missing (readonly), not a SQLite database, not a
    slurm-ft journal, corrupted, or written by a newer slurm-ft (unknown migrations).
    """
    return Journal(path, readonly=readonly)


class Journal:
    def __init__(self, path: str | os.PathLike, *, readonly: bool = False):
        self.path = Path(path)
        if readonly and not self.path.is_file():
            raise JournalError(f"{self.path}: no journal here (check [journal] path or --journal)")
        try:
            if readonly:
                conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0,
                                       isolation_level=None)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(str(self.path), timeout=10.0, isolation_level=None)
            self.db = sqlite_utils.Database(conn)
            conn.execute("PRAGMA busy_timeout = 10000")
            if not readonly:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self.db.enable_wal()
                migrations.apply(self.db)
            elif "_migrations" not in self.db.table_names():
                raise JournalError(f"{self.path}: not a slurm-ft journal")
            newer = {r[0] for r in conn.execute("SELECT name FROM _migrations")} - migrations.known()
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{self.path}: cannot open journal ({exc}); if it is corrupted, move it "
                               f"aside and slurm-ft will start a new one") from None
        except OSError as exc:
            raise JournalError(f"{self.path}: cannot open journal: {exc.strerror}") from None
        if newer:
            raise JournalError(f"{self.path}: written by a newer slurm-ft (migrations {sorted(newer)})")

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
