"""The path of a job's batch output on its node, from the job's Slurm filename pattern
(``sbatch -o/-e``), expanded as slurmstepd does: one parser for the epilog and the hang watcher.
The pattern is the user's (untrusted): an escape slurm-ft does not know or a value it does not
have is a :class:`PatternError`, never a guessed path."""

from __future__ import annotations

import os
import re

from slurm_ft.errors import SlurmFTError
from slurm_ft.node.job import NodeJob

#: Slurm pads a number in a filename pattern to at most this many digits (sbatch(1): "The
#: maximal number is 10").
PATTERN_MAX_WIDTH = 10
#: Slurm's ``NO_VAL``: the array task id of a job that is not an array task; ``%a`` of such a job
#: expands to it (slurmstepd prints ``step->array_task_id`` as is: ``slurm-12_4294967294.out``).
NO_VAL = 0xFFFFFFFE
#: The escapes whose value slurm-ft may have to ask slurmctld for (the job name and array ids are
#: not in the 22.05 epilog environment): :func:`pattern_needs_job_record`.
RECORD_ESCAPES = frozenset("xAa")


class PatternError(ValueError):
    """A filename pattern slurm-ft will not expand (an unknown escape, a value it does not know):
    the message says which; the output is then not read (never a guessed path)."""


def _escapes(pattern: str):
    """``(width digits, escape letter)`` of every ``%`` escape of an unescaped pattern; a pattern
    holding a backslash has none (Slurm expands nothing in it)."""
    if "\\" in pattern:
        return
    i = 0
    while i < len(pattern):
        if pattern[i] != "%":
            i += 1
            continue
        j = i + 1
        while j < len(pattern) and pattern[j] in "0123456789":
            j += 1
        yield pattern[i + 1:j], pattern[j] if j < len(pattern) else ""
        i = j + 1


def pattern_needs_job_record(pattern: str | bytes | None, job: NodeJob) -> bool:
    """True when ``pattern`` has an escape (``%x``, ``%A``, ``%a``) whose value ``job`` does not
    hold (the epilog then asks ``scontrol show job`` once: :func:`with_job_record`)."""
    if not pattern:
        return False
    if isinstance(pattern, (bytes, bytearray)):
        pattern = os.fsdecode(bytes(pattern))
    return any(key in RECORD_ESCAPES and (job.job_name if key == "x" else job.array_job_id) is None
               for _, key in _escapes(pattern))


def with_job_record(cfg, job: NodeJob, log) -> NodeJob:
    """``job`` with its name and array ids from one ``scontrol show job`` (:meth:`Slurm.job`,
    parsed by :mod:`slurm_ft.slurm.jobinfo`); ``job`` unchanged (and the reason logged) when slurmctld
    cannot answer. A job that is not an array task gets ``array_job_id=0``,
    ``array_task_id=NO_VAL`` (Slurm's own values)."""
    import dataclasses

    from slurm_ft.slurm import Slurm
    try:
        info = Slurm.from_config(cfg).job(job.job_id)
    except SlurmFTError as exc:
        log(f"job record unavailable for the output pattern: {exc}")
        return job
    if info is None:
        log("job record unavailable for the output pattern: slurmctld no longer knows the job")
        return job
    array_job, array_task = job.array_job_id, job.array_task_id
    if array_job is None:                    # what the environment gave stays
        array_job, array_task = _uint(info.raw.get("array_job_id")), _uint(info.raw.get("array_task_id"))
        if not array_job:
            array_job, array_task = 0, NO_VAL
    return dataclasses.replace(job, job_name=job.job_name if job.job_name is not None else info.name,
                               array_job_id=array_job, array_task_id=array_task)


def _uint(value) -> int | None:
    """A record's unsigned id (an int, a decimal string, or 23.02+ json's ``{"set":..., "number":...}``);
    None when absent or not a plain number (a pending array's ``1-5%2``)."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    text = str(value)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else None


def expand_output_pattern(pattern: str | bytes, job: NodeJob) -> str | None:
    """The path of the job's output for this node from its Slurm filename pattern, or None when
    slurm-ft will not expand it (:func:`expand_pattern` says why)."""
    try:
        return expand_pattern(pattern, job)
    except PatternError:
        return None


def expand_pattern(pattern: str | bytes, job: NodeJob) -> str:
    """Expand the Slurm filename pattern of the job's batch output (``sbatch -o/-e``) as slurmstepd
    does for the batch step (Slurm src/slurmd/common/fname.c ``fname_create``,
    ``remove_path_slashes``; sbatch(1) "filename pattern"):

    * a pattern holding a backslash is not expanded at all: each ``\\\\`` becomes ``\\`` and
      every other backslash is dropped;
    * ``%%`` -> ``%``; ``%j`` and ``%J`` -> job id (the batch step has no step number to add);
      ``%A`` -> array master job id (the job id when not an array task); ``%a`` -> array task id
      (``4294967294``, Slurm's NO_VAL, when not an array task); ``%s`` -> ``batch``; ``%n`` ->
      ``0`` (node index), ``%t`` -> ``0`` (task rank); ``%N`` -> this machine's short host name
      (``NodeJob.host``; slurmstepd's, which is not the NodeName where they differ); ``%u``
      -> the user name (``SLURM_JOB_USER``, else the passwd entry of ``SLURM_JOB_UID``); ``%x``
      -> the job name;
    * ASCII digits between ``%`` and the letter zero-pad a number (``%4j`` -> ``0012``), at most
      :data:`PATTERN_MAX_WIDTH` digits; a width on a name (``%5x``) is ignored;
    * a relative result is joined to the job's working directory.

    Raises :class:`PatternError` for any other escape (``%q``, a ``%`` at the end, a non-ASCII
    digit) or a value ``job`` does not hold (``%x`` without a job name, ``%A``/``%a`` without
    array ids: :func:`with_job_record`): never a guessed path.

    The pattern is the user's and may hold any bytes but NUL: a ``bytes`` pattern is decoded with
    ``os.fsdecode``, and a non-UTF-8 byte stays a surrogate escape (PEP 383, as ``os.environ``
    gives it), so ``os.fsencode`` of the result is the exact path; never print it raw
    (:mod:`slurm_ft.textsafe`)."""
    if isinstance(pattern, (bytes, bytearray)):
        pattern = os.fsdecode(bytes(pattern))
    if "\\" in pattern:
        path = re.sub(r"\\(.?)", lambda m: m.group(1), pattern, flags=re.S)
    else:
        path = "".join(_expand_escapes(pattern, job))
    if not os.path.isabs(path) and job.work_dir:
        path = os.path.join(job.work_dir, path)
    return path


def _expand_escapes(pattern: str, job: NodeJob):
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c != "%":
            yield c
            i += 1
            continue
        j = i + 1
        while j < len(pattern) and pattern[j] in "0123456789":
            j += 1
        digits, key = pattern[i + 1:j], pattern[j] if j < len(pattern) else ""
        # "%99999999j": Slurm caps at 10; never int() a huge digit string
        width = PATTERN_MAX_WIDTH if len(digits.lstrip("0")) > 2 else min(int(digits or 0), PATTERN_MAX_WIDTH)
        if key == "%" and not digits:
            yield "%"
        elif key in _NUMBERS:
            value = _NUMBERS[key](job)
            if value is None:
                raise PatternError(f"%{key} needs the job's array ids, which are not known here")
            yield str(value).zfill(width)
        elif key in _NAMES:
            value = _NAMES[key](job)
            if value is None:
                raise PatternError(f"%{key} needs {_NAME_WHAT[key]}, which is not known here")
            yield value
        else:
            shown = (digits + key).encode("ascii", "backslashreplace").decode() or "end of pattern"
            raise PatternError(f"escape %{shown} is not a Slurm filename pattern slurm-ft expands")
        i = j + 1


def _array_job(job: NodeJob) -> int | None:
    if job.array_job_id is None:
        return None
    return job.array_job_id or job.job_id


def _array_task(job: NodeJob) -> int | None:
    if job.array_job_id is None:
        return None
    return job.array_task_id if job.array_job_id and job.array_task_id is not None else NO_VAL


def _user(job: NodeJob) -> str | None:
    if job.user:
        return job.user
    if job.uid is None:
        return None
    import pwd
    try:
        return pwd.getpwuid(job.uid).pw_name
    except KeyError:
        return None


_NUMBERS = {"j": lambda job: job.job_id, "J": lambda job: job.job_id, "A": _array_job, "a": _array_task,
            "n": lambda job: 0, "t": lambda job: 0}
_NAMES = {"N": lambda job: job.host or job.node, "u": _user, "x": lambda job: job.job_name, "s": lambda job: "batch"}
_NAME_WHAT = {"u": "the user name", "x": "the job name", "N": "the node name", "s": "the step"}
