"""The daemon's effects: each action of the state machine (:mod:`slurm_ft.failover.machine`)
carried out against Slurm and journaled.

Every failover is journaled as an *intent* before its first Slurm action and marked done after
its last; each step is idempotent and checked against Slurm's own state (:mod:`.steps`), so a
daemon killed at any point resumes on restart (:meth:`Effects.resume`): drains are repeated
harmlessly, the requeue is done only while Slurm's restart count still equals the attempt (never
twice), exclusions and priority are re-applied, a held job is released. Writes go to the
journal's spool when another process holds it locked (slurm_ft.journal.store), so a locked
journal neither stalls the daemon nor loses a verdict or a decision.
"""

from __future__ import annotations

import json
import logging

from slurm_ft.drain import OBSERVED, drain_node, drain_reason
from slurm_ft.errors import SlurmCommandError
from slurm_ft.slurm import Job, split_nodes
from slurm_ft.failover import machine as m
from slurm_ft.failover import policy, steps
from slurm_ft.failover.options import admin_comment
from slurm_ft.failover.verdict import NodeVerdict

log = logging.getLogger("slurm_ft.daemon")
#: Seconds an admin's evacuation request of a running attempt may stay unanswered (the machine
#: answers it in the first cycle that sees the job running; this only bounds a stuck one).
REQUEST_TTL_S = 600.0
#: Refused ``scontrol requeue`` calls of one attempt before its failover is booked
#: ``internal-error``: the daemon's backoff spreads them over about 15 s (1 + 2 + 4 + 8), longer
#: than a slurmctld restart takes (about 5 s on the lab).
REQUEUE_TRIES = 5
#: Intents :meth:`Effects.resume` carries out again (each changes the job in Slurm); a sub-step
#: (drain, requeue, update, start-now) is re-checked by its parent instead.
RESUMED_ACTS = ("failover", "release", "evacuation", "continue")


#: Modules a failover imports on first use (the classifier's rule table, the constraint check, the
#: owner's notice): imported when the daemon starts (:func:`warm`), so that the first failover
#: after a start does not pay ~70 ms of imports (measured on the lab) between the verdict and the
#: requeue.
FAILOVER_IMPORTS = ("slurm_ft.classify.recurrence", "slurm_ft.failover.constraints", "slurm_ft.failover.owner",
                    "slurm_ft.failover.ckpt_signal")


def warm() -> None:
    """Import :data:`FAILOVER_IMPORTS` now (at daemon start)."""
    import importlib

    for name in FAILOVER_IMPORTS:
        importlib.import_module(name)


class Effects:
    """Carries out actions for the daemon ``d`` (its Slurm, journal, config, node view, clock)."""

    def __init__(self, d):
        self.d = d

    @property
    def slurm(self):
        return self.d.slurm

    @property
    def journal(self):
        return self.d.journal

    @property
    def fcfg(self):
        return self.d.cfg.failover

    # ------------------------------------------------------------------ dispatch
    def apply(self, job: Job, action: m.Action, opts=None) -> None:
        if hasattr(self.journal, "acting"):   # observe mode: whose would-be Slurm commands follow
            self.journal.acting = (job.job_id, getattr(action, "attempt", job.restart_count))
        getattr(self, f"_{type(action).__name__}")(job, action, opts)

    def _Wake(self, job, a: m.Wake, opts) -> None:
        self.d.wake(a.job_id, a.at)

    def _RecordAttempt(self, job, a: m.RecordAttempt, opts) -> None:
        self.journal.upsert_attempt(a.job_id, a.attempt, **dict(a.fields))

    def _CloseAttempts(self, job, a, opts) -> None:
        self.journal.close_attempts_before(a.job_id, a.attempt)

    def _NotConfigured(self, job, a: m.NotConfigured, opts) -> None:
        self.journal.upsert_job(job.job_id, name=job.name, user=job.user, account=job.account, ft_enabled=0,
                                ft_state=policy.NOT_CONFIGURED)
        if not a.plain:
            log.warning("job %s: bad ft options: %s", job.job_id, a.error)
            self.journal.record(job.job_id, a.attempt, "decide", detail=f"not-configured: {a.error}")

    def _MarkRunning(self, job, a: m.MarkRunning, opts) -> None:
        self.journal.set_ft_state(job.job_id, policy.RUNNING)
        # a fact that stays true once the job has ended (Slurm refuses updates to finished jobs:
        # "Job has already finished"), never a state that would go stale
        self.try_update(job.job_id, AdminComment=admin_comment(self.journal, job.job_id, "restarted"))

    def _Eligible(self, job, a, opts) -> None:
        self.journal.set_ft_state(job.job_id, policy.REQUEUED)
        self.try_update(job.job_id, AdminComment=admin_comment(self.journal, job.job_id, policy.REQUEUED))

    def _ClearDelay(self, job, a: m.ClearDelay, opts) -> None:
        step = self.journal.intend(job.job_id, a.attempt, "start-now", str(job.job_id), f"StartTime={a.start}")
        try:
            self.slurm.update_job(job.job_id, StartTime=a.start)
            self.journal.finish(step)
        except SlurmCommandError as exc:
            self.journal.finish(step, "failed", str(exc))

    def _RecordAck(self, job, a: m.RecordAck, opts) -> None:
        self.journal.record(job.job_id, a.attempt, "ckpt-ack", job.nodes, a.detail,
                            status="done" if a.saved else "failed")

    def _Notify(self, job, a: m.Notify, opts) -> None:
        from slurm_ft.failover.ckpt_signal import notify

        delivery = notify(self.slurm, self.journal, job, opts, a.why, purpose=a.purpose)
        log.info("job %s: %s: %s", job.job_id, a.why, delivery.summary())

    def _NotifyRefused(self, job, a: m.NotifyRefused, opts) -> None:
        self.journal.record(job.job_id, a.attempt, "ckpt-notify", job.nodes, a.detail, status="failed")

    def _StartEvacuation(self, job, a: m.StartEvacuation, opts) -> None:
        self.journal.record(job.job_id, a.attempt, "evacuate", a.node, a.reason)
        log.info("job %s: %s degraded (%s): checkpoint-before-exit, then requeue", job.job_id, a.node, a.reason)

    def _AnswerRequest(self, job, a: m.AnswerRequest, opts) -> None:
        for aid in a.ids:
            self.journal.finish(aid, a.status, a.detail)
        if a.status != "done":
            log.info("job %s: drain --checkpoint request not carried out: %s", job.job_id, a.detail)

    def _EvacuationTimeout(self, job, a: m.EvacuationTimeout, opts) -> None:
        self.journal.record(job.job_id, a.attempt, "ckpt-timeout", job.nodes, a.detail, status="failed")

    def _RecordRestarts(self, job, a: m.RecordRestarts, opts) -> None:
        from slurm_ft.job.inplace import record_restarts

        if record_restarts(self.journal, job):
            log.info("job %s: in-place restarts reported by the job journaled", job.job_id)

    def _StartBisect(self, job, a: m.StartBisect, opts) -> None:
        """One bisect at a time (each takes the nodes it tests for minutes); a second candidate
        while one runs is journaled as skipped, not queued."""
        from slurm_ft import bisect

        target = m.hostlist(a.nodes)
        running = self.d.bisect_proc
        if getattr(self.slurm, "observe", False):   # a bisect runs jobs on the nodes it tests: never in observe mode
            self.journal.record(job.job_id, a.attempt, "bisect-start", target, f"would start: {a.reason}")
            return
        if running is not None and running.poll() is None:
            self.journal.record(job.job_id, a.attempt, "bisect-start", target,
                                f"not started: bisect pid {running.pid} still running", status="skipped")
            return
        try:
            self.d.bisect_proc = bisect.spawn(self.d.cfg, job.job_id, a.attempt, list(a.nodes))
        except OSError as exc:
            self.journal.record(job.job_id, a.attempt, "bisect-start", target, f"could not start: {exc}",
                                status="failed")
            return
        self.journal.record(job.job_id, a.attempt, "bisect-start", target,
                            f"pid {self.d.bisect_proc.pid}: {a.reason}")
        log.info("job %s attempt %s: bisect started on %s (pid %s)", job.job_id, a.attempt, target,
                 self.d.bisect_proc.pid)

    def _DrainLate(self, job, a: m.DrainLate, opts) -> None:
        log.info("job %s attempt %s: late hardware verdict from %s", job.job_id, a.attempt, m.hostlist(a.nodes))
        self.drain(job.job_id, a.attempt, a.nodes, a.verdicts)

    # ------------------------------------------------------------------ decisions
    def _Failover(self, job, a: m.Failover, opts) -> None:
        self._node_fail_verdicts(job, a.attempt, a.node_fail, a.slurm_state)
        avoid = tuple(n for n in policy.avoided_by(a.verdicts) if n not in a.blamed)
        detail = json.dumps({"reason": a.reason, "blamed": list(a.blamed), **({"avoid": list(avoid)} if avoid else {})})
        aid = self.journal.intend(job.job_id, a.attempt, "failover", m.hostlist(a.blamed), detail,
                                  kind="blamed" if a.blamed else "unblamed")
        self.journal.set_ft_state(job.job_id, policy.FAILOVER)
        log.info("job %s attempt %s: failover (%s), blaming %s%s", job.job_id, a.attempt, a.reason,
                 m.hostlist(a.blamed) or "no node", f", avoiding {m.hostlist(avoid)}" if avoid else "")
        self.failover(job, a.attempt, a.reason, a.blamed, a.verdicts, aid, avoid)
        from slurm_ft.failover.owner import tell_failover   # [notify]: mail / webhook to the owner

        tell_failover(self, job)

    def _Final(self, job, a: m.Final, opts) -> None:
        self._node_fail_verdicts(job, a.attempt, a.node_fail, a.slurm_state)
        self.journal.record(job.job_id, a.attempt, "decide", detail=f"{a.kind}: {a.reason}")
        self.journal.set_ft_state(job.job_id, a.kind)
        log.info("job %s attempt %s: %s (%s)", job.job_id, a.attempt, a.kind, a.reason)
        if a.kind == policy.MAX_RETRIES and a.blamed:
            self.drain(job.job_id, a.attempt, a.blamed, a.verdicts)
        # only a job Slurm still lets us update (requeued, held) takes the final state in its
        # live record; a finished one takes it in its accounting record (sacct) and its owner
        # reads the give-up line in the job's log (slurm_ft.failover.owner)
        from slurm_ft.failover.owner import tell_final

        tell_final(self, job, a)
        if a.hold:
            # Slurm requeued it by itself (NODE_FAIL), but slurm-ft will not retry it: hold it, visibly.
            self.slurm.run("scontrol", "hold", str(job.job_id), check=False)

    def _node_fail_verdicts(self, job, attempt: int, nodes, slurm_state: str) -> None:
        for node in nodes:   # no epilog ran on a lost node: Slurm's word is the verdict
            self.journal.add_node_verdict(NodeVerdict(
                job.job_id, attempt, "hardware", "slurm-node-fail", (), None, self.d.clock(), node,
                (f"Slurm: node {node} not responding (job state {slurm_state})",), "drain_node", "daemon"))

    def _AdminRequeue(self, job, a, opts) -> None:
        # an admin's requeue (often with the node drained for maintenance): an evacuation, not a
        # fault; nothing blamed, no retry spent, the admin's drain reason kept
        self.journal.record(job.job_id, a.attempt, "decide", detail="evacuate: requeued by an admin or Slurm")
        self.journal.record(job.job_id, a.attempt, "evacuation", "", "requeued by an admin or Slurm")
        self.journal.set_ft_state(job.job_id, policy.EVACUATED)
        self.try_update(job.job_id, AdminComment=admin_comment(self.journal, job.job_id, policy.EVACUATED))
        self.d.wake(job.job_id, self.d.clock())

    def _RequeueNotFault(self, job, a: m.RequeueNotFault, opts) -> None:
        """Requeue after an evacuation (excluding the job's drained nodes, priority boosted as
        for a failover: an admin, not the job, chose to end it) or a time-limit continuation (no
        exclusion, priority kept). Counted apart from the retry budget."""
        action, state = (("evacuation", policy.EVACUATED) if a.kind == policy.EVACUATE
                         else ("continue", policy.CONTINUED))
        nodes = split_nodes(job.nodes) or split_nodes(self._attempt_nodes(job.job_id, a.attempt))
        drained = sorted({n.name for n in self.d.nodes if n.name in nodes and n.drained}
                         # the node it evacuates (an admin's drain may be newer than the node view)
                         | {x["target"] for x in self.journal.actions(job.job_id, a.attempt)
                            if x["action"] == "evacuate" and x["target"] in nodes}) \
            if action == "evacuation" else []
        self.journal.record(job.job_id, a.attempt, "decide", m.hostlist(drained), f"{a.kind}: {a.reason}")
        aid = self.journal.intend(job.job_id, a.attempt, action, m.hostlist(drained), a.reason)
        self.journal.set_ft_state(job.job_id, state)
        log.info("job %s attempt %s: %s", job.job_id, a.attempt, a.reason)
        self.requeue_not_fault(job, a.attempt, action, state, drained, aid)

    def requeue_not_fault(self, job: Job, attempt: int, action: str, state: str, drained: list[str],
                          aid: int) -> None:
        refused = steps.requeue_in_place(self.slurm, self.journal, job.job_id, attempt)
        if refused:
            self.journal.finish(aid, "failed", f"requeue refused: {refused}")
            self.journal.set_ft_state(job.job_id, policy.INTERNAL_ERROR)
            log.error("job %s: requeue refused: %s", job.job_id, refused)
            return
        if action == "evacuation":
            steps.exclude_and_boost(self.slurm, self.journal, job.job_id, attempt, drained, nodes=self.d.nodes,
                                    top=self.d.boost_base(job), priority_boost=self.fcfg.priority_boost,
                                    ceiling=self.fcfg.priority_ceiling, unsatisfiable=self.fcfg.unsatisfiable)
            self.d.boosted.add(job.job_id)
        self.try_update(job.job_id, AdminComment=admin_comment(self.journal, job.job_id, state))
        self.journal.finish(aid)
        self.d.wake(job.job_id, self.d.clock())

    # ------------------------------------------------------------------ failover steps
    def failover(self, job: Job, attempt: int, reason: str, blamed, verdicts, aid: int, avoid=()) -> None:
        """Drain, requeue in place, exclude, boost, clear the requeue delay (``steps``).
        ``avoid``: nodes excluded for this retry only, neither drained nor blamed
        (:func:`policy.avoided_by`). Idempotent: safe to run again for the same attempt after a
        crash at any point."""
        j = self.journal
        self.drain(job.job_id, attempt, blamed, verdicts, retry=True)
        refused = steps.requeue_in_place(self.slurm, j, job.job_id, attempt)
        if refused:
            tries = self._refusals(job.job_id, attempt, "requeue")
            if tries < REQUEUE_TRIES:
                # a refusal may be slurmctld restarting or an RPC lost ("Unexpected message
                # received", measured on 22.05 in the restart's first second): the failover's
                # intent stays open and the daemon resumes it after its backoff (1, 2, 4, 8 s);
                # only the last refusal is final
                raise SlurmCommandError(f"requeue refused ({tries} of {REQUEUE_TRIES} tries; retried): {refused}")
            j.finish(aid, "failed", f"requeue refused: {refused}")
            j.set_ft_state(job.job_id, policy.INTERNAL_ERROR)
            log.error("job %s: requeue refused: %s", job.job_id, refused)
            return
        # above the jobs waiting *now* (one light read of the queue, a fault's cost): the last full
        # scan may be a minute old, from before those jobs came or had their priority raised
        top = self.d.boost_base(job) if blamed else 0
        outcome = steps.exclude_and_boost(self.slurm, j, job.job_id, attempt, list(blamed), nodes=self.d.nodes,
                                          top=top, avoid=list(avoid),
                                          # a retry that blames no node (the job's own output may
                                          # have chosen it) keeps the job's priority
                                          priority_boost=self.fcfg.priority_boost if blamed else 0,
                                          ceiling=self.fcfg.priority_ceiling, unsatisfiable=self.fcfg.unsatisfiable)
        if blamed:
            self.d.boosted.add(job.job_id)
        j.finish(aid)
        if outcome == "held":
            return
        self.d.wake(job.job_id, self.d.clock())   # StartTime=now once out of COMPLETING (machine._restart)

    def drain(self, job_id: int, attempt: int, nodes, verdicts, retry: bool = False) -> None:
        """Drain ``nodes`` within the circuit breaker (slurm_ft.drain.breaker): once it opens, it stays
        open (journaled) until ``slurm-ft breaker reset``; the job still fails over.

        ``retry`` (a failover): a drain Slurm refused (slurmctld restarting, unreachable) raises
        :class:`SlurmCommandError` after the other nodes were tried, so the failover's intent stays
        open and the daemon resumes it (drain first, then the requeue) after its backoff, as for a
        refused requeue; after :data:`REQUEUE_TRIES` refusals of a node the failover goes on
        without it. (Found by test_lab_ctld: the drain met slurmctld's kill, the requeue went to
        the restarted one, and the rollback had also lost the epilog's drain: the faulty node
        stayed in service.)"""
        if not self.fcfg.drain:
            return
        refused = []
        for node in nodes:
            verdict = next((x for x in verdicts if x["node"] == node), {})
            reason = drain_reason(job_id, verdict)
            step = self.journal.intend(job_id, attempt, "drain", node, reason)
            latched = self.d.breaker_latched
            if latched:
                self.journal.finish(step, "skipped", f"circuit breaker open since {latched}: {reason}")
                log.warning("job %s: not draining %s: circuit breaker open (slurm-ft breaker reset)", job_id, node)
                continue
            try:
                outcome = drain_node(self.slurm, node, reason, breaker=self.d.cfg.breaker, nodes=self.d.nodes)
                done = outcome in ("drained", OBSERVED)   # observed: journaled as such (.observe)
                self.journal.finish(step, "done" if done else "skipped", None if done else f"{outcome}: {reason}")
                if outcome.startswith("breaker-open"):
                    self.journal.record(job_id, attempt, "breaker-open", node, outcome)
                    self.d.breaker_latched = self.journal.breaker_latched()
                    log.error("ALERT %s (job %s); slurm-ft stops draining until `slurm-ft breaker reset`",
                              outcome, job_id)
                elif outcome == "drained":
                    self.d.refresh_nodes()   # the next drain this cycle counts this one
            except SlurmCommandError as exc:
                self.journal.finish(step, "failed", str(exc))
                refused.append((node, exc))
        if retry and refused:
            tries = {node: self._refusals(job_id, attempt, "drain", node) for node, _ in refused}
            again = [(node, exc) for node, exc in refused if tries[node] < REQUEUE_TRIES]
            if again:
                node, exc = again[0]
                raise SlurmCommandError(f"drain of {node} refused ({tries[node]} of {REQUEUE_TRIES} tries; the "
                                        f"failover is resumed): {exc}")

    # ------------------------------------------------------------------ prolog refusals
    def _Release(self, job, a: m.Release, opts) -> None:
        aid = self.journal.intend(job.job_id, a.attempt, "release", m.hostlist(a.blamed),
                                  f"prolog health check failed ({a.rule})")
        log.info("job %s: prolog health check failed on %s: releasing elsewhere", job.job_id, m.hostlist(a.blamed))
        self.release(job, a.attempt, list(a.blamed), aid)

    def release(self, job: Job, attempt: int, blamed: list[str], aid: int) -> None:
        """A prolog health check failed the node before the job ran: Slurm requeued the job held
        (``launch_failed_requeued_held`` on 22.05) with the 121 s delay. Send it elsewhere now:
        exclude the node, release, ``StartTime=now``, and a priority that keeps its place: at
        least the one it had (a release alone puts it behind every job submitted since) and above
        every waiting job. Applies to every job (ft-enabled or not), and does not count against
        the retry budget: the job never ran.

        A job that cannot run with the refused node excluded (pinned there with ``-w``, a feature
        or reservation only it has: :func:`.steps.feasibility`) would pend with ``BadConstraints``
        forever: it is held instead, as a failover holds one (``[failover] unsatisfiable``:
        ``hold``, or ``relax`` where dropping the node from ``ReqNodeList`` suffices): ``scontrol
        hold``, ``AdminComment`` ``slurm-ft: held: <reason>``, journal ``hold``, ft state ``held``."""
        excluded = split_nodes([job.excluded_nodes, *blamed])
        fit = steps.feasibility(self.slurm, self.journal, job, attempt, excluded, blamed, nodes=self.d.nodes,
                                unsatisfiable=self.fcfg.unsatisfiable)
        if not fit.runnable:
            self.try_update(job.job_id, **steps.hold(self.slurm, self.journal, job.job_id, attempt, fit.reason))
            self.journal.finish(aid, "skipped", f"not released: held: {fit.reason}")
            return
        self.slurm.update_job(job.job_id, ExcNodeList=m.hostlist(excluded))
        if job.priority == 0:
            self.slurm.release(job.job_id)
        fields = {"StartTime": "now"}
        top = self.d.fresh_top_priority(exclude=job.job_id)
        boosted = steps.boosted_priority(top, self.fcfg.priority_boost, self.fcfg.priority_ceiling)
        target = max(boosted, self.d.priority_seen(job.job_id))
        if target > (job.priority or 0):
            fields["Priority"] = str(min(target, steps.MAX_PRIORITY))
            self.d.boosted.add(job.job_id)
        self.slurm.update_job(job.job_id, **fields)
        self.journal.finish(aid, detail=f"released, ExcNodeList={m.hostlist(excluded)}"
                                        + (f", Priority={fields['Priority']}" if "Priority" in fields else ""))

    # ------------------------------------------------------------------ crash recovery
    def resume(self, intent: dict, job: Job | None) -> None:
        """Finish an action whose intent is journaled but not done (the daemon stopped mid-way)."""
        if intent["action"] == m.EVACUATE_REQUEST:
            # an admin's `drain --checkpoint`: the state machine answers it (machine._evacuation_request)
            # while the attempt runs; one that cannot be carried out any more is answered here
            why = self._stale_request(intent, job)
            if why is not None:
                self.journal.finish(intent["id"], "skipped", why)
            return
        if intent["action"] not in RESUMED_ACTS:
            # a sub-step (drain, requeue, update, start-now) cut short: its parent re-checks it
            self.journal.finish(intent["id"], "abandoned", "daemon restarted mid-step; step re-checked")
            return
        if job is None:
            self.journal.finish(intent["id"], "failed", "job no longer known to Slurm")
            return
        log.info("job %s: resuming unfinished %s of attempt %s", job.job_id, intent["action"], intent["attempt"])
        attempt = intent["attempt"]
        if hasattr(self.journal, "acting"):
            self.journal.acting = (job.job_id, attempt)
        if intent["action"] == "failover":
            detail = json.loads(intent["detail"] or "{}")
            self.failover(job, attempt, detail.get("reason", ""), tuple(detail.get("blamed", [])),
                          tuple(self.journal.node_verdicts(job.job_id, attempt)), intent["id"],
                          tuple(detail.get("avoid", [])))
        elif intent["action"] == "release":
            self.release(job, attempt, split_nodes(intent["target"]), intent["id"])
        else:
            state = policy.EVACUATED if intent["action"] == "evacuation" else policy.CONTINUED
            self.requeue_not_fault(job, attempt, intent["action"], state, split_nodes(intent["target"]),
                                   intent["id"])

    def _stale_request(self, intent: dict, job: Job | None) -> str | None:
        """Why an ``evacuate-request`` can no longer be carried out, or None while it can."""
        if job is None:
            return "job no longer known to Slurm"
        if job.state != "RUNNING" or job.restart_count != intent["attempt"]:
            return f"attempt {intent['attempt']} no longer running (now attempt {job.restart_count}, {job.state})"
        if self.d.clock() - intent["created"] > REQUEST_TTL_S:
            return f"not carried out within {REQUEST_TTL_S:g} s"
        return None

    # ------------------------------------------------------------------ helpers
    def _refusals(self, job_id: int, attempt: int, action: str, target: str | None = None) -> int:
        """``action`` steps of the attempt Slurm refused (journaled ``failed``), of ``target`` only
        when given: a step is retried until :data:`REQUEUE_TRIES` refusals."""
        return sum(1 for a in self.journal.actions(job_id, attempt)
                   if a["action"] == action and a["status"] == "failed" and (target is None or a["target"] == target))

    def try_update(self, job_id: int, **fields: str) -> None:
        try:
            self.slurm.update_job(job_id, **fields)
        except SlurmCommandError as exc:
            log.debug("job %s: update %s refused: %s", job_id, fields, exc)

    def _attempt_nodes(self, job_id: int, attempt: int) -> str:
        return next((a["nodes"] or "" for a in self.journal.attempts(job_id) if a["attempt"] == attempt), "")
