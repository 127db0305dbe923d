"""What ``ft-history`` shows: fault-tolerant jobs and their retry chains read from the daemon's
journal, selected as sacct selects (``-j -u -a -A -N -S -E -s -D``, see docs/user-guide.md); its
command line is :mod:`slurm_ft.cli.history`, the history service answers with the same code.

Which jobs: with ``-j``, those jobs; otherwise every ft-enabled job active in the time window
(``-S``/``-E``, Slurm's time formats: :mod:`slurm_ft.slurm.timespec`), of the caller only unless
``-u``/``-a`` (as sacct). Output layouts live in :mod:`slurm_ft.history.format`.

Privacy: when Slurm's ``PrivateData`` includes ``jobs``, a user other than root and SlurmUser
sees only their own jobs (the journal's ``jobs.user``), as ``squeue`` would show them. Every
text field printed is passed through :func:`slurm_ft.textsafe.terminal_safe` by the formats
(``--json`` is ASCII JSON, which escapes control characters itself).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pwd
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ft import config as config_mod
from slurm_ft.history import format as fmt
from slurm_ft.errors import JournalError, SlurmFTError
from slurm_ft.failover import policy
from slurm_ft.journal import identity
from slurm_ft.journal.migrations import MEMO_TABLE


@dataclass(frozen=True)
class Viewer:
    """Who runs ft-history, and whether Slurm hides other users' jobs from them."""

    uid: int
    user: str
    #: Slurm's ``PrivateData`` includes ``jobs`` (or could not be read: fail closed).
    private_jobs: bool
    slurm_user: str = "root"

    @property
    def sees_all(self) -> bool:
        return self.uid == 0 or not self.private_jobs or self.user in ("root", self.slurm_user)

    @property
    def admin(self) -> bool:
        """root or SlurmUser: sees every user's jobs by default (others see their own, as sacct)."""
        return self.uid == 0 or self.user in ("root", self.slurm_user)

    def may_see(self, job: dict | None) -> bool:
        return self.sees_all or bool(job and job.get("user") and job["user"] == self.user)


def current_viewer(cfg, uid: int | None = None, slurm=None) -> Viewer:
    """The calling user (real uid) and Slurm's ``PrivateData``/``SlurmUser``, read once with
    ``scontrol show config`` (not asked for root). If Slurm cannot be asked, a non-root user is
    treated as under ``PrivateData=jobs``."""
    uid = os.getuid() if uid is None else uid
    if uid == 0:
        return Viewer(0, "root", False)
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    from slurm_ft.slurm import Slurm, private_data
    try:
        timeout_s = cfg.slurm.command_timeout_s if cfg is not None else config_mod.SlurmConfig().command_timeout_s
        conf = (slurm or Slurm(bin_dir=config_mod.trusted_bin_dir(cfg), timeout_s=timeout_s)).show_config()
    except SlurmFTError:
        return Viewer(uid, user, True)
    return Viewer(uid, user, "jobs" in private_data(conf), conf.get("SlurmUser", "root").split("(")[0] or "root")


_HIDDEN = ", or not yours (Slurm PrivateData=jobs)"


def _job_row(journal, job_id: int, viewer: Viewer | None) -> dict | None:
    """The job's ``jobs`` row as ``viewer`` may see it; a job known only by its verdicts (not
    ft-enabled) reads as ``not-configured``; None when unknown or hidden from ``viewer``."""
    job = journal.job(job_id)
    if viewer is not None and not viewer.sees_all:
        return job if viewer.may_see(job) else None
    if job is None and journal.verdicts(job_id):
        job = {"job_id": job_id, "name": None, "user": None, "account": None, "ft_state": policy.NOT_CONFIGURED,
               "retries": None, "excluded_nodes": None}
    return job


def fold_nodes(names) -> str:
    """Node names as one Slurm hostlist (``gpu[01-02]-ib``); a name that is not one is listed as is."""
    from slurm_ft.slurm import compress_nodes     # here: ft-history's start imports no Slurm client
    names = sorted(set(names))
    try:
        return compress_nodes(names)
    except SlurmFTError:
        return ",".join(names)


def not_in_journal(journal, job_ids: list, viewer: Viewer | None) -> SlurmFTError:
    hidden = _HIDDEN if viewer is not None and not viewer.sees_all else ""
    what = f"job {job_ids[0]} is" if len(job_ids) == 1 else f"jobs {', '.join(map(str, job_ids))} are"
    return SlurmFTError(f"{what} not in the journal {journal.path} (not ft-enabled, or unknown{hidden})")


def history(journal, job_id: int, viewer: Viewer | None = None) -> dict:
    """``{"job_id", "name", "user", "ft_state", "retries", "failovers", "excluded_nodes",
    "attempts": [...]}``; each attempt has ``attempt, nodes, start, end, state, exit_code,
    signal, verdict, rule, xids, verdicts, checkpoint, action, actions`` (times epoch seconds).
    ``viewer``: who asks (None: no restriction); a job ``viewer`` may not see is reported as
    not in the journal, exactly like an unknown one."""
    job = _job_row(journal, job_id, viewer)
    if job is None:
        raise not_in_journal(journal, [job_id], viewer)
    return _chain(journal, job_id, job, identity.arrays(journal).get(job_id))


@functools.lru_cache(maxsize=1)
def _observed() -> str:
    """The status of an observe-mode daemon's actions (slurm_ft.failover.observe.OBSERVED), read
    at first use: ft-history's start does not import the observe machinery."""
    from slurm_ft.failover.observe import OBSERVED
    return OBSERVED


#: Verdict classes, worst first: an attempt's verdict is its worst node's.
_WORST = {c: i for i, c in enumerate(("hardware", "hang", "infra", "user", "unknown", "ok"))}


def _rank(v: dict) -> int:
    return _WORST.get(v["verdict"], len(_WORST))


def _chain(journal, job_id: int, job: dict, array: tuple[int, int] | None = None,
           retired: dict | None = None) -> dict:
    """The history of the record ``job_id`` (a job id, or a retired record's negative key,
    slurm_ft.journal.identity), with its array ids and, for a retired record, when and why."""
    rows = []
    recorded = {a["attempt"]: a for a in journal.attempts(job_id)}
    # an attempt that never ran (a prolog health check refused the node) has verdicts/actions only
    numbers = set(recorded) | {v["attempt"] for v in journal.verdicts(job_id)} | \
        {x["attempt"] for x in journal.actions(job_id)}
    for n in sorted(numbers):
        verdicts = journal.verdicts(job_id, n)
        a = recorded.get(n)
        if a is None:
            refused = any(v["rule"].startswith(policy.HEALTH_RULE) for v in verdicts)
            a = {"attempt": n, "nodes": None, "start": None, "end": None,
                 "state": "PROLOG_REFUSED" if refused else "NOT_STARTED", "exit_code": None, "signal": None}
        actions = [x for x in journal.actions(job_id, n) if x["status"] != "intent"]
        nodes = a["nodes"] if a["nodes"] is not None or not verdicts else fold_nodes(v["node"] for v in verdicts)
        worst = min(verdicts, key=_rank) if verdicts else None     # the first of the worst class
        worst = worst if worst is not None and _rank(worst) < len(_WORST) else None
        rows.append({
            "attempt": a["attempt"], "nodes": nodes, "start": a["start"], "end": a["end"],
            "state": a["state"], "exit_code": a["exit_code"], "signal": a["signal"],
            "verdict": worst["verdict"] if worst else None, "rule": worst["rule"] if worst else None,
            "xids": sorted({f"{x['xid']}@{x.get('bus_id') or '?'}" for v in verdicts for x in v["xids"]}),
            "verdicts": [{k: v[k] for k in ("node", "verdict", "rule", "xids", "evidence")} for v in verdicts],
            "checkpoint": _checkpoint(actions),
            "action": _summarise(actions),
            "actions": [{k: x[k] for k in ("action", "target", "detail", "status", "created")} for x in actions],
        })
    observed = any(x["status"] == _observed() for r in rows for x in r["actions"])
    return {"job_id": retired["job_id"] if retired else job_id, "name": job["name"], "user": job.get("user"),
            "account": job.get("account"), "ft_state": job["ft_state"],
            "array_job_id": array[0] if array else None, "array_task_id": array[1] if array else None,
            "retired": {"at": retired["retired"], "reason": retired["reason"]} if retired else None,
            "observed": observed,
            "retries": job["retries"], "failovers": journal.failovers_done(job_id),
            "excluded_nodes": job["excluded_nodes"], "attempts": rows}


# ------------------------------------------------------------------------------ selection
#: sacct's job state codes (``man sacct``, JOB STATE CODES) and the two ft-history adds for an
#: attempt that never ran.
SLURM_STATES = {"BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "CF": "CONFIGURING", "CG": "COMPLETING",
                "DL": "DEADLINE", "F": "FAILED", "NF": "NODE_FAIL", "OOM": "OUT_OF_MEMORY", "PD": "PENDING",
                "PR": "PREEMPTED", "R": "RUNNING", "RQ": "REQUEUED", "RS": "RESIZING", "RV": "REVOKED",
                "S": "SUSPENDED", "TO": "TIMEOUT", "PROLOG_REFUSED": "PROLOG_REFUSED",
                "NOT_STARTED": "NOT_STARTED"}
#: Every ft state (slurm_ft.failover.policy): running, the pending ones, then the final ones.
FT_STATES = (policy.RUNNING,
             *sorted(getattr(policy, "PENDING_STATES", {policy.FAILOVER, policy.REQUEUED}) - {policy.RUNNING}),
             *sorted(policy.FINAL_STATES - {policy.RUNNING}))


def parse_states(text: str) -> frozenset[str]:
    """``-s`` value: a comma list of ft states (lower-case in the result) and Slurm states, long or
    short (upper-case), case-insensitive. A word that is both (``requeued``, ``running``,
    ``completed``, ``cancelled``) selects either. Raises ValueError naming an unknown word."""
    out: set[str] = set()
    longs = set(SLURM_STATES.values())
    for word in text.split(","):
        w = word.strip()
        hit = False
        if w.lower() in FT_STATES:
            out.add(w.lower())
            hit = True
        if w.upper() in SLURM_STATES or w.upper() in longs:
            out.add(SLURM_STATES.get(w.upper(), w.upper()))
            hit = True
        if not hit:
            raise ValueError(f"{w!r}: not a state; ft states: {', '.join(FT_STATES)}; Slurm states: "
                             f"{', '.join(sorted(longs))} or their short forms (CA, CD, F, NF, R, RQ, TO, ...)")
    return frozenset(out)


#: Largest job id and array task id ``-j`` takes (Slurm's ids are 32-bit; MaxArraySize <= 4000001).
MAX_JOB_ID = 2 ** 32 - 1
MAX_TASK_ID = 4_000_000
_SPEC = re.compile(r"([0-9]{1,10})(?:_(?:([0-9]{1,10})|\[([^\[\]]*)\]))?")
_RANGE = re.compile(r"([0-9]{1,10})(?:-([0-9]{1,10}))?")


@dataclass(frozen=True)
class JobSpec:
    """One ``-j`` item, as sacct takes it: ``50`` (job 50, or every task of array 50), ``50_2``
    (task 2 of array 50), ``50_[1-3,7]`` (those tasks)."""

    job_id: int
    #: inclusive task id ranges; None: the whole job or array
    tasks: tuple[tuple[int, int], ...] | None = None

    def __str__(self) -> str:
        if self.tasks is None:
            return str(self.job_id)
        if len(self.tasks) == 1 and self.tasks[0][0] == self.tasks[0][1]:
            return f"{self.job_id}_{self.tasks[0][0]}"
        return f"{self.job_id}_[{','.join(str(a) if a == b else f'{a}-{b}' for a, b in self.tasks)}]"

    def matches(self, job_id: int, array: tuple[int, int] | None) -> bool:
        """Whether the record of ``job_id`` (its array ids ``array``, or None) is selected."""
        if self.tasks is None:
            return job_id == self.job_id or (array is not None and array[0] == self.job_id)
        return array is not None and array[0] == self.job_id and any(a <= array[1] <= b for a, b in self.tasks)


def parse_job_ids(text: str) -> list[JobSpec]:
    """``-j`` value: comma-separated ``JOBID``, ``JOBID_TASK`` and ``JOBID_[RANGES]`` items, where
    ``RANGES`` is a comma list of ``N`` and ``N-M`` (commas inside brackets belong to them).
    Raises ValueError naming the bad item (and nothing else, whatever ``text`` is)."""
    items, depth, cur = [], 0, []
    for ch in text:
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
            continue
        depth += ch == "["
        depth -= ch == "]"
        if depth not in (0, 1):
            raise ValueError(f"{text!r}: unbalanced brackets in a job id list")
        cur.append(ch)
    if depth:
        raise ValueError(f"{text!r}: unbalanced brackets in a job id list")
    items.append("".join(cur))
    return [_parse_item(item.strip()) for item in items]


def _parse_item(item: str) -> JobSpec:
    m = _SPEC.fullmatch(item)
    if not m:
        hint = " (ft-history takes job ids, not steps)" if re.fullmatch(r"\d+[.+].*", item) else ""
        raise ValueError(f"{item!r} is not a job id (JOBID, JOBID_TASK or JOBID_[N-M,...]){hint}")
    job_id = int(m.group(1))
    if not 1 <= job_id <= MAX_JOB_ID:
        raise ValueError(f"{item!r} is not a job id (1 to {MAX_JOB_ID})")
    if m.group(2) is None and m.group(3) is None:
        return JobSpec(job_id)
    ranges = []
    for part in ([m.group(2)] if m.group(2) is not None else m.group(3).split(",")):
        r = _RANGE.fullmatch(part.strip())
        if not r:
            raise ValueError(f"{item!r}: {part.strip()!r} is not an array task id or range N-M")
        a, b = int(r.group(1)), int(r.group(2) if r.group(2) is not None else r.group(1))
        if a > b or b > MAX_TASK_ID:
            raise ValueError(f"{item!r}: {part.strip()!r} is not a task range (N-M, N <= M <= {MAX_TASK_ID})")
        ranges.append((a, b))
    return JobSpec(job_id, tuple(ranges))


@dataclass(frozen=True)
class Selection:
    """Which jobs ``ft-history`` prints (sacct's meanings, docs/user-guide.md)."""

    #: job ids (int) or :class:`JobSpec` (array tasks)
    job_ids: tuple = ()
    #: user names (a uid is looked up); None: the caller's own jobs, or everyone's for root,
    #: SlurmUser, with ``job_ids`` or ``all_users``
    users: frozenset[str] | None = None
    all_users: bool = False
    start: float = 0.0
    end: float | None = None                 #: None: now
    states: frozenset[str] = frozenset()     #: from :func:`parse_states`; empty: any
    #: every attempt stands alone: attempts outside the window or (for Slurm states in
    #: ``states``) in another state are left out
    duplicates: bool = False
    #: Slurm accounts (``-A``, compared case-insensitively: Slurm keeps them in lower case);
    #: None: any account
    accounts: frozenset[str] | None = None
    #: node names (``-N``, expanded by :func:`parse_nodelist`): only jobs with an attempt, a
    #: verdict or an action on one of them in the window; None: any node
    nodes: frozenset[str] | None = None


#: Each table's first and last time of a record (the window test, :func:`_overlaps`); the "last"
#: expressions are indexed as written (journal migration ``005_time_indexes``).
_TIMES = (("jobs", "created", "updated"),
          ("attempts", "COALESCE(start, updated)", 'COALESCE("end", start, updated)'),
          ("verdicts", "created", "created"),
          ("actions", "created", "COALESCE(finished, created)"))


def _spans(journal, keys) -> dict[int, tuple[float | None, float | None]]:
    """record key -> (first, last) time anything about it was recorded, for ``keys`` only
    (one query, the keys passed as one JSON parameter: read-only connections can run it)."""
    keys = sorted({int(k) for k in keys})
    if not keys:
        return {}
    parts = " UNION ALL ".join(f"SELECT job_id, {t0} AS t0, {t1} AS t1 FROM {table} "
                               f"WHERE job_id IN (SELECT value FROM json_each(:keys))" for table, t0, t1 in _TIMES)
    sql = f"SELECT job_id, MIN(t0), MAX(t1) FROM ({parts}) GROUP BY job_id"
    return {r[0]: (r[1], r[2]) for r in journal.db.conn.execute(sql, {"keys": json.dumps(keys)}).fetchall()}


#: The ``jobs`` columns that select a job (ft state, owner, account): all the window reads of a
#: job whose text the memo holds (slurm_ft.history.memo).
_LIGHT = "job_id, user, account, ft_state"


def _candidates(journal, start: float) -> set[int]:
    """Record keys that may overlap a window starting at ``start``: anything recorded at or after
    it (index range scans), a job whose ft state is not final (it overlaps any window that
    reaches now), and a job with no time at all. A superset: :func:`_overlaps` decides. Every
    part reads one index range (``record_last_t1``, migration ``010_record_last``, else the covering
    indexes of ``007_covering_time_indexes``; "not final" as the ranges between the final states,
    not a scan of ``jobs_ft_state``)."""
    finals = sorted(policy.FINAL_STATES)
    states = ["SELECT job_id FROM jobs WHERE ft_state IS NULL", "SELECT job_id FROM jobs WHERE ft_state < ?",
              "SELECT job_id FROM jobs WHERE ft_state > ?"]
    states += ["SELECT job_id FROM jobs WHERE ft_state > ? AND ft_state < ?"] * (len(finals) - 1)
    states += ["SELECT job_id FROM jobs WHERE created IS NULL AND updated IS NULL"]
    state_args = [finals[0], finals[-1]] + [x for pair in zip(finals, finals[1:]) for x in pair]
    # the latest time of every record, one index range (migration 010_record_last); a journal
    # from before it, opened read-only: each table's own range
    times = ["SELECT job_id FROM record_last WHERE t1 >= ?"]
    if not journal.db.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'record_last'"
                                   ).fetchone():
        times = [f"SELECT job_id FROM {table} WHERE {t1} >= ?" for table, _, t1 in _TIMES]
        times += ["SELECT job_id FROM jobs WHERE created >= ?"]
    # UNION: SQLite drops the duplicates (a record has rows in several tables) before Python sees them
    keys = {key for (key,) in journal.db.conn.execute(" UNION ".join(times + states),
                                                      [start] * len(times) + state_args)}
    keys.discard(None)
    return keys


def _users(sel: Selection, viewer: Viewer | None) -> frozenset[str] | None:
    """The user names the selection is limited to (``-u``; an ordinary user's own jobs by default,
    as sacct), None for every user."""
    if sel.users is None and not sel.job_ids and not sel.all_users and viewer is not None and not viewer.admin:
        return frozenset({viewer.user})
    return sel.users


def _jobs_of(journal, users: frozenset[str]) -> set[int]:
    """Record keys of the jobs of ``users`` (names; the journal holds Slurm's user name, or a
    uid as digits, which :func:`slurm_ft.history.format.user_name` maps: both are asked for)."""
    forms = set(users)
    for name in users:
        try:
            forms.add(str(pwd.getpwnam(name).pw_uid))
        except KeyError:
            pass
        if name.isdigit():
            try:
                forms.add(pwd.getpwuid(int(name)).pw_name)
            except (KeyError, OverflowError):
                pass
    rows = journal.db.conn.execute("SELECT job_id FROM jobs WHERE user IN (SELECT value FROM json_each(?))",
                                   [json.dumps(sorted(forms))]).fetchall()
    return {r[0] for r in rows}


def _fold_case(account: str) -> str:
    """An account name as ``-A`` compares it: ASCII letters in lower case (SQLite's NOCASE, the
    ``jobs_account`` index)."""
    return account.lower() if account.isascii() else account


def _jobs_of_accounts(journal, accounts: frozenset[str]) -> set[int]:
    """Record keys of the jobs of Slurm ``accounts`` (lower case), by the ``jobs_account`` index."""
    names = sorted(accounts)
    sql = " UNION ALL ".join(["SELECT job_id FROM jobs WHERE account = ? COLLATE NOCASE"] * len(names))
    return {r[0] for r in journal.db.conn.execute(sql, names).fetchall()} if names else set()


class _Prefetched:
    """The journal rows of many records, read in three queries, answering the reads
    :func:`_chain` makes (``job``, ``attempts``, ``verdicts``, ``actions``, ``failovers_done``)
    exactly as :class:`slurm_ft.journal.store.Journal` does for a journal with no spooled rows
    (the only case it is used for). The rows are shared, not copied (:func:`_chain` only reads
    them). :attr:`spans` is :func:`_spans`' answer for the records, from the same rows."""

    def __init__(self, journal, keys, jobs: dict | None = None):
        from slurm_ft.journal.store import _json_list

        self.journal = journal
        arg = {"keys": json.dumps(sorted({int(k) for k in keys}))}
        where = "WHERE job_id IN (SELECT value FROM json_each(:keys))"
        self._attempts: dict[int, list[dict]] = {}
        self._verdicts: dict[int, list[dict]] = {}
        self._actions: dict[int, list[dict]] = {}
        self._by_attempt: dict[tuple, list[dict]] = {}      # ("v" | "x", job, attempt) -> rows
        #: record key -> [first, last] time (the expressions of _TIMES, as _spans reads them)
        self.spans: dict[int, list] = {k: [j.get("created"), j.get("updated")] for k, j in (jobs or {}).items()}
        times = {table: (t0, t1) for table, t0, t1 in _TIMES}
        for table, order, target, kind in (("attempts", "job_id, attempt", self._attempts, None),
                                           ("verdicts", "job_id, attempt, node", self._verdicts, "v"),
                                           ("actions", "id", self._actions, "x")):
            cols, rows = _read(journal.db.conn, f"SELECT *, {times[table][0]}, {times[table][1]} FROM {table} "
                                                f"{where} ORDER BY {order}", arg)
            cols = cols[:-2]                 # dict(zip(...)) leaves the two times out
            decode = table == "verdicts"
            spans, by_attempt = self.spans, self._by_attempt
            for row in rows:
                r = dict(zip(cols, row))
                key = r["job_id"]
                if decode:
                    x, e = r["xids"], r["evidence"]
                    r["xids"] = [] if x == "[]" else _json_list(x)
                    r["evidence"] = [] if e == "[]" else _json_list(e)
                group = target.get(key)
                if group is None:
                    target[key] = [r]
                else:
                    group.append(r)
                if kind:
                    by_attempt.setdefault((kind, key, r["attempt"]), []).append(r)
                t0, t1 = row[-2], row[-1]
                span = spans.get(key)
                if span is None:
                    spans[key] = [t0, t1]
                    continue
                if t0 is not None and (span[0] is None or t0 < span[0]):
                    span[0] = t0
                if t1 is not None and (span[1] is None or t1 > span[1]):
                    span[1] = t1

    def attempts(self, job_id: int) -> list[dict]:
        return self._attempts.get(job_id, [])

    def verdicts(self, job_id: int, attempt: int | None = None) -> list[dict]:
        if attempt is None:
            return self._verdicts.get(job_id, [])
        return self._by_attempt.get(("v", job_id, attempt), [])

    def actions(self, job_id: int, attempt: int | None = None) -> list[dict]:
        if attempt is None:
            return self._actions.get(job_id, [])
        return self._by_attempt.get(("x", job_id, attempt), [])

    def failovers_done(self, job_id: int) -> int:
        return sum(1 for a in self._actions.get(job_id, ()) if a["action"] == "failover" and a["status"] == "done")


def _read(conn, sql: str, args) -> tuple[list[str], list[tuple]]:
    """(column names, rows) of ``sql``, text decoded by sqlite3's own C decoder; when a value is
    not UTF-8 (a row another tool wrote) the query is read again with the journal's own
    text_factory (U+FFFD for such bytes, slurm_ft.journal.store)."""
    saved = conn.text_factory
    conn.text_factory = str
    try:
        cur = conn.execute(sql, args)
        return [d[0] for d in cur.description], cur.fetchall()
    except sqlite3.OperationalError as exc:
        if "decode" not in str(exc):
            raise
    finally:
        conn.text_factory = saved
    cur = conn.execute(sql, args)
    return [d[0] for d in cur.description], cur.fetchall()


# ------------------------------------------------------------------------------ the memo, read side
# Finished jobs rendered ahead by the history service (slurm_ft.history.memo, the write side):
# which rows this process may print as they are.
#: The modules whose code decides the text (hashed into :func:`render_key`).
_CODE = ("history/query.py", "history/format.py", "textsafe.py", "hang/report.py", "history/memo.py")


def tz_key() -> str:
    """The local time zone as this process renders times (``TZ``, names, offsets)."""
    return f"{os.environ.get('TZ', '')}|{time.tzname}|{time.timezone}|{time.altzone}|{time.daylight}"


@functools.lru_cache(maxsize=None)
def _code_hash() -> str:
    base = Path(__file__).resolve().parent.parent        # the package: _CODE's paths are below it
    h = hashlib.sha256()
    try:
        for name in _CODE:
            h.update(name.encode() + b"\0" + (base / name).read_bytes() + b"\0")
    except OSError:          # code not readable as files: a key no other process has (memo unused)
        return os.urandom(16).hex()
    return h.hexdigest()


def render_key() -> str:
    """A memo row rendered by this code in this time zone carries this key (24 hex digits)."""
    return hashlib.sha256(f"{_code_hash()}|{tz_key()}".encode()).hexdigest()[:24]


def row_key() -> str:
    """The key of a memo row cut to its job row (:data:`slurm_ft.history.memo.MEMO_DAYS` < age <= :data:`slurm_ft.history.memo.ROW_DAYS`)."""
    return render_key() + ":row"


def lookup(journal, keys, kind: str) -> dict[int, tuple]:
    """record key -> (t0, t1, text) of the memo rows of ``keys`` that this process may print as
    they are (``kind``: ``"list"``, ``"jobrow"``: the list's first line, the job row, or
    ``"chain"``); {} when the journal has no memo or holds rows in its spool."""
    column = _KINDS.get(kind)
    if column is None or getattr(journal, "spooled", False) or not keys:
        return {}
    held = [render_key(), row_key()] if kind == "jobrow" else [render_key()]
    try:
        _, rows = _read(journal.db.conn, f"SELECT job_id, t0, t1, {column} FROM {MEMO_TABLE} WHERE key IN "
                                         f"(SELECT value FROM json_each(?)) AND job_id IN (SELECT value FROM json_each(?))",
                        [json.dumps(held), json.dumps(sorted(int(k) for k in keys))])
    except sqlite3.OperationalError:     # a journal from before migration 009, opened read-only
        return {}
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


#: What :func:`lookup` reads for each kind of text.
_KINDS = {"list": "list", "chain": "chain", "jobrow": "substr(list, 1, instr(list || char(10), char(10)) - 1)"}
#: SQL of a memo row's job row (its list's first line; slurm_ft.history.memo cuts old rows to it).
JOBROW_SQL = _KINDS["jobrow"]


# ------------------------------------------------------------------------------ -N: nodes
#: Most node names ``-N`` takes (and the most a journal's hostlist is expanded to): a bound on
#: the memory a hostlist such as ``n[1-999999999]`` could take (ClusterShell expands ranges).
MAX_NODES = 65536
#: A node name as Slurm allows it (NodeName): no hostlist syntax, no space, no control character.
_NODE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_RANGES = re.compile(r"\[([^\[\]]*)\]")


def _size_bound(text: str) -> int:
    """An upper bound of the names hostlist ``text`` expands to, read without expanding it (a
    range ``a-b`` counts b - a + 1 whatever its step; brackets of one name multiply)."""
    total = 0
    for pattern in re.split(r",(?![^\[]*\])", text):
        count = 1
        for group in _RANGES.findall(pattern):
            n = 0
            for part in group.split(","):
                lo, _, rest = (x.strip() for x in part.partition("-"))
                hi = rest.split("/", 1)[0].strip()
                if len(lo) > 12 or len(hi) > 12:        # never int() of a thousand digits
                    return MAX_NODES + 1
                n += int(hi) - int(lo) + 1 if lo.isdigit() and hi.isdigit() else 1
            count *= max(n, 1)
        total += count
        if total > MAX_NODES:
            break
    return total


def parse_nodelist(text: str) -> frozenset[str]:
    """``-N`` value: a Slurm hostlist (``g[001-004],n1``, ClusterShell's syntax without its set
    operators and groups) -> the node names. Raises ValueError with one line naming the problem
    (a malformed hostlist, a name Slurm would not take, more than :data:`MAX_NODES` names)."""
    from slurm_ft.slurm.records import _nodeset

    text = str(text).strip()
    if not text:
        raise ValueError("an empty node list")
    if _size_bound(text) > MAX_NODES:
        raise ValueError(f"{text[:80]!r}: more than {MAX_NODES} nodes")
    try:
        names = frozenset(_nodeset(text))
    except Exception as exc:             # noqa: BLE001 - HostlistError, or any ClusterShell complaint
        msg = str(exc) if isinstance(exc, SlurmFTError) else f"not a Slurm hostlist: {text[:80]!r}"
        msg = (msg.splitlines() or ["not a Slurm hostlist"])[0]
        raise ValueError(msg if len(msg) <= 200 else msg[:197] + "...") from None
    bad = sorted(n for n in names if not _NODE.fullmatch(n))
    if bad or not names:
        raise ValueError(f"{(bad[0] if bad else text)[:80]!r} is not a node name")
    if len(names) > MAX_NODES:
        raise ValueError(f"{text[:80]!r}: more than {MAX_NODES} nodes")
    return names


class _NodeMatch:
    """Which of the selected ``names`` a journal hostlist (an attempt's ``nodes``, a drain's
    ``target``: possibly folded, ``n[1-2]``) names; each distinct text is read once."""

    def __init__(self, names):
        self.names = frozenset(names)
        self._seen: dict[str, frozenset[str]] = {}

    def __call__(self, text) -> frozenset[str]:
        if not text:
            return frozenset()
        text = str(text)
        hit = self._seen.get(text)
        if hit is None:
            if "[" not in text:
                hit = self.names.intersection(p.strip() for p in text.split(","))
            elif _size_bound(text) > MAX_NODES:
                hit = self.names & {text}
            else:
                try:
                    from slurm_ft.slurm.records import _nodeset
                    hit = self.names.intersection(_nodeset(text))
                except Exception:     # noqa: BLE001 - not a hostlist: the text as one name
                    hit = self.names & {text}
            self._seen[text] = hit = frozenset(hit)
        return hit


def _jobs_on_nodes(journal, names, start: float, end: float) -> set[int]:
    """Record keys with an attempt, a verdict or an action (its target) on one of ``names`` in the
    window: attempts and actions by their time indexes, each row's hostlist expanded."""
    match = _NodeMatch(names)
    out: set[int] = set()
    conn = journal.db.conn
    sql = ('SELECT job_id, nodes FROM attempts WHERE COALESCE("end", start, updated) >= ? '
           'AND COALESCE(start, updated, 0) <= ? AND nodes IS NOT NULL AND nodes != \'\'')
    for job_id, nodes in _read(conn, sql, [start, end])[1]:
        if job_id is not None and match(nodes):
            out.add(job_id)
    sql = ("SELECT DISTINCT job_id FROM verdicts WHERE created >= ? AND created <= ? "
           "AND node IN (SELECT value FROM json_each(?))")
    out.update(r[0] for r in conn.execute(sql, [start, end, json.dumps(sorted(match.names))]) if r[0] is not None)
    sql = ("SELECT job_id, target FROM actions WHERE COALESCE(finished, created) >= ? AND created <= ? "
           "AND target IS NOT NULL AND target != '' AND status != 'intent'")
    for job_id, target in _read(conn, sql, [start, end])[1]:
        if job_id and match(target):
            out.add(job_id)
    return out


#: Node steps of the ``-N`` section: journal action -> step name (``remediate-<kind>``: the kind).
NODE_STEPS = {"drain": "drain", "report-ack": "ack"}
#: reconcile kinds (slurm_ft.failover.reconcile) that are node steps: a lifted drain is a resume
_RECONCILE_STEPS = {"drain-lifted": "resume", "drain-reapplied": "redrain"}
_JOB_IN_TEXT = re.compile(r"(?i)\b(jobs?(?: ?id)?[ _=:#]*)\d+")
#: Longest reason a node step shows (the whole detail is in --json).
MAX_REASON = 160


def _step_name(action: str, detail: str | None) -> str | None:
    if action.startswith("remediate-"):
        return action[len("remediate-"):] or None
    if action in NODE_STEPS:
        return NODE_STEPS[action]
    if action == "reconcile":
        from slurm_ft.failover.reconcile import parse_detail
        return _RECONCILE_STEPS.get(str(parse_detail(detail).get("kind")))
    return None


def _step_reason(action: str, status: str, detail: str | None) -> str:
    """A short reason from a step's detail: a remediation's JSON ``why`` (failed) or ``reason``/
    ``why``/``what``; a drain's or an acknowledgement's text; a reconciliation's ``why``."""
    text = detail or ""
    if action.startswith("remediate-") or action == "reconcile":
        try:
            d = json.loads(text or "{}")
        except (ValueError, RecursionError):
            d = None
        if isinstance(d, dict):
            keys = ("why", "reason", "what") if status == "failed" or action == "reconcile" else \
                ("reason", "why", "what")
            text = next((str(d[k]) for k in keys if d.get(k) not in (None, "")), "")
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


def node_steps(journal, names, start: float, end: float, viewer: Viewer | None = None) -> dict[str, list[dict]]:
    """``-N``: each of ``names`` that has any -> its drains and repairs in the window, oldest
    first: ``{"time", "step"`` (reset, reboot, pass, fail, rma, cancel, drain, ack, resume,
    redrain), ``"status"`` (done, failed, observed, skipped), ``"job_id"`` (the job whose fault
    caused it; None when none, or when ``viewer`` is no admin and the job is not theirs),
    ``"reason", "action", "target", "detail"}``. Raises :class:`JournalError`."""
    try:
        return _node_steps(journal, names, start, end, viewer)
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"{journal.path}: {exc}") from None


def _node_steps(journal, names, start, end, viewer) -> dict[str, list[dict]]:
    match = _NodeMatch(names)
    sql = ("SELECT id, job_id, action, target, detail, status, created FROM actions "
           "WHERE COALESCE(finished, created) >= ? AND created <= ? AND target IS NOT NULL AND target != '' "
           "AND status != 'intent' AND (action IN ('drain', 'report-ack', 'reconcile') OR action LIKE 'remediate-%') "
           "ORDER BY created, id")
    cols, rows = _read(journal.db.conn, sql, [start, end])
    out: dict[str, list[dict]] = {}
    owners: dict[int, str | None] = {}
    retired = None
    for row in rows:
        r = dict(zip(cols, row))
        step = _step_name(str(r["action"]), r["detail"])
        if step is None or r["created"] is None or not start <= r["created"] <= end:
            continue
        hit = match(r["target"])
        if not hit:
            continue
        job_id = r["job_id"] if isinstance(r["job_id"], int) else None
        if job_id is not None and job_id < 0:          # a retired record's key: its job id
            retired = identity.retired(journal) if retired is None else retired
            job_id = retired.get(job_id, {}).get("job_id")
        if job_id is not None and job_id <= 0:
            job_id = None
        if job_id is not None and viewer is not None and not viewer.admin:
            if r["job_id"] not in owners:
                job = journal.job(r["job_id"])
                owners[r["job_id"]] = job.get("user") if job else None
            owner = owners[r["job_id"]]
            if not owner or (owner != viewer.user and owner != str(viewer.uid) and fmt.user_name(owner) != viewer.user):
                job_id = None
        reason = _step_reason(str(r["action"]), str(r["status"]), r["detail"])
        if job_id is None and viewer is not None and not viewer.admin:   # not theirs: no job id in the text
            reason = _JOB_IN_TEXT.sub(r"\1-", reason)
        entry = {"time": r["created"], "step": step, "status": r["status"], "job_id": job_id, "reason": reason,
                 "action": r["action"], "target": r["target"]}
        if viewer is None or viewer.admin:
            entry["detail"] = r["detail"]
        for node in sorted(hit):
            out.setdefault(node, []).append(entry)
    return {n: out[n] for n in sorted(out)}


def _overlaps(first, last, active: bool, start: float, end: float) -> bool:
    return (first is None or first <= end) and (active or last is None or last >= start)


class Rendered(str):
    """A job's text as ``ft-history`` prints it, from the history memo (slurm_ft.history.memo):
    its ``-P`` lines or its chain view, in place of its history dict in :func:`select`'s answer."""


def select(journal, sel: Selection, viewer: Viewer | None = None,
           now: float | None = None, memo: str | None = None) -> tuple[list, list]:
    """(histories of the selected jobs in job id order (an array's tasks in task order, an
    earlier job with the same id first), requested job ids -- an int, or the ``-j`` item's text
    for an array task item -- not in the journal or hidden from ``viewer``). With ``memo``
    (``"list"``, ``"jobrow"`` or ``"chain"``: :func:`memo_kind`), a finished job the memo holds is its
    :class:`Rendered` text instead of its dict. Raises :class:`JournalError` if the journal
    cannot be queried."""
    try:
        return _select(journal, sel, viewer, time.time() if now is None else now, memo)
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"{journal.path}: {exc}") from None


def memo_kind(*, columns, parsable: bool, delimiter: str | None, header: bool, allocations: bool,
              detail: bool, as_json: bool, sel: Selection) -> str | None:
    """Which pre-rendered text (slurm_ft.history.memo) these options print as is: ``"list"``
    (``-p``/``-P`` with the default columns and delimiter), ``"jobrow"`` (the same with ``-X``:
    the job row alone), ``"chain"`` (the default view, with its header), else None (every job
    rendered now)."""
    if columns or detail or as_json or sel.job_ids or sel.states or sel.duplicates or sel.nodes is not None:
        return None
    if parsable:
        return ("jobrow" if allocations else "list") if delimiter in (None, "|") else None
    return "chain" if header and not allocations else None


def _records(journal) -> set[int]:
    """Every record key on file: job ids and retired records' keys (slurm_ft.journal.identity)."""
    return {r[0] for r in journal.db.conn.execute("SELECT job_id FROM jobs UNION SELECT job_id FROM verdicts")
            if r[0] is not None}


def _select(journal, sel: Selection, viewer: Viewer | None, now: float, memo: str | None = None) -> tuple[list, list]:
    end = now if sel.end is None else sel.end
    missing: list = []
    # -N: the records with an attempt, a verdict or an action on those nodes in the window
    on_nodes = _jobs_on_nodes(journal, sel.nodes, sel.start, end) if sel.nodes is not None else None
    arrays, retired = identity.arrays(journal), identity.retired(journal)
    if sel.job_ids:
        jobs = {}
        specs = sorted({s if isinstance(s, JobSpec) else JobSpec(int(s)) for s in sel.job_ids},
                       key=lambda s: (s.job_id, s.tasks or ()))
        keys = _records(journal) if any(s.tasks is not None or s.job_id in {a for a, _ in arrays.values()}
                                        or any(r["job_id"] == s.job_id for r in retired.values())
                                        for s in specs) else set()
        for spec in specs:
            hits = {k for k in keys if spec.matches(retired[k]["job_id"] if k in retired else k, arrays.get(k))}
            if spec.tasks is None:
                hits.add(spec.job_id)
            rows = {k: r for k in hits if (r := _job_row(journal, k, viewer)) is not None}
            if not rows:
                missing.append(spec.job_id if spec.tasks is None else str(spec))
            jobs.update(rows)
    else:
        listed = policy.NOT_CONFIGURED in sel.states     # jobs slurm-ft only saw fail: on request
        users = _users(sel, viewer)
        # a user's jobs (index jobs_user), an account's (jobs_account), else the records the window
        # may hold (index range scans)
        keys = _jobs_of(journal, users) if users is not None else \
            _jobs_of_accounts(journal, sel.accounts) if sel.accounts is not None else \
            set(on_nodes) if on_nodes is not None else _candidates(journal, sel.start)
        window = {"keys": json.dumps(sorted(keys))}
        # with the memo, the columns that select a job first (_LIGHT); the whole row of the jobs
        # rendered now is read below
        cols, found = _read(journal.db.conn, f"SELECT {_LIGHT if memo else '*'} FROM jobs WHERE job_id IN "
                                             f"(SELECT value FROM json_each(:keys)) ORDER BY job_id", window)
        jobs = {r["job_id"]: r for r in (dict(zip(cols, row)) for row in found)
                if (listed or r["ft_state"] != policy.NOT_CONFIGURED) and (r["job_id"] > 0 or r["job_id"] in retired)}
        if listed and (viewer is None or viewer.sees_all):
            for (job_id,) in journal.db.conn.execute(
                    "SELECT DISTINCT job_id FROM verdicts WHERE job_id IN (SELECT value FROM json_each(:keys)) "
                    "AND job_id NOT IN (SELECT job_id FROM jobs)", window).fetchall():
                jobs[job_id] = _job_row(journal, job_id, None)
        if viewer is not None:
            jobs = {k: v for k, v in jobs.items() if viewer.may_see(v)}
    users = _users(sel, viewer)
    if users is not None:
        jobs = {k: v for k, v in jobs.items() if v.get("user") and fmt.user_name(v["user"]) in users}
    if sel.accounts is not None:
        jobs = {k: v for k, v in jobs.items() if _fold_case(v.get("account") or "") in sel.accounts}
    if on_nodes is not None:
        jobs = {k: v for k, v in jobs.items() if k in on_nodes}
    # finished jobs rendered ahead (slurm_ft.history.memo): their text and times, no row read
    done = lookup(journal, jobs, memo) if memo and not sel.states and not sel.duplicates else {}
    spans = None
    if not sel.job_ids and (users is not None or sel.accounts is not None):
        # a user's (an account's) jobs of all time: their times first (the memo's, else one query),
        # then read only those in the window
        spans = _spans(journal, [k for k in jobs if k not in done])
        spans.update((k, m[:2]) for k, m in done.items())
        jobs = {k: v for k, v in jobs.items()
                if _overlaps(*spans.get(k, (None, None)), v["ft_state"] not in policy.FINAL_STATES, sel.start, end)}
    rest = {k: v for k, v in jobs.items() if k not in done} if done else jobs
    if memo and not sel.job_ids and rest:      # read with _LIGHT's columns: the whole rows now
        cols, found = _read(journal.db.conn, "SELECT * FROM jobs WHERE job_id IN (SELECT value FROM json_each(?))",
                            [json.dumps(sorted(rest))])
        whole = {r["job_id"]: r for r in (dict(zip(cols, row)) for row in found)}
        rest = {k: whole.get(k, v) for k, v in rest.items()}      # (a not-configured job: no jobs row)
        jobs = {k: rest.get(k, v) for k, v in jobs.items()}
    # many records: their rows in three queries, which also give their times (a journal with
    # spooled rows is read job by job, through the Journal's own reads, which add those rows)
    if len(rest) > 1 and not journal.spooled:
        rows = _Prefetched(journal, rest, rest)
        spans = rows.spans if spans is None else spans
    else:
        rows, spans = journal, _spans(journal, rest) if spans is None else spans
    out = []
    slurm_states = {s for s in sel.states if s.isupper()}
    def order(key: int) -> tuple:
        array, old = arrays.get(key), retired.get(key)
        base = array[0] if array else (old["job_id"] if old else key)
        return (base, array[1] if array else -1, old["retired"] if old else float("inf"), key)

    for job_id in sorted(jobs, key=order) if arrays or retired else sorted(jobs):
        job = jobs[job_id]
        ahead = done.get(job_id)
        first, last = ahead[:2] if ahead else spans.get(job_id, (None, None))
        active = job["ft_state"] not in policy.FINAL_STATES
        if not _overlaps(first, last, active, sel.start, end):
            continue
        if ahead:
            out.append(Rendered(ahead[2]))
            continue
        h = _chain(rows, job_id, job, arrays.get(job_id), retired.get(job_id))
        if sel.states and h["ft_state"] not in sel.states and not any(a["state"] in sel.states for a in h["attempts"]):
            continue
        if sel.duplicates and h["attempts"]:
            h["attempts"] = [a for a in h["attempts"]
                             if (not slurm_states or a["state"] in slurm_states)
                             and _overlaps(a["start"], a["end"], a["end"] is None, sel.start, end)]
            if not h["attempts"]:
                continue
        out.append(h)
    return out, missing


def _checkpoint(actions: list[dict]) -> dict | None:
    """The attempt's exit checkpoint (slurm_ft/failover/ckpt_signal.py, the daemon's evacuation): result, step, path."""
    ckpt = [x for x in actions if x["action"].startswith("ckpt-")]
    if not ckpt:
        return None
    last = ckpt[-1]
    out: dict = {"result": "notified", "step": None, "path": None, "detail": last["detail"]}
    if last["action"] == "ckpt-ack":
        words = last["detail"].split()
        out["result"] = words[0] if words else "?"
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key == "step" and value.isdigit():
                out["step"] = int(value)
            elif key == "path":
                out["path"] = value
    elif last["action"] == "ckpt-timeout":
        out["result"] = "timeout"
    return out



def _bisect_summary(detail: str) -> str:
    try:
        return str(json.loads(detail or "{}").get("summary", "?"))
    except (ValueError, AttributeError):
        return "?"


#: Actions of an observe-mode daemon (status ``observed``) named in the summary, as "would ...".
_WOULD = ("drain", "requeue", "release", "hold", "relax", "evacuation", "continue", "failover", "start-now",
          "bisect-start")


def _reconcile_why(detail: str) -> str:
    from slurm_ft.failover.reconcile import parse_detail

    d = parse_detail(detail)
    return str(d.get("why") or d.get("kind") or detail)


def _summarise(actions: list[dict]) -> str:
    parts = []
    for x in actions:
        if x["status"] == _observed():   # [failover] mode = "observe": decided, nothing done in Slurm
            if x["action"] in _WOULD:
                what = f"{x['action']} {x['target']}" if x["action"] == "drain" else x["action"]
                parts.append(f"observed: would {what}" + (f": {x['detail']}" if x["action"] == "hold" else ""))
            elif x["action"] == "decide":
                parts.append(f"observed: {x['detail']}")
            elif x["action"].startswith("remediate-"):
                parts.append(f"observed: would {x['action']} {x['target']}")
            continue
        if x["action"] == "drain" and x["status"] == "done":
            parts.append(f"drain {x['target']}")
        elif x["action"] in ("requeue", "release") and x["status"] == "done":
            parts.append(x["action"])
        elif x["action"] == "decide":
            parts.append(x["detail"])  # e.g. "user-error: the job's own error: xid-13 on n2"
        elif x["action"] in ("hold", "relax") and x["status"] == "done":
            parts.append(f"{x['action']}: {x['detail']}")
        elif x["action"] == "ckpt-notify" and x["status"] == "skipped":
            parts.append("checkpoint signal: nothing catches it")
        elif x["action"] == "ckpt-timeout":
            parts.append("checkpoint wait expired")
        elif x["action"] == "inplace-restart":       # slurm_ft.job.inplace: reported by the job's wrapper
            what = x["detail"].split(": ", 1)[-1].split(", reported", 1)[0]
            parts.append(f"restart {x['detail'].split(' ', 2)[1]} in place ({what})")
        elif x["action"] == "inplace-escalate":
            parts.append("in-place budget used up")
        elif x["action"] == "reconcile":             # slurm_ft.failover.reconcile: Slurm lost a change
            parts.append(f"reconcile: {_reconcile_why(x['detail'])}" + ("" if x["status"] == "done" else
                                                                          f" ({x['status']})"))
        elif x["action"].startswith("remediate-") and x["status"] == "done":   # slurm_ft.remediate
            parts.append(f"{x['action']} {x['target']}")
        elif x["action"] == "bisect":                # slurm_ft.bisect: the rounds are in --json
            parts.append(f"bisect: {_bisect_summary(x['detail'])}")
        elif x["status"] == "failed":
            parts.append(f"{x['action']} failed")
    return ", ".join(parts) or "-"


def render_table(h: dict) -> str:
    """The retry-chain view of one job (heading line and attempt table), every cell terminal-safe."""
    return fmt.chain(h)
