"""Slurm index lists (GPU ``IDX:0-1,3`` of ``scontrol show job -d``, ``SLURM_JOB_GPUS=0,2-3``),
expanded with ClusterShell's ``RangeSet``.

A module of its own, importing only ``ClusterShell.RangeSet`` (not the node-set machinery, the
Slurm client or ``subprocess``), so that the prolog and epilog of every GPU job can read
``SLURM_JOB_GPUS`` cheaply (issue 24, docs/architecture.md "Per-job cost");
``slurm_ft.slurm`` re-exports :func:`split_indices`."""

from __future__ import annotations

import re

from ClusterShell.RangeSet import RangeSet, RangeSetException

from slurm_ft.errors import HostlistError

#: Characters ClusterShell gives a meaning (set operations, whitespace) that a Slurm list never holds.
NOT_HOSTLIST = re.compile(r"[!&^\s]")


def split_indices(expr: str) -> list[int]:
    """Expand a Slurm index list (GPU ``IDX:0-1,3``, ``SLURM_JOB_GPUS=0,2-3``) with ClusterShell's
    ``RangeSet``: ``"0-1,3"`` -> ``[0, 1, 3]``; ``""`` -> ``[]``. Raises :class:`HostlistError` on
    anything else (``"0;rm"``, ``"3-1"``, ``"-1"``)."""
    if not expr:
        return []
    try:
        out = [] if NOT_HOSTLIST.search(expr) else list(RangeSet(expr).intiter())
    except RangeSetException as exc:
        raise HostlistError(f"not an index list: {expr!r} ({exc})") from None
    if not out or min(out) < 0:
        raise HostlistError(f"not an index list: {expr!r}")
    return out
