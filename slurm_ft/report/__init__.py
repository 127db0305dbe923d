"""Drain report for HPC admins (``slurm-ft report``, docs/drain-report.md): which nodes are out
of service and who took them out (slurm-ft for a fault verdict or a health check, an admin,
Slurm), the drains in a window with counts that add up, flapping nodes and GPUs (RMA
candidates), Xids and failed health checks per node and GPU. HTML, text or JSON.

``collect`` gathers (``collect.py``), ``render`` formats (``render.py``), ``write_report``
writes a file without ever following a symlink planted at its path.
"""

from __future__ import annotations

import os
import tempfile

from slurm_ft.errors import SlurmFTError
from slurm_ft.report.collect import (
    FLAP_THRESHOLD, DrainEvent, NodeRow, ReportData, collect, reason_category)
from slurm_ft.report.render import FORMATS, render, to_json

__all__ = ["FLAP_THRESHOLD", "FORMATS", "DrainEvent", "NodeRow", "ReportData", "ReportError", "check_output",
           "collect", "reason_category", "render", "to_json", "write_report"]


class ReportError(SlurmFTError):
    """The report cannot be written where the admin asked (``-o``)."""


def _directory(path: str) -> str:
    return os.path.dirname(os.path.abspath(path)) or "/"


def check_output(path: str) -> None:
    """Fail early (before asking Slurm) when ``path`` cannot be written: a missing directory, one
    we may not write to, or a directory at ``path``. Raises :class:`ReportError`."""
    directory = _directory(path)
    if not os.path.isdir(directory):
        raise ReportError(f"{path}: cannot write the report: no directory {directory}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ReportError(f"{path}: cannot write the report: permission denied on {directory}")
    if os.path.isdir(path):
        raise ReportError(f"{path}: cannot write the report: it is a directory")


def write_report(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory, renamed over
    it: a reader never sees half a report, and a symlink at ``path`` is replaced, never followed
    (the report is often written by root into shared directories). Mode 0644 less the umask.
    Raises :class:`ReportError` with the reason (no such directory, permission denied, ...)."""
    check_output(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".slurm-ft-report.", dir=_directory(path))
    except OSError as exc:
        raise ReportError(f"{path}: cannot write the report: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fh.fileno(), 0o644 & ~umask)
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ReportError(f"{path}: cannot write the report: {exc.strerror}") from None
