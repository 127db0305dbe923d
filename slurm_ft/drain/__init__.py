"""Draining nodes with a slurm-ft reason, never overwriting a reason an admin set.

The room of node drains: the reasons slurm-ft writes and reads (:mod:`.reason`), the circuit
breaker that bounds them (:mod:`.breaker`) and the drain itself (:func:`drain_node`). Imports run
one way: ``drain`` -> ``breaker`` -> ``reason``."""

from __future__ import annotations

from slurm_ft.errors import SlurmFTError
from slurm_ft.drain import breaker as breaker_mod
from slurm_ft.drain.reason import (
    LEADER, OBSERVED, SLURM_REASONS, SINFO_REASON_WIDTH, VERIFIED, drain_reason)

__all__ = ["LEADER", "OBSERVED", "SLURM_REASONS", "SINFO_REASON_WIDTH", "VERIFIED", "drain_node", "drain_reason"]


def drain_node(slurm, node: str, reason: str, *, breaker=None, nodes: list | None = None) -> str:
    """Drain ``node`` with ``reason`` (must start with ``slurm-ft:``).

    Returns ``"drained"``; ``"kept-admin-reason"`` when the node is already drained (or down)
    with a reason not set by slurm-ft, which is left untouched (as NHC's node-mark-offline does);
    ``"observed"`` when the client is in observe mode (``[failover] mode = "observe"``: the drain
    was journaled/logged as what slurm-ft would do, Slurm was not asked);
    ``"already-drained"`` when slurm-ft drained it before (its first reason is kept: Slurm holds
    one reason, the journal holds every verdict); ``"breaker-open: <why>"`` when ``breaker`` (the
    ``[breaker]`` config; None = no limit, for an admin's own command) says slurm-ft has taken
    too many nodes out of service already (:mod:`slurm_ft.drain.breaker`; ``nodes``: the cluster's
    nodes if the caller has them, else one ``sinfo --json``).
    Raises :class:`SlurmCommandError` if Slurm refuses.
    """
    if not reason.startswith(LEADER):
        raise ValueError(f"drain reason must start with {LEADER!r}: {reason!r}")
    if breaker is not None:
        try:
            st = breaker_mod.state(breaker, slurm.nodes() if nodes is None else nodes, node)
        except SlurmFTError:
            st = None  # node list unreadable: the drain below asks Slurm anyway and fails loudly if it is down
        if st is not None and st.open:
            return f"breaker-open: {st.why}"
    current = slurm.show_node(node)
    cur_reason = current.get("Reason", "")
    state = current.get("State", "")
    ours = cur_reason.startswith(LEADER) or cur_reason.startswith(SLURM_REASONS)
    if cur_reason and not ours and any(s in state for s in ("DRAIN", "DOWN", "FAIL")):
        return "kept-admin-reason"
    if cur_reason.startswith(LEADER) and "DRAIN" in state:
        return "already-drained"
    slurm.drain(node, reason)
    # [failover] mode = "observe": the client's gate held the drain back (slurm_ft/slurm/__init__.py)
    return OBSERVED if getattr(slurm, "observe", False) else "drained"
