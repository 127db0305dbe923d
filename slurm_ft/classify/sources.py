"""Evidence sources, each bounded in bytes and time.  Run as root by the epilog.

* :func:`read_kmsg`: kernel log records since a ``time.monotonic()`` value, from ``/dev/kmsg``
  (Documentation/ABI/testing/dev-kmsg), falling back to ``dmesg``.
* :func:`read_tail_safely`: the tail of a job's output file, read as the job's user
  (:mod:`slurm_ft.node.userfile`).

Neither follows the environment: no ``$PATH`` lookup (``dmesg`` is called by absolute path with an
argv list and a timeout).  Failures raise :class:`slurm_ft.errors.EvidenceError`.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections import deque

from slurm_ft.errors import EvidenceError
from slurm_ft.classify.parse import fmt

#: One /dev/kmsg record is at most ~8 KiB (PRINTK_MESSAGE_MAX plus dictionary).
_KMSG_READ = 16 << 10
#: dmesg locations tried, in order (never $PATH).
DMESG_PATHS = ("/usr/bin/dmesg", "/bin/dmesg")
#: Seconds before the dmesg fallback is abandoned / the kmsg read loop gives up.
DMESG_TIMEOUT_S = 5.0
KMSG_DEADLINE_S = 5.0


def _kmsg_record(raw: bytes) -> tuple[float, bytes] | None:
    """``b"6,1234,219470994,-;NVRM: Xid ...\\n SUBSYSTEM=pci\\n"`` -> ``(219.470994, b"NVRM: Xid ...")``."""
    head, sep, body = raw.partition(b";")
    if not sep:
        return None
    fields = head.split(b",")
    if len(fields) < 3:
        return None
    try:
        ts = int(fields[2]) / 1e6
    except ValueError:
        return None
    return ts, body.split(b"\n", 1)[0]


def _keep(buf: deque, total: int, item: bytes, max_bytes: int) -> int:
    buf.append(item)
    total += len(item) + 1
    while total > max_bytes and buf:
        total -= len(buf.popleft()) + 1
    return total


def _trim(buf: list[bytes], total: int, max_bytes: int) -> int:
    """Drop the oldest records of ``buf`` (``total`` bytes, one newline each counted) until at
    most ``max_bytes`` remain; returns the new total."""
    cut = 0
    while total > max_bytes and cut < len(buf):
        total -= len(buf[cut]) + 1
        cut += 1
    del buf[:cut]
    return total


def read_kmsg(since_monotonic_s: float, *, max_bytes: int = 4 << 20, path: str = "/dev/kmsg") -> list[str]:
    """Kernel messages stamped at or after ``since_monotonic_s`` (seconds, printk clock, which
    follows CLOCK_MONOTONIC: pass a ``time.monotonic()`` value), oldest first, newest
    ``max_bytes`` kept.  Reads ``path`` non-blocking until EAGAIN; if it cannot be opened or read,
    runs ``dmesg`` instead.  Raises :class:`EvidenceError` when neither works."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        first = f"{path}: {exc.strerror}"
    else:
        # the newest records within max_bytes; trimmed from the front only when twice over (the
        # per-record work is the whole cost of a large window: issue 22, benchmarks/epilog_overhead.py)
        buf: list[bytes] = []
        total = 0
        pending = b""
        deadline = time.monotonic() + KMSG_DEADLINE_S
        try:
            while time.monotonic() < deadline:
                try:
                    raw = os.read(fd, _KMSG_READ)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # records overwritten while reading: carry on
                        continue
                    raise
                if not raw:
                    break
                # /dev/kmsg returns one record per read; a captured copy (plain file) returns many
                lines = (pending + raw).split(b"\n")
                pending = lines.pop()
                for rec in lines:
                    if rec[:1] == b" ":  # continuation line: " SUBSYSTEM=pci"
                        continue
                    head, sep, body = rec.partition(b";")   # _kmsg_record, inline
                    fields = head.split(b",", 3)
                    if not sep or len(fields) < 3:
                        continue
                    try:
                        if int(fields[2]) / 1e6 < since_monotonic_s:
                            continue
                    except ValueError:
                        continue
                    buf.append(body)
                    total += len(body) + 1
                if total > 2 * max_bytes:
                    total = _trim(buf, total, max_bytes)
            parsed = _kmsg_record(pending) if pending[:1] not in (b"", b" ") else None
            if parsed is not None and parsed[0] >= since_monotonic_s:
                buf.append(parsed[1])
                total += len(parsed[1]) + 1
            _trim(buf, total, max_bytes)
        except OSError as exc:
            first = f"{path}: {exc.strerror}"
        else:
            # one decode: UTF-8 never lets an invalid sequence swallow the ASCII newline
            return b"\n".join(buf).decode("utf-8", "replace").split("\n") if buf else []
        finally:
            os.close(fd)
    return _read_dmesg(since_monotonic_s, max_bytes, first)


def _read_dmesg(since: float, max_bytes: int, why: str) -> list[str]:
    exe = next((p for p in DMESG_PATHS if os.access(p, os.X_OK)), None)
    if exe is None:
        raise EvidenceError(f"kernel log unreadable ({why}) and no dmesg in {', '.join(DMESG_PATHS)}")
    try:
        proc = subprocess.run([exe], capture_output=True, timeout=DMESG_TIMEOUT_S, check=False,
                              env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EvidenceError(f"kernel log unreadable ({why}); dmesg failed: {exc}") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()[:200]
        raise EvidenceError(f"kernel log unreadable ({why}); dmesg exited {proc.returncode}: {err}")
    buf: deque[bytes] = deque()
    total = 0
    stamp = fmt("ts_mono")
    for line in proc.stdout.splitlines():
        m = stamp.match(line)
        if m is None or float(m.group(1)) < since:
            continue
        total = _keep(buf, total, line[m.end():].lstrip(), max_bytes)
    return [b.decode("utf-8", "replace") for b in buf]


def read_tail_safely(path: str | bytes, *, expected_uid: int | None, max_bytes: int = 64 << 10,
                     gid: int | None = None, deadline_s: float = 2.0) -> str:
    """The last ``max_bytes`` of the job's output file at ``path`` (absolute; bytes or str, a
    non-UTF-8 name as surrogate escapes), decoded as UTF-8 (errors replaced); when ``max_bytes`` were
    read (the file may be longer) the partial first line is dropped.

    Read by :func:`slurm_ft.node.userfile.read_tail`: a child that became the job's user
    (``expected_uid``; ``gid``, default the uid's passwd group) walks the path without following
    any symlink, opens only a regular file owned by ``expected_uid`` (a device or FIFO is never
    opened) and answers within ``deadline_s`` seconds or is killed. ``expected_uid`` None is
    refused: no read without the job's uid. Raises :class:`EvidenceError`
    (:class:`slurm_ft.node.userfile.UserFileError`) with the reason.
    """
    from slurm_ft.node.userfile import read_tail

    if max_bytes <= 0:
        return ""
    data = read_tail(path, expected_uid, gid, max_bytes, deadline_s)
    if len(data) >= max_bytes:  # the file may be longer: drop the partial first line
        nl = data.find(b"\n")
        if 0 <= nl < len(data) - 1:
            data = data[nl + 1:]
    return data.decode("utf-8", "replace")
