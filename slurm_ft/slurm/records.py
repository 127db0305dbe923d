"""Slurm's records and text shapes, parsed: jobs and nodes (``squeue``/``sinfo --json``, 22.05 and
24.11+ shapes; ``scontrol ... -o`` records), hostlists, ``scontrol show config``, slurm.conf, gres.
Pure: no command is run here (slurm_ft.slurm runs them); the state machine reads these types."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from slurm_ft.drain.reason import FailedCheck, read_health_reason
from slurm_ft.errors import HostlistError, SlurmCommandError
from slurm_ft.health.result import CHECK_NAMES
from slurm_ft.slurm.indices import NOT_HOSTLIST

#: Set operators and separators of ClusterShell's grammar that Slurm's hostlists do not have:
#: rejected rather than silently applied (``n[1-3]!n2`` is no Slurm hostlist).
_NOT_HOSTLIST = NOT_HOSTLIST
_EMPTY = ("", "(null)", "None")


def _nodeset(exprs) -> NodeSet:
    """The union of hostlist ``exprs`` (a string or an iterable of them; empty ones, ``(null)`` and
    ``None`` skipped), parsed by ClusterShell with group resolution off (no ``@group`` lookups)."""
    nodes = NodeSet(resolver=RESOLVER_NOGROUP)
    for expr in [exprs] if isinstance(exprs, str) else exprs:
        expr = str(expr).strip()
        if expr in _EMPTY:
            continue
        bad = _NOT_HOSTLIST.search(expr)
        if bad:
            raise HostlistError(f"not a Slurm hostlist: {expr!r} (unexpected {bad.group()!r})")
        try:
            nodes.update(NodeSet(expr, resolver=RESOLVER_NOGROUP))
        except NodeSetException as exc:
            raise HostlistError(f"not a Slurm hostlist: {expr!r} ({exc})") from None
    return nodes


def replace_comment_record(comment: str | None, prefix: str, record: str) -> str:
    """A job's ``Comment`` (words separated by blanks) with its words that start with ``prefix``
    replaced by ``record``, put last; the other words kept, in order. The comment carries one
    record per writer (the checkpoint ack ``slurm-ft-ckpt:``, the in-place restarts: both through
    :func:`slurm_ft.slurm.put_comment_record`); the job's stand-alone client module keeps its
    own copy of this rule (``slurm_ft_job.merge``, which must agree: tests/test_slurm_records.py)."""
    return " ".join([*(w for w in (comment or "").split() if not w.startswith(prefix)), record])


def split_nodes(expr: str | list[str] | None) -> list[str]:
    """Expand a Slurm hostlist expression into node names (ClusterShell's ``NodeSet``).

    ``expr``: a string as Slurm prints it (``squeue --json`` ``nodes``/``excluded_nodes``,
    ``scontrol -o`` ``Nodes=``), or a list of names/expressions (24.11 JSON lists nodes as arrays).
    Empty, ``"(null)"``, ``"None"`` and None give ``[]``. Returns the names sorted the way
    ClusterShell folds them (by pattern, then index), each once::

        split_nodes("gpu[01-02]-ib")      == ["gpu01-ib", "gpu02-ib"]
        split_nodes("n[1-3],gpu[07-08]")  == ["gpu07", "gpu08", "n1", "n2", "n3"]
        split_nodes("a[1-2]b[3-4]")       == ["a1b3", "a1b4", "a2b3", "a2b4"]
        split_nodes(["n1", "n[2-3]"])     == ["n1", "n2", "n3"]

    Raises :class:`HostlistError` on a malformed expression (``gpu[1``, ``n[3-1]``, ``n[1-3]!n2``).
    """
    return [] if expr is None else list(_nodeset(expr))


def compress_nodes(names) -> str:
    """Fold node names (or hostlist expressions; a string or an iterable) into one Slurm hostlist,
    the inverse of :func:`split_nodes`: ``["n1", "n2", "n3", "gpu07"]`` -> ``"gpu07,n[1-3]"``;
    ``["gpu01-ib", "gpu02-ib"]`` -> ``"gpu[01-02]-ib"``; ``[]`` -> ``""``. Duplicates fold away.
    Raises :class:`HostlistError` on a name that is not one (``"n1 n2"``, ``"gpu]"``)."""
    return str(_nodeset(names))


def parse_kv_line(text: str) -> dict[str, str]:
    """Parse scontrol's one-line ``Key=Value Key=Value`` output; values may contain spaces
    only for the last key on 22.05 (e.g. ``Reason``), which we keep whole."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(\S+?)=(.*?)(?=\s+\S+?=|\s*$)", text.strip()):
        out[m.group(1)] = m.group(2)
    return out


_CONFIG_LINE = re.compile(r"^(\w[\w/.-]*?)(?:\[(\d+)\])?\s+=\s?(.*)$")


def parse_config(text: str) -> dict[str, str]:
    """Parse ``scontrol show config``: one ``Key   = Value`` per line (headers skipped; first
    occurrence of a key wins).

    Both shapes of a list setting are read: 22.05 prints ``Prolog = /a,/b``; 24.11 prints one
    indexed line per entry, ``Prolog[0] = /a`` ``Prolog[1] = /b`` (also ``SlurmctldHost[0]``).
    Each indexed line is kept under its own key (``Prolog[0]``), and the entries are also joined,
    in index order, under the bare key (``Prolog = "/a,/b"``) unless a bare line exists: callers
    read ``Prolog`` whatever the version."""
    out: dict[str, str] = {}
    indexed: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        m = _CONFIG_LINE.match(line)
        if not m:
            continue
        key, index, value = m.group(1), m.group(2), m.group(3).strip()
        if index is None:
            out.setdefault(key, value)
        else:
            out.setdefault(f"{key}[{index}]", value)
            indexed.setdefault(key, {}).setdefault(int(index), value)
    for key, entries in indexed.items():
        values = [entries[i] for i in sorted(entries) if entries[i] not in _EMPTY]
        out.setdefault(key, ",".join(values))
    return out


_CTLD_KEY = re.compile(r"^slurmctldhost(?:\[(\d+)\])?$", re.IGNORECASE)


def slurmctld_hosts(conf: dict[str, str]) -> list[tuple[str, str]]:
    """``(name, address)`` of each controller, in ``SlurmctldHost`` order: the address is the one
    in parentheses (``ctl(10.0.0.1)``: the one Slurm itself uses), else the name. One parser for
    the daemon's leadership, ``doctor``'s roles and the history service's endpoints. ``conf``: a
    parsed ``scontrol show config`` (:func:`parse_config`: ``SlurmctldHost[0]`` ... and the bare key
    joining them) or slurm.conf (:func:`parse_slurm_conf`: lower-case keys, a comma-separated
    line); the old ``ControlMachine``/``BackupController`` when no ``SlurmctldHost`` is set. Empty
    and ``(null)`` entries are skipped; never raises."""
    indexed: dict[int, str] = {}
    bare = legacy = ""
    for key, value in conf.items():
        k = str(key).strip()
        m = _CTLD_KEY.match(k)
        if m and m.group(1) is not None:
            indexed.setdefault(int(m.group(1)), str(value))
        elif m:
            bare = bare or str(value)
        elif k.lower() in ("controlmachine", "backupcontroller") and str(value).strip().lower() not in _EMPTY_LOWER:
            legacy = f"{legacy},{value}" if legacy else str(value)
    items = [indexed[i] for i in sorted(indexed)] if indexed else (bare or legacy).split(",")
    out = []
    for item in items:
        item = item.strip()
        if item.lower() in _EMPTY_LOWER:
            continue
        name, _, addr = item.partition("(")
        name, addr = name.strip(), addr.rstrip(")").strip()
        if name or addr:
            out.append((name or addr, addr or name))
    return out


_EMPTY_LOWER = ("", "(null)", "none")


#: One gres entry as Slurm prints it: ``name[:type][:count[KMGTP]][(S:0-1)]``.
_GRES_ITEM = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)((?::[A-Za-z0-9_.+-]+)*?)(?::(\d{1,9})([KMGTP]?))?"
                        r"(?:\([^()]*\))?$")
_GRES_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def parse_slurm_conf(text: str) -> dict[str, str]:
    """The global ``Key=Value`` settings of a slurm.conf (keys lower-case, first wins); node,
    partition and other multi-key lines are skipped."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip() or " " in key.strip() or "\t" in key.strip():
            continue
        key = key.strip().lower()
        if key in ("nodename", "partitionname", "frontendname", "nodeset", "downnodes"):
            continue
        out.setdefault(key, value.strip())
    return out


def parse_gres(text: str | None) -> dict[str, int]:
    """A node's generic resources as Slurm prints them -> ``{name: count}`` (counts of the same
    name, e.g. two GPU types, added up).

    ``text``: ``Gres=`` of ``scontrol show node -o`` (22.05 and 24.11), ``gres`` of a ``sinfo
    --json`` node record, or ``Gres=`` of a slurm.conf node line::

        parse_gres("gpu:h100:8(S:0-1)")            == {"gpu": 8}
        parse_gres("gpu:a100:4(S:0),gpu:v100:2,mps:200") == {"gpu": 6, "mps": 200}
        parse_gres("gpu")                          == {"gpu": 1}
        parse_gres("(null)") == parse_gres("") == parse_gres(None) == {}

    Raises :class:`SlurmCommandError` on anything else (the message quotes it): a caller treats
    an unreadable record as "unknown", never as "no GPUs"."""
    if text is None or text.strip() in _EMPTY:
        return {}
    out: dict[str, int] = {}
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):  # split on commas outside "(S:0,1)"
        depth += (ch == "(") - (ch == ")")
        if depth < 0 or depth > 1:
            break
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    if depth != 0:
        raise SlurmCommandError(f"not a gres list: {text[:200]!r}")
    for item in items:
        m = _GRES_ITEM.match(item.strip())
        if not m:
            raise SlurmCommandError(f"not a gres list: {text[:200]!r} (at {item[:80]!r})")
        count = 1 if m.group(3) is None else int(m.group(3)) * _GRES_SUFFIX[m.group(4)]
        out[m.group(1)] = out.get(m.group(1), 0) + count
    return out


def parse_boot_time(text: str) -> float | None:
    """``scontrol show config``'s ``BOOT_TIME`` (``2026-12-02T02:43:00``, local time) as epoch
    seconds; None for anything else."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def private_data(conf: dict[str, str]) -> set[str]:
    """``PrivateData`` of a parsed ``scontrol show config`` as a set of lower-case flags."""
    value = conf.get("PrivateData", "").strip().lower()
    flags = {f.strip() for f in value.split(",") if f.strip()}
    return set() if flags <= {"none", "(null)"} else flags - {"none"}


def _num(value) -> int | None:
    """22.05 prints plain ints; 24.11 wraps them as {"set": bool, "infinite": bool, "number": n}."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        return value.get("number")
    return value


def _states(value) -> list[str]:
    """22.05: "RUNNING"; 24.11: ["RUNNING"] (+ flags like "COMPLETING")."""
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)] if value else []


def _nodes(value) -> str:
    """A hostlist string as-is; a list of names (24.11 arrays) folded into one; else ""."""
    if isinstance(value, list):
        return compress_nodes(str(v) for v in value)
    return value if isinstance(value, str) else ""


@dataclass
class Job:
    """The fields of a ``squeue --json`` job record that slurm-ft uses."""

    job_id: int
    name: str
    user: str
    state: str                 # base state: PENDING, RUNNING, COMPLETING, FAILED, COMPLETED, NODE_FAIL, ...
    flags: list[str]           # extra states (24.11: COMPLETING, REQUEUED...)
    reason: str
    nodes: str                 # hostlist expression, "" when none
    restart_count: int
    exit_code: int | None      # process exit code (0-255), None unknown
    exit_signal: int | None
    start_time: int | None     # epoch seconds
    end_time: int | None
    submit_time: int | None
    priority: int | None
    comment: str
    admin_comment: str
    requeue: bool
    excluded_nodes: str
    raw: dict

    @property
    def completing(self) -> bool:
        return self.state == "COMPLETING" or "COMPLETING" in self.flags

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES and not self.completing

    @property
    def array_job_id(self) -> int | None:
        """``ArrayJobId`` of an array task (the array's id, sacct's ``50`` of ``50_2``); None for
        a job that is not one (Slurm's 0) or a pending array record of several tasks."""
        task = self.array_task_id
        return (_num(self.raw.get("array_job_id")) or None) if task is not None else None

    @property
    def array_task_id(self) -> int | None:
        """``ArrayTaskId`` of a single array task (``2`` of ``50_2``); None otherwise (also for a
        pending array's task range such as ``1-5%2``)."""
        if not _num(self.raw.get("array_job_id")):
            return None
        task = _num(self.raw.get("array_task_id"))
        if isinstance(task, str):
            task = int(task) if task.isdigit() else None
        return task if isinstance(task, int) and not isinstance(task, bool) and task >= 0 else None

    @property
    def failed_nodes(self) -> list[str]:
        """Nodes Slurm itself names failed for this job: ``FailedNode=`` of ``scontrol show job``
        (printed from Slurm 23.02 on, :func:`slurm_ft.slurm.jobinfo.parse_show_job` -> ``failed_node``)
        or ``failed_node`` of a 24.11 ``--json`` record; ``[]`` when Slurm names none (22.05)."""
        return split_nodes(_nodes(self.raw.get("failed_node")))

    @property
    def account(self) -> str:
        """The job's Slurm account, as slurmctld set it at submit (``account`` of ``squeue
        --json``, ``Account=`` of ``scontrol show job``); "" when none. Shown only (ft-history)."""
        value = self.raw.get("account")
        return value if isinstance(value, str) else ""

    @classmethod
    def from_json(cls, j: dict) -> "Job":
        states = _states(j.get("job_state"))
        exit_code, exit_signal = _exit(j.get("exit_code"))
        return cls(
            job_id=int(j["job_id"]),
            name=j.get("name", ""),
            user=j.get("user_name", "") or "",
            state=states[0] if states else "UNKNOWN",
            flags=states[1:],
            reason=j.get("state_reason", "") or "",
            nodes=_nodes(j.get("nodes")),
            restart_count=_num(j.get("restart_cnt")) or 0,
            exit_code=exit_code,
            exit_signal=exit_signal,
            start_time=_num(j.get("start_time")),
            end_time=_num(j.get("end_time")),
            submit_time=_num(j.get("submit_time")),
            priority=_num(j.get("priority")),
            comment=j.get("comment", "") or "",
            admin_comment=j.get("admin_comment", "") or "",
            requeue=bool(j.get("requeue")),
            excluded_nodes=_nodes(j.get("excluded_nodes")),
            raw=j,
        )


def _exit(value) -> tuple[int | None, int | None]:
    """22.05: an int wait status (e.g. 768 = exit 3; 9 = signal 9);
    24.11: {"status": [...], "return_code": {...}, "signal": {"id": {...}}}."""
    if value is None:
        return None, None
    if isinstance(value, dict):
        rc = _num(value.get("return_code"))
        sig = value.get("signal") or {}
        signo = _num(sig.get("id")) if isinstance(sig, dict) else None
        return rc, (signo or None)
    status = int(value)
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


ENDED_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
}


@dataclass
class Node:
    """The fields of a ``sinfo --json`` node record that slurm-ft uses.

    ``failed_check``: the failing health check (and GPU) ``reason`` names when it is a health
    drain's reason (``slurm-ft: <check>: [GPU<n> ]<measurement>``), else None; read from the
    reason once, here, by the module that writes it (:func:`slurm_ft.drain.reason.read_health_reason`):
    the daemon learns of a node's health drain only from Slurm's node record (the check ran on
    the node and drained it there; the node's journal is not the daemon's), so the record is
    where the typed value belongs, and the state machine reads it without parsing text. Set
    whether or not the node is still drained (:attr:`drained` says that)."""

    name: str
    state: str
    flags: list[str]
    reason: str
    reason_set_by_user: str
    comment: str
    extra: str
    raw: dict
    failed_check: FailedCheck | None = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        self.failed_check = read_health_reason(self.reason, CHECK_NAMES)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in ("DRAINED", "DRAINING")

    @property
    def partitions(self) -> list[str]:
        """Names of the partitions the node is in (``partitions`` of its ``sinfo --json`` record)."""
        parts = self.raw.get("partitions") or []
        return [str(p) for p in parts] if isinstance(parts, list) else [str(parts)]

    @property
    def reason_time(self) -> int | None:
        """Epoch seconds when the drain/down reason was set (``reason_changed_at``), or None."""
        return _num(self.raw.get("reason_changed_at"))

    @classmethod
    def from_json(cls, n: dict) -> "Node":
        state = n.get("state")
        states = _states(state)
        flags = list(n.get("state_flags", []) or [])
        return cls(
            name=n.get("name") or n.get("hostname", ""),
            state=states[0] if states else "UNKNOWN",
            flags=flags + states[1:],
            reason=n.get("reason", "") or "",
            reason_set_by_user=n.get("reason_set_by_user", "") or "",
            comment=n.get("comment", "") or "",
            extra=n.get("extra", "") or "",
            raw=n,
        )
