"""``slurm-ft daemon --log-file PATH``: the daemon's log in a file that rotates itself, for a
daemon run without systemd (with systemd its stderr goes to the journal: docs/install.md).

Rotation: :class:`logging.handlers.RotatingFileHandler` (stdlib): at ``max_bytes`` the file is
renamed ``PATH.1`` (``PATH.1`` -> ``PATH.2`` ..., ``backups`` kept) and a new one started. It
needs no logrotate; do not also point logrotate at the file (two rotators lose lines).

The file is root's (the daemon runs as root): its directory must be a path only root can
change (:func:`slurm_ft.admin.install.untrusted`: every component root-owned, not group/other
writable), so no other user can plant or swap a name in it; the file is opened with
``O_NOFOLLOW`` (a symlink there is refused, never followed), must be a regular file with one
link owned by this process's user, and is made mode 0640.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import stat
from pathlib import Path

from slurm_ft.errors import SlurmFTError

MAX_BYTES = 20 * 1024 * 1024
BACKUPS = 5


class LogFileError(SlurmFTError):
    """The log file cannot be used (an untrusted directory, a symlink, another user's file)."""


class RootLogFile(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler whose every open (the first, and after each rollover) goes through
    :func:`open_log`."""

    def _open(self):
        return open_log(self.baseFilename, self.encoding, self.errors)


def open_log(path: str, encoding: str | None = "utf-8", errors: str | None = None):
    """``path`` opened for appending (created 0640), refusing a symlink (``O_NOFOLLOW``), a
    non-regular file, a file with other hard links and one owned by another user. Raises
    OSError naming the reason."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                 0o640)
    try:
        st = os.fstat(fd)
        why = ("not a regular file" if not stat.S_ISREG(st.st_mode)
               else f"owned by uid {st.st_uid}, not {os.geteuid()}" if st.st_uid != os.geteuid()
               else f"has {st.st_nlink} hard links" if st.st_nlink != 1 else None)
        if why:
            raise OSError(f"{path}: {why}")
        os.fchmod(fd, 0o640)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a", encoding=encoding, errors=errors)
    except BaseException:
        os.close(fd)
        raise


def attach(path: str, *, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> RootLogFile:
    """Send the root logger to ``path`` instead of stderr, in the format :func:`slurm_ft.logfmt.setup`
    chose (call that first). Raises :class:`LogFileError` for an untrusted directory or a file
    :func:`open_log` refuses."""
    from slurm_ft.admin.install import untrusted
    target = Path(os.path.abspath(path))
    bad = untrusted(target.parent)
    if bad:
        raise LogFileError(f"--log-file {target}: {bad}: only root may be able to change the log's directory")
    try:
        handler = RootLogFile(str(target), maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    except OSError as exc:
        raise LogFileError(f"--log-file {target}: {exc.strerror or exc}") from None
    root = logging.getLogger()
    formatter = next((h.formatter for h in root.handlers if h.formatter), None)
    handler.setFormatter(formatter or logging.Formatter())
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    return handler
