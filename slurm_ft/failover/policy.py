"""Failover policy: from an ended attempt and its verdicts to a decision. Pure: no I/O.

Follows the Job Failover product we model (shared/seeds/003_*): hardware faults fail over to other
nodes within a retry budget (3 by default); anything else that ends a job is not retried
(``internal-error``); an exhausted budget ends as ``max-retries-exceeded``. ``infra`` and ``hang``
verdicts (transient, see docs/classifier.md) are retried without blaming a node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ft states users see (ft-history, squeue's AdminComment)
RUNNING = "running"
FAILOVER = "failover-in-progress"
REQUEUED = "requeued"
INTERNAL_ERROR = "internal-error"
MAX_RETRIES = "max-retries-exceeded"
COMPLETED = "completed"
CANCELLED = "cancelled"
NOT_CONFIGURED = "not-configured"
#: Failover stopped because excluding the blamed nodes leaves too few for the job (admin decides).
HELD = "held"
FINAL_STATES = {INTERNAL_ERROR, MAX_RETRIES, COMPLETED, CANCELLED, NOT_CONFIGURED, HELD}

#: Rule-id prefix of verdicts from a prolog health check that refused the node (``health:<check>``).
HEALTH_RULE = "health:"
#: Slurm job states after which a job is looked at for failover.
FAILED_STATES = {"FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
#: Verdict classes that fail a job over, and whether the node is blamed (drained, excluded).
RETRY_CLASSES = {"hardware": True, "infra": False, "hang": False}


@dataclass(frozen=True)
class Decision:
    kind: str                      # "failover" | one of the final states | "wait"
    reason: str
    blamed_nodes: tuple[str, ...] = ()
    verdicts: tuple[dict, ...] = field(default=())


def decide(*, slurm_state: str, failovers_done: int, retries: int, verdicts: list[dict], job_nodes: list[str],
           seconds_since_end: float, grace_s: float = 3.0) -> Decision:
    """Decide what to do with an ended attempt.

    ``slurm_state``: the job's Slurm state (e.g. FAILED, NODE_FAIL, COMPLETED); ``failovers_done``:
    failovers slurm-ft already did for this job (prolog-failure releases and in-place restarts do not
    count); ``retries``: the job's budget (0 = never requeue);
    ``verdicts``: the node verdicts of this attempt (dicts with ``node``, ``verdict``, ``rule``);
    ``seconds_since_end``: time since the attempt ended, used to wait ``grace_s`` for late verdicts.
    """
    if slurm_state == "COMPLETED":
        return Decision(COMPLETED, "job completed")
    if slurm_state == "CANCELLED":
        return Decision(CANCELLED, "cancelled by user or admin")
    verdicts = list(verdicts)
    if slurm_state == "NODE_FAIL" and not any(v["verdict"] == "hardware" for v in verdicts):
        verdicts += [{"node": n, "verdict": "hardware", "rule": "slurm-node-fail", "xids": []} for n in job_nodes]
    by_class = {c: [v for v in verdicts if v["verdict"] == c] for c in ("hardware", "infra", "hang", "user")}
    if by_class["hardware"] or by_class["infra"] or by_class["hang"]:
        chosen = by_class["hardware"] or by_class["hang"] or by_class["infra"]
        kind = chosen[0]["verdict"]
        blamed = tuple(sorted({v["node"] for v in chosen})) if RETRY_CLASSES[kind] else ()
        if failovers_done >= retries:
            return Decision(MAX_RETRIES, f"{kind} fault but retry budget {retries} is used up", blamed, tuple(chosen))
        return Decision("failover", f"{kind} fault ({chosen[0]['rule']})", blamed, tuple(chosen))
    if by_class["user"]:
        v = by_class["user"][0]
        return Decision(INTERNAL_ERROR, f"not a hardware fault: {v['rule']} on {v['node']}", (), tuple(by_class["user"]))
    if seconds_since_end < grace_s:
        return Decision("wait", "waiting for node verdicts")
    return Decision(INTERNAL_ERROR, "no hardware fault found", (), tuple(verdicts))
