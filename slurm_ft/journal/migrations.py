"""Schema migrations: applied in order, one transaction each, recorded in ``_migrations``.

Never edit a migration that has shipped; add a new one.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sqlite_utils


def m001_initial(db: sqlite_utils.Database) -> None:
    db["jobs"].create({
        "job_id": int, "name": str, "user": str, "ft_enabled": int, "retries": int,
        "ft_state": str, "excluded_nodes": str, "created": float, "updated": float,
    }, pk="job_id")
    db["attempts"].create({
        "job_id": int, "attempt": int, "nodes": str, "start": float, "end": float,
        "exit_code": int, "signal": int, "state": str, "updated": float,
    }, pk=("job_id", "attempt"))
    db["verdicts"].create({
        "id": int, "job_id": int, "attempt": int, "node": str, "verdict": str, "rule": str,
        "xids": str, "evidence": str, "action": str, "exit_code": int, "source": str, "created": float,
    }, pk="id")
    db["verdicts"].create_index(["job_id", "attempt", "node"], unique=True)
    db["actions"].create({
        "id": int, "job_id": int, "attempt": int, "action": str, "target": str, "detail": str,
        "status": str, "created": float, "finished": float,
    }, pk="id")
    db["actions"].create_index(["job_id", "attempt"])
    db["health"].create({
        "id": int, "node": str, "job_id": int, "check_name": str, "status": str, "gpu": int,
        "measurement": str, "value": str, "detail": str, "created": float,
    }, pk="id")
    db["health"].create_index(["node", "created"])
    db["mailbox_seen"].create({"node": str, "key": str, "seen": float}, pk=("node", "key"))


def m002_ft_options(db: sqlite_utils.Database) -> None:
    """``jobs.ft_options``: the job's ft options as fixed at submit (canonical token), recorded
    once and used for the job's whole life (docs/security.md: never re-read the live comment)."""
    db["jobs"].add_column("ft_options", str)


def m003_action_uid_dead_letters(db: sqlite_utils.Database) -> None:
    """``actions.uid``: the unique id a writer gives an action when it intends it; an update
    (:meth:`Journal.finish`) finds its row by it, whichever process applied the insert.
    ``dead_letters``: spooled writes the database refused, set aside (never retried) and reported
    by ``slurm-ft doctor``: ``op`` is the write as JSON, ``error`` why it was refused."""
    db["actions"].add_column("uid", str)
    db["actions"].create_index(["uid"], index_name="actions_uid", unique=True)
    db["dead_letters"].create({"id": int, "created": float, "op": str, "error": str}, pk="id")


def m004_job_identity(db: sqlite_utils.Database) -> None:
    """Job identity across job-id reuse (slurm_ft.journal.identity). ``job_identity``: the
    incarnation of each job id the journal's rows (``jobs``, ``attempts``, ``verdicts``,
    ``actions``, ``health``) now belong to: its array ids and the (restart count, SubmitTime)
    pairs Slurm showed for it (``seen``, JSON). ``retired_jobs``: earlier jobs that had the same
    id; their rows carry the negative ``key`` as their ``job_id``."""
    db["job_identity"].create({
        "job_id": int, "array_job_id": int, "array_task_id": int, "seen": str, "first_seen": float,
        "updated": float,
    }, pk="job_id")
    db["retired_jobs"].create({
        "key": int, "job_id": int, "array_job_id": int, "array_task_id": int, "seen": str, "retired": float,
        "reason": str,
    }, pk="key")
    db["retired_jobs"].create_index(["job_id"])
    db["job_identity"].create_index(["array_job_id", "array_task_id"])


def m005_time_indexes(db: sqlite_utils.Database) -> None:
    """Indexes on the times ``ft-history``'s window and the drain report read (slurm_ft.history.query
    ``_candidates``, slurm_ft.report): each table's "last time" expression exactly as the queries
    write it, so a window over a journal of 1,000,000 attempts reads only its own rows
    (benchmarks/history_scale.py)."""
    conn = db.conn
    conn.execute('CREATE INDEX IF NOT EXISTS attempts_last ON attempts (COALESCE("end", start, updated))')
    conn.execute("CREATE INDEX IF NOT EXISTS verdicts_created ON verdicts (created)")
    conn.execute("CREATE INDEX IF NOT EXISTS actions_last ON actions (COALESCE(finished, created))")
    conn.execute("CREATE INDEX IF NOT EXISTS jobs_updated ON jobs (updated)")
    conn.execute("CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created)")
    conn.execute("CREATE INDEX IF NOT EXISTS jobs_ft_state ON jobs (ft_state)")
    conn.execute("CREATE INDEX IF NOT EXISTS jobs_user ON jobs (user)")


def m006_job_account(db: sqlite_utils.Database) -> None:
    """``jobs.account``: the job's Slurm account (``Account=`` of ``scontrol show job``,
    ``account`` of ``squeue --json``: set by slurmctld at submit), recorded with the job's name and
    user when slurm-ft first records the job (``ft-history -A``, field ``Account``); NULL for a job
    recorded before. Index ``jobs_account`` for ``ft-history -A`` (ASCII case-insensitive, as
    ``-A`` matches: Slurm keeps account names in lower case)."""
    db["jobs"].add_column("account", str)
    db.conn.execute("CREATE INDEX IF NOT EXISTS jobs_account ON jobs (account COLLATE NOCASE)")


def m007_covering_time_indexes(db: sqlite_utils.Database) -> None:
    """The "last time" indexes of 005 carry ``job_id`` too, so ``ft-history``'s window finds its
    records from the indexes alone, reading no table row (benchmarks/history_scale.py)."""
    conn = db.conn
    for name, table, expr in (("attempts_last", "attempts", 'COALESCE("end", start, updated)'),
                              ("verdicts_created", "verdicts", "created"),
                              ("actions_last", "actions", "COALESCE(finished, created)")):
        conn.execute(f"DROP INDEX IF EXISTS {name}")
        conn.execute(f"CREATE INDEX IF NOT EXISTS {name}_job ON {table} ({expr}, job_id)")



def m008_verdict_uid(db: sqlite_utils.Database) -> None:
    """``verdicts.uid``: the job's owner, as slurmd gave the epilog (``SLURM_JOB_UID``; the job
    cannot set it), on a node journal's verdict rows; NULL where unknown (the daemon's rows, rows
    recorded before).  The epilog counts distinct owners of this node's recent crashes with it
    (the ``node-crash-recurring`` rule, slurm_ft.classify.recurrence; issue 22)."""
    db["verdicts"].add_column("uid", int)


#: The history memo's table (slurm_ft.history.memo).
MEMO_TABLE = "history_memo"
#: Tables whose rows make up a record's history (slurm_ft.history.query._chain, identity): their
#: triggers drop the record's memo row; (table, expression(s) of the record key).
MEMO_SOURCES = (("jobs", ("job_id",)), ("attempts", ("job_id",)), ("verdicts", ("job_id",)),
           ("actions", ("job_id",)), ("job_identity", ("job_id",)), ("retired_jobs", ("key", "job_id")))

def m009_history_memo(db: sqlite_utils.Database) -> None:
    """``history_memo``: ``ft-history``'s pre-rendered text of finished jobs, and the triggers that
    drop a record's row whenever a row of that record changes (slurm_ft.history.memo; issue 26).
    Idempotent."""
    conn = db.conn
    conn.execute(f"CREATE TABLE IF NOT EXISTS {MEMO_TABLE} (job_id INTEGER PRIMARY KEY, key TEXT NOT NULL, "
                 f"t0 REAL, t1 REAL, list TEXT NOT NULL, chain TEXT NOT NULL)")
    for table, cols in MEMO_SOURCES:
        for event, refs in (("INSERT", ["NEW"]), ("UPDATE", ["OLD", "NEW"]), ("DELETE", ["OLD"])):
            keys = ", ".join(f"{ref}.{c}" for ref in refs for c in cols)
            conn.execute(f"CREATE TRIGGER IF NOT EXISTS {MEMO_TABLE}_{table}_{event.lower()} AFTER {event} ON {table} "
                         f"BEGIN DELETE FROM {MEMO_TABLE} WHERE job_id IN ({keys}); END")


#: Each table's "last time" of a record (slurm_ft.history.query._TIMES' second expressions).
RECORD_LAST = (("jobs", "MAX(COALESCE(updated, created), COALESCE(created, updated))"),
               ("attempts", 'COALESCE("end", start, updated)'), ("verdicts", "created"),
               ("actions", "COALESCE(finished, created)"))


_COLUMN = re.compile(r'\b(?:updated|created|start|finished)\b|"end"')


def m010_record_last(db: sqlite_utils.Database) -> None:
    """``record_last``: per record key, the latest time any of its rows holds (the largest of
    :data:`RECORD_LAST`'s expressions), indexed, so ``ft-history``'s window finds its records in
    one index range instead of four (slurm_ft.history.query ``_candidates``; issue 26). Kept by triggers
    on every insert and update of those tables (never lowered: a superset for the window, whose
    exact times are read afterwards); filled from the rows already there."""
    conn = db.conn
    conn.execute("CREATE TABLE IF NOT EXISTS record_last (job_id INTEGER PRIMARY KEY, t1 REAL NOT NULL)")
    conn.execute("CREATE INDEX IF NOT EXISTS record_last_t1 ON record_last (t1, job_id)")
    for table, expr in RECORD_LAST:
        new = _COLUMN.sub(lambda m: f"NEW.{m.group(0)}", expr)       # the expression over the new row
        for event in ("INSERT", "UPDATE"):
            conn.execute(f"CREATE TRIGGER IF NOT EXISTS record_last_{table}_{event.lower()} AFTER {event} ON {table} "
                         f"WHEN NEW.job_id IS NOT NULL AND ({new}) IS NOT NULL BEGIN "
                         f"INSERT INTO record_last (job_id, t1) VALUES (NEW.job_id, {new}) "
                         f"ON CONFLICT (job_id) DO UPDATE SET t1 = MAX(t1, excluded.t1); END")
    parts = " UNION ALL ".join(f"SELECT job_id, {expr} AS t1 FROM {table}" for table, expr in RECORD_LAST)
    conn.execute(f"INSERT OR REPLACE INTO record_last (job_id, t1) SELECT job_id, MAX(t1) FROM ({parts}) "
                 f"WHERE job_id IS NOT NULL AND t1 IS NOT NULL GROUP BY job_id")


#: Typed columns of migration 011, per action whose rows carry them (the rest leave them NULL).
TYPED_ACTIONS = {"failover": ("kind",), "inplace-restart": ("restart", "restart_of")}
#: Kinds of a ``failover`` row (``actions.kind``): a node was blamed; a retry that blamed none;
#: an evacuation (what a plain-text ``failover`` detail was read as before 011).
FAILOVER_KINDS = ("blamed", "unblamed", "evacuation")
_RESTART = re.compile(r"restart (\d+)/(\d+)(?: |$)")


def typed_from_text(action: str, detail) -> dict:
    """The typed columns of an ``actions`` row written before 011, read from its ``detail`` as
    slurm-ft read them until 011 (kept as it was: these are old rows' formats): a ``failover``
    row's ``kind`` (JSON detail with a non-empty ``blamed``, or JSON that is no object:
    ``blamed``; a JSON object without: ``unblamed``; no JSON: ``evacuation``); an
    ``inplace-restart`` row's ``restart``/``restart_of`` (``restart K/M in place: ...``: K, M;
    None when the text has no such start). ``{}`` for any other action. Never raises."""
    if action == "failover":
        try:
            d = json.loads(detail or "{}")
        except (ValueError, TypeError, RecursionError):
            return {"kind": "evacuation"}
        return {"kind": "unblamed" if isinstance(d, dict) and not d.get("blamed") else "blamed"}
    if action == "inplace-restart":
        m = _RESTART.match(detail) if isinstance(detail, str) else None
        return {"restart": int(m.group(1)), "restart_of": int(m.group(2))} if m else {"restart": None,
                                                                                      "restart_of": None}
    return {}


def m011_action_typed_columns(db: sqlite_utils.Database) -> None:
    """Typed ``actions`` columns for what was read back from ``detail`` text (issue 21):
    ``kind`` of a ``failover`` row (:data:`FAILOVER_KINDS`; slurm_ft.failover.machine
    ``Facts.failover_kinds``), ``restart`` and ``restart_of`` of an ``inplace-restart`` row (the
    job's in-place restart K of its budget M, both counts; slurm_ft.job.inplace
    ``record_restarts``); NULL on other rows. Their writers fill them; the rows already there
    are filled here, once, from their text (:func:`typed_from_text`; the history memo of their
    jobs is dropped by its triggers and rendered again when asked)."""
    db["actions"].add_column("kind", str)
    db["actions"].add_column("restart", int)
    db["actions"].add_column("restart_of", int)
    conn = db.conn
    names = sorted(TYPED_ACTIONS)
    rows = conn.execute(f"SELECT id, action, detail FROM actions WHERE action IN ({', '.join('?' * len(names))})",
                        names).fetchall()
    filled = []
    for rowid, action, detail in rows:
        typed = typed_from_text(action, detail)
        filled.append((typed.get("kind"), typed.get("restart"), typed.get("restart_of"), rowid))
    conn.executemany("UPDATE actions SET kind = ?, restart = ?, restart_of = ? WHERE id = ?", filled)


MIGRATIONS = [("001_initial", m001_initial), ("002_ft_options", m002_ft_options),
              ("003_action_uid_dead_letters", m003_action_uid_dead_letters),
              ("004_job_identity", m004_job_identity), ("005_time_indexes", m005_time_indexes),
              ("006_job_account", m006_job_account), ("007_covering_time_indexes", m007_covering_time_indexes),
              ("008_verdict_uid", m008_verdict_uid), ("009_history_memo", m009_history_memo),
              ("010_record_last", m010_record_last), ("011_action_typed_columns", m011_action_typed_columns)]


def apply(db: sqlite_utils.Database | sqlite3.Connection) -> list[str]:
    """Apply pending migrations to ``db`` (a ``sqlite_utils.Database``, or a ``sqlite3`` connection
    in autocommit mode); returns the names applied now.  With nothing pending (the prolog's and
    epilog's case) sqlite_utils is not even imported (issue 22)."""
    conn = db if isinstance(db, sqlite3.Connection) else db.conn
    conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied REAL)")
    done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
    applied = []
    if isinstance(db, sqlite3.Connection) and not known() <= done:
        import sqlite_utils
        db = sqlite_utils.Database(conn, execute_plugins=False)
    for name, fn in MIGRATIONS:
        if name in done:
            continue
        with conn:  # one transaction per step
            conn.execute("BEGIN IMMEDIATE")
            # re-check under the write lock: another process may have migrated meanwhile
            if conn.execute("SELECT 1 FROM _migrations WHERE name = ?", (name,)).fetchone():
                continue
            fn(db)
            conn.execute("INSERT INTO _migrations (name, applied) VALUES (?, ?)", (name, time.time()))
        applied.append(name)
    return applied


def known() -> set[str]:
    return {name for name, _ in MIGRATIONS}
