"""What a node does with its health results: journal them, drain on a fail (never over an admin's
reason), and — only if the admin enabled ``[failover] auto_resume`` — put a node slurm-ft drained
back into service once every check passes. Used by the prolog and by ``slurm-ft health --act``
(Slurm's ``HealthCheckProgram`` for idle nodes)."""

from __future__ import annotations

from ..drain import LEADER, drain_node
from ..errors import SlurmFTError


def drain_reason(results) -> str | None:
    """``slurm-ft: <check>: <measurement>`` for the first failing result, or None if none fails."""
    failing = [r for r in results if r.status == "fail"]
    if not failing:
        return None
    first = failing[0]
    where = f"GPU{first.gpu} " if first.gpu is not None and f"GPU{first.gpu}" not in first.measurement else ""
    return f"{LEADER} {first.check}: {where}{first.measurement}"[:200]


def journal_results(cfg, node: str, results, job_id: int | None, log) -> None:
    """Every result, pass or not, goes to the node's journal (trends for the drain report)."""
    from ..journal import open_node_journal
    try:
        with open_node_journal(cfg, node) as journal:
            journal.add_health(node, [r.to_dict() for r in results], job_id=job_id)
    except SlurmFTError as exc:
        log(f"health results not journaled: {exc}")


def act_on_node(cfg, node: str, results, slurm, log) -> str:
    """Drain on a fail; resume a slurm-ft-drained node on a full pass if auto_resume is on.
    Returns what was done: "drained", "kept-admin-reason", "already-drained", "breaker-open: ..."
    (the circuit breaker stopped the drain, see slurm_ft.breaker), "resumed" or "none"."""
    reason = drain_reason(results)
    if reason:
        outcome = drain_node(slurm, node, reason, breaker=cfg.breaker)
        log(f"{node}: {reason}: {outcome}")
        return outcome
    if not cfg.failover.auto_resume:
        return "none"
    info = slurm.show_node(node)
    if "DRAIN" in info.get("State", "") and info.get("Reason", "").startswith(LEADER):
        slurm.resume(node)
        log(f"{node}: all checks pass: resumed (was: {info.get('Reason')})")
        return "resumed"
    return "none"
