"""``ft-history`` output: the field table (``-o``/``--helpformat``), sacct-style tables and
``|``-separated output, and the retry-chain view.

Rows are of two kinds, as sacct prints a job and its steps: the **job row** (the job as a whole:
``Attempt`` is empty) and one **attempt row** per attempt (``Attempt`` is Slurm's restart count).
On a job row the attempt fields describe the job's newest attempt, except ``Start`` (its first
attempt's start), ``Elapsed`` (first start to last end, or now) and ``Xids`` (every attempt's).

Every cell goes through :func:`slurm_ft.textsafe.terminal_safe` (job names, rules, evidence and
checkpoint paths are partly user-written); in ``|``-separated output a ``|`` inside a value is
printed as ``\\x7c``, so a value can never add a column.
"""

from __future__ import annotations

import pwd
import re
import time
from dataclasses import dataclass
from typing import Callable

from .textsafe import terminal_safe


@dataclass(frozen=True)
class Row:
    h: dict                 #: the job's history (slurm_ft.history.history)
    a: dict | None          #: the attempt described: this row's, or the job's newest
    job_row: bool
    now: float


@dataclass(frozen=True)
class Field:
    name: str
    help: str
    get: Callable[[Row], str]


def _t(ts) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) if ts else "Unknown"


def _elapsed(seconds: float | None) -> str:
    """sacct's ``[D-]HH:MM:SS``."""
    if seconds is None or seconds < 0:
        return ""
    s = int(seconds)
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def user_name(user: str | None) -> str:
    """The journal's user (Slurm's user name); a bare number is a uid, shown as its name."""
    if user and user.isdigit():
        try:
            return pwd.getpwuid(int(user)).pw_name
        except (KeyError, OverflowError):
            return user
    return user or ""


def user_uid(user: str | None) -> str:
    if not user:
        return ""
    if user.isdigit():
        return user
    try:
        return str(pwd.getpwnam(user).pw_uid)
    except KeyError:
        return ""


def _attr(key: str) -> Callable[[Row], str]:
    return lambda r: "" if r.a is None or r.a.get(key) is None else str(r.a[key])


def _start(r: Row) -> str:
    if r.job_row:
        starts = [a["start"] for a in r.h["attempts"] if a["start"]]
        return _t(min(starts) if starts else None)
    return _t(r.a and r.a["start"])


def _elapsed_of(r: Row) -> str:
    if r.a is None:
        return ""
    if r.job_row:
        starts = [a["start"] for a in r.h["attempts"] if a["start"]]
        start = min(starts) if starts else None
    else:
        start = r.a["start"]
    if not start:
        return ""
    end = r.a["end"] or (r.now if r.a["state"] in ("RUNNING", "COMPLETING", "SUSPENDED") else None)
    return _elapsed(end - start) if end else ""


def _exit(r: Row) -> str:
    if r.a is None or r.a.get("exit_code") is None:
        return ""
    return f"{r.a['exit_code']}:{r.a.get('signal') or 0}"


def _verdict(r: Row) -> str:
    if r.a is None or not r.a.get("verdict"):
        return ""
    return f"{r.a['verdict']} ({r.a['rule']})"


def _xids(r: Row) -> str:
    if r.job_row:
        return ",".join(sorted({x for a in r.h["attempts"] for x in a["xids"]}))
    return ",".join(r.a["xids"]) if r.a else ""


def ckpt_cell(c: dict | None) -> str:
    """``saved @120 /ckpt/120``, ``timeout``, ``notified``; "" for none."""
    if not c:
        return ""
    text = c["result"]
    if c["step"] is not None:
        text += f" @{c['step']}"
    if c["path"]:
        text += f" {c['path']}"
    return text


#: Every field ``-o`` accepts, in ``--helpformat`` order. Names are matched case-insensitively.
FIELDS: tuple[Field, ...] = (
    Field("JobID", "Slurm job id", lambda r: str(r.h["job_id"])),
    Field("JobName", "job name", lambda r: r.h.get("name") or ""),
    Field("User", "user name (a uid on record is shown as its name)", lambda r: user_name(r.h.get("user"))),
    Field("UID", "user id (looked up on this host)", lambda r: user_uid(r.h.get("user"))),
    Field("FTState", "slurm-ft state of the job (running, requeued, completed, max-retries-exceeded, ...; "
          "ft-history -s lists them all); observed:STATE when slurm-ft only observed ([failover] mode = "
          "observe: decided, nothing done in Slurm)",
          lambda r: ("observed:" if r.h.get("observed") else "") + (r.h.get("ft_state") or "")),
    Field("Retries", "the job's retry budget", lambda r: "" if r.h.get("retries") is None else str(r.h["retries"])),
    Field("Failovers", "failovers done (spent from the budget)", lambda r: str(r.h.get("failovers", ""))),
    Field("Attempts", "number of attempts", lambda r: str(len(r.h["attempts"]))),
    Field("Attempt", "attempt number (Slurm's restart count); empty on the job row",
          lambda r: "" if r.job_row or r.a is None else str(r.a["attempt"])),
    Field("State", "Slurm job state of the attempt (PROLOG_REFUSED: a prolog health check refused the node; "
          "NOT_STARTED: never ran)", _attr("state")),
    Field("ExitCode", "exit code:signal, as sacct prints it", _exit),
    Field("NodeList", "nodes of the attempt", _attr("nodes")),
    Field("ExcludeNodes", "nodes slurm-ft excluded the job from (blamed in any attempt)",
          lambda r: r.h.get("excluded_nodes") or ""),
    Field("Start", "start of the attempt (job row: of its first attempt)", _start),
    Field("End", "end of the attempt", lambda r: _t(r.a and r.a["end"])),
    Field("Elapsed", "run time [D-]HH:MM:SS (job row: first start to last end)", _elapsed_of),
    Field("Verdict", "worst verdict of the attempt's nodes, with its rule: hardware (xid-79)", _verdict),
    Field("VerdictClass", "verdict class: hardware, hang, infra, user, unknown, ok", _attr("verdict")),
    Field("Rule", "rule that decided the verdict (docs/classifier.md)", _attr("rule")),
    Field("Xids", "Xid@bus id seen (job row: every attempt's)", _xids),
    Field("Checkpoint", "exit checkpoint: saved @STEP PATH, failed, timeout, notified",
          lambda r: ckpt_cell(r.a.get("checkpoint")) if r.a else ""),
    Field("Action", "what slurm-ft did (drain, requeue, release, its decision)",
          lambda r: "" if r.a is None or r.a.get("action") in (None, "-") else r.a["action"]),
)
BY_NAME = {f.name.lower(): f for f in FIELDS}

#: The retry-chain view's attempt table (the default output).
CHAIN_FORMAT = "Attempt,NodeList,Start,End,State,Verdict,Xids,Checkpoint,Action"
#: ``|``-separated output, and ``-X -D`` (one row per attempt).
LIST_FORMAT = "JobID,Attempt,JobName,User,FTState,Attempts,State,NodeList,Start,End,Verdict"
#: ``-X``: one row per job.
JOB_FORMAT = "JobID,JobName,User,FTState,Attempts,State,NodeList,Start,End,Verdict"


@dataclass(frozen=True)
class Column:
    field: Field
    #: ``%N``: None = as wide as the widest value (left-justified); > 0 right-justified in N
    #: characters; < 0 left-justified in -N characters. Longer values end in ``+`` (sacct).
    width: int | None = None


_ITEM = re.compile(r"([A-Za-z]+)(?:%(-?\d{1,4}))?")


def parse_format(spec: str) -> list[Column]:
    """``-o`` value: ``JobID,JobName%30,State%-12``, or ``ALL``. Raises ValueError naming the bad item."""
    if spec.strip().lower() == "all":
        return [Column(f) for f in FIELDS]
    cols = []
    for item in spec.split(","):
        item = item.strip()
        m = _ITEM.fullmatch(item)
        if not m:
            raise ValueError(f"{item!r}: expected FIELD or FIELD%WIDTH (fields: ft-history --helpformat)")
        field = BY_NAME.get(m.group(1).lower())
        if field is None:
            raise ValueError(f"{m.group(1)!r}: no such field (fields: ft-history --helpformat)")
        width = int(m.group(2)) if m.group(2) is not None else None
        if width == 0:
            raise ValueError(f"{item!r}: a width must not be 0")
        cols.append(Column(field, width))
    return cols


def helpformat() -> str:
    w = max(len(f.name) for f in FIELDS)
    return "\n".join(f"{f.name:<{w}}  {f.help}" for f in FIELDS)


def rows(h: dict, *, job_row: bool = True, attempts: bool = True, now: float | None = None) -> list[Row]:
    """The job's rows: its job row (``job_row``) and one row per attempt (``attempts``)."""
    now = time.time() if now is None else now
    out = []
    if job_row:
        out.append(Row(h, h["attempts"][-1] if h["attempts"] else None, True, now))
    if attempts:
        out += [Row(h, a, False, now) for a in h["attempts"]]
    return out


def _cell(col: Column, row: Row) -> str:
    return terminal_safe(col.field.get(row))


def _fit(text: str, col: Column, auto: int, mark: str = "+") -> str:
    if col.width is None:
        return text.ljust(auto)
    n = abs(col.width)
    if len(text) > n:
        text = text[:n - len(mark)] + mark if n > len(mark) else text[:n]
    return text.rjust(n) if col.width > 0 else text.ljust(n)


def table(cols: list[Column], rows_: list[Row], *, header: bool = True, indent: str = "") -> list[str]:
    """sacct's fixed-width layout: header, a line of dashes, one line per row."""
    cells = [[_cell(c, r) for c in cols] for r in rows_]
    names = [c.field.name for c in cols]
    widths = [max([len(names[i])] + [len(line[i]) for line in cells]) for i in range(len(cols))]
    lines = []
    if header:
        lines.append(" ".join(_fit(n, c, w, mark="") for n, c, w in zip(names, cols, widths)))
        lines.append(" ".join("-" * (abs(c.width) if c.width else w) for c, w in zip(cols, widths)))
    lines += [" ".join(_fit(v, c, w) for v, c, w in zip(line, cols, widths)) for line in cells]
    return [indent + line.rstrip() for line in lines]


def parsable(cols: list[Column], rows_: list[Row], *, header: bool = True, trailing: bool = False) -> list[str]:
    """``-p``/``-P``: ``|``-separated, widths ignored (as sacct does); ``|`` in a value is ``\\x7c``."""
    end = "|" if trailing else ""

    def join(values):
        return "|".join(v.replace("|", "\\x7c") for v in values) + end

    lines = [join(c.field.name for c in cols)] if header else []
    return lines + [join(_cell(c, r) for c in cols) for r in rows_]


def job_heading(h: dict) -> str:
    """``Job 5 (train): ft state requeued, retries 3, user alice``: the job line of the chain view."""
    budget = f", retries {h['retries']}" if h.get("retries") is not None else ""
    user = user_name(h.get("user"))
    who = f", user {user}" if user else ""
    state = h["ft_state"]
    if state == "held":          # why slurm-ft holds it (the newest hold's reason)
        reason = next((x["detail"] for a in reversed(h.get("attempts") or []) for x in reversed(a.get("actions") or [])
                       if x["action"] == "hold" and x.get("detail")), "")
        state = f"held: {reason}" if reason else state
    if h.get("observed"):
        state = f"{state} (observed only: [failover] mode = observe, nothing done in Slurm)"
    return terminal_safe(f"Job {h['job_id']} ({h.get('name') or '-'}): ft state {state}{budget}{who}")


def chain(h: dict, cols: list[Column] | None = None, *, header: bool = True, now: float | None = None) -> str:
    """The retry-chain view of one job: its heading line, then its attempts as a table."""
    cols = cols or parse_format(CHAIN_FORMAT)
    return "\n".join([job_heading(h), *table(cols, rows(h, job_row=False, now=now), header=header)])
