"""Job records without ``squeue --json``: one job's full record from ``scontrol show job J`` (a
single-job RPC, ``REQUEST_JOB_INFO_SINGLE``; :func:`parse_show_job`), and every job, light, from
``squeue -o`` (:func:`list_jobs`).

Why not ``squeue --json --jobs=J``: on 22.05 it asks slurmctld for the whole queue
(``REQUEST_JOB_INFO``) and filters on the client, so every per-job look would cost as much as
the queue is long (measured: ``sdiag`` deltas, shared/SLURM_LAB_NOTES.md). ``scontrol show job``
has no ``--json`` on 22.05, so its text is parsed here into the keys of a 22.05 ``squeue --json``
record, which :meth:`slurm_ft.slurm.Job.from_json` reads as usual.

The text holds user-chosen values (job name, comment, working directory). A value with a newline
could forge a ``Key=value`` line, so the parse is refused (None; the caller then asks
``squeue --json``) when any key appears twice or the free-text lines are out of Slurm's order.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

#: Lines whose whole rest is one value (may hold spaces), in the order Slurm prints them.
FREE_TEXT = ("Command", "WorkDir", "AdminComment", "SystemComment", "Comment", "StdErr", "StdIn", "StdOut", "Power")
#: 22.05 JSON's value for an unlimited time limit.
UNLIMITED = None
_FIRST = re.compile(r"^JobId=(\d+)(?:\s.*?)?\sJobName=(.*)$")
_OWNER = re.compile(r"^(.*)\((\d+)\)$")


def _epoch(value: str) -> int:
    if not value or value in ("Unknown", "None", "N/A", "(null)"):
        return 0
    try:
        return int(time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return 0


def _minutes(value: str) -> int | None:
    """``TimeLimit`` (``UNLIMITED``, ``[days-]hours:minutes:seconds``, ``minutes:seconds``)."""
    if value in ("UNLIMITED", "Partition_Limit", "INFINITE", "", "N/A"):
        return UNLIMITED
    days = 0
    if "-" in value:
        d, value = value.split("-", 1)
        days = int(d)
    parts = [int(p) for p in value.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts[-3:]
    return days * 1440 + h * 60 + m + (1 if s else 0)


def _null(value: str) -> str:
    return "" if value in ("(null)", "None") else value


def _wait_status(value: str) -> int:
    """``ExitCode=3:0`` (exit code:signal) as the wait status 22.05 JSON gives (768; a signal: 9)."""
    code, _, sig = value.partition(":")
    code_i, sig_i = int(code or 0), int(sig or 0)
    return sig_i if sig_i else (code_i & 0xFF) << 8


def parse_show_job(text: str, job_id: int) -> dict | None:
    """The record of ``job_id`` in ``scontrol show job`` output as a 22.05 ``squeue --json`` job
    dict; None when it is not there or its text is ambiguous (see the module doc)."""
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = block.splitlines()
        m = _FIRST.match(lines[0].strip()) if lines else None
        if m is None or int(m.group(1)) != job_id:
            continue
        return _record(lines, job_id, m.group(2))
    return None


def _record(lines: list[str], job_id: int, name: str) -> dict | None:
    kv: dict[str, str] = {}
    order = -1
    for line in lines[1:]:
        s = line.strip()
        if not s:
            continue
        key, eq, value = s.partition("=")
        if key in FREE_TEXT:
            pos = FREE_TEXT.index(key)
            if key in kv or pos <= order:
                return None
            order = pos
            kv[key] = value[:-1] if value.endswith(" ") else value
            continue
        if order >= FREE_TEXT.index("Comment"):
            continue            # after the comment: only fields slurm-ft never reads
        if order >= 0 and not line.startswith("   "):
            return None
        for token in s.split():
            k, eq, v = token.partition("=")
            if not eq:
                continue
            if k in kv:
                return None
            kv[k] = v
    try:
        user = _OWNER.match(kv.get("UserId", ""))
        group = _OWNER.match(kv.get("GroupId", ""))
        shared = {"NO": "none", "USER": "user", "MCS": "mcs"}.get(kv.get("OverSubscribe", ""))
        count = kv.get("NumNodes", "1").split("-")[0]
        return {
            "job_id": job_id, "name": name, "user_name": user.group(1) if user else "",
            "user_id": int(user.group(2)) if user else None, "group_id": int(group.group(2)) if group else None,
            "job_state": kv["JobState"], "state_reason": kv.get("Reason", ""),
            "restart_cnt": int(kv.get("Restarts", "0")), "exit_code": _wait_status(kv.get("ExitCode", "0:0")),
            "time_limit": _minutes(kv.get("TimeLimit", "UNLIMITED")),
            "start_time": _epoch(kv.get("StartTime", "")), "end_time": _epoch(kv.get("EndTime", "")),
            "eligible_time": _epoch(kv.get("EligibleTime", "")), "submit_time": _epoch(kv.get("SubmitTime", "")),
            "priority": int(kv.get("Priority", "0")), "shared": shared,
            "nodes": _null(kv.get("NodeList", "")), "excluded_nodes": _null(kv.get("ExcNodeList", "")),
            "required_nodes": _null(kv.get("ReqNodeList", "")), "node_count": int(count) if count.isdigit() else 1,
            "comment": kv.get("Comment", ""), "admin_comment": kv.get("AdminComment", ""),
            "requeue": kv.get("Requeue", "0") == "1", "partition": kv.get("Partition", ""),
            "dependency": _null(kv.get("Dependency", "")), "features": _null(kv.get("Features", "")),
            "resv_name": _null(kv.get("Reservation", "")),
        }
    except (KeyError, ValueError):
        return None


# ------------------------------------------------------------------------------ the whole queue, light
#: ``squeue -o`` fields of a full scan: job id (unique for array tasks), state, reason, priority,
#: nodes, comment (last: it may hold the separator). One ``REQUEST_JOB_INFO`` like
#: ``squeue --json``, but measured on 22.05 with ~38,000 jobs: 0.5-0.8 s and a few MB against
#: 17-22 s and 1.8 GB of memory for ``--json``.
LIST_FORMAT = "%A|%T|%r|%Q|%N|%k"


@dataclass(frozen=True)
class JobRow:
    """One job as the light full scan sees it: enough to tell whether it changed and whether it
    may concern slurm-ft; never enough to act on (the daemon reads the job itself first)."""

    job_id: int
    state: str
    reason: str
    priority: int
    nodes: str
    comment: str

    @property
    def snapshot(self) -> tuple:
        return (self.state, self.reason, self.priority, self.nodes, self.comment)


def list_jobs(slurm, timeout_s: float | None = None) -> list[JobRow]:
    """Every job slurmctld knows, light (``squeue -h --states=all -o LIST_FORMAT``). A line that
    does not parse (a comment with a newline) is skipped: the rows are hints."""
    out = slurm.run("squeue", "-h", "--states=all", "-o", LIST_FORMAT, timeout_s=timeout_s).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split("|", 5)
        if len(parts) != 6 or not parts[0].isdigit():
            continue
        try:
            prio = int(parts[3])
        except ValueError:
            continue
        rows.append(JobRow(int(parts[0]), parts[1], parts[2], prio, _null(parts[4]), _null(parts[5])))
    return rows
