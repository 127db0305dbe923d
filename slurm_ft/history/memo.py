"""Pre-rendered ``ft-history`` text of finished jobs (issue 26: ``ft-history -S now-30days`` over a
journal of 1,000,000 attempts within 0.3 s, benchmarks/history_scale.py).

What ``ft-history`` prints for a job whose ft state is final does not change any more, unless a
row of it does. The history service (the daemon's child, root, on the controller) therefore
renders ahead, with ``ft-history``'s own code (:func:`slurm_ft.history.query._chain`,
:mod:`slurm_ft.history.format`: no second renderer), the two default outputs of each finished
job of the last :data:`MEMO_DAYS` days, and the job row alone of each finished job of the last
:data:`ROW_DAYS` days (what ``-u USER -X -P`` over a year prints: about 150 bytes a job), into
the journal's ``history_memo`` table (migration ``009_history_memo``), one row per record::

    job_id  the record key (a job id, or a retired record's negative key)
    key     :func:`slurm_ft.history.query.render_key` of the process that rendered it (a whole row), or
            :func:`slurm_ft.history.query.row_key` (the job row alone: ``chain`` is empty, ``list`` its first line)
    t0, t1  the record's time span (slurm_ft.history.query._spans' expressions), epoch seconds
    list    the ``-P`` lines of the default columns (LIST_FORMAT): the job row, then each attempt
    chain   the retry-chain view (heading, table with its header, hang lines)

A memo row is used (:func:`slurm_ft.history.query.lookup`) only when all of these hold, else ``ft-history`` renders
the job as before:

- its ``key`` is the reader's :func:`slurm_ft.history.query.render_key`: a hash of the rendering code and of the local
  time zone (times are printed in local time), so another slurm-ft version or ``TZ`` renders
  afresh;
- no row of the record changed since it was rendered: triggers on ``jobs``, ``attempts``,
  ``verdicts``, ``actions``, ``job_identity`` and ``retired_jobs`` delete a record's memo row in
  the same transaction as any insert, update or delete of its rows; :func:`fill` reads and writes
  inside one write transaction, so no change slips in between;
- the output is one of the default ones: the chain view (with its header), ``-p``/``-P`` and
  ``-X -p``/``-X -P`` (the list's first line); no ``-o``, ``--delimiter``, ``--detail``, ``-s``,
  ``-D``, ``--json`` (``slurm_ft.history.query.memo_kind``), and no row waits in the journal's spool.

A user name held as a uid is shown as the name this host's passwd gave when the job was
rendered. The memo costs about 1 KB a job for :data:`MEMO_DAYS` and 150 bytes for the rest of
:data:`ROW_DAYS` (~30 + 25 MB for a site with 14,000 jobs a month); a whole row older than
:data:`MEMO_DAYS` is cut to its job row, a row older than :data:`ROW_DAYS` or of another
rendering code is deleted;
none is written while the journal's filesystem has less than :data:`MIN_FREE_BYTES` free (a
cache never takes the daemon's last free pages). Errors are the caller's to log: :func:`fill`
raises ``sqlite3.Error``; :func:`slurm_ft.history.query.lookup` answers {} for a journal without the table.
"""

from __future__ import annotations

import json
import os
import threading
import time

from slurm_ft.history import query as hist
from slurm_ft.history import format as fmt
from slurm_ft.failover import policy
from slurm_ft.history.query import render_key, row_key
from slurm_ft.journal.migrations import MEMO_TABLE as TABLE

#: Days back (by the job record's last update) the memo holds whole rows (every default output).
MEMO_DAYS = 62
#: Days back it holds the job row alone (``-X -P``/``-X -p``: a user's jobs of a year); older
#: records render as before.
ROW_DAYS = 400
#: Free bytes the journal's filesystem must keep for :func:`fill` to write.
MIN_FREE_BYTES = 64 * 2 ** 20
#: Records rendered in one write transaction (about 10 ms of the journal's write lock).
CHUNK = 100
#: Seconds between two passes of the service's filler; seconds it rests between two chunks.
PASS_S, REST_S = 30.0, 0.05
def _finals() -> list[str]:
    return sorted(policy.FINAL_STATES)


def missing(conn, now: float, limit: int) -> list[int]:
    """Up to ``limit`` record keys of finished jobs updated within :data:`ROW_DAYS` that have no
    memo row of this code (:func:`slurm_ft.history.query.render_key`; :func:`slurm_ft.history.query.row_key` past :data:`MEMO_DAYS`), the most
    recently updated first."""
    finals = _finals()
    whole_since = now - MEMO_DAYS * 86400.0
    sql = (f"SELECT j.job_id FROM jobs j LEFT JOIN {TABLE} m ON m.job_id = j.job_id "
           f"AND (m.key = ? OR (m.key = ? AND j.updated < ?)) "
           f"WHERE j.updated >= ? AND j.ft_state IN ({', '.join('?' * len(finals))}) AND m.job_id IS NULL "
           f"ORDER BY j.updated DESC LIMIT ?")
    return [r[0] for r in conn.execute(sql, [render_key(), row_key(), whole_since, now - ROW_DAYS * 86400.0,
                                             *finals, limit])]


def render(journal, keys, now: float) -> list[tuple]:
    """(key, memo key, t0, t1, list text, chain text) for each finished record of ``keys``, by
    ``ft-history``'s own code (records whose ft state is not final are left out); a record last
    updated before :data:`MEMO_DAYS` is its job row alone (:func:`slurm_ft.history.query.row_key`)."""
    from slurm_ft.journal import identity

    keys = sorted({int(k) for k in keys})
    cols, found = hist._read(journal.db.conn, "SELECT * FROM jobs WHERE job_id IN (SELECT value FROM "
                                              "json_each(:keys))", {"keys": json.dumps(keys)})
    jobs = {r["job_id"]: r for r in (dict(zip(cols, row)) for row in found)
            if r["ft_state"] in policy.FINAL_STATES}
    if not jobs:
        return []
    rows = hist._Prefetched(journal, jobs, jobs)
    arrays, retired = identity.arrays(journal), identity.retired(journal)
    list_cols, key, short = fmt.parse_format(fmt.LIST_FORMAT), render_key(), row_key()
    whole_since = now - MEMO_DAYS * 86400.0
    out = []
    for job_id, job in jobs.items():
        h = hist._chain(rows, job_id, job, arrays.get(job_id), retired.get(job_id))
        t0, t1 = rows.spans.get(job_id, (None, None))
        whole = (job.get("updated") or 0.0) >= whole_since
        listed = "\n".join(fmt.parsable(list_cols, fmt.rows(h, attempts=whole, now=now), header=False))
        out.append((job_id, key if whole else short, t0, t1, listed,
                    fmt.chain(h, header=True, now=now) if whole else ""))
    return out


def room(path: str) -> bool:
    """Whether the journal's filesystem has :data:`MIN_FREE_BYTES` free."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)) or ".")
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= MIN_FREE_BYTES


def fill(journal, *, now: float | None = None, limit: int = CHUNK, clock=time.time) -> int:
    """Render up to ``limit`` missing records (:func:`missing`) and store them, in one write
    transaction (BEGIN IMMEDIATE: the rendering reads and the writes see the same rows, and a
    record changed since :func:`missing` read it is rendered as it is now); the pass's last call
    (nothing missing) ages the memo (:data:`MEMO_DAYS`, :data:`ROW_DAYS`, other codes' rows). Returns how many were stored (0: nothing to do, or no room). Raises
    ``sqlite3.Error`` (a locked or full journal: the next pass tries again)."""
    if not room(journal.path):
        return 0
    conn = journal.db.conn
    now = clock() if now is None else now
    keys = missing(conn, now, limit)   # a read (a pass's last walks ROW_DAYS of jobs): no write lock
    conn.execute("BEGIN IMMEDIATE")
    try:
        made = render(journal, keys, now) if keys else []
        conn.executemany(f"INSERT OR REPLACE INTO {TABLE} (job_id, key, t0, t1, list, chain) VALUES (?, ?, ?, ?, ?, ?)",
                         made)
        if not keys:        # a pass's last chunk: age the memo (whole rows to job rows, then out)
            conn.execute(f"UPDATE {TABLE} SET key = ?, chain = '', list = {hist.JOBROW_SQL} "
                         f"WHERE key = ? AND t1 < ?", [row_key(), render_key(), now - (MEMO_DAYS + 1) * 86400.0])
            conn.execute(f"DELETE FROM {TABLE} WHERE t1 < ? OR key NOT IN (?, ?)",
                         [now - (ROW_DAYS + 1) * 86400.0, render_key(), row_key()])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return len(made)


class Filler:
    """The history service's background thread: every :data:`PASS_S` seconds, :func:`fill` chunk
    after chunk (:data:`REST_S` apart) until nothing is missing or ``stop`` is set. Logs its
    trouble and goes on; never raises."""

    def __init__(self, journal_path: str, stop: threading.Event, log, read_group: str = ""):
        #: ``read_group``: ``[journal] read_group``, as every writer opens the journal with it
        #: (a writer puts the file's group and mode right: slurm_ft.journal.store)
        self.path, self.stop, self.log, self.read_group = journal_path, stop, log, read_group
        self.thread = threading.Thread(target=self.run, name="ft-history-memo", daemon=True)

    def start(self) -> "Filler":
        self.thread.start()
        return self

    def run(self) -> None:
        from slurm_ft.journal import open_journal

        while not self.stop.is_set():
            try:
                with open_journal(self.path, read_group=self.read_group, busy_timeout_s=1.0) as journal:
                    while not self.stop.is_set() and not journal.spooled and fill(journal) > 0:
                        self.stop.wait(REST_S)
            except Exception as exc:    # a locked or full journal, a bug: the next pass tries again
                self.log.warning("history service: memo not filled: %s: %s", type(exc).__name__, exc)
            self.stop.wait(PASS_S)
