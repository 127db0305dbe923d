"""Circuit breaker on node actions: slurm-ft never takes more than a site-set number, or fraction
of a partition, of nodes out of service by itself within a sliding window (``[breaker]``).

Why: a misbehaving rule, a driver update that breaks NVML everywhere, or a forged line must not
empty a cluster (NVSentinel has the same guard).  Past the limit slurm-ft stops draining, keeps
failing jobs over without a drain, says so loudly (log, daemon journal, ``slurm-ft report``,
``slurm-ft breaker status``) and, in the daemon, stays open until an admin runs
``slurm-ft breaker reset``.

The count is read from Slurm itself, so every node's prolog/epilog and the daemon see the same
state without a shared file: the nodes currently drained (or down) with a ``slurm-ft:`` reason set
within ``window_s`` (``reason_changed_at`` in ``sinfo --json``), per partition of the node about to
be drained.  Pure functions here; the Slurm call is the caller's (one ``sinfo --json``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from slurm_ft.drain.reason import LEADER


@dataclass(frozen=True)
class BreakerState:
    """``open``: no more drains now.  ``count``/``limit``: slurm-ft drains in the window and the
    allowance of the tightest partition of the node.  ``why``: one line for logs and reports."""

    open: bool
    count: int
    limit: int
    partition: str
    why: str


def drained_by_us_since(node, since: float) -> bool:
    """Whether slurm-ft took ``node`` out of service (a ``slurm-ft:`` reason on a drained or down
    node) at or after ``since`` (epoch seconds; a reason without a time counts)."""
    if not node.reason.startswith(LEADER):
        return False
    states = {node.state.upper(), *(f.upper() for f in node.flags)}
    if not states & {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL"}:
        return False
    changed = node.reason_time
    return changed is None or changed >= since


def limit_for(cfg, partition_size: int) -> int:
    """Nodes slurm-ft may drain by itself in one window in a partition of ``partition_size``
    nodes: ``min(max_nodes, max(1, floor(max_fraction * size)))``; 0 when ``max_nodes`` is 0."""
    if cfg.max_nodes == 0:
        return 0
    return min(cfg.max_nodes, max(1, math.floor(cfg.max_fraction * max(partition_size, 1))))


def state(cfg, nodes: list, target: str, now: float | None = None) -> BreakerState:
    """The breaker for draining ``target`` given every node of the cluster (``Slurm.nodes()``).
    ``cfg``: the ``[breaker]`` config.  Open when, in any partition of ``target``, the nodes
    slurm-ft drained within ``cfg.window_s`` already reach the limit (``target`` itself, if
    already drained by us, does not count: re-draining it takes nothing more out of service)."""
    now = time.time() if now is None else now
    since = now - cfg.window_s
    me = next((n for n in nodes if n.name == target), None)
    parts = me.partitions if me is not None else []
    groups = {p: [n for n in nodes if p in n.partitions] for p in parts} or {"(all)": list(nodes)}
    worst = BreakerState(False, 0, 0, "", "closed")
    for part, members in groups.items():
        count = sum(1 for n in members if n.name != target and drained_by_us_since(n, since))
        lim = limit_for(cfg, len(members))
        if count >= lim:
            return BreakerState(True, count, lim, part,
                                f"circuit breaker open: slurm-ft drained {count} node(s) of partition {part} "
                                f"in the last {cfg.window_s:g} s (limit {lim}); not draining {target}")
        if not worst.limit or count / max(lim, 1) > worst.count / max(worst.limit, 1):
            worst = BreakerState(False, count, lim, part, f"closed: {count}/{lim} in partition {part}")
    return worst
