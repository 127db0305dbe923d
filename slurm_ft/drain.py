"""Draining nodes with a slurm-ft reason, never overwriting a reason an admin set."""

from __future__ import annotations

from .errors import SlurmFTError

LEADER = "slurm-ft:"
#: What :func:`drain_node` returns in observe mode (the drain held back by the client's gate).
OBSERVED = "observed"
#: Rule prefix of a hardware verdict the trusted GPU checks confirmed (slurm_ft/epilog.py).
VERIFIED = "verified:"
#: Reasons slurmctld/slurmd set by themselves (not an admin's words): slurm-ft may replace them
#: with its own, more precise reason. From Slurm's source (node_mgr.c, job_mgr.c, req.c).
SLURM_REASONS = ("Not responding", "Prolog error", "Epilog error", "Kill task failed", "Node unexpectedly rebooted",
                 "batch job complete failure", "Prolog failed", "Epilog failed", "Job credential expired")


#: ``sinfo -R`` shows the first 20 characters of a reason: :func:`drain_reason` puts who and what
#: first (``slurm-ft: Xid 79 GPU``), where and which job after.
SINFO_REASON_WIDTH = 20


def drain_reason(job_id: int, verdict: dict) -> str:
    """The drain reason for a verdict (a dict with ``xids`` and ``rule``, as ``Verdict.to_dict()``
    or the journal gives it): ``slurm-ft: Xid 79 GPU 0000:10:00 (job 12)`` (every distinct Xid
    code, up to three: ``Xid 79,48 GPU ...``; the first one's bus id), else
    ``slurm-ft: <rule> (job 12)`` with a ``verified:`` prefix moved behind the rule
    (``slurm-ft: cuda-ecc-uncorrectable, verified (job 12)``). The rule is the fault's: a verdict
    whose rule does not name it (a job that exited 0 on a node with a trusted fault: rule
    ``clean-exit``) carries the winning hardware rule as ``cause``, and that is named
    (``slurm-ft: gpu-fallen-off-bus (job 12)``). The first 20 characters (what ``sinfo -R``
    shows) name slurm-ft and the fault; ``(job N)`` always ends it (the drain report reads it)."""
    xids = [x for x in verdict.get("xids") or [] if isinstance(x, dict) and "xid" in x]
    if xids:
        codes: list[str] = []
        for x in xids:
            if str(x["xid"]) not in codes:
                codes.append(str(x["xid"]))
        bus = next((x["bus_id"] for x in xids if x.get("bus_id")), None)
        where = f" GPU {bus}" if bus else ""
        return f"{LEADER} Xid {','.join(codes[:3])}{where} (job {job_id})"
    rule = str(verdict.get("cause") or verdict.get("rule") or "fault")
    if rule.startswith(VERIFIED):
        rule = f"{rule[len(VERIFIED):]}, verified"
    return f"{LEADER} {rule} (job {job_id})"


def drain_node(slurm, node: str, reason: str, *, breaker=None, nodes: list | None = None) -> str:
    """Drain ``node`` with ``reason`` (must start with ``slurm-ft:``).

    Returns ``"drained"``; ``"kept-admin-reason"`` when the node is already drained (or down)
    with a reason not set by slurm-ft, which is left untouched (as NHC's node-mark-offline does);
    ``"observed"`` when the client is in observe mode (``[failover] mode = "observe"``: the drain
    was journaled/logged as what slurm-ft would do, Slurm was not asked);
    ``"already-drained"`` when slurm-ft drained it before (its first reason is kept: Slurm holds
    one reason, the journal holds every verdict); ``"breaker-open: <why>"`` when ``breaker`` (the
    ``[breaker]`` config; None = no limit, for an admin's own command) says slurm-ft has taken
    too many nodes out of service already (:mod:`slurm_ft.breaker`; ``nodes``: the cluster's
    nodes if the caller has them, else one ``sinfo --json``).
    Raises :class:`SlurmCommandError` if Slurm refuses.
    """
    if not reason.startswith(LEADER):
        raise ValueError(f"drain reason must start with {LEADER!r}: {reason!r}")
    if breaker is not None:
        from . import breaker as breaker_mod  # local: breaker imports this module

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
    # [failover] mode = "observe": the client's gate held the drain back (slurm_ft/slurm.py)
    return OBSERVED if getattr(slurm, "observe", False) else "drained"
