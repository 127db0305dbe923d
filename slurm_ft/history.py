"""``ft-history``: fault-tolerant jobs and their retry chains from the daemon's journal, with
sacct's options (``-j -u -a -S -E -s -o -p -P -n -X -D --json``, see docs/user-guide.md).

Which jobs: with ``-j``, those jobs; otherwise every ft-enabled job active in the time window
(``-S``/``-E``, Slurm's time formats: :mod:`slurm_ft.timespec`), of the caller only unless
``-u``/``-a`` (as sacct). Output layouts live in :mod:`slurm_ft.history_format`.

Privacy: when Slurm's ``PrivateData`` includes ``jobs``, a user other than root and SlurmUser
sees only their own jobs (the journal's ``jobs.user``), as ``squeue`` would show them. Every
text field printed is passed through :func:`slurm_ft.textsafe.terminal_safe` (``--json`` is
ASCII JSON, which escapes control characters itself).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import sqlite3
import sys
import time
from dataclasses import dataclass

import click

from . import config as config_mod
from . import daemonlock
from . import history_format as fmt
from .errors import JournalError, SlurmFTError
from .failover import policy
from .failover.observe import OBSERVED
from .journal import open_journal
from .slurm import compress_nodes
from .textsafe import terminal_safe
from .timespec import parse_time


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
    from .slurm import Slurm, private_data
    try:
        timeout_s = cfg.slurm.command_timeout_s if cfg is not None else config_mod.SlurmConfig().command_timeout_s
        conf = (slurm or Slurm(bin_dir=_trusted_bin_dir(cfg), timeout_s=timeout_s)).show_config()
    except SlurmFTError:
        return Viewer(uid, user, True)
    return Viewer(uid, user, "jobs" in private_data(conf), conf.get("SlurmUser", "root").split("(")[0] or "root")


def _trusted_bin_dir(cfg) -> str:
    """``[slurm] bin_dir`` of a config only root can change; else the default. A user's own
    ``--config``/``$SLURM_FT_CONFIG`` must not pick the ``scontrol`` that answers PrivateData."""
    default = config_mod.SlurmConfig().bin_dir
    if cfg is None or cfg.source is None:
        return default if cfg is None else cfg.slurm.bin_dir
    try:
        st = os.stat(cfg.source)
    except OSError:
        return default
    return cfg.slurm.bin_dir if st.st_uid == 0 and not st.st_mode & 0o022 else default


_HIDDEN = ", or not yours (Slurm PrivateData=jobs)"


def _job_row(journal, job_id: int, viewer: Viewer | None) -> dict | None:
    """The job's ``jobs`` row as ``viewer`` may see it; a job known only by its verdicts (not
    ft-enabled) reads as ``not-configured``; None when unknown or hidden from ``viewer``."""
    job = journal.job(job_id)
    if viewer is not None and not viewer.sees_all:
        return job if viewer.may_see(job) else None
    if job is None and journal.verdicts(job_id):
        job = {"job_id": job_id, "name": None, "user": None, "ft_state": policy.NOT_CONFIGURED,
               "retries": None, "excluded_nodes": None}
    return job


def _fold(names) -> str:
    """Node names as one Slurm hostlist (``gpu[01-02]-ib``); a name that is not one is listed as is."""
    names = sorted(set(names))
    try:
        return compress_nodes(names)
    except SlurmFTError:
        return ",".join(names)


def _not_in_journal(journal, job_ids: list[int], viewer: Viewer | None) -> SlurmFTError:
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
        raise _not_in_journal(journal, [job_id], viewer)
    return _chain(journal, job_id, job)


def _chain(journal, job_id: int, job: dict) -> dict:
    rows = []
    recorded = {a["attempt"]: a for a in journal.attempts(job_id)}
    # an attempt that never ran (a prolog health check refused the node) has verdicts/actions only
    numbers = set(recorded) | {v["attempt"] for v in journal.verdicts(job_id)} | \
        {x["attempt"] for x in journal.actions(job_id)}
    for n in sorted(numbers):
        verdicts = journal.verdicts(job_id, n)
        refused = any(v["rule"].startswith(policy.HEALTH_RULE) for v in verdicts)
        a = recorded.get(n) or {"attempt": n, "nodes": None, "start": None, "end": None,
                                "state": "PROLOG_REFUSED" if refused else "NOT_STARTED",
                                "exit_code": None, "signal": None}
        actions = [x for x in journal.actions(job_id, n) if x["status"] != "intent"]
        if a["nodes"] is None and verdicts:
            a["nodes"] = _fold(v["node"] for v in verdicts)
        worst = next((v for c in ("hardware", "hang", "infra", "user", "unknown", "ok")
                      for v in verdicts if v["verdict"] == c), None)
        rows.append({
            "attempt": a["attempt"], "nodes": a["nodes"], "start": a["start"], "end": a["end"],
            "state": a["state"], "exit_code": a["exit_code"], "signal": a["signal"],
            "verdict": worst["verdict"] if worst else None, "rule": worst["rule"] if worst else None,
            "xids": sorted({f"{x['xid']}@{x.get('bus_id') or '?'}" for v in verdicts for x in v["xids"]}),
            "verdicts": [{k: v[k] for k in ("node", "verdict", "rule", "xids", "evidence")} for v in verdicts],
            "checkpoint": _checkpoint(actions),
            "action": _summarise(actions),
            "actions": [{k: x[k] for k in ("action", "target", "detail", "status", "created")} for x in actions],
        })
    observed = any(x["status"] == OBSERVED for r in rows for x in r["actions"])
    return {"job_id": job_id, "name": job["name"], "user": job.get("user"), "ft_state": job["ft_state"],
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


@dataclass(frozen=True)
class Selection:
    """Which jobs ``ft-history`` prints (sacct's meanings, docs/user-guide.md)."""

    job_ids: tuple[int, ...] = ()
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


def _spans(journal) -> dict[int, tuple[float | None, float | None]]:
    """job id -> (first, last) time anything about it was recorded."""
    sql = ("SELECT job_id, MIN(t0), MAX(t1) FROM ("
           " SELECT job_id, created AS t0, updated AS t1 FROM jobs"
           " UNION ALL SELECT job_id, COALESCE(start, updated), COALESCE(end, start, updated) FROM attempts"
           " UNION ALL SELECT job_id, created, created FROM verdicts"
           " UNION ALL SELECT job_id, created, COALESCE(finished, created) FROM actions"
           ") WHERE job_id IS NOT NULL GROUP BY job_id")
    return {r[0]: (r[1], r[2]) for r in journal.db.execute(sql).fetchall()}


def _overlaps(first, last, active: bool, start: float, end: float) -> bool:
    return (first is None or first <= end) and (active or last is None or last >= start)


def select(journal, sel: Selection, viewer: Viewer | None = None,
           now: float | None = None) -> tuple[list[dict], list[int]]:
    """(histories of the selected jobs in job id order, requested job ids not in the journal or
    hidden from ``viewer``). Raises :class:`JournalError` if the journal cannot be queried."""
    try:
        return _select(journal, sel, viewer, time.time() if now is None else now)
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"{journal.path}: {exc}") from None


def _select(journal, sel: Selection, viewer: Viewer | None, now: float) -> tuple[list[dict], list[int]]:
    end = now if sel.end is None else sel.end
    missing: list[int] = []
    if sel.job_ids:
        jobs = {}
        for job_id in sorted(set(sel.job_ids)):
            row = _job_row(journal, job_id, viewer)
            if row is None:
                missing.append(job_id)
            else:
                jobs[job_id] = row
    else:
        listed = policy.NOT_CONFIGURED in sel.states     # jobs slurm-ft only saw fail: on request
        jobs = {r["job_id"]: r for r in journal.db.query("SELECT * FROM jobs ORDER BY job_id")
                if listed or r["ft_state"] != policy.NOT_CONFIGURED}
        if listed and (viewer is None or viewer.sees_all):
            for (job_id,) in journal.db.execute("SELECT DISTINCT job_id FROM verdicts WHERE job_id NOT IN "
                                                "(SELECT job_id FROM jobs)").fetchall():
                jobs[job_id] = _job_row(journal, job_id, None)
        if viewer is not None:
            jobs = {k: v for k, v in jobs.items() if viewer.may_see(v)}
    users = sel.users
    if users is None and not sel.job_ids and not sel.all_users and viewer is not None and not viewer.admin:
        users = frozenset({viewer.user})
    if users is not None:
        jobs = {k: v for k, v in jobs.items() if v.get("user") and fmt.user_name(v["user"]) in users}
    spans = _spans(journal)
    out = []
    slurm_states = {s for s in sel.states if s.isupper()}
    for job_id in sorted(jobs):
        job = jobs[job_id]
        first, last = spans.get(job_id, (None, None))
        active = job["ft_state"] not in policy.FINAL_STATES
        if not _overlaps(first, last, active, sel.start, end):
            continue
        h = _chain(journal, job_id, job)
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


def _summarise(actions: list[dict]) -> str:
    parts = []
    for x in actions:
        if x["status"] == OBSERVED:      # [failover] mode = "observe": decided, nothing done in Slurm
            if x["action"] in _WOULD:
                what = f"{x['action']} {x['target']}" if x["action"] == "drain" else x["action"]
                parts.append(f"observed: would {what}" + (f": {x['detail']}" if x["action"] == "hold" else ""))
            elif x["action"] == "decide":
                parts.append(f"observed: {x['detail']}")
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
        elif x["action"] == "inplace-restart":       # slurm_ft.inplace: reported by the job's wrapper
            what = x["detail"].split(": ", 1)[-1].split(", reported", 1)[0]
            parts.append(f"restart {x['detail'].split(' ', 2)[1]} in place ({what})")
        elif x["action"] == "inplace-escalate":
            parts.append("in-place budget used up")
        elif x["action"] == "bisect":                # slurm_ft.bisect: the rounds are in --json
            parts.append(f"bisect: {_bisect_summary(x['detail'])}")
        elif x["status"] == "failed":
            parts.append(f"{x['action']} failed")
    return ", ".join(parts) or "-"


def render_table(h: dict) -> str:
    """The retry-chain view of one job (heading line and attempt table), every cell terminal-safe."""
    return fmt.chain(h)


# ------------------------------------------------------------------------------------ CLI
class _JobIds(click.ParamType):
    name = "JOBID[,JOBID...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        ids = []
        for item in str(value).split(","):
            item = item.strip()
            if not re.fullmatch(r"[0-9]{1,10}", item) or int(item) < 1:
                hint = " (ft-history takes job ids, not steps)" if re.fullmatch(r"\d+[._+].*", item) else ""
                self.fail(terminal_safe(f"{item!r} is not a job id{hint}"), param, ctx)
            ids.append(int(item))
        return ids


class _Users(click.ParamType):
    name = "USER[,USER...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        names = []
        for item in str(value).split(","):
            item = item.strip()
            if item.isdigit():
                names.append(fmt.user_name(item))
            elif re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}\$?", item):
                names.append(item)
            else:
                self.fail(terminal_safe(f"{item!r} is not a user name or uid"), param, ctx)
        return names


class _Time(click.ParamType):
    name = "TIME"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        try:
            return parse_time(str(value))
        except ValueError as exc:
            self.fail(terminal_safe(str(exc)), param, ctx)


class _States(click.ParamType):
    name = "STATE[,STATE...]"

    def convert(self, value, param, ctx):
        if isinstance(value, frozenset):
            return value
        try:
            return parse_states(str(value))
        except ValueError as exc:
            self.fail(terminal_safe(str(exc)), param, ctx)


class _Format(click.ParamType):
    name = "FIELD[%WIDTH],..."

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            return fmt.parse_format(str(value))
        except ValueError as exc:
            self.fail(terminal_safe(str(exc)), param, ctx)


def _helpformat(ctx, param, value):
    if value and not ctx.resilient_parsing:
        click.echo(fmt.helpformat())
        ctx.exit(0)


def _midnight(now: float) -> float:
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


@click.command(name="ft-history")
@click.option("-j", "--jobs", "job_ids", type=_JobIds(), multiple=True,
              help="Job ids, comma-separated; repeatable. Without -j: every ft job in the time window.")
@click.option("-u", "--user", "--uid", "users", type=_Users(), multiple=True,
              help="Only these users' jobs (names or uids, comma-separated; repeatable). Default: your own "
                   "(root and SlurmUser: everyone's). With Slurm PrivateData=jobs you see only your own.")
@click.option("-a", "--allusers", "all_users", is_flag=True,
              help="Every user's jobs (as far as Slurm PrivateData lets you see them).")
@click.option("-S", "--starttime", "start", type=_Time(),
              help="Jobs active at or after this time (Slurm time formats: YYYY-MM-DD[THH:MM[:SS]], "
                   "MMDD[YY], now-2days, ...). Default: 00:00 today; with -j: no limit.")
@click.option("-E", "--endtime", "end", type=_Time(), help="Jobs active at or before this time. Default: now.")
@click.option("-s", "--state", "states", type=_States(), multiple=True,
              help="Only jobs in these ft states (completed, max-retries-exceeded, ...) or with an attempt in "
                   "these Slurm states (FAILED, NF, RQ, ...); comma-separated.")
@click.option("-o", "--format", "columns", type=_Format(),
              help=f"Fields to print, comma-separated, FIELD%N for a width (negative: left-justified), or ALL. "
                   f"Default: {fmt.CHAIN_FORMAT} under each job; with -X: {fmt.JOB_FORMAT}; with -p, -P, "
                   f"-X -D: {fmt.LIST_FORMAT}.")
@click.option("-e", "--helpformat", is_flag=True, expose_value=False, is_eager=True, callback=_helpformat,
              help="List the fields -o accepts and exit.")
@click.option("-p", "--parsable", is_flag=True, help="'|'-separated output, with a '|' at the end of each line.")
@click.option("-P", "--parsable2", is_flag=True, help="'|'-separated output, no '|' at the end.")
@click.option("-n", "--noheader", is_flag=True, help="No column header.")
@click.option("-X", "--allocations", is_flag=True, help="One row per job: no attempt rows.")
@click.option("-D", "--duplicates", is_flag=True,
              help="Every attempt as a row of its own: with -X one row per attempt; attempts outside the time "
                   "window or (with Slurm states in -s) in another state are left out.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON (every field, every attempt); -o, -p, -P, -n and -X are ignored.")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False),
              help="Journal file (default: [journal] path of the config).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Config file (default: $SLURM_FT_CONFIG, slurm-ft.toml beside $SLURM_CONF, "
                   "/etc/slurm-ft/slurm-ft.toml).")
def command(job_ids, users, all_users: bool, start: float | None, end: float | None, states, columns,
            parsable: bool, parsable2: bool, noheader: bool, allocations: bool, duplicates: bool, as_json: bool,
            journal_path: str | None, config_path: str | None) -> None:
    """Show fault-tolerant jobs and their retry chains: under each job one row per attempt (nodes,
    times, Slurm state, verdict, Xids, checkpoint, what slurm-ft did). sacct's options and time
    formats. Reads the journal only."""
    if parsable and parsable2:
        raise click.UsageError("use -p/--parsable or -P/--parsable2, not both")
    now = time.time()
    ids = tuple(i for group in job_ids for i in group)
    if start is None:
        start = 0.0 if ids else _midnight(now)
    if end is not None and start > end:
        raise click.UsageError(f"start time {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(start))} is after "
                               f"end time {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(end))}")
    sel = Selection(job_ids=ids, users=frozenset(u for g in users for u in g) if users else None,
                    all_users=all_users, start=start, end=end,
                    states=frozenset(s for g in states for s in g), duplicates=duplicates)
    try:
        # root with --journal needs no config; anyone else needs [slurm] to ask Slurm's PrivateData
        root_with_path = journal_path and not config_path and os.getuid() == 0
        cfg = None if root_with_path else config_mod.load(config_path)
        path = journal_path or cfg.journal.path
        with open_journal(path, readonly=True) as journal:
            viewer = current_viewer(cfg)
            found, missing = select(journal, sel, viewer=viewer, now=now)
            error = _not_in_journal(journal, missing, viewer) if missing else None
    except SlurmFTError as exc:
        raise click.ClickException(terminal_safe(str(exc))) from None
    poll = cfg.failover.poll_interval_s if cfg is not None else config_mod.FailoverConfig().poll_interval_s
    daemon_state, age = daemonlock.staleness(path, poll, now)
    if daemon_state == "stale":
        click.echo(terminal_safe(f"ft-history: warning: the slurm-ft daemon has not run for {age:.0f} s (heartbeat "
                                 f"{daemonlock.heartbeat_path(path)}): the journal may be behind Slurm"), err=True)
    if error is not None and daemon_state != "fresh":
        why = (f"it has not run for {age:.0f} s" if daemon_state == "stale" else "no heartbeat") + \
            f" ({daemonlock.heartbeat_path(path)})"
        error = SlurmFTError(f"{error}; the slurm-ft daemon may be down: {why}, and a job it has not seen yet is not "
                             f"in the journal")
    if as_json:
        # ensure_ascii: control characters (and all non-ASCII) become \uXXXX escapes, valid JSON
        if len(set(ids)) == 1:          # ft-history -j ID --json: the job's object, as always
            if found:
                click.echo(json.dumps(found[0], indent=2, ensure_ascii=True))
        else:
            click.echo(json.dumps(found, indent=2, ensure_ascii=True))
    else:
        text = _render(found, columns, parsable=parsable or parsable2, trailing=parsable, header=not noheader,
                       allocations=allocations, duplicates=duplicates, now=now)
        if text:
            click.echo(text)
    if error is not None:
        raise click.ClickException(terminal_safe(str(error)))


def _render(found: list[dict], columns, *, parsable: bool, trailing: bool, header: bool, allocations: bool,
            duplicates: bool, now: float) -> str:
    if not parsable and not allocations:
        return "\n\n".join(fmt.chain(h, columns, header=header, now=now) for h in found)
    job_rows, attempt_rows = (False, True) if allocations and duplicates else (True, not allocations)
    cols = columns or fmt.parse_format(fmt.JOB_FORMAT if allocations and not duplicates and not parsable
                                       else fmt.LIST_FORMAT)
    rows = [r for h in found for r in fmt.rows(h, job_row=job_rows, attempts=attempt_rows, now=now)]
    lines = fmt.parsable(cols, rows, header=header, trailing=trailing) if parsable else \
        fmt.table(cols, rows, header=header)
    return "\n".join(lines)


def main() -> None:
    command(prog_name="ft-history")


if __name__ == "__main__":
    sys.exit(main())
