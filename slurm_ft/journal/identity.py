"""Job identity across job-id reuse: which incarnation of a job id a Slurm job record is.

Slurm hands a job id out again once the old job is purged (after a slurmctld state loss, or
when the id sequence wraps at ``MaxJobId``; seen on the lab, 22.05). The journal keys its rows on
the job id; without this module a new job with an old id would inherit the old job's attempts, verdicts
and spent retry budget (issue 20, item 2).

**The identity of a job** is its job id plus the ``(restart count, SubmitTime)`` pairs Slurm
showed for it, kept in ``job_identity.seen`` (migration ``004_job_identity``). Both values are
set by slurmctld and by nothing a user can edit (a comment, a name, a ``BeginTime``), so a user
can neither make their job look new (and reset its retry budget) nor merge it into another one.
Slurm gives a job a new SubmitTime on every requeue and counts the requeue in ``Restarts``
(checked on 22.05), so a record continues the same job when (:func:`same_job`):

- its SubmitTime is one seen before for this id (the same attempt, or one a slurmctld state
  rollback brought back), or
- its restart count is higher than any seen (a requeue: new SubmitTime, one more restart), or
- it is a later attempt (restart count above 0) never seen: a requeue after a state rollback.

A **new job** is a first attempt (restart count 0) with a SubmitTime never seen, later than the
first one seen: the old rows are *retired* (:func:`retire`), never merged. A journal from before
identity existed is judged by when it first recorded the id (:func:`_legacy_new`). Known limit:
a new job Slurm requeued before the daemon first saw it continues the old record.

Retiring moves every row of the old job (``jobs``, ``attempts``, ``verdicts``, ``actions``,
``health``) to a negative key, records it in ``retired_jobs`` (``ft-history -j ID`` shows it
beside the new one, as "an earlier job with this id"), books an unfinished old job ``lost``,
sets its unfinished intents aside (``skipped``) and journals a ``retire`` action, all in one
transaction. Array tasks (``ArrayJobId``/``ArrayTaskId``) are recorded here too, for
``ft-history``'s ``50_2`` notation (slurm_ft.history.query).

Raises :class:`slurm_ft.errors.JournalError` only (the daemon retries the job later).
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from typing import Any

from slurm_ft.errors import JournalError

#: Tables whose rows belong to one job incarnation (``job_id`` column), moved together on retirement.
JOB_TABLES = ("jobs", "attempts", "verdicts", "actions", "health")
#: (restart count, SubmitTime) pairs kept per job (a job requeued more often keeps its newest).
MAX_SEEN = 64
#: The action journaled on a retired record.
RETIRE_ACTION = "retire"


def same_job(seen: list[tuple[int, float]], restarts: int, submit: float | None) -> bool:
    """True when a Slurm record with ``restarts`` (``Restarts``) and ``submit`` (SubmitTime,
    epoch seconds; None: unknown) continues the job that showed the ``seen`` pairs (see the
    module doc). A new job is a first attempt (restart count 0) submitted after the first
    SubmitTime seen and never seen itself; a later attempt never seen (a requeue after a
    slurmctld state rollback, by Slurm, an admin or slurm-ft) continues the job. Never raises."""
    if not seen or submit is None or any(s == submit for _, s in seen):
        return True
    if restarts > max(r for r, _ in seen):
        return True
    return not (restarts == 0 and submit > min(s for _, s in seen))


def _seen(text: Any) -> list[tuple[int, float]]:
    """``job_identity.seen`` as pairs; [] for NULL or anything another tool wrote that is not one."""
    try:
        raw = json.loads(text or "[]")
    except (TypeError, ValueError):
        return []
    out = []
    for item in raw if isinstance(raw, list) else []:
        if (isinstance(item, list) and len(item) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                               for v in item)):
            out.append((int(item[0]), float(item[1])))
    return out


def _guard(journal, fn):
    try:
        return fn()
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"{journal.path}: {exc}") from None


def _has_record(conn, job_id: int) -> bool:
    return any(conn.execute(f"SELECT 1 FROM {t} WHERE job_id = ? LIMIT 1", [job_id]).fetchone()
               for t in ("jobs", "attempts", "verdicts", "actions"))


def _legacy_new(conn, job_id: int, restarts: int, submit: float | None) -> bool:
    """A record without an identity row (written before identity existed) belongs to another job
    when Slurm's record is a first attempt submitted after slurm-ft first recorded anything of
    the id (by more than a second of rounding): the job's own first attempt was submitted before."""
    if submit is None or restarts != 0:
        return False
    first = conn.execute(
        "SELECT MIN(t) FROM (SELECT MIN(created) AS t FROM jobs WHERE job_id = ?1 UNION ALL SELECT MIN(created) "
        "FROM verdicts WHERE job_id = ?1 UNION ALL SELECT MIN(created) FROM actions WHERE job_id = ?1 "
        "UNION ALL SELECT MIN(start) FROM attempts WHERE job_id = ?1)", [job_id]).fetchone()[0]
    return first is not None and submit > first + 1.0


def observe(journal, job) -> int | None:
    """Check ``job`` (a :class:`slurm_ft.slurm.Job` read from Slurm now) against the journal's
    record of its id, before anything reads that record: the first sight of an id records its
    identity; a new job with a used id retires the old record. Returns the retired record's
    key (negative), or None. Raises :class:`JournalError` (the journal failing, or locked when a
    record must be retired: the caller retries the job later and must not act on it meanwhile).
    A journal merely locked by another process never delays a job otherwise: the identity row
    waits in the journal's spool like any other write (slurm_ft.journal.store)."""
    submit = float(job.submit_time) if job.submit_time else None
    pair = (int(job.restart_count), submit)
    conn = journal.db.conn
    row = _identity_row(journal, job.job_id)
    array = (job.array_job_id, job.array_task_id)
    if row is None:
        if _guard(journal, lambda: _has_record(conn, job.job_id)) and \
                _guard(journal, lambda: _legacy_new(conn, job.job_id, *pair)):
            return retire(journal, job, [], "its journal record predates identity checks, and Slurm's "
                                            f"job was submitted {_when(submit)}, after it")
        _save(journal, job.job_id, array, [pair] if submit is not None else [])
        return None
    seen = _seen(row.get("seen"))
    if same_job(seen, *pair):
        if (submit is not None and pair not in seen) or (row.get("array_job_id"), row.get("array_task_id")) != array:
            _save(journal, job.job_id, array, (seen + [pair] if submit is not None and pair not in seen
                                               else seen)[-MAX_SEEN:])
        return None
    return retire(journal, job, seen, f"job id {job.job_id} reused: a new job submitted "
                                      f"{_when(submit)} (restart count {pair[0]})")


def observe_node(journal, job_id: int, attempt: int, start: float | None, array=(None, None)) -> int | None:
    """The node side (a compute node's own journal, its epilog): before filing a verdict for
    ``(job_id, attempt)`` that started here at ``start`` (slurm_ft.node.job.node_key: slurmd's
    ``SLURM_JOB_START_TIME`` or the prolog's root-written marker, nothing the job sets), retire
    the rows of an earlier job with the same id (:func:`retire`), so the new job's verdict is
    neither dropped as already recorded nor merged into the old job's, and the old job's Xids stay
    this node's history. An earlier job is one whose rows were recorded before this first attempt
    started (by more than a second): the rule of :func:`_legacy_new`, on rows only (one indexed
    query, no write, when nothing is retired). A later attempt, or an unknown start, continues the
    record. Returns the retired record's key, or None. Raises :class:`JournalError`."""
    if start is None or attempt != 0:
        return None
    conn = journal.db.conn
    if not _guard(journal, lambda: _legacy_new(conn, job_id, 0, start)):
        return None
    from types import SimpleNamespace
    job = SimpleNamespace(job_id=job_id, restart_count=0, submit_time=start, array_job_id=array[0],
                          array_task_id=array[1])
    return retire(journal, job, [], f"job id {job_id} reused on this node: a new job started {_when(start)}, "
                                    f"after this record began")


def continued(journal, job) -> None:
    """Record Slurm's current (restart count, SubmitTime) of ``job`` as its own: a requeue slurm-ft
    redid after a slurmctld state rollback (slurm_ft.failover.reconcile) gives the job a new
    SubmitTime at a restart count seen before. Raises :class:`JournalError`."""
    if not job.submit_time:
        return
    row = _identity_row(journal, job.job_id) or {}
    seen, pair = _seen(row.get("seen")), (int(job.restart_count), float(job.submit_time))
    if pair not in seen:
        _save(journal, job.job_id, (job.array_job_id, job.array_task_id), (seen + [pair])[-MAX_SEEN:])


def _identity_row(journal, job_id: int) -> dict | None:
    """The ``job_identity`` row of ``job_id``, this connection's spooled writes included."""
    conn = journal.db.conn
    found = _guard(journal, lambda: conn.execute(
        "SELECT seen, array_job_id, array_task_id FROM job_identity WHERE job_id = ?", [job_id]).fetchone())
    row = dict(zip(("seen", "array_job_id", "array_task_id"), found)) if found else None
    for op in journal._overlay("job_identity", lambda o: o["row"]["job_id"] == job_id):
        row = {**(row or {}), **op["row"]}
    return row


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "at an unknown time"


def _save(journal, job_id: int, array: tuple, seen: list) -> None:
    """Write the identity row (through the journal's spool when it is locked). Raises
    :class:`JournalError`."""
    now = journal.clock()
    journal._write({"op": "upsert", "table": "job_identity", "first": {"first_seen": now},
                    "row": {"job_id": job_id, "array_job_id": array[0], "array_task_id": array[1],
                            "seen": json.dumps(seen), "updated": now}})


def retire(journal, job, seen: list, reason: str) -> int:
    """Move every journal row of ``job.job_id`` to a new negative key and start the id afresh
    for ``job`` (see the module doc); returns that key. Writes the spool first (the old rows
    must all be in the database). Raises :class:`JournalError`."""
    from slurm_ft.failover import policy

    if not journal.flush():
        raise JournalError(f"{journal.path}: locked by another process; job {job.job_id} (a reused id) is "
                           f"looked at again later")
    conn, now, jid = journal.db.conn, journal.clock(), job.job_id
    submit = float(job.submit_time) if job.submit_time else None
    finals = sorted(policy.FINAL_STATES)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            old = conn.execute("SELECT array_job_id, array_task_id FROM job_identity WHERE job_id = ?",
                               [jid]).fetchone() or (None, None)
            key = conn.execute("SELECT COALESCE(MIN(key), 0) - 1 FROM retired_jobs").fetchone()[0]
            attempt = conn.execute("SELECT COALESCE(MAX(attempt), 0) FROM attempts WHERE job_id = ?",
                                   [jid]).fetchone()[0]
            for table in JOB_TABLES:
                conn.execute(f"UPDATE {table} SET job_id = ? WHERE job_id = ?", [key, jid])
            conn.execute(f"UPDATE jobs SET ft_state = ?, updated = ? WHERE job_id = ? AND (ft_state IS NULL OR "
                         f"ft_state NOT IN ({', '.join('?' * len(finals))}))", [policy.LOST, now, key, *finals])
            conn.execute("UPDATE actions SET status = 'skipped', finished = ? WHERE job_id = ? AND status = 'intent'",
                         [now, key])
            conn.execute("INSERT INTO actions (job_id, attempt, action, target, detail, status, created, finished, "
                         "uid) VALUES (?, ?, ?, '', ?, 'done', ?, ?, ?)",
                         [key, attempt, RETIRE_ACTION, reason[:1024], now, now, uuid.uuid4().hex])
            # node mailbox records are keyed "JOB.ATTEMPT": the new job's own must be read
            conn.execute("DELETE FROM mailbox_seen WHERE substr(key, 1, ?) = ?", [len(f"{jid}."), f"{jid}."])
            conn.execute("INSERT INTO retired_jobs (key, job_id, array_job_id, array_task_id, seen, retired, reason) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [key, jid, old[0], old[1], json.dumps(seen), now, reason[:1024]])
            conn.execute("INSERT OR REPLACE INTO job_identity (job_id, array_job_id, array_task_id, seen, first_seen, "
                         "updated) VALUES (?, ?, ?, ?, ?, ?)",
                         [jid, job.array_job_id, job.array_task_id,
                          json.dumps([(int(job.restart_count), submit)] if submit is not None else []), now, now])
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"{journal.path}: cannot retire the record of job {jid}: {exc}") from None
    return key


def record_for(journal, job_id: int, when: float | None) -> int:
    """The record a node verdict about ``job_id`` concluded at ``when`` (epoch seconds) belongs
    to: the current job of that id, unless it was concluded before that job was submitted (a
    late post of an earlier job with the id): then the retired record of the job submitted last
    before ``when``. Raises :class:`JournalError`."""
    row = _identity_row(journal, job_id)
    seen = _seen(row.get("seen")) if row else []
    if not when or not seen or when >= min(s for _, s in seen) - 1.0:
        return job_id
    olds = _guard(journal, lambda: journal.db.conn.execute(
        "SELECT key, seen FROM retired_jobs WHERE job_id = ? ORDER BY key", [job_id]).fetchall())
    best = [(min(s for _, s in _seen(text)), key) for key, text in olds if _seen(text)]
    best = [(first, key) for first, key in best if first - 1.0 <= when]
    return max(best)[1] if best else job_id


# ------------------------------------------------------------------------------ readers
def arrays(journal) -> dict[int, tuple[int, int]]:
    """record key (a job id, or a retired record's negative key) -> (ArrayJobId, ArrayTaskId),
    for the array tasks on record. {} for a journal from before identity existed."""
    conn = journal.db.conn
    if not _tables(conn):
        return {}
    out = {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT job_id, array_job_id, array_task_id FROM job_identity WHERE array_job_id IS NOT NULL "
        "AND array_task_id IS NOT NULL")}
    out.update({r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT key, array_job_id, array_task_id FROM retired_jobs WHERE array_job_id IS NOT NULL "
        "AND array_task_id IS NOT NULL")})
    return out


def retired(journal) -> dict[int, dict]:
    """Retired records: negative key -> ``{key, job_id, array_job_id, array_task_id, retired, reason}``."""
    conn = journal.db.conn
    if not _tables(conn):
        return {}
    cols = ("key", "job_id", "array_job_id", "array_task_id", "retired", "reason")
    return {r[0]: dict(zip(cols, r)) for r in conn.execute(f"SELECT {', '.join(cols)} FROM retired_jobs")}


def _tables(conn) -> bool:
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return {"job_identity", "retired_jobs"} <= names
