"""What is wrong with a journal that refuses a write: the one classification every writer (the
daemon, the prolog/epilog, the health checks), ``slurm-ft doctor``, the metrics and the epilog's
advice use, so a full disk is reported as a full disk and "move it aside" is said only of a
journal that is really corrupted.

:func:`diagnose` turns the exception a write raised (``sqlite3.Error`` or ``OSError``) into a
:class:`Trouble`. SQLite's own code says most (``SQLITE_FULL``: the unix VFS returns it for
``ENOSPC``; ``SQLITE_READONLY``; ``SQLITE_IOERR_*``; ``SQLITE_CORRUPT``/``SQLITE_NOTADB``;
``SQLITE_BUSY``/``SQLITE_LOCKED``), an ``OSError`` its ``errno``. SQLite reports some OS errors
only as a generic I/O error (``EDQUOT`` and ``EROFS`` on a write are ``SQLITE_IOERR_WRITE``), so
an I/O error is checked against the filesystem itself (``statvfs`` of the journal's directory:
no free block, or mounted read-only) before it is called one.

Kinds (:data:`KINDS`; the ``kind`` label of ``slurm_ft_journal_ok``):

=============  ===================================  ======================================
kind           said as                              what slurm-ft does
=============  ===================================  ======================================
``disk_full``  ``disk full (ENOSPC)``, ``EDQUOT``   keeps the rows, writes them when space returns
``read_only``  ``read-only filesystem (EROFS)``     keeps the rows, writes them after a remount
``io_error``   ``I/O error (EIO)``                  keeps the rows, tries again each cycle
``busy``       ``locked by another process``        spools the rows (``<journal>.spool``)
``corrupted``  ``corrupted (SQLITE_CORRUPT)``       refuses: move the file aside
``permission`` ``permission denied (EACCES)``       refuses: fix the owner/mode
``other``      the error's own text                 refuses
=============  ===================================  ======================================

The first four are **transient** (:attr:`Trouble.transient`): the journal is sound, only the
storage under it is not taking writes now.
"""

from __future__ import annotations

import errno as _errno
import os
import sqlite3
from dataclasses import dataclass

#: kind -> (how it is said, advice to the admin; ``{path}`` and ``{dir}`` are filled in).
KINDS: dict[str, tuple[str, str]] = {
    "disk_full": ("disk full", "free space on the filesystem holding {dir} (df -h {dir}); slurm-ft keeps the rows "
                               "in memory and writes them when space returns; the journal is not corrupted"),
    "read_only": ("read-only filesystem", "the filesystem holding {dir} is mounted read-only (an error "
                                          "remount? see dmesg); remount it read-write; the journal is not "
                                          "corrupted"),
    "io_error": ("I/O error", "the disk under {dir} reports I/O errors (see dmesg, smartctl); slurm-ft tries "
                              "again each cycle; the journal file itself is not known to be damaged"),
    "busy": ("locked by another process", "another process holds {path} locked; writes are spooled to "
                                          "{path}.spool and applied by the next writer"),
    "corrupted": ("corrupted", "move it aside (mv {path} {path}.bad) and slurm-ft will start a new one"),
    "permission": ("permission denied", "the journal or its directory is not writable by this user "
                                        "(check owner and mode of {dir})"),
    "other": ("cannot be written", "see the error; `slurm-ft doctor` checks the journal"),
}
TRANSIENT = frozenset({"disk_full", "read_only", "io_error", "busy"})

_ERRNO_KIND = {_errno.ENOSPC: "disk_full", _errno.EDQUOT: "disk_full", _errno.EROFS: "read_only",
               _errno.EIO: "io_error", _errno.EACCES: "permission", _errno.EPERM: "permission"}
#: SQLite primary result codes (the low byte of an extended code) -> (kind, code name).
_SQLITE_KIND = {13: ("disk_full", "SQLITE_FULL"), 8: ("read_only", "SQLITE_READONLY"), 10: ("io_error", "SQLITE_IOERR"),
                11: ("corrupted", "SQLITE_CORRUPT"), 26: ("corrupted", "SQLITE_NOTADB"),
                5: ("busy", "SQLITE_BUSY"), 6: ("busy", "SQLITE_LOCKED"), 3: ("permission", "SQLITE_PERM"),
                23: ("permission", "SQLITE_AUTH")}
#: Message texts, for an error without a result code (an older Python, a wrapped error).
_TEXT_KIND = (("database or disk is full", "disk_full", "SQLITE_FULL"),
              ("no space left", "disk_full", "ENOSPC"),
              ("readonly database", "read_only", "SQLITE_READONLY"),
              ("read-only file system", "read_only", "EROFS"),
              ("disk i/o error", "io_error", "SQLITE_IOERR"),
              ("malformed", "corrupted", "SQLITE_CORRUPT"),
              ("not a database", "corrupted", "SQLITE_NOTADB"),
              ("locked", "busy", "SQLITE_BUSY"), ("busy", "busy", "SQLITE_BUSY"))


@dataclass(frozen=True)
class Trouble:
    """One diagnosis: ``kind`` (a key of :data:`KINDS`), ``code`` (``ENOSPC``, ``SQLITE_FULL``...),
    ``detail`` (the error's own text), ``path`` (the journal)."""
    kind: str
    code: str
    detail: str
    path: str = ""

    @property
    def label(self) -> str:
        """How the kind is said: ``disk full``, ``read-only filesystem``, ``I/O error``..."""
        return KINDS[self.kind][0]

    @property
    def transient(self) -> bool:
        """True when the journal is sound and only its storage refuses writes now (keep the rows)."""
        return self.kind in TRANSIENT

    @property
    def advice(self) -> str:
        path = self.path or "the journal"
        return KINDS[self.kind][1].format(path=path, dir=os.path.dirname(path) or ".")

    def __str__(self) -> str:
        """``disk full (ENOSPC)``."""
        return f"{self.label} ({self.code})" if self.code else self.label

    def message(self) -> str:
        """``journal <path>: disk full (ENOSPC): <advice>``: one line for a log or a terminal."""
        return f"journal {self.path}: {self}: {self.advice}"


def _probe(path: str) -> tuple[str, str] | None:
    """(kind, code) the filesystem holding ``path`` shows now (read-only, or no free block), or None."""
    d = os.path.dirname(os.path.abspath(path)) if path else ""
    while d and not os.path.isdir(d):
        d = os.path.dirname(d)
    if not d:
        return None
    try:
        st = os.statvfs(d)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return "read_only", "EROFS"
    if st.f_bavail == 0 or (st.f_files and st.f_favail == 0):
        return "disk_full", "ENOSPC"
    return None


def diagnose(exc: BaseException, path: str | os.PathLike = "") -> Trouble:
    """The :class:`Trouble` behind ``exc`` (raised by a write to the journal at ``path``)."""
    path = os.fspath(path) if path else ""
    detail = str(exc)
    kind, code = "other", ""
    if isinstance(exc, OSError) and exc.errno in _ERRNO_KIND:
        kind, code = _ERRNO_KIND[exc.errno], _errno.errorcode.get(exc.errno, "")
        detail = exc.strerror or detail
    elif isinstance(exc, sqlite3.Error):
        ext = getattr(exc, "sqlite_errorcode", None)
        if isinstance(ext, int) and (ext & 0xFF) in _SQLITE_KIND:
            kind, code = _SQLITE_KIND[ext & 0xFF]
            code = getattr(exc, "sqlite_errorname", None) or code
        else:
            low = detail.lower()
            kind, code = next(((k, c) for t, k, c in _TEXT_KIND if t in low), ("other", ""))
    if kind in ("disk_full", "io_error", "read_only") and not isinstance(exc, OSError):
        seen = _probe(path)   # what SQLite calls an I/O error or SQLITE_FULL: the filesystem says which
        if seen is not None and (kind != "read_only" or seen[0] == "read_only"):
            kind, code = seen
        elif kind == "disk_full":
            code = "ENOSPC"     # SQLite's unix VFS says SQLITE_FULL for ENOSPC only
    return Trouble(kind, code, detail, path)


def check_writable(path: str | os.PathLike, *, write_test: bool = False) -> Trouble | None:
    """Whether the journal at ``path`` can take writes now, asked of its filesystem (no journal
    write): read-only or without a free block (``statvfs``) is a :class:`Trouble`; with
    ``write_test`` (``slurm-ft doctor``, as root) a 4 KiB file is also written, fsync'd and removed
    in the journal's directory, which finds a quota or an I/O error too. None when it can."""
    path = os.fspath(path)
    seen = _probe(path)
    if seen is not None:
        return Trouble(seen[0], seen[1], "seen on the filesystem", path)
    d = os.path.dirname(os.path.abspath(path))
    if not write_test or not os.path.isdir(d) or not os.access(d, os.W_OK):
        return None
    import tempfile
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".slurm-ft-write-test.")
    except OSError as exc:
        return diagnose(exc, path) if exc.errno in _ERRNO_KIND else None
    try:
        os.write(fd, b"\0" * 4096)
        os.fsync(fd)
    except OSError as exc:
        return diagnose(exc, path) if exc.errno in _ERRNO_KIND else None
    finally:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return None


def waiting_rows(path: str | os.PathLike) -> int:
    """Rows waiting in the journal's spool (``<journal>.spool``, written when the database was
    locked or refused them) that are not in the database yet; 0 when none or unreadable."""
    try:
        with open(f"{os.fspath(path)}.spool", "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0
