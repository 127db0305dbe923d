"""The job as a node's prolog/epilog sees it: parsed, validated ``SLURM_*`` environment, plus the
per-job start marker the prolog leaves for the epilog.

Every value comes from slurmd (not the user), but it is still validated: job ids and counts must be
integers, node names must look like node names, GPU lists like ``0,1``. The marker lives in a
root-owned directory (``[node_state] dir``) and is written temp-then-rename, opened O_NOFOLLOW.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass


_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class BadEnvironment(ValueError):
    """A required ``SLURM_*`` variable is missing or malformed."""


def _int(env: dict, name: str, default: int | None = None) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise BadEnvironment(f"{name}={value!r} is not an integer") from None


def _id(env: dict, name: str) -> int | None:
    """An optional id: a decimal of at most 10 ASCII digits, else None (unknown, never fatal)."""
    value = env.get(name) or ""
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 10 else None


def parse_gpu_list(value: str | None) -> tuple[int, ...] | None:
    """``SLURM_JOB_GPUS`` ("0,1" or "0-1,3") -> (0, 1, 3); None when unset/empty."""
    if not value:
        return None
    from slurm_ft.errors import HostlistError
    from slurm_ft.slurm.indices import (  # ClusterShell's RangeSet only: not the Slurm client (issue 24, per-job cost)
        split_indices)

    try:
        return tuple(split_indices(value))
    except HostlistError:
        raise BadEnvironment(f"SLURM_JOB_GPUS={value!r} is not a GPU index list") from None


def wait_status(status: int | None) -> tuple[int | None, int | None]:
    """A wait status (``SLURM_JOB_EXIT_CODE``, e.g. 768 = exit 3, 9 = killed by signal 9) ->
    (exit code, signal)."""
    if status is None:
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


@dataclass(frozen=True)
class NodeJob:
    job_id: int
    node: str
    attempt: int                # SLURM_JOB_RESTART_COUNT, 0 on the first run
    uid: int | None
    gpus: tuple[int, ...] | None
    exit_code: int | None       # epilog only
    signal: int | None          # epilog only
    stdout: str | None          # unexpanded pattern, e.g. /path/%j.out
    stderr: str | None
    work_dir: str | None
    #: The job's name, ``SLURM_JOB_NAME``; None when the environment does not give it (Slurm
    #: 22.05's Prolog/Epilog do not: slurm_ft.node.output_pattern.with_job_record asks slurmctld).
    job_name: str | None = None
    #: ``SLURM_ARRAY_JOB_ID``/``SLURM_ARRAY_TASK_ID``: array master job id and task id; None when
    #: unknown. ``array_job_id == 0``: known not to be an array task (Slurm's own convention).
    array_job_id: int | None = None
    array_task_id: int | None = None
    #: ``SLURM_JOB_USER``: the user name (``%u`` of a filename pattern); None when unset.
    user: str | None = None
    #: This machine's short host name (``gethostname`` up to the first dot), which slurmstepd
    #: writes for ``%N`` (not the NodeName: measured on the lab, where nodes ``n1``..``n3`` share
    #: host ``vm``, ``%N`` is ``vm``); None: use :attr:`node`.
    host: str | None = None
    #: ``SLURM_JOB_START_TIME`` (epoch seconds): the attempt's start, which slurmd (23.02+) puts in
    #: the Prolog/Epilog environment from slurmctld's signed credential, after (over) the job's
    #: SPANK environment, whose names slurmd prefixes ``SPANK_`` (``valid_spank_job_env``): nothing
    #: a job sets. 22.05's slurmd does not export it (None; :func:`node_key` uses the prolog's marker).
    start_time: float | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "NodeJob":
        env = dict(os.environ if env is None else env)
        job_id = _int(env, "SLURM_JOB_ID")
        if job_id is None:
            raise BadEnvironment("SLURM_JOB_ID is not set (not run by slurmd?)")
        node = env.get("SLURMD_NODENAME", "")
        if not _NODE.match(node):
            raise BadEnvironment(f"SLURMD_NODENAME={node!r} is not a node name")
        exit_code, signal = wait_status(_int(env, "SLURM_JOB_EXIT_CODE"))
        return cls(
            job_id=job_id, node=node, attempt=_int(env, "SLURM_JOB_RESTART_COUNT", 0) or 0,
            uid=_int(env, "SLURM_JOB_UID"), gpus=parse_gpu_list(env.get("SLURM_JOB_GPUS")),
            exit_code=exit_code, signal=signal,
            stdout=env.get("SLURM_JOB_STDOUT") or None, stderr=env.get("SLURM_JOB_STDERR") or None,
            work_dir=env.get("SLURM_JOB_WORK_DIR") or None,
            job_name=env.get("SLURM_JOB_NAME"), user=env.get("SLURM_JOB_USER") or None,
            array_job_id=_id(env, "SLURM_ARRAY_JOB_ID"), array_task_id=_id(env, "SLURM_ARRAY_TASK_ID"),
            host=os.uname().nodename.split(".", 1)[0] or None,   # gethostname(2); no socket import per job
            start_time=_start(env),
        )


def _start(env: dict) -> float | None:
    value = _id(env, "SLURM_JOB_START_TIME")
    return float(value) if value else None


def node_key(job: NodeJob, marker: dict | None) -> tuple[int, int, float | None]:
    """The node-side identity of the attempt that ran here: ``(job id, attempt, start)``, where
    ``start`` is set only by slurmd or slurm-ft as root, never by the job: ``SLURM_JOB_START_TIME``
    (slurmd, 23.02+), else the wall time of the prolog's start marker (root-only directory,
    ``O_NOFOLLOW``; 22.05), else None (unknown: the epilog then cannot tell a reused job id here).
    slurm_ft.journal.identity.observe_node files a reused id's verdict as a new job with it."""
    if job.start_time is not None:
        return job.job_id, job.attempt, job.start_time
    t = marker.get("time") if isinstance(marker, dict) else None
    ok = isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0
    return job.job_id, job.attempt, float(t) if ok else None


# ----------------------------------------------------------------------------- start marker
def _marker_path(state_dir: str, job: NodeJob) -> str:
    # Keyed by job and node, not attempt: when a prolog fails, Slurm has already bumped the
    # restart count by the time the epilog runs, and the epilog must still find this start.
    return os.path.join(state_dir, f"{job.job_id}.{job.node}.json")


def write_start_marker(state_dir: str, job: NodeJob) -> None:
    """Record when (monotonic and wall clock, seconds) this attempt started on this node, and which
    attempt it is (the epilog files its verdict under it: slurm_ft.node.epilog.attempt_that_ran)."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = _marker_path(state_dir, job)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"monotonic": time.monotonic(), "time": time.time(), "gpus": job.gpus, "attempt": job.attempt}, fh)
    os.replace(tmp, path)


def pop_start_marker(state_dir: str, job: NodeJob) -> dict | None:
    """Read and remove the marker; None if there is none (prolog did not run) or it is unreadable."""
    path = _marker_path(state_dir, job)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        data = None
    try:
        os.unlink(path)
    except OSError:
        pass
    return data if isinstance(data, dict) else None
