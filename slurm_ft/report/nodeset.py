"""Node names folded into Slurm hostlists for the report (``n[1-3,7],gpu[01-02]``).

ClusterShell's ``NodeSet`` does the folding when it is installed; without it the names are
listed in natural order, comma-separated. Names come from Slurm and from the journals, so a
name that is not a plain host name (``[``, ``,``, spaces, control characters: NodeSet would
read them as its own syntax) is never handed to NodeSet; it is listed as it is (the templates
escape it like every other field).
"""

from __future__ import annotations

import re

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def natural_key(name: str) -> tuple:
    """Sort key that puts ``n2`` before ``n10``."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p)


def fold(names) -> str:
    """One hostlist for ``names`` (duplicates fold away); "" for none."""
    names = sorted({n for n in names if n}, key=natural_key)
    plain = [n for n in names if _PLAIN.fullmatch(n)]
    other = [n for n in names if not _PLAIN.fullmatch(n)]
    try:
        from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet
    except ImportError:       # not installed yet: plain list
        return ",".join(names)
    try:
        folded = [str(NodeSet.fromlist(plain, resolver=RESOLVER_NOGROUP))] if plain else []
    except Exception:         # noqa: BLE001 - any NodeSet parse problem: keep the names as they are
        folded = plain
    return ",".join(folded + other)
