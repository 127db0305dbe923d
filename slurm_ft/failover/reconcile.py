"""Reconciliation with Slurm: the journal's "done" is never trusted over what Slurm says now.

slurmctld saves its state (jobs, nodes, the node ``Extra`` field) to ``StateSaveLocation`` every
few seconds. A controller that crashes and restarts from an older save forgets what happened
since: a requeue slurm-ft made (the job is back ``RUNNING`` on the faulty node with its old
restart count, then ``FAILED JobLaunchFailure``), a drain (the node with the dead GPU comes back
``idle``), a job submitted shortly before (purged). The journal remembers all of it; this module
compares the two and re-applies what Slurm lost, each time as a journal action of its own
(``reconcile``, detail: JSON ``{"kind": ..., "why": ...}``) so ``ft-history`` shows it.

When (docs/architecture.md, "Reconciliation with Slurm"):

- **every full scan** (``[failover] scan_interval_s``) and at once when a **controller restart**
  is noticed (slurmctld's start time, ``BOOT_TIME`` of ``scontrol show config``, changed; read on
  each full scan and after a cycle whose Slurm calls failed): the nodes slurm-ft drained
  (:meth:`Reconciler.after_reads`: one journal query, on each node list the cycle reads anyway,
  every ``node_poll_s``) and the open ft jobs Slurm no longer lists (booked ``lost``);
- **every job the daemon handles** (:meth:`Reconciler.redo`, from the record it read anyway): a
  requeue journaled done for attempt N while Slurm's restart count is still N is redone once.

What is compared and re-applied:

- ``drain-reapplied``: a node slurm-ft drained (a ``drain`` action done, or skipped because the
  epilog had drained it already, or a node whose epilog drained it for a hardware verdict of a
  job the daemon never failed over: :func:`epilog_drains`) that Slurm shows not drained, when slurmctld started *after*
  that drain: drained again with the same reason, through :func:`slurm_ft.drain.drain_node`; the
  original drain time is kept in the detail (``drained_at``; Slurm's reason time is now);
  the same when Slurm shows the node drained by a reason of its own (``Kill task failed``,
  ``batch job complete failure``: :data:`slurm_ft.drain.SLURM_REASONS`), which would hide the
  fault from the admin who resumes it; never over an admin's reason;
- ``drain-lifted``: the same, when slurmctld has *not* restarted since the drain: someone
  resumed the node (an admin); recorded once, never re-drained for that drain;
- ``failover-redone`` (or ``evacuation-redone``, ``continue-redone``): the requeue Slurm lost is
  redone with the effects' own idempotent steps (:meth:`Effects.failover`: drain, requeue only
  while Slurm's restart count equals the attempt, exclude, boost, ``StartTime=now``); no new
  ``failover`` row, so the retry budget is not charged twice;
- ``lost``: an ft job open in the journal (ft state not final) that Slurm no longer lists:
  ft state ``lost`` (final), never ``running`` forever.

A verdict lost from a node's mailbox field is not re-posted here: the daemon never writes the
field (one writer per node, slurm_ft.failover.mailbox); the node re-posts it from its sent ledger
(slurm_ft.failover.repost), and a verdict the daemon read before the restart is in the journal
already (the re-post is then ignored: ``mailbox_seen``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Mapping

from slurm_ft.drain import LEADER, OBSERVED, SLURM_REASONS, drain_node, drain_reason
from slurm_ft.errors import SlurmFTError
from slurm_ft.journal import identity
from slurm_ft.slurm import Job, split_nodes
from slurm_ft.failover import machine as m
from slurm_ft.failover import policy

log = logging.getLogger("slurm_ft.daemon")

#: The journal action of every reconciliation.
ACTION = "reconcile"
DRAIN_REAPPLIED, DRAIN_LIFTED, LOST = "drain-reapplied", "drain-lifted", "lost"
#: Requeues slurm-ft journals (action -> ft state while the job waits to run again).
REQUEUES = {"failover": policy.FAILOVER, "evacuation": policy.EVACUATED, "continue": policy.CONTINUED}
#: Seconds before slurmctld's start within which a drain may have been lost by a state rollback
#: (older drains were saved by the controller long before it stopped).
DRAIN_HORIZON_S = 86400.0
#: Redos of one attempt's requeue within :data:`REDO_WINDOW_S` (Slurm refusing the redo again
#: and again must not cost an RPC storm).
MAX_REDO, REDO_WINDOW_S = 3, 600.0
#: Seconds a job Slurm shows running an attempt the journal says was requeued (the saved state's
#: copy) is left for slurmctld to end before the requeue is redone on the running job.
GHOST_GRACE_S = m.GHOST_GRACE_S
#: Seconds between two reads of slurmctld's start time while some job's reads fail.
RECHECK_S = 2.0
#: ``BOOT_TIME`` has whole seconds: a drain journaled less than this after it may be older than
#: the restart (and is then taken as forgotten, never as lifted by an admin), unless the daemon
#: had already read that start time when it journaled the drain.
BOOT_SLACK_S = 1.0


def detail(kind: str, why: str, **fields) -> str:
    """The ``reconcile`` row's detail: JSON ``{"kind", "why", ...}`` (``why`` is what ft-history shows)."""
    return json.dumps({"kind": kind, "why": why, **fields}, sort_keys=True)


def parse_detail(text: str | None) -> dict:
    """A ``reconcile`` row's detail as a dict ({} when it is not one)."""
    try:
        d = json.loads(text or "{}")
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def _iso(t: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "?"


def _ours(row: Mapping) -> str | None:
    """The reason of a ``drain`` row that left the node drained by slurm-ft (done, or skipped
    because slurm-ft's epilog had drained it already), else None."""
    text = row.get("detail") or ""
    if row["status"] == "skipped" and text.startswith("already-drained: "):
        text = text[len("already-drained: "):]
    elif row["status"] != "done":
        return None
    return text if text.startswith(LEADER) else None    # drain_node drains with slurm-ft's reasons only


def drain_facts(rows) -> dict[str, dict]:
    """The newest fact per node among journal rows (oldest first): ``{"kind": "drain" |
    DRAIN_REAPPLIED | DRAIN_LIFTED, "row", "reason", "drained_at"}``."""
    out: dict[str, dict] = {}
    for r in rows:
        node = r.get("target") or ""
        if not node:
            continue
        if r["action"] == "drain":
            reason = _ours(r)
            if reason:
                out[node] = {"kind": "drain", "row": r, "reason": reason, "drained_at": r["created"]}
        elif r["action"] == ACTION:
            d = parse_detail(r["detail"])
            if d.get("kind") == DRAIN_REAPPLIED and r["status"] == "done" and str(d.get("reason", "")).startswith(LEADER):
                out[node] = {"kind": DRAIN_REAPPLIED, "row": r, "reason": d.get("reason", ""),
                             "drained_at": d.get("drained_at", r["created"])}
            elif d.get("kind") == DRAIN_LIFTED:
                out[node] = {"kind": DRAIN_LIFTED, "row": r}
    return out


def epilog_drains(verdicts) -> list[dict]:
    """The drains the nodes' epilogs made, as ``drain`` rows (:func:`drain_facts`): one per
    hardware verdict with action ``drain_node`` (``Journal.drain_verdicts``), dated by the verdict,
    with the reason the epilog drained with (:func:`slurm_ft.drain.drain_reason`; a clean exit's
    fault rule stays on its node: ``clean-exit`` is named instead). A job that completed or failed
    on its own leaves no ``drain`` action of the daemon's, yet its node's drain is slurm-ft's:
    a rollback that loses it must not put the faulty GPU back in service. Prolog health refusals
    are not among them (rule ``health:``; their checks run again on that node)."""
    return [{"action": "drain", "target": v["node"], "job_id": v["job_id"], "attempt": v["attempt"],
             "created": v["created"], "status": "done", "detail": drain_reason(v["job_id"], v)}
            for v in verdicts if v.get("node") and not str(v.get("rule") or "").startswith(policy.HEALTH_RULE)]


def lost_requeue(job: Job, actions) -> Mapping | None:
    """The requeue (``failover``/``evacuation``/``continue`` done) that Slurm has lost: journaled
    done for attempt N = Slurm's restart count, which it would have raised to N + 1 (a requeue
    always does). None when Slurm agrees with the journal, or the job waits to run (pending or
    completing: a requeue cannot be redone on a pending job)."""
    if job.state == "PENDING" or job.completing:
        return None
    return next((a for a in actions if a["action"] in REQUEUES and a["status"] == "done"
                 and a["attempt"] == job.restart_count), None)


class Reconciler:
    """Reconciliation for the daemon ``d`` (its Slurm, journal, effects, node view, clock)."""

    def __init__(self, d):
        self.d = d
        self.boot: float | None = None       # slurmctld's start time, last read
        self._unsure = False                 # the last read failed (slurmctld down or restarting)
        self._next_look = self._next_error_look = 0.0
        self._boot_seen_at = float("inf")      # when this daemon first read the current start time
        self._nodes_checked: list | None = None        # the node list last compared with the journal
        self._ghosts: dict[tuple[int, int], float] = {}   # (job, attempt) -> first seen running rolled back

    # ------------------------------------------------------------------ controller restarts
    def ctld_restarted(self, look: bool) -> bool:
        """With ``look`` (a full scan, or the last cycle's Slurm calls failed), while the last try
        failed, every ``[failover] node_poll_s`` (as often as the node poll: one light RPC), and
        every :data:`RECHECK_S` while reading some job fails: read slurmctld's start time; True
        when it changed since the last read (a restart: the caller makes this cycle a full scan).
        Never raises: an unreachable controller is the cycle's business."""
        now = self.d.clock()
        if not (look or self._unsure or now >= self._next_look
                or (self.d._errors and now >= self._next_error_look)):
            return False
        self._next_look = now + self.d.cfg.failover.node_poll_s
        self._next_error_look = now + RECHECK_S
        try:
            boot = self.d.slurm.boot_time()
        except SlurmFTError as exc:
            log.debug("slurmctld start time not read: %s", exc)
            self._unsure = True          # tried again every cycle until slurmctld answers
            return False
        self._unsure = False
        if boot is None:
            return False
        changed = self.boot is not None and boot != self.boot
        if boot != self.boot:
            self._boot_seen_at = now
        self.boot = boot
        if changed:
            log.warning("slurmctld restarted (started %s): reconciling the journal with Slurm", _iso(boot))
        return changed

    # ------------------------------------------------------------------ after the reads of a cycle
    def after_reads(self, rows) -> None:
        """After a cycle's Slurm reads: jobs Slurm lost (``rows``: a full scan's light job list,
        None when this cycle made none) and, whenever the node list was read again (``d.nodes``),
        drains Slurm forgot or someone lifted. Never raises: trouble is logged and in
        ``d.cycle_errors``."""
        try:
            if rows is not None:
                self._lost_jobs({r.job_id for r in rows})
            if self.d.nodes and self.d.nodes is not self._nodes_checked:
                self._nodes_checked = self.d.nodes
                self._drains()
        except SlurmFTError as exc:
            log.error("reconcile: %s", exc)
            self.d.cycle_errors.append(f"reconcile: {exc}")

    def _lost_jobs(self, listed: set[int]) -> None:
        j = self.d.journal
        for jid in sorted(j.active_ft_jobs() - listed):
            attempt = max([a["attempt"] for a in j.attempts(jid)] + [a["attempt"] for a in j.actions(jid)], default=0)
            why = ("Slurm no longer knows the job (purged after a slurmctld state loss, or ended while "
                   "slurm-ft was not watching): nothing more can be done for it")
            j.record(jid, attempt, ACTION, str(jid), detail(LOST, why))
            j.set_ft_state(jid, policy.LOST)
            self.d._ft.discard(jid)
            log.error("job %s: lost: %s", jid, why)

    def _drains(self) -> None:
        if self.boot is None:
            return                # without slurmctld's start time a forgotten drain cannot be told apart
        d, j = self.d, self.d.journal
        nodes = {n.name: n for n in d.nodes}
        since = self.boot - DRAIN_HORIZON_S
        rows = j.actions_named(("drain", ACTION), since)
        if d.effects.fcfg.drain:
            rows = sorted(rows + epilog_drains(j.drain_verdicts(since)), key=lambda r: r["created"] or 0.0)
        for node, fact in sorted(drain_facts(rows).items()):
            cur = nodes.get(node)
            if fact["kind"] == DRAIN_LIFTED or cur is None:
                continue
            row = fact["row"]
            # journaled after this slurmctld started: it took slurm-ft's drain (never forgot it)
            after_boot = row["created"] >= min(self.boot + BOOT_SLACK_S, self._boot_seen_at)
            if cur.drained:
                if not after_boot and (cur.reason or "").startswith(SLURM_REASONS):
                    # slurmctld forgot slurm-ft's drain and drained the node for a reason of its
                    # own (the rolled-back job's launch or kill failed there): the node is out of
                    # service, but its reason no longer says why; an admin would resume it
                    self._redrain(node, fact)
                continue          # slurm-ft's drain holds, or an admin's
            if after_boot and not self.ctld_restarted(True):
                # (slurmctld's start time read again after the node list: a restart in between
                # would make a forgotten drain look lifted)
                # this controller took slurm-ft's drain, and someone lifted it since: an admin
                j.record(row["job_id"], row["attempt"], ACTION, node, detail(
                    DRAIN_LIFTED, f"{node} resumed by someone else after slurm-ft drained it "
                                  f"({_iso(row['created'])}): not drained again"))
                continue
            self._redrain(node, fact)

    def _redrain(self, node: str, fact: dict) -> None:
        d, j, row = self.d, self.d.journal, fact["row"]
        why = (f"slurmctld (started {_iso(self.boot)}) forgot slurm-ft's drain of {node} "
               f"(drained {_iso(fact['drained_at'])}): drained again with the same reason")
        aid = j.intend(row["job_id"], row["attempt"], ACTION, node, detail(
            DRAIN_REAPPLIED, why, reason=fact["reason"], drained_at=fact["drained_at"], boot=self.boot))
        if d.breaker_latched:
            j.finish(aid, "skipped", detail(DRAIN_REAPPLIED, f"not drained again: circuit breaker open since "
                                                             f"{d.breaker_latched}", reason=fact["reason"]))
            return
        try:
            outcome = drain_node(d.slurm, node, fact["reason"], nodes=d.nodes)
        except SlurmFTError as exc:
            j.finish(aid, "failed", detail(DRAIN_REAPPLIED, f"drain refused: {exc}", reason=fact["reason"]))
            return
        if outcome in ("drained", OBSERVED, "already-drained"):
            j.finish(aid)
            log.warning("%s: %s", node, why)
            d.refresh_nodes()
        else:
            j.finish(aid, "skipped", detail(DRAIN_REAPPLIED, f"not drained again: {outcome}", reason=fact["reason"]))

    # ------------------------------------------------------------------ each job handled
    def redo(self, job: Job, facts: m.Facts) -> Job | None:
        """Redo the requeue Slurm lost for ``job`` (:func:`lost_requeue`) once, with the effects'
        own steps; returns the job as Slurm shows it afterwards (the caller plans from it), None
        when nothing was redone. Journaled as ``reconcile`` (``failover-redone``...): the
        ``failover`` row stays the one of the attempt. The redone requeue's new SubmitTime is
        recorded as this job's (slurm_ft.journal.identity: not a new job with a used id).

        Only for the job the journal's record is of: the daemon checks every job it reads against
        its record (``identity.observe``, before ``handle``), and a new job with a used id has
        retired the old record by then, so ``facts`` never holds another job's requeues."""
        if facts.opts is None:
            return None
        lost = lost_requeue(job, facts.actions)
        if lost is None:
            return None
        attempt, action = lost["attempt"], lost["action"]
        kind = f"{action}-redone"
        now = self.d.clock()
        ended = any(a["attempt"] == attempt and a.get("end") for a in facts.attempts)
        if job.state == "RUNNING" and not ended:
            # the saved state's copy, on the node it ran on, and no end of it on record: slurmctld
            # ends it (JobLaunchFailure) once that node's slurmd reports it gone. Redone anyway
            # after a grace. (With its end on record, the copy Slurm shows is surely gone.)
            first = self._ghosts.setdefault((job.job_id, attempt), now)
            if now - first < GHOST_GRACE_S:
                self.d.wake(job.job_id, first + GHOST_GRACE_S)
                return None
        tries = [a for a in facts.acts(attempt, ACTION) if parse_detail(a["detail"]).get("kind") == kind
                 and now - (a["created"] or 0) < REDO_WINDOW_S]
        if len(tries) >= MAX_REDO:
            return None
        j, fx = self.d.journal, self.d.effects
        why = (f"Slurm lost the {action} of attempt {attempt} (restart count {job.restart_count}, "
               f"{job.state} on {job.nodes or 'no node'}: a slurmctld state rollback): redone")
        aid = j.intend(job.job_id, attempt, ACTION, lost["target"] or "", detail(kind, why, of=lost["id"]))
        j.set_ft_state(job.job_id, REQUEUES[action])
        log.warning("job %s: %s", job.job_id, why)
        if action == "failover":
            info = parse_detail(lost["detail"])
            fx.failover(job, attempt, str(info.get("reason", "")), tuple(info.get("blamed") or ()),
                        tuple(j.node_verdicts(job.job_id, attempt)), aid)
        else:
            fx.requeue_not_fault(job, attempt, action, REQUEUES[action], split_nodes(lost["target"]), aid)
        self._ghosts.pop((job.job_id, attempt), None)
        fresh = self.d.slurm.job(job.job_id)
        if fresh is not None and not fresh.completing:
            identity.continued(j, fresh)
        return fresh
