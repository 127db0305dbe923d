"""Failover policy: from an ended attempt and its verdicts to a decision. Pure: no I/O.

Follows the Job Failover product we model (shared/seeds/003_*): hardware faults fail over to other
nodes within a retry budget (3 by default); a user's own error is not retried (``user-error``),
nor is a failure with no fault found (``failed``); an exhausted budget ends as
``max-retries-exceeded``. ``infra`` and ``hang`` verdicts (transient, see docs/classifier.md) are
retried without blaming a node. ``internal-error`` is kept for "slurm-ft itself failed" (e.g.
Slurm refused the requeue).

Not faults, each with its own site bound, never taken from the retry budget:
**evacuations** (an admin's requeue, ``slurm-ft drain --checkpoint``, a health-check
evacuation: the job is requeued elsewhere, with or without an exit checkpoint) and
**continuations** (the time limit is near: exit checkpoint, then requeue; ``timeout`` without
a save).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ft states users see (ft-history, squeue's AdminComment)
RUNNING = "running"
FAILOVER = "failover-in-progress"
REQUEUED = "requeued"
INTERNAL_ERROR = "internal-error"
#: The job's own error (a ``user`` verdict): not retried.
USER_ERROR = "user-error"
#: The job failed and no fault was found (or the same failure repeated: fast-fail): not retried.
FAILED = "failed"
#: The time limit ended the job without an exit checkpoint (or past the continuation bound).
TIMEOUT = "timeout"
#: Requeued at its time limit after an exit checkpoint; pending until it runs again.
CONTINUED = "continued"
#: Requeued by an evacuation (admin, drain --checkpoint, health check); pending until it runs.
EVACUATED = "evacuated"
MAX_RETRIES = "max-retries-exceeded"
COMPLETED = "completed"
CANCELLED = "cancelled"
NOT_CONFIGURED = "not-configured"
#: Failover stopped because excluding the blamed nodes leaves too few for the job (admin decides).
HELD = "held"
#: The job's container image could not be imported (pyxis/enroot: a rejected reference, or a
#: transient cause that outlasted the unblamed retries): the seed's ``imagepullbackoff`` on Slurm
#: (issue 22). Its own final state, whatever ended the retries (:func:`visible_final`).
IMAGE_PULL_FAILED = "image-pull-failed"
#: Rule-id prefix of the image-import rules (slurm_ft/data/signatures.toml: image-pull-rejected,
#: image-pull-transient, image-pull-failed).
IMAGE_PULL_RULE = "image-pull"
#: Slurm no longer knows an open ft job (purged after a slurmctld state loss:
#: slurm_ft.failover.reconcile); nothing more can be done for it.
LOST = "lost"
FINAL_STATES = {INTERNAL_ERROR, USER_ERROR, FAILED, TIMEOUT, MAX_RETRIES, COMPLETED, CANCELLED, NOT_CONFIGURED, HELD,
                LOST, IMAGE_PULL_FAILED}
#: States of a job slurm-ft requeued that waits to run again (the daemon clears the requeue delay).
PENDING_STATES = {FAILOVER, REQUEUED, CONTINUED, EVACUATED}
#: Decision kinds that requeue the job (besides finals and "wait").
EVACUATE, CONTINUE = "evacuate", "continue"
#: What a slurm-ft checkpoint notification of an attempt was for (journal ``ckpt-notify`` detail).
#: Prefix of an in-place restart record in the job's comment (``slurm-ft run``: slurm_ft.job.inplace
#: writes and parses it; the daemon journals what it says).
INPLACE_PREFIX = "slurm-ft-run:"
NOTIFY_EVACUATION, NOTIFY_TIME_LIMIT = "evacuation", "time-limit"

#: Rule-id prefix of verdicts from a prolog health check that refused the node (``health:<check>``).
HEALTH_RULE = "health:"
#: Rule-id prefix of a verdict whose only hardware evidence was the job's own output and which the
#: trusted GPU checks did not confirm (slurm_ft/node/epilog.py): retried elsewhere, nobody blamed.
UNVERIFIED_RULE = "unverified:"
#: Slurm job states after which a job is looked at for failover.
FAILED_STATES = {"FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
#: Verdict classes that fail a job over, and whether the node is blamed (drained, excluded).
RETRY_CLASSES = {"hardware": True, "infra": False, "hang": False, "unknown": False}
#: Rule of the hardware verdict slurm-ft makes for a node Slurm itself reports failed (a lost
#: node runs no epilog): the only verdict that blames a node without that node's own evidence.
NODE_FAIL_RULE = "slurm-node-fail"
#: ``source`` of the verdicts :func:`node_fail_verdicts` makes from Slurm's own word (no node
#: wrote them: a rule name alone never makes one).
SLURM_SOURCE = "slurm"
#: Rule of the verdict for a multi-node NODE_FAIL in which Slurm names no failed node: retried
#: once without blame (class ``infra``), never a drain.
NODE_FAIL_UNNAMED_RULE = "slurm-node-fail-unnamed"
#: Rules that say Slurm itself ended the job (preemption, requeue, suspend): no fault, nothing
#: blamed, not retried by slurm-ft (Slurm's own requeue, if any, brings the job back).
NOT_A_FAULT_RULES = frozenset({"preempted", "slurm-preempted"})


@dataclass(frozen=True)
class SitePolicy:
    """What the site allows, whatever a job asks (``[failover]``, docs/security.md).

    ``unblamed_retries``: failovers a job may get for verdicts that blame no node (infra, hang,
    unverified output), within its own budget too; ``unblamed_max_runtime_s``: no such retry once
    the job has run this long in all (seconds; 0 = no bound)."""

    unblamed_retries: int = 1
    unblamed_max_runtime_s: float = 86400.0
    max_evacuations: int = 10
    max_continuations: int = 2
    #: An attempt whose only verdicts are ``unknown`` (no root cause on any node: e.g. every rank
    #: only saw a peer vanish) gets one unblamed retry elsewhere (True) or none (False).
    retry_unknown: bool = False

    @classmethod
    def from_config(cls, failover) -> "SitePolicy":
        return cls(failover.unblamed_retries, float(failover.unblamed_max_runtime_s), failover.max_evacuations,
                   failover.max_continuations, bool(getattr(failover, "retry_unknown", False)))


@dataclass(frozen=True)
class Decision:
    kind: str                      # "failover" | "evacuate" | "continue" | one of the final states | "wait"
    reason: str
    blamed_nodes: tuple[str, ...] = ()
    verdicts: tuple[dict, ...] = field(default=())

    @property
    def unblamed(self) -> bool:
        """A failover that blames no node (counted against the site's unblamed retries)."""
        return self.kind == "failover" and not self.blamed_nodes


def retry_class(v: dict, site: "SitePolicy | None" = None) -> str | None:
    """The failover class of one node verdict: ``hardware`` (blame the node), ``infra``/``hang``/
    ``unknown`` (retry without blame; ``unknown`` only for unverified output, or any unknown when
    the site sets ``retry_unknown``), or None (not a fault slurm-ft retries: a user error, or
    Slurm's own preemption/requeue, :data:`NOT_A_FAULT_RULES`)."""
    cls = v["verdict"]
    rule = str(v.get("rule", ""))
    if rule in NOT_A_FAULT_RULES:
        return None
    if cls == "unknown":
        return "unknown" if rule.startswith(UNVERIFIED_RULE) or (site is not None and site.retry_unknown) else None
    return cls if cls in RETRY_CLASSES else None


def decide(*, slurm_state: str, failovers_done: int, retries: int, verdicts: list[dict], job_nodes: list[str],
           seconds_since_end: float, grace_s: float = 3.0, unblamed_done: int = 0, runtime_s: float = 0.0,
           site: SitePolicy | None = None, notified: str | None = None, saved: bool = False,
           evacuations_done: int = 0, continuations_done: int = 0,
           failed_nodes: list[str] | tuple[str, ...] = ()) -> Decision:
    """Decide what to do with an ended attempt.

    ``slurm_state``: the job's Slurm state (e.g. FAILED, NODE_FAIL, COMPLETED); ``failovers_done``:
    failovers slurm-ft already did for this job (prolog-failure releases, evacuations and
    continuations do not count); ``retries``: the job's budget as fixed at submit (0 = never requeue);
    ``verdicts``: the node verdicts of this attempt (dicts with ``node``, ``verdict``, ``rule``);
    ``seconds_since_end``: time since the attempt ended, used to wait ``grace_s`` for late verdicts;
    ``unblamed_done``: failovers so far that blamed no node; ``runtime_s``: seconds the job has
    run over all attempts; ``site``: the site's limits (:class:`SitePolicy`; default limits if None);
    ``notified``: slurm-ft sent this attempt its checkpoint signal (:data:`NOTIFY_EVACUATION` or
    :data:`NOTIFY_TIME_LIMIT`), None if not; ``saved``: the attempt acked a saved exit checkpoint
    after that; ``evacuations_done`` / ``continuations_done``: requeues of those kinds so far;
    ``failed_nodes``: the job's nodes Slurm itself reports failed (down, not responding, or the
    job's ``FailedNode``; :func:`slurm_ft.failover.machine.slurm_failed`), read for ``NODE_FAIL``.

    Blame (:func:`blamed_by`): a node is blamed only by its own trusted hardware verdict or by
    Slurm naming it failed (``NODE_FAIL``: ``failed_nodes``; a one-node job's ``NODE_FAIL``
    names its node), never because another node of the job failed. A multi-node ``NODE_FAIL``
    in which Slurm names no node is retried without blame (:data:`NODE_FAIL_UNNAMED_RULE`).
    A hardware verdict on any node decides (that node is blamed). An attempt that ended after
    slurm-ft's own checkpoint signal is requeued as what the signal was for (never blamed on the
    user: slurm-ft ended it), within that kind's bound. Otherwise a retryable verdict that
    blames nobody is retried only within the site's unblamed retries and run-time bound.
    """
    site = site or SitePolicy()
    verdicts = list(verdicts)
    if slurm_state == "CANCELLED":
        return Decision(CANCELLED, "cancelled by user or admin")
    if slurm_state == "NODE_FAIL":
        verdicts += node_fail_verdicts(verdicts, job_nodes, failed_nodes)
    if not any(retry_class(v) == "hardware" for v in verdicts):
        requeue = _after_notify(slurm_state, notified, saved, evacuations_done, continuations_done, site)
        if requeue is not None:
            return requeue
    if slurm_state == "COMPLETED":
        return Decision(COMPLETED, "job completed")
    by_class: dict[str, list[dict]] = {c: [] for c in RETRY_CLASSES}
    for v in verdicts:
        c = retry_class(v, site)
        if c is not None:
            by_class[c].append(v)
    chosen = by_class["hardware"] or by_class["hang"] or by_class["infra"] or by_class["unknown"]
    if chosen:
        kind = retry_class(chosen[0], site)
        blamed = blamed_by(chosen) if RETRY_CLASSES[kind] else ()
        what = f"{kind} fault ({chosen[0]['rule']})"
        if failovers_done >= retries:
            return Decision(MAX_RETRIES, f"{what} but retry budget {retries} is used up", blamed, tuple(chosen))
        if not blamed:
            if unblamed_done >= site.unblamed_retries:
                return Decision(MAX_RETRIES, f"{what} blames no node and the site allows {site.unblamed_retries} "
                                f"such retr{'y' if site.unblamed_retries == 1 else 'ies'}", (), tuple(chosen))
            if site.unblamed_max_runtime_s and runtime_s >= site.unblamed_max_runtime_s:
                return Decision(MAX_RETRIES, f"{what} blames no node and the job has run {runtime_s:.0f} s "
                                f"(site bound {site.unblamed_max_runtime_s:.0f} s)", (), tuple(chosen))
        return Decision("failover", what, blamed, tuple(chosen))
    users = [v for v in verdicts if v["verdict"] == "user"]
    if users:
        v = users[0]
        return Decision(USER_ERROR, f"the job's own error: {v['rule']} on {v['node']}", (), tuple(users))
    if slurm_state == "TIMEOUT":
        return Decision(TIMEOUT, "time limit reached without an exit checkpoint", (), tuple(verdicts))
    slurm_acted = [v for v in verdicts if v.get("rule") in NOT_A_FAULT_RULES]
    if slurm_acted:
        return Decision(FAILED, f"ended by Slurm ({slurm_acted[0]['rule']}), not a fault: not retried by slurm-ft",
                        (), tuple(slurm_acted))
    if seconds_since_end < grace_s:
        return Decision("wait", "waiting for node verdicts")
    return Decision(FAILED, "no hardware fault found", (), tuple(verdicts))


def visible_final(kind: str, verdicts) -> str:
    """The final ft state the owner sees for a give-up decision of ``kind`` made on ``verdicts``
    (dicts with ``verdict`` and ``rule``): :data:`IMAGE_PULL_FAILED` when the job gave up
    (user error, no fault found, fast-fail or retries used up) because its container image could
    not be imported and no hardware verdict is among them; else ``kind`` unchanged. One place for
    every path that ends a job (:func:`decide` and the daemon's fast-fail)."""
    if kind not in (USER_ERROR, FAILED, MAX_RETRIES):
        return kind
    verdicts = list(verdicts)
    if any(v.get("verdict") == "hardware" for v in verdicts):
        return kind
    if any(str(v.get("rule") or "").startswith(IMAGE_PULL_RULE) for v in verdicts):
        return IMAGE_PULL_FAILED
    return kind


def node_fail_verdicts(verdicts: list, job_nodes, failed_nodes) -> list[dict]:
    """The verdicts Slurm's own ``NODE_FAIL`` adds (a lost node runs no epilog): a hardware
    :data:`NODE_FAIL_RULE` verdict for each node Slurm names failed (``failed_nodes``; for a
    one-node job its node) that has no hardware verdict of its own; when Slurm names none of a
    multi-node job's nodes and no node has hardware evidence, one unblamed ``infra`` verdict
    (:data:`NODE_FAIL_UNNAMED_RULE`, node ``""``). A survivor is never given a verdict here."""
    failed = sorted(set(failed_nodes or ()))
    if not failed and len(job_nodes) == 1:
        failed = list(job_nodes)     # the job's state names its only node
    own = {v["node"] for v in verdicts if v["verdict"] == "hardware"}
    out = [{"node": n, "verdict": "hardware", "rule": NODE_FAIL_RULE, "xids": [], "source": SLURM_SOURCE}
           for n in failed if n not in own]
    if not failed and not own:
        out.append({"node": "", "verdict": "infra", "rule": NODE_FAIL_UNNAMED_RULE, "xids": [], "source": SLURM_SOURCE})
    return out


def blamed_by(verdicts) -> tuple[str, ...]:
    """The nodes a set of verdicts blames: each node named by a hardware verdict (its own
    epilog's trusted evidence, a prolog health check, or :data:`NODE_FAIL_RULE` for a node Slurm
    reports failed), sorted; a verdict without a node blames nobody."""
    return tuple(sorted({v["node"] for v in verdicts if v["verdict"] == "hardware" and v.get("node")}))


def avoided_by(verdicts) -> tuple[str, ...]:
    """The nodes a failed-over job's retry keeps off without blaming them: each node of an
    :data:`UNVERIFIED_RULE` verdict of a cross-job rule (``unverified:<recurrence rule id>``,
    slurm_ft.classify.recurrence: jobs of several users crashed there; the trusted checks did
    not confirm it), sorted. Only such evidence counts: it needs jobs of other users (slurmd's
    uids), so no job can name a node to avoid by its own output. Only this job's
    ``ExcNodeList`` is touched: the node is neither drained nor blamed, and a job that cannot run
    without it keeps it (slurm_ft.failover.steps.exclude_and_boost)."""
    from slurm_ft.classify.recurrence import rule_ids   # on a failover only

    wanted = {f"{UNVERIFIED_RULE}{rid}" for rid in rule_ids()}
    return tuple(sorted({v["node"] for v in verdicts if v.get("node") and str(v.get("rule") or "") in wanted}))


def _after_notify(slurm_state: str, notified: str | None, saved: bool, evacuations_done: int,
                  continuations_done: int, site: SitePolicy) -> Decision | None:
    """The requeue owed to an attempt that ended after slurm-ft's checkpoint signal (or that hit
    its time limit after saving), or None when the usual rules apply."""
    how = "after its exit checkpoint" if saved else "without an exit checkpoint"
    if notified == NOTIFY_EVACUATION:
        if evacuations_done >= site.max_evacuations:
            return None
        return Decision(EVACUATE, f"evacuated {how} (ended {slurm_state} after slurm-ft's checkpoint signal)")
    if notified == NOTIFY_TIME_LIMIT and saved:
        if continuations_done >= site.max_continuations:
            return Decision(TIMEOUT, f"time limit: continuation bound {site.max_continuations} used up")
        return Decision(CONTINUE, f"time limit: continued after its exit checkpoint (ended {slurm_state})")
    return None


# -- the checkpoint handshake's facts (slurm_ft.failover.ckpt_signal sends the signal) ----------------
#: An ack may carry a time a little before the notify (clocks of nodes and controller differ).
CLOCK_SKEW_S = 5.0


def notify_purpose(detail: str | None) -> str:
    """What a journaled ``ckpt-notify`` was for (rows before purposes existed: evacuation)."""
    return NOTIFY_TIME_LIMIT if (detail or "").startswith(NOTIFY_TIME_LIMIT + ":") \
        else NOTIFY_EVACUATION


def ack_detail(ack) -> str:
    """Journal text of an ack (a ``slurm_ft_job.Ack``: ``state``, ``step``, ``path``): ``saved step=120 path=/ckpt/120.pt``."""
    parts = [ack.state]
    if ack.step is not None:
        parts.append(f"step={ack.step}")
    if ack.path:
        parts.append(f"path={ack.path}")
    return " ".join(parts)


# -- bisect (slurm_ft.bisect runs it) -------------------------------------------------------------
def bisect_candidate(decision, job_nodes: list[str]) -> bool:
    """An attempt a bisect could explain: it ran on more than one node and its verdicts are
    ``infra`` or ``unknown`` with no node blamed (``decision``:
    :class:`slurm_ft.failover.policy.Decision`; a user fault or a blamed node needs no search)."""
    if len(job_nodes) < 2 or decision.blamed_nodes:
        return False
    classes = {v["verdict"] for v in decision.verdicts}
    return bool(classes) and classes <= {"infra", "unknown"}
