"""Job records without ``squeue --json``: one job's full record from ``scontrol show job J`` (a
single-job RPC, ``REQUEST_JOB_INFO_SINGLE``; :func:`parse_show_job`), and every job, light, from
``squeue -o`` (:func:`list_jobs`).

Why not ``squeue --json --jobs=J``: on 22.05 it asks slurmctld for the whole queue
(``REQUEST_JOB_INFO``) and filters on the client, so every per-job look would cost as much as
the queue is long (measured: ``sdiag`` deltas, shared/SLURM_LAB_NOTES.md). ``scontrol show job``
has no ``--json`` on 22.05, so its text is parsed here into the keys of a 22.05 ``squeue --json``
record, which :meth:`slurm_ft.slurm.Job.from_json` reads as usual.

The text holds user-chosen values (job name, command, working directory, comment, output paths),
which may hold newlines and blank lines. Fields are found by where Slurm prints them, never by what
a value holds (:func:`split_record`): the record is anchored on its ``JobId=`` line and blank lines
never end it; a line that is not a field line is more of the free-text value above it; a value
that forges a field line is refused (None; the caller then asks ``squeue --json``), since the
forged key either repeats one Slurm prints or sits where Slurm never prints it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

#: Lines whose whole rest is one value (may hold spaces and, for the user's own, newlines).
FREE_TEXT = ("Command", "WorkDir", "AdminComment", "SystemComment", "Comment", "StdErr", "StdIn", "StdOut",
             "BurstBuffer", "MailUser", "Container", "SELinuxContext")
#: The keys slurm-ft reads, and the ones Slurm always prints around them, in the order Slurm
#: prints them (src/api/job_info.c ``slurm_sprint_job_info``, 22.05 to 24.11). Other keys are
#: passed over (they differ between versions).
ORDER = ("JobId", "ArrayJobId", "ArrayTaskId", "HetJobId", "HetJobOffset", "JobName", "UserId", "GroupId",
         "Priority", "JobState", "Reason", "FailedNode", "Dependency", "Requeue", "Restarts", "ExitCode", "RunTime",
         "TimeLimit", "SubmitTime", "EligibleTime", "StartTime", "EndTime", "Partition", "ReqNodeList",
         "ExcNodeList", "NodeList", "NumNodes", "Features", "Reservation", "OverSubscribe", "Command", "WorkDir",
         "AdminComment", "SystemComment", "Comment", "StdErr", "StdIn", "StdOut")
_RANK = {k: i for i, k in enumerate(ORDER)}
#: Fields Slurm prints as ``Key=%s `` (one trailing space that is not the value's).
_TRAILING_SPACE = ("AdminComment", "SystemComment", "Comment")
_FIELD = re.compile(r"^   ([A-Za-z][A-Za-z0-9_/:]*)=")
#: 22.05 JSON's value for an unlimited time limit.
UNLIMITED = None
_FIRST = re.compile(r"^JobId=(\d+)((?: [^ ]*?)*?) JobName=(.*)$")
#: Tokens of the first line between ``JobId=`` and ``JobName=`` that slurm-ft reads (an array
#: task's ``ArrayJobId=10 ArrayTaskId=2``; a heterogeneous job's ``HetJobId=`` ones are passed over).
_FIRST_KEYS = ("ArrayJobId", "ArrayTaskId")
_OWNER = re.compile(r"^(.*)\((\d+)\)$")
#: Key under which :func:`split_record` keeps the lines that follow a structured field and are
#: not field lines (``scontrol show job -d``'s per-node detail lines), one per line; never a
#: Slurm key (it holds a NUL).
DETAIL = "\0detail"
#: A ``-d`` detail line, as Slurm prints it (src/api/job_info.c): ``Nodes=n[1-2] CPU_IDs=0-1
#: Mem=0 GRES=gpu:1(IDX:0)`` after leading spaces.
_DETAIL_LINE = re.compile(r"^ +Nodes=(\S+) CPU_IDs=\S+ Mem=\d+ GRES=(\S*)$")
_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:\d+\(IDX:([\d,-]+)\)")


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
    """The record of ``job_id`` in ``scontrol show job J`` output (multi-line form) as a 22.05
    ``squeue --json`` job dict; None when it is not there or its text is ambiguous (the caller
    then asks ``squeue --json``). See :func:`split_record` for what the text may hold."""
    fields = split_record(text, job_id)
    if fields is None:
        return None
    return _record(fields, job_id, fields["JobName"])


def split_record(text: str, job_id: int) -> dict[str, str] | None:
    """``{key: value}`` of job ``job_id``'s record, split by where Slurm puts its fields, never by
    what the values hold (src/api/job_info.c ``slurm_sprint_job_info``):

    * the record is anchored on its ``JobId=J`` line (column 0); the output must hold exactly one
      record (a second ``JobId=`` line at column 0 is either another job, an array or a
      heterogeneous job, or a value that forges one: refused). Blank lines never end it.
    * lines split on ``\\n`` only (never on the other characters ``str.splitlines`` takes);
    * a field line starts with three spaces and ``Key=``; the free-text fields (:data:`FREE_TEXT`,
      ``JobName``) take the rest of their line, and every following line that is not a field line
      is more of that value (a value with newlines and blank lines stays whole); other lines hold
      space-separated ``Key=value`` tokens;
    * the keys of :data:`ORDER` must each appear at most once and in Slurm's order, so a value
      that forges a field line (``WorkDir=/x\\n   JobState=COMPLETED``) is refused: the forged
      key either repeats one Slurm prints, or sits where Slurm never prints it.

    None when the record is missing or refused."""
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith("JobId=")]
    if len(starts) != 1 or any(line.strip() for line in lines[:starts[0]]):
        return None
    m = _FIRST.match(lines[starts[0]])
    if m is None or int(m.group(1)) != job_id:
        return None
    body = lines[starts[0] + 1:]
    while body and not body[-1].strip():
        body.pop()                       # the record's end: "\n   \n\n"
    fields: dict[str, str] = {"JobId": m.group(1)}
    for token in m.group(2).split(" "):  # Slurm's own tokens: none holds a space
        key, _, value = token.partition("=")
        if key in _FIRST_KEYS:
            fields[key] = value
    fields["JobName"] = m.group(3)
    seen = list(fields)
    free: str | None = "JobName"         # the free-text field that further non-field lines extend
    for line in body:
        key = _field_key(line)
        if key is None:
            if free is not None:
                fields[free] += "\n" + line
            else:                        # a stray line after a structured field: -d's detail lines
                fields[DETAIL] = fields.get(DETAIL, "") + line + "\n"
            continue
        if key in FREE_TEXT:
            tokens = [(key, line[3 + len(key) + 1:])]
            free = key
        else:
            tokens = [tuple(t.split("=", 1)) for t in line.split(" ") if "=" in t]
            free = None
        for k, v in tokens:
            if k in fields:
                return None              # Slurm prints each key once
            fields[k] = v
            if k in _RANK:
                seen.append(k)
    ranks = [_RANK[k] for k in seen]
    if ranks != sorted(ranks):
        return None                      # a key where Slurm never prints it
    for k in _TRAILING_SPACE:
        if k in fields and fields[k].endswith(" "):
            fields[k] = fields[k][:-1]
    return fields


def gres_gpu_detail(text: str, job_id: int) -> dict[str, str] | None:
    """``{node expression: GPU index list}`` from ``scontrol show job -d J`` output: the detail
    lines (``Nodes=n[1-2] CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0-1)``) of job ``job_id``'s anchored
    record only (:func:`split_record`), never a line inside a user's free-text value (job name,
    command, working directory, comment), so no value the user sets can add GPUs to a job.
    None when the record is missing or refused; ``{}`` when the job holds no GPU."""
    fields = split_record(text, job_id)
    if fields is None:
        return None
    out: dict[str, str] = {}
    for line in fields.get(DETAIL, "").split("\n"):
        m = _DETAIL_LINE.match(line)
        if m is None:
            continue
        gpu = _GPU_IDX.search(m.group(2))
        if gpu is not None:
            out[m.group(1)] = gpu.group(1)
    return out


def _field_key(line: str) -> str | None:
    """``Key`` of a field line (``   Key=...``), else None."""
    m = _FIELD.match(line)
    return m.group(1) if m else None


def _record(kv: dict[str, str], job_id: int, name: str) -> dict | None:
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
            "account": _null(kv.get("Account", "")),
            "dependency": _null(kv.get("Dependency", "")), "features": _null(kv.get("Features", "")),
            "resv_name": _null(kv.get("Reservation", "")),
            "failed_node": _null(kv.get("FailedNode", "")),   # Slurm >= 23.02 prints it
            # an array task's ids, as 22.05 json (0: not an array task; a pending array's
            # "1-5%2" task range is kept as text)
            "array_job_id": int(kv.get("ArrayJobId", "0")), "array_task_id": kv.get("ArrayTaskId"),
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
