"""The training-step heartbeat: written by the job (``slurm_ft.checkpoint``), read by the hang
watcher (root).

**Where.** The prolog makes one directory per job and node, ``<[hang] heartbeat_dir>/<job id>``
(``{node}`` in the setting replaced), owned by the job's user, mode 0700, inside a root-owned
directory the user cannot change. Each process that beats has its own file ``<pid>.hb`` there.

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
import mmap
import os
import re
import stat
import struct
import time
from dataclasses import dataclass

MAGIC = b"SFTHB\x01\x00\x00"
_FMT = struct.Struct("<8sQddqIId")
SIZE = 64
MAX_SIZE = 4096
#: Files the watcher reads per look (a job making thousands of files only hides its own hang).
MAX_FILES = 256
RUNNING, SAVING = 0, 1
_NAME = re.compile(r"^\d{1,10}\.hb$")
#: The in-place wrapper's mark in the directory (slurm_ft.inplace): end only the step on a hang.
INPLACE_MARK = "inplace"


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
class Writer:
    """One process's heartbeat file. :meth:`beat` is the hot-path call."""

    def __init__(self, directory: str, pid: int | None = None):
        self.pid = os.getpid() if pid is None else pid
        self.path = os.path.join(directory, f"{self.pid}.hb")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._seq = 0
        self._since = 0.0

    def beat(self, step: int, saving: bool = False) -> None:
        """Record a training step (``saving``: a checkpoint is being written)."""
        self._seq += 1
        now = time.monotonic()
        if saving and not self._since:
            self._since = now
        elif not saving:
            self._since = 0.0
        _FMT.pack_into(self._mm, 0, MAGIC, self._seq, now, time.time(), int(step), SAVING if saving else RUNNING,
                       self.pid, self._since)

    def close(self) -> None:
        self._mm.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


_writer: Writer | None = None
_next_try = 0.0
#: Seconds between two tries to find the job's heartbeat directory when it is not there.
RETRY_S = 30.0


def _directory(env) -> str | None:
    """This job's heartbeat directory on this node, or None (not in a job, no hang watch)."""
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    if not job.isdigit() or not node:
        return None
    from .. import config as config_mod
    try:
        cfg = config_mod.load(env=dict(env))
    except Exception:  # a broken config must never break training
        return None
    d = job_dir(cfg.heartbeat_root(node), int(job))
    return d if os.path.isdir(d) else None


def _forked() -> None:
    """In a forked child (a DataLoader worker...): the parent's mapping is not this process's."""
    global _writer, _next_try
    _writer, _next_try = None, 0.0


os.register_at_fork(after_in_child=_forked)


def heartbeat(step: int, saving: bool = False, env=None) -> bool:
    """Record one training step for the hang watcher (``saving``: a checkpoint is in progress,
    which pauses the hang window). Cheap enough for every step: after the first call it is one
    store into shared memory (no system call). Returns False when the job is not hang-watched on
    this node (then it looks again at most every :data:`RETRY_S` s). Never raises."""
    global _writer, _next_try
    if _writer is not None:
        _writer.beat(step, saving)
        return True
    now = time.monotonic()
    if now < _next_try:
        return False
    _next_try = now + RETRY_S
    try:
        d = _directory(os.environ if env is None else env)
        if d is None:
            return False
        _writer = Writer(d)
    except OSError:
        return False
    _writer.beat(step, saving)
    return True


def mark_inplace(env=None) -> bool:
    """The in-place wrapper's mark (slurm_ft.inplace): on a hang, the watcher ends only the step's
    tasks, so the wrapper can restart it. Returns whether it was made."""
    try:
        d = _directory(os.environ if env is None else env)
        if d is None:
            return False
        os.close(os.open(os.path.join(d, INPLACE_MARK), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600))
        return True
    except OSError:
        return False


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
