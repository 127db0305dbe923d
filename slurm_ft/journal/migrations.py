"""Schema migrations: applied in order, one transaction each, recorded in ``_migrations``.

Never edit a migration that has shipped; add a new one.
"""

from __future__ import annotations

import time

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


MIGRATIONS = [("001_initial", m001_initial), ("002_ft_options", m002_ft_options),
              ("003_action_uid_dead_letters", m003_action_uid_dead_letters)]


def apply(db: sqlite_utils.Database) -> list[str]:
    """Apply pending migrations; returns the names applied now."""
    conn = db.conn
    conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied REAL)")
    done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
    applied = []
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
