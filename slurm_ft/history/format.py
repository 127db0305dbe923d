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

import functools
import pwd
import re
import time
from dataclasses import dataclass
from typing import Callable

from slurm_ft.textsafe import terminal_safe


@dataclass(frozen=True)
class Row:
    h: dict                 #: the job's history (slurm_ft.history.query.history)
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


def job_label(h: dict) -> str:
    """The job's id as sacct prints it: ``50_2`` for task 2 of array 50, else ``41``."""
    if h.get("array_job_id") is not None and h.get("array_task_id") is not None:
        return f"{h['array_job_id']}_{h['array_task_id']}"
    return str(h["job_id"])


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


def _evidence(r: Row) -> str:
    if r.job_row:
        return "\n".join(f"attempt {a['attempt']}: {e}" for a in r.h["attempts"] for e in evidence_lines(a))
    return "\n".join(evidence_lines(r.a)) if r.a else ""


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
    Field("JobID", "Slurm job id; an array task as ARRAYJOBID_TASK (sacct's 50_2)", lambda r: job_label(r.h)),
    Field("JobName", "job name", lambda r: r.h.get("name") or ""),
    Field("User", "user name (a uid on record is shown as its name)", lambda r: user_name(r.h.get("user"))),
    Field("UID", "user id (looked up on this host)", lambda r: user_uid(r.h.get("user"))),
    Field("Account", "Slurm account of the job (as slurmctld recorded it at submit; empty for a job recorded "
          "before slurm-ft kept it)", lambda r: r.h.get("account") or ""),
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
    Field("JobIDRaw", "Slurm's own id of the job (an array task's unique id)", lambda r: str(r.h["job_id"])),
    Field("Retired", "when an earlier job with the same job id was retired (the id was reused); empty "
          "for the current job of that id", lambda r: _t(r.h["retired"]["at"]) if r.h.get("retired") else ""),
    Field("Evidence", "the evidence lines of the attempt's verdicts (ft-history --detail), each as NODE VERDICT "
          "(RULE): LINE, separated by \\x0a (an escaped newline: one record stays one line); job row: every "
          "attempt's, each line led by 'attempt N: '", _evidence),
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


@functools.lru_cache(maxsize=1)
def _chain_columns() -> tuple[Column, ...]:
    """:data:`CHAIN_FORMAT`, parsed once (the chain view prints one table a job)."""
    return tuple(parse_format(CHAIN_FORMAT))


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


def _cells(cols: list[Column], rows_: list[Row]) -> list[list[str]]:
    """Every row's cells, each terminal-safe (:func:`_cell`). :func:`terminal_safe` maps each
    character alone, so a row whose cells are all printable ASCII (nearly every row) is checked
    once as a whole and kept as it is; any other row is escaped cell by cell."""
    getters = [c.field.get for c in cols]
    out = []
    for r in rows_:
        values = [g(r) for g in getters]
        try:
            whole = "".join(values)
        except TypeError:                    # a field gave something that is not text
            whole = "\0"
        if not (whole.isascii() and whole.isprintable()):
            values = [terminal_safe(v) for v in values]
        out.append(values)
    return out


def _fit(text: str, col: Column, auto: int, mark: str = "+") -> str:
    if col.width is None:
        return text.ljust(auto)
    n = abs(col.width)
    if len(text) > n:
        text = text[:n - len(mark)] + mark if n > len(mark) else text[:n]
    return text.rjust(n) if col.width > 0 else text.ljust(n)


def table(cols: list[Column], rows_: list[Row], *, header: bool = True, indent: str = "") -> list[str]:
    """sacct's fixed-width layout: header, a line of dashes, one line per row."""
    cells = _cells(cols, rows_)
    names = [c.field.name for c in cols]
    widths = [max([len(names[i])] + [len(line[i]) for line in cells]) for i in range(len(cols))]
    lines = []
    if header:
        lines.append(" ".join(_fit(n, c, w, mark="") for n, c, w in zip(names, cols, widths)))
        lines.append(" ".join("-" * (abs(c.width) if c.width else w) for c, w in zip(cols, widths)))
    if all(c.width is None for c in cols):     # every column as wide as its widest value: one format
        layout = " ".join(f"{{:<{w}}}" for w in widths)
        lines += [layout.format(*line) for line in cells]
    else:
        lines += [" ".join(_fit(v, c, w) for v, c, w in zip(line, cols, widths)) for line in cells]
    return [indent + line.rstrip() for line in lines]


#: ``--delimiter``: what a delimiter may hold (sacct: "ASCII characters"). Letters, digits and
#: ``\\`` are refused: they are what the escapes of a value's own delimiter characters and
#: controls (``\\xNN``) are written with, so a value could otherwise forge a delimiter.
_DELIMITER = re.compile(r"[\t !-/:-@\[\]-`{-~]{1,16}")


def check_delimiter(text: str) -> str:
    """``--delimiter`` value, checked: 1 to 16 characters, each ASCII punctuation, a space or a
    tab. Raises ValueError (its message terminal-safe) for anything else: a newline, another
    control character, a letter, a digit, ``\\`` or a non-ASCII character."""
    if not _DELIMITER.fullmatch(text):
        raise ValueError(f"{terminal_safe(repr(text))}: a delimiter is 1 to 16 ASCII punctuation characters, "
                         f"spaces or tabs (no letter, digit or backslash: values escape with them)")
    return text


def parsable(cols: list[Column], rows_: list[Row], *, header: bool = True, trailing: bool = False,
             delimiter: str = "|") -> list[str]:
    """``-p``/``-P``: ``delimiter``-separated (default ``|``, checked by :func:`check_delimiter`),
    widths ignored (as sacct does); a character of ``delimiter`` inside a value is written
    ``\\xNN`` (``|`` as ``\\x7c``), so a value never adds a column and a record is one line."""
    end = delimiter if trailing else ""
    escape = {ord(ch): f"\\x{ord(ch):02x}" for ch in check_delimiter(delimiter)}
    chars = set(delimiter)

    def join(values):
        whole = "".join(values)
        if any(ch in whole for ch in chars):     # rare: escape the delimiter's characters
            values = [v.translate(escape) for v in values]
        return delimiter.join(values) + end

    lines = [join([c.field.name for c in cols])] if header else []
    return lines + [join(values) for values in _cells(cols, rows_)]


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
    old = h.get("retired")
    earlier = f" [an earlier job with this id, retired {_t(old['at'])}: {old.get('reason') or '-'}]" if old else ""
    return terminal_safe(f"Job {job_label(h)} ({h.get('name') or '-'}): ft state {state}{budget}{who}{earlier}")


def chain(h: dict, cols: list[Column] | None = None, *, header: bool = True, now: float | None = None,
          detail: bool = False) -> str:
    """The retry-chain view of one job: its heading line, then its attempts as a table; with
    ``detail`` (``--detail``) each attempt's row is followed by its verdicts' evidence lines."""
    cols = cols or _chain_columns()
    lines = table(cols, rows(h, job_row=False, now=now), header=header)
    if not detail:
        return "\n".join([job_heading(h), *lines, *hang_lines(h)])
    top = 2 if header else 0
    out = [job_heading(h), *lines[:top]]
    for line, a in zip(lines[top:], h["attempts"]):
        out += [line, *(f"    {e}" for e in evidence_lines(a)), *(f"    {e}" for e in stack_lines(a))]
    return "\n".join(out)


def evidence_lines(a: dict) -> list[str]:
    """The evidence of attempt ``a``'s verdicts, one terminal-safe line each: ``n1 hardware
    (xid-79): NVRM: Xid (PCI:0000:10:00): 79, ...``; a verdict without evidence gives one line
    ``n1 ok (exit-0): -``. [] for an attempt without verdicts."""
    out = []
    for v in a.get("verdicts") or []:
        head = f"{v.get('node') or '?'} {v.get('verdict') or '?'} ({v.get('rule') or '?'})"
        lines = [str(e) for e in v.get("evidence") or []] or ["-"]
        out += [terminal_safe(f"{head}: {e}") for e in lines]
    return out


def hang_lines(h: dict) -> list[str]:
    """``  attempt 0: hang on n1: no progress for 62 s (window 60 s); last heartbeat ...``: the
    hang watcher's evidence of each hung attempt (its mailbox summary, or the node journal's
    first lines), under the chain view's table; terminal-safe, at most 3 lines a verdict; then
    the attempt's stack frames, when the watcher's report reached the journal (:func:`stack_lines`)."""
    out = []
    for a in h.get("attempts") or []:
        for v in a.get("verdicts") or []:
            ev = [str(e) for e in v.get("evidence") or []]
            if v.get("verdict") == "hang" or (ev and ev[0].startswith("hang on ")):
                out += [terminal_safe(f"  attempt {a['attempt']}: {e}")[:400] for e in ev[:3]]
        out += [f"  attempt {a['attempt']}: {line}" for line in stack_lines(a)]
    return out


#: Of an attempt's stack reports (``hang-stack`` rows): nodes shown (the newest report of each),
#: processes a node, frames a process, characters a frame (the rest: ``ft-history --json``).
STACK_NODES, STACK_PROCS, STACK_FRAMES, STACK_FRAME_CHARS = 4, 2, 5, 160


def stack_lines(a: dict) -> list[str]:
    """The stack frames the hang watcher sent for attempt ``a`` (its ``hang-stack`` actions, the
    private channel of slurm_ft.hang.report): ``stack of pid 4242 (python3) on n1, innermost
    first:`` then ``  <module> (train.py:29)``, one terminal-safe line each, at most
    :data:`STACK_NODES` nodes x :data:`STACK_PROCS` processes x :data:`STACK_FRAMES` frames.
    [] for an attempt without one. The row is journal text: read defensively, shown escaped."""
    from slurm_ft.hang.report import ACTION, read_detail

    newest: dict[str, dict] = {}
    for x in a.get("actions") or []:
        if x.get("action") == ACTION and x.get("status") == "done":
            newest[str(x.get("target") or "?")] = x     # oldest first: the last one wins
    out = []
    for node in sorted(newest)[:STACK_NODES]:
        for pid, comm, frames in read_detail(newest[node].get("detail"))[:STACK_PROCS]:
            who = terminal_safe(f"pid {pid} ({comm[:32]}) on {node[:64]}")
            if not frames:
                out.append(f"stack of {who}: no frame")
                continue
            out.append(f"stack of {who}, innermost first:")
            out += [terminal_safe(f"  {f[:STACK_FRAME_CHARS]}") for f in frames[:STACK_FRAMES]]
    if len(newest) > STACK_NODES:
        out.append(f"stacks of {len(newest) - STACK_NODES} more node(s): ft-history --json")
    return out


def node_section(node: str, steps: list[dict]) -> list[str]:
    """``ft-history -N``: ``Node n1: drains and repairs`` and one line per step, oldest first
    (time, step, status, the job that caused it or ``-``, a short reason); every line
    terminal-safe (node names, reasons and statuses are journal text)."""
    out = [terminal_safe(f"Node {node}: drains and repairs")]
    rows = [[_t(x.get("time")), str(x.get("step") or "?"), str(x.get("status") or "?"),
             "-" if x.get("job_id") is None else str(x["job_id"]), str(x.get("reason") or "-")] for x in steps]
    rows = [[terminal_safe(v) for v in r] for r in rows]
    names = ["Time", "Step", "Status", "JobID", "Reason"]
    widths = [max([len(names[i])] + [len(r[i]) for r in rows]) for i in range(5)]
    layout = "  " + " ".join(f"{{:<{w}}}" for w in widths[:4]) + " {}"
    out += [layout.format(*names).rstrip(), layout.format(*("-" * w for w in widths)).rstrip()]
    out += [layout.format(*r).rstrip() for r in rows]
    return out


def node_sections(nodes: dict, asked: str = "") -> str:
    """Every node's section (:func:`node_section`), a blank line between; ``asked`` (the ``-N``
    hostlist) names the nodes when none has a step in the window."""
    if not nodes:
        return terminal_safe(f"No drains or repairs of {asked or 'these nodes'} in the time window.")
    return "\n\n".join("\n".join(node_section(n, steps)) for n, steps in nodes.items())
