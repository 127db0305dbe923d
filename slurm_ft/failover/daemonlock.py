"""One daemon per journal, and a heartbeat that tells whether it is running.

Both files live in the daemon journal's directory (``[journal] path``'s, default
/var/lib/slurm-ft), so each journal (each lab, too) has its own:

* ``daemon.lock``: ``slurm-ft daemon`` holds an exclusive ``flock`` on it for its whole life
  (:func:`acquire`) and writes its pid into it. A second daemon on the same journal gets
  :class:`DaemonRunning` (``Error: another slurm-ft daemon (pid N) is running on ...``) before
  it reads or writes anything. The kernel drops the lock when the process dies, however it
  dies: no stale lock to clean up. Test it by hand with ``flock -n daemon.lock true``.
* ``daemon.heartbeat``: JSON ``{"pid", "time", "ok", "last_ok", "started"}`` the daemon
  rewrites (temp file + rename) after each cycle, at most once a second (:func:`beat`);
  ``time`` is its last cycle, ``last_ok`` its last cycle that reached Slurm and finished.
  Readers (:func:`read_heartbeat`, :func:`staleness`): ``slurm-ft doctor``, ``ft-history``,
  ``slurm-ft metrics``. Mode 0644 in a directory that is 0700 or 0750 root:``read_group``: who
  may read the journal may read the heartbeat.

The daemon's loop calls :func:`beat` (see docs/install.md, "Is the daemon running?").
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ft.errors import SlurmFTError

LOCK_NAME = "daemon.lock"
HEARTBEAT_NAME = "daemon.heartbeat"
#: A heartbeat older than this (seconds), or ``STALE_CYCLES`` poll intervals if longer, means the
#: daemon is not running (a cycle that waits on a slow slurmctld takes several command timeouts).
STALE_AFTER_S = 60.0
STALE_CYCLES = 20
#: Seconds between two heartbeat writes of one daemon.
BEAT_EVERY_S = 1.0


class DaemonRunning(SlurmFTError):
    """Another slurm-ft daemon holds the journal's lock."""


def state_dir(journal_path: str | os.PathLike) -> Path:
    """The directory of the daemon journal, where the lock and the heartbeat live."""
    return Path(journal_path).parent


def lock_path(journal_path: str | os.PathLike) -> Path:
    return state_dir(journal_path) / LOCK_NAME


def heartbeat_path(journal_path: str | os.PathLike) -> Path:
    return state_dir(journal_path) / HEARTBEAT_NAME


def stale_after(poll_interval_s: float = 0.5) -> float:
    """Seconds after which a heartbeat is stale for a daemon polling every ``poll_interval_s``."""
    return max(STALE_AFTER_S, STALE_CYCLES * poll_interval_s)


@dataclass
class DaemonLock:
    """The held lock: keep the object (its descriptor) for the daemon's life; :meth:`release`
    (or process exit) frees it."""

    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "DaemonLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(path: Path) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            pid = fh.read(32).strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def acquire(journal_path: str | os.PathLike) -> DaemonLock:
    """Take the journal's daemon lock or raise :class:`DaemonRunning` naming the holder's pid.
    The journal's directory must exist (the journal creates it with its permissions: open the
    journal first). Raises :class:`SlurmFTError` when the lock file cannot be opened."""
    path = lock_path(journal_path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SlurmFTError(f"{path}: is a symlink; refusing to use it as the daemon lock") from None
        raise SlurmFTError(f"{path}: cannot open the daemon lock: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DaemonRunning(f"another slurm-ft daemon{_holder(path)} is running on the journal "
                                f"{journal_path} (it holds {path}); stop it first "
                                f"(systemctl stop slurm-ft-daemon), one daemon per journal") from None
        raise SlurmFTError(f"{path}: cannot lock: {exc.strerror}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return DaemonLock(path, fd)


_last: dict[str, tuple[float, bool, float | None, float]] = {}   # path -> (written, ok, last_ok, started)


def beat(cfg_or_path, *, ok: bool = True, now: float | None = None) -> None:
    """Record that the daemon finished a cycle now (``ok``: it reached Slurm and completed).
    ``cfg_or_path``: the config (its ``[journal] path``) or the journal path. At most one write
    per :data:`BEAT_EVERY_S` unless ``ok`` changed; never raises (a full disk must not stop
    failovers; the staleness shows it)."""
    journal_path = getattr(getattr(cfg_or_path, "journal", None), "path", cfg_or_path)
    path = heartbeat_path(journal_path)
    now = time.time() if now is None else now
    key = str(path)
    written, was_ok, last_ok, started = _last.get(key, (0.0, not ok, None, now))
    if ok:
        last_ok = now
    if now - written < BEAT_EVERY_S and was_ok == ok:
        _last[key] = (written, ok, last_ok, started)
        return
    record = {"pid": os.getpid(), "time": now, "ok": ok, "last_ok": last_ok, "started": started}
    try:
        import tempfile     # here: ft-history imports this module, and only the daemon writes
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{HEARTBEAT_NAME}.")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(record, fh)
                os.fchmod(fh.fileno(), 0o644)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
    _last[key] = (now, ok, last_ok, started)


def read_heartbeat(journal_path: str | os.PathLike) -> dict | None:
    """The heartbeat record, or None when there is none (the daemon never ran here, or an older
    release) or it cannot be read by this user."""
    try:
        with open(heartbeat_path(journal_path), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("time"), (int, float)) else None


def staleness(journal_path: str | os.PathLike, poll_interval_s: float = 0.5,
              now: float | None = None) -> tuple[str, float | None]:
    """(``"fresh"`` | ``"stale"`` | ``"missing"``, seconds since the last cycle or None)."""
    hb = read_heartbeat(journal_path)
    if hb is None:
        return "missing", None
    age = max(0.0, (time.time() if now is None else now) - hb["time"])
    return ("stale" if age > stale_after(poll_interval_s) else "fresh"), age


def down_warning(journal_path: str | os.PathLike, poll_interval_s: float = 0.5, now: float | None = None,
                 *, missing_too: bool = False) -> str | None:
    """``the slurm-ft daemon has not run for N s`` when the heartbeat is stale (with
    ``missing_too``, also when there is none), else None."""
    state, age = staleness(journal_path, poll_interval_s, now)
    if state == "stale":
        return f"the slurm-ft daemon has not run for {age:.0f} s (heartbeat {heartbeat_path(journal_path)})"
    if state == "missing" and missing_too:
        return f"no slurm-ft daemon heartbeat at {heartbeat_path(journal_path)}: the daemon may not be running"
    return None
