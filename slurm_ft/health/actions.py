"""What a node does with its health results: journal them, drain on a fail (never over an admin's
reason), and — only if the admin enabled ``[failover] auto_resume`` — put a node slurm-ft drained
back into service once every check passes. Used by the prolog and by ``slurm-ft health --act``
(Slurm's ``HealthCheckProgram`` for idle nodes)."""

from __future__ import annotations

import re

from slurm_ft.drain import LEADER, drain_node
from slurm_ft.drain.reason import health_reason
from slurm_ft.errors import SlurmFTError


def journal_results(cfg, node: str, results, job_id: int | None, log) -> None:
    """Every result, pass or not, goes to the node's journal (trends for the drain report)."""
    from slurm_ft.journal import open_node_journal
    try:
        # spooled, never waited for, when another process holds the journal (issue 14)
        with open_node_journal(cfg, node, spool=True, busy_timeout_s=1.0) as journal:
            journal.add_health(node, [r.to_dict() for r in results], job_id=job_id)
    except SlurmFTError as exc:
        log(f"health results not journaled: {exc}")


def act_on_node(cfg, node: str, results, slurm, log) -> str:
    """Drain on a fail; resume a slurm-ft-drained node on a full pass if auto_resume is on.
    Returns what was done: "drained", "observed" (``[failover] mode = "observe"``: the drain or
    resume was only logged), "kept-admin-reason", "already-drained", "breaker-open: ..."
    (the circuit breaker stopped the drain, see slurm_ft.drain.breaker), "resumed", "still-drained"
    (every check passes, the node stays drained: slurm-ft's drain without auto_resume, or an
    admin's; ``log`` says which and how to resume it) or "none"; with ``[remediate] enabled``, on a
    node under repair: "resumed" or "remediate-failed" (slurm_ft.remediate.actions.after_checks)."""
    # a node under repair ([remediate]): the checks decide (slurm_ft.remediate.actions)
    if getattr(getattr(cfg, "remediate", None), "enabled", False):
        from slurm_ft.remediate.actions import after_checks

        def rerun():
            from slurm_ft.health import run_checks
            return run_checks(cfg, node)

        done = after_checks(cfg, node, results, slurm, log, rerun=rerun)
        if done is not None:
            return done
    reason = health_reason(results)
    if reason:
        outcome = drain_node(slurm, node, reason, breaker=cfg.breaker)
        log(f"{node}: {reason}: {outcome}")
        return outcome
    try:
        info = slurm.show_node(node)
    except SlurmFTError as exc:
        log(f"{node}: all checks pass; node state unknown ({exc})")
        return "none"
    state = info.get("State", "")
    why = re.sub(r"\s*\[[^\]@]*@[^\]]*\]$", "", info.get("Reason", ""))   # scontrol's " [root@2026-...]"
    if "DRAIN" not in state:
        return "none"
    if why.startswith(LEADER) and cfg.failover.auto_resume:
        slurm.resume(node)
        if getattr(slurm, "observe", False):   # [failover] mode = "observe": the client's gate held it back
            log(f"{node}: all checks pass: observed (mode = observe), would resume (was: {why})")
            return "observed"
        log(f"{node}: all checks pass: resumed (was: {why})")
        return "resumed"
    resume = f"scontrol update NodeName={node} State=RESUME"
    if why.startswith(LEADER):
        log(f"{node}: all checks pass, but the node is still drained ({why}); slurm-ft does not resume it "
            f"([failover] auto_resume = false): an admin decides: {resume}")
    else:
        log(f"{node}: all checks pass; the node is drained by someone else ({why or 'no reason'}): left drained "
            f"({resume} when done)")
    return "still-drained"
