"""Wake the daemon's loop when slurmctld's hook drops an event, instead of at the next poll.

The loop (:mod:`slurm_ft.failover.daemon`) sleeps ``[failover] poll_interval_s`` between cycles;
:class:`EventWatch` ends that sleep early when a job-end event file arrives in ``events_dir``
(:mod:`.events`: the hook writes ``.<job>.<kind>.<pid>`` and renames it to
``<ns time>.<job>.<kind>``, so a rename into the directory is a complete event). Linux inotify
through ctypes (``inotify_init1``, ``inotify_add_watch`` with ``IN_MOVED_TO | IN_CLOSE_WRITE``,
``IN_ONLYDIR | IN_DONT_FOLLOW``: a symlink in place of the directory is not followed). Only an
``.end`` name wakes: job starts are routine and keep to the poll. Without inotify (another OS, no
such directory, the watch limit reached) :meth:`EventWatch.wait` is a plain sleep: the events are
still read every cycle, only later.

A wake-up is a hint, like the event itself: it costs one early cycle, never a decision
(the daemon reads the job from Slurm). A flood of events cannot make the loop spin: a cycle
never starts sooner than :data:`MIN_GAP_S` after the previous one began.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import time

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_HEADER = struct.Struct("iIII")    # wd, mask, cookie, len (struct inotify_event), then the name
#: Shortest pause (seconds) between the starts of two cycles, however many events arrive.
MIN_GAP_S = 0.02


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return lib
    except (OSError, AttributeError):
        return None


def wanted(names: list[str]) -> bool:
    """Whether any of these event-file names is a job end (``<digits>.<digits>.end``)."""
    for name in names:
        parts = name.split(".")
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit() and parts[2] == "end":
            return True
    return False


def names(buf: bytes) -> list[str]:
    """The file names in a buffer of ``struct inotify_event`` records (a truncated tail ignored)."""
    out, off = [], 0
    while off + _HEADER.size <= len(buf):
        _wd, _mask, _cookie, length = _HEADER.unpack_from(buf, off)
        off += _HEADER.size
        raw = buf[off:off + length]
        off += length
        out.append(raw.split(b"\0", 1)[0].decode("ascii", "replace"))
    return out


class EventWatch:
    """An inotify watch on ``directory`` (None or unusable: :meth:`wait` just sleeps)."""

    def __init__(self, directory: str | None):
        self.fd: int | None = None
        self.why_not = ""
        lib = _libc() if directory else None
        if lib is None:
            self.why_not = "no events directory" if not directory else "no inotify in libc"
            return
        fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self.why_not = os.strerror(ctypes.get_errno())
            return
        if lib.inotify_add_watch(fd, os.fsencode(directory),
                                 IN_MOVED_TO | IN_CLOSE_WRITE | IN_ONLYDIR | IN_DONT_FOLLOW) < 0:
            self.why_not = os.strerror(ctypes.get_errno())
            os.close(fd)
            return
        self.fd = fd

    def wait(self, timeout_s: float, *, sleep=None) -> bool:
        """Sleep up to ``timeout_s`` seconds; True as soon as a job-end event arrived (pending
        notifications are consumed), False at the timeout."""
        timeout_s = max(0.0, timeout_s)
        sleep = sleep or time.sleep      # looked up now (a test may replace time.sleep)
        if self.fd is None:
            sleep(timeout_s)
            return False
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
            except InterruptedError:     # a signal (SIGTERM sets the stop flag): let the loop look
                return False
            if not ready:
                return False
            try:
                buf = os.read(self.fd, 65536)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EINTR):
                    continue
                self.close()
                sleep(max(0.0, deadline - time.monotonic()))
                return False
            if wanted(names(buf)):
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
