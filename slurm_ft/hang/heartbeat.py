"""The training-step heartbeat: written by the job (``slurm_ft.checkpoint``), read by the hang
watcher (root).

**Where.** The prolog makes one directory per job and node, ``<[hang] heartbeat_dir>/<job id>``
(``{node}`` in the setting replaced), owned by the job's user, mode 0700, inside a root-owned
directory the user cannot change. Each process that beats has its own file ``<pid>.hb`` there.

**Who writes.** The job-side client, slurm_ft/data/client/slurm_ft_job.py (stdlib only; this
module re-exports its writer and owns the reader).

**What.** 64 bytes, memory-mapped by the writer, so one beat is a store into memory — no
system call, no file I/O on the training loop's hot path (about 1 µs in CPython)::

    magic "SFTHB\\x01\\0\\0" | seq u64 | mono f64 | wall f64 | step i64 | state u32 | pid u32 | since f64

``mono``/``since`` are ``CLOCK_MONOTONIC`` seconds (one clock for every process of a node; NTP
steps do not move it), ``wall`` epoch seconds (for people), ``state`` 0 running, 1 saving (a
checkpoint in progress since ``since``), ``seq`` counts beats (progress = a file's ``seq``
changed between two looks of the watcher).

**Trust.** The files are the job's own: the watcher opens them only through the directory's file
descriptor, ``O_NOFOLLOW | O_NONBLOCK``, keeps only regular files of the job's user of at most
:data:`MAX_SIZE` bytes, reads :data:`SIZE` bytes, and checks every field. A job that lies can
only keep itself alive (hide its own hang) or get itself ended: its own retry budget, nobody
else's node.
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass

from slurm_ft.data.client.slurm_ft_job import FORMAT as _FMT, INPLACE_MARK, MAGIC, RUNNING, SAVING, SIZE
from slurm_ft.data.client.slurm_ft_job import (  # noqa: F401
    Writer, heartbeat, heartbeat_dir, mark_inplace)

MAX_SIZE = 4096
#: Files the watcher reads per look (a job making thousands of files only hides its own hang).
MAX_FILES = 256
_NAME = re.compile(r"^\d{1,10}\.hb$")


@dataclass(frozen=True)
class Beat:
    seq: int
    mono: float
    wall: float
    step: int
    state: int
    pid: int
    since: float

    @property
    def saving(self) -> bool:
        return self.state == SAVING


def pack(b: Beat) -> bytes:
    return _FMT.pack(MAGIC, b.seq, b.mono, b.wall, b.step, b.state, b.pid, b.since).ljust(SIZE, b"\0")


def unpack(data: bytes) -> Beat | None:
    """A heartbeat from ``data``, or None when it is not one (wrong magic, size, or a field out of
    range: NaN, a negative sequence, an unknown state)."""
    if len(data) < _FMT.size:
        return None
    magic, seq, mono, wall, step, state, pid, since = _FMT.unpack_from(data)
    if magic != MAGIC or state not in (RUNNING, SAVING):
        return None
    if not all(math.isfinite(x) and x >= 0 for x in (mono, wall, since)):
        return None
    return Beat(seq, mono, wall, step, state, pid, since)


def job_dir(root: str, job_id: int) -> str:
    return os.path.join(root, str(int(job_id)))


# ------------------------------------------------------------------------------ writer (the job)
# Writer, heartbeat(), mark_inplace(), heartbeat_dir(): the job-side client
# (slurm_ft/data/client/slurm_ft_job.py, stdlib only), re-exported above: one writer for jobs with
# or without slurm-ft installed.


# ------------------------------------------------------------------------------ reader (root)
def read_dir(dir_fd: int, uid: int, limit: int = MAX_FILES) -> dict[str, Beat]:
    """Every valid heartbeat in the job's directory (``dir_fd``), by file name: regular files of
    ``uid`` only, opened without following links or blocking, at most ``limit`` of them."""
    out: dict[str, Beat] = {}
    seen = 0
    with os.scandir(dir_fd) as entries:
        for e in entries:
            if seen >= limit:
                break
            if not _NAME.match(e.name):
                continue
            seen += 1
            try:
                fd = os.open(e.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY,
                             dir_fd=dir_fd)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > MAX_SIZE:
                    continue
                b = unpack(os.pread(fd, SIZE, 0))
            except OSError:
                continue
            finally:
                os.close(fd)
            if b is not None:
                out[e.name] = b
    return out


def inplace_marked(dir_fd: int, uid: int) -> bool:
    try:
        st = os.stat(INPLACE_MARK, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == uid
