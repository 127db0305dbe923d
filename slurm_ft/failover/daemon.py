"""The requeue daemon: verdicts in, Slurm actions out, every step journaled.

Runs as root on the controller host (``slurm-ft daemon``; ``--once`` for one cycle). Each cycle:

1. read every node's verdict mailbox (one ``sinfo --json``) into the journal;
2. read every job (one ``squeue --json``); for each ft-enabled job, record the attempt;
3. for an attempt that ended: decide (``policy.decide``) and act — drain blamed nodes, requeue the
   job in place (same job id) with every node blamed so far in ``ExcNodeList``, raise its priority
   above every waiting job, and clear Slurm's 121 s requeue delay (``StartTime=now`` once the job
   has left COMPLETING; re-applied each cycle while the job is pending and not yet eligible).

**Crash safety.** Every failover is journaled as an *intent* before the first Slurm action and
marked done after the last. Each step is idempotent and checked against Slurm's own state, so a
daemon killed at any point resumes the failover on restart (``reconcile``): drains are repeated
harmlessly; the requeue is done only while Slurm's restart count still equals the failed attempt
(so never twice); exclusions and priority are re-applied; a held job is released.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import time

from ..drain import LEADER, drain_node, drain_reason
from ..errors import ConfigError, SlurmCommandError, SlurmFTError
from ..journal import open_daemon_journal
from ..slurm import Job, Slurm
from . import mailbox, policy, steps
from .options import admin_comment, trusted_options
from ..slurm import split_nodes as _split_nodes

log = logging.getLogger("slurm_ft.daemon")
#: Why an attempt runs, by the ft state it left (AdminComment of a running or finished job).
RESTART_WHY = {policy.FAILOVER: "after a failover", policy.REQUEUED: "after a failover",
               policy.EVACUATED: "after an evacuation", policy.CONTINUED: "after a time-limit continuation"}
#: Seconds between a continuation's requeue and ``StartTime=now`` (a job credential created in
#: the second its predecessor's was revoked is refused by slurmd).
CONTINUE_SETTLE_S = 2.0
#: Node states in which Slurm has lost a node (sinfo --json, lower- or upper-case).
LOST = ("down", "not_responding", "no_respond")
#: Slurm's INFINITE time limit (``0xfffffffe``) and above: no limit.
INFINITE_MINUTES = 0xFFFFFFFE
#: Seconds of slack, besides the job's --ft-ckpt-wait, between the time-limit checkpoint signal
#: and the limit (the requeue itself takes ~1 s; slurmctld ends jobs at or after the limit).
TIME_LIMIT_MARGIN_S = 10.0


def signature(verdicts: list[dict]) -> tuple:
    """What an attempt died of, for fast-fail: the set of (class, rule, Xid codes) of its non-ok
    verdicts. Two consecutive attempts with the same non-empty signature stop the retries."""
    return tuple(sorted({(v["verdict"], v["rule"], tuple(sorted({x["xid"] for x in v.get("xids") or []})))
                         for v in verdicts if v["verdict"] != "ok"}))


class Daemon:
    def __init__(self, cfg, slurm: Slurm | None = None):
        self.cfg = cfg
        self.slurm = slurm or Slurm.from_config(cfg)
        self.journal = open_daemon_journal(cfg)  # 0600, or 0640 root:[journal] read_group
        self._stop = False
        self._stable: dict[int, tuple] = {}   # job id -> snapshot of a job needing no attention
        self._top_priority = 0
        self._boosted: set[int] = self.journal.boosted_jobs()  # jobs slurm-ft set a priority for
        self._breaker_latched: str | None = None                  # read from the journal each cycle
        self._nodes: list = []
        self._children: list[subprocess.Popen] = []               # evacuations in progress
        self._gpus: dict[tuple[int, int], dict[str, set[int]]] = {}  # (job, attempt) -> node -> GPUs
        self._wake: dict[int, float] = {}                         # job id -> when to look again

    # ------------------------------------------------------------------ loop
    def run(self, once: bool = False) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        log.info("slurm-ft daemon started (journal %s)", self.journal.path)
        while not self._stop:
            t0 = time.monotonic()
            try:
                self.cycle()
            except SlurmFTError as exc:
                log.error("cycle failed: %s", exc)
                if once:
                    raise
            except Exception:  # a bug or an OS error must not crash-loop the daemon under systemd
                log.exception("cycle failed unexpectedly (retried next cycle)")
                if once:
                    raise
            if once:
                return
            time.sleep(max(0.0, self.cfg.failover.poll_interval_s - (time.monotonic() - t0)))
        log.info("slurm-ft daemon stopped")

    def cycle(self) -> None:
        """One pass: mailboxes, unfinished failovers (after a crash), then every job."""
        self._nodes = self.slurm.nodes()
        self._breaker_latched = self.journal.breaker_latched()  # `slurm-ft breaker reset` closes it
        self.ingest_mailboxes(self._nodes)
        jobs = self.slurm.jobs()
        by_id = {j.job_id: j for j in jobs}
        self._top_priority = steps.top_priority(jobs, self._boosted)
        try:
            self.reconcile(by_id)
        except SlurmFTError as exc:  # one refused scontrol must not stop every later failover
            log.error("reconcile: %s", exc)
        self.evacuate_degraded(jobs)
        for job in jobs:
            snap = (job.state, tuple(job.flags), job.reason, job.restart_count, job.nodes, job.priority, job.comment,
                    job.admin_comment)
            if self._stable.get(job.job_id) == snap and self._wake.get(job.job_id, float("inf")) > time.time():
                continue
            try:
                if self.handle(job):
                    self._stable[job.job_id] = snap
                else:
                    self._stable.pop(job.job_id, None)
            except SlurmFTError as exc:
                log.error("job %s: %s", job.job_id, exc)
            except Exception:  # a bug with one job must not stop failover for every other job
                log.exception("job %s: internal error (retried next cycle)", job.job_id)
        for gone in set(self._stable) - set(by_id):
            del self._stable[gone]
        self._gpus = {k: v for k, v in self._gpus.items() if k[0] in by_id}
        self._wake = {k: v for k, v in self._wake.items() if k in by_id}

    def evacuate_degraded(self, jobs: list[Job]) -> None:
        """A node slurm-ft drained for a failing health check while jobs still run on it (e.g.
        ``slurm-ft health --act`` as HealthCheckProgram found a GPU degrading): checkpoint-before-exit
        the ft jobs that hold the failing GPU (all of them for a node-level check), then requeue
        them elsewhere. Runs ``slurm-ft drain NODE --checkpoint --job J`` as a child process so the
        daemon's cycle never waits for a save (up to the job's --ft-ckpt-wait). Once per attempt."""
        self._children = [c for c in self._children if c.poll() is None]
        for node in self._nodes:
            failing = _health_drain(node)
            if failing is None:
                continue
            check, gpu = failing
            for job in jobs:
                if job.state != "RUNNING" or node.name not in _split_nodes(job.nodes):
                    continue
                try:
                    if not trusted_options(job, self.journal, self.cfg.failover).enabled:
                        continue
                except ConfigError:
                    continue
                if any(a["action"] == "evacuate" for a in self.journal.actions(job.job_id, job.restart_count)):
                    continue
                if gpu is not None and gpu not in self._job_gpus(job, node.name):
                    continue
                self.journal.record(job.job_id, job.restart_count, "evacuate", node.name, node.reason)
                log.info("job %s: %s degraded (%s): checkpoint-before-exit, then requeue", job.job_id, node.name, check)
                argv = [sys.executable, "-m", "slurm_ft.cli", "drain", node.name, "--checkpoint", "--job",
                        str(job.job_id), "--reason", node.reason]
                if self.cfg.source:
                    argv += ["--config", self.cfg.source]
                self._children.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True))

    def _job_gpus(self, job: Job, node: str) -> set[int]:
        """GPU indices the job holds on ``node``; asked of Slurm once per attempt."""
        key = (job.job_id, job.restart_count)
        if key not in self._gpus:
            self._gpus[key] = self.slurm.job_gpus(job.job_id)
        return self._gpus[key].get(node, set())

    def ingest_mailboxes(self, nodes) -> int:
        """Copy new verdict records from node mailbox fields into the journal; returns how many."""
        field = self.cfg.failover.mailbox_field.lower()
        new = 0
        for node in nodes:
            for rec in mailbox.parse(getattr(node, field, "")):
                if self.journal.mailbox_seen(node.name, rec.key):
                    continue
                xids = [{"xid": x, "bus_id": b or None} for x, b in rec.xids]
                self.journal.add_verdict(rec.job_id, rec.attempt, node.name, rec.verdict, rec.rule, xids, [],
                                         "drain_node" if rec.verdict == "hardware" else "none", rec.exit_code,
                                         source="mailbox", created=rec.time)
                self.journal.mark_mailbox_seen(node.name, rec.key)
                self._stable.pop(rec.job_id, None)
                log.info("verdict job %s attempt %s on %s: %s (%s)", rec.job_id, rec.attempt, node.name,
                         rec.verdict, rec.rule)
                new += 1
        return new

    def reconcile(self, jobs: dict[int, Job]) -> None:
        """Finish failovers and releases whose intent is journaled but not done (daemon crash)."""
        for intent in self.journal.pending_intents():
            if intent["action"] not in ("failover", "release"):
                # a sub-step (drain, requeue, update, start-now) cut short: its failover re-checks it
                self.journal.finish(intent["id"], "abandoned", "daemon restarted mid-step; step re-checked")
                continue
            job = jobs.get(intent["job_id"])
            if job is None:
                self.journal.finish(intent["id"], "failed", "job no longer known to Slurm")
                continue
            log.info("job %s: resuming unfinished %s of attempt %s", job.job_id, intent["action"], intent["attempt"])
            if intent["action"] == "failover":
                detail = json.loads(intent["detail"] or "{}")
                decision = policy.Decision("failover", detail.get("reason", ""), tuple(detail.get("blamed", [])),
                                           tuple(self.journal.verdicts(job.job_id, intent["attempt"])))
                self._do_failover(job, intent["attempt"], decision, intent["id"])
            else:
                self._do_release(job, intent["attempt"], intent["target"].split(","), intent["id"])
            self._stable.pop(job.job_id, None)

    # ------------------------------------------------------------------ per job
    def handle(self, job: Job) -> bool:
        """Look at one job; returns True when it needs no attention until its Slurm record changes."""
        if job.state == "PENDING" and job.restart_count > 0 and self._prolog_refused(job):
            return False
        try:
            opts = trusted_options(job, self.journal, self.cfg.failover)
        except ConfigError as exc:
            if self.journal.job(job.job_id) is None:
                log.warning("job %s: bad ft options: %s", job.job_id, exc)
                self.journal.upsert_job(job.job_id, name=job.name, user=job.user, ft_enabled=0,
                                        ft_state=policy.NOT_CONFIGURED)
                self.journal.record(job.job_id, job.restart_count, "decide", detail=f"not-configured: {exc}")
            return True
        if not opts.enabled:
            if job.ended and job.state in policy.FAILED_STATES and self.journal.job(job.job_id) is None:
                self.journal.upsert_job(job.job_id, name=job.name, user=job.user, ft_enabled=0,
                                        ft_state=policy.NOT_CONFIGURED)
            return True
        row = self.journal.job(job.job_id)  # recorded by trusted_options at first sight
        attempt = job.restart_count
        self.journal.close_attempts_before(job.job_id, attempt)
        ran = (job.state == "RUNNING" and job.reason != "Prolog") or job.ended
        if ran or (job.state != "PENDING" and self.journal.has_attempt(job.job_id, attempt)):
            # an attempt a prolog refused never ran: it is on record through its verdict only
            self.journal.upsert_attempt(job.job_id, attempt, nodes=job.nodes or None, start=job.start_time,
                                        end=job.end_time if job.ended else None, exit_code=job.exit_code,
                                        signal=job.exit_signal, state=job.state)
        state = row["ft_state"]
        if job.state == "PENDING" and attempt > 0 and not self._decided(job.job_id, attempt - 1):
            return self._requeued_by_slurm(job, row)
        if job.state == "PENDING" and state in policy.PENDING_STATES:
            return steps.clear_requeue_delay(self.slurm, self.journal, job, start=self._restart_at(job.job_id, state))
        if job.state == "RUNNING" and state in policy.PENDING_STATES:
            self.journal.set_ft_state(job.job_id, policy.RUNNING)
            # a fact that stays true once the job has ended (Slurm refuses updates to finished
            # jobs: "Job has already finished"), never a state that would go stale
            self._try_update(job.job_id, AdminComment=admin_comment(self.journal, job.job_id,
                                                                    f"attempt {attempt} ({RESTART_WHY[state]})"))
            return True
        self._record_ckpt_ack(job)
        if job.state == "RUNNING" and job.reason != "Prolog":
            return self._time_limit(job, opts)
        if not job.ended:
            return True
        if state in policy.FINAL_STATES or self._decided(job.job_id, attempt):
            return True
        return self._decide(job, row, attempt, job.state)

    def _decide(self, job: Job, row: dict, attempt: int, slurm_state: str, requeued: bool = False) -> bool:
        verdicts = self.journal.verdicts(job.job_id, attempt)
        since_end = time.time() - (job.end_time or time.time()) if not requeued else 60.0
        failovers = self.journal.failovers_done(job.job_id)
        nodes = _split_nodes(job.nodes) or _split_nodes(self._attempt_nodes(job.job_id, attempt))
        notified, saved = self._notified(job.job_id, attempt)
        decision = policy.decide(slurm_state=slurm_state, failovers_done=failovers, retries=row["retries"],
                                 verdicts=verdicts, job_nodes=nodes, seconds_since_end=since_end,
                                 unblamed_done=self._unblamed_failovers(job.job_id),
                                 runtime_s=self._runtime_s(job.job_id),
                                 site=policy.SitePolicy.from_config(self.cfg.failover),
                                 notified=None if requeued else notified, saved=saved,
                                 evacuations_done=self._count(job.job_id, "evacuation"),
                                 continuations_done=self._count(job.job_id, "continue"))
        if decision.kind == "wait":
            return False
        if decision.kind in (policy.EVACUATE, policy.CONTINUE):
            self._requeue_not_fault(job, attempt, decision.kind, decision.reason)
            return False
        for v in decision.verdicts:
            if v["rule"] == "slurm-node-fail":  # no epilog ran on a lost node: Slurm's word is the verdict
                self.journal.add_verdict(job.job_id, attempt, v["node"], "hardware", v["rule"], [],
                                         [f"Slurm: node {v['node']} not responding (job state {slurm_state})"],
                                         "drain_node", source="daemon")
        if decision.kind == "failover" and failovers and attempt > 0 and not decision.blamed_nodes:
            # fast-fail is for faults that would repeat anywhere; two hardware faults on two
            # nodes are bad luck (and the first node is excluded, so it cannot repeat there)
            previous = self.journal.verdicts(job.job_id, attempt - 1)
            if signature(previous) and signature(previous) == signature(list(decision.verdicts)):
                decision = policy.Decision(policy.FAILED, f"fast-fail: attempts {attempt - 1} and {attempt} "
                                           f"failed the same way ({decision.reason})", decision.blamed_nodes,
                                           decision.verdicts)
        if decision.kind == "failover":
            detail = json.dumps({"reason": decision.reason, "blamed": list(decision.blamed_nodes)})
            aid = self.journal.intend(job.job_id, attempt, "failover", ",".join(decision.blamed_nodes), detail)
            self.journal.set_ft_state(job.job_id, policy.FAILOVER)
            log.info("job %s attempt %s: failover (%s), blaming %s", job.job_id, attempt, decision.reason,
                     ",".join(decision.blamed_nodes) or "no node")
            self._do_failover(job, attempt, decision, aid)
            return False
        self.journal.record(job.job_id, attempt, "decide", detail=f"{decision.kind}: {decision.reason}")
        self.journal.set_ft_state(job.job_id, decision.kind)
        log.info("job %s attempt %s: %s (%s)", job.job_id, attempt, decision.kind, decision.reason)
        if decision.kind == policy.MAX_RETRIES and decision.blamed_nodes:
            self._drain(job, attempt, decision)
        # only a job Slurm still lets us update (requeued, held) takes the final state; a finished
        # job keeps "attempt N (after ...)" and ft-history has its final state
        self._try_update(job.job_id, AdminComment=admin_comment(self.journal, job.job_id, decision.kind))
        if requeued and decision.kind != policy.COMPLETED:
            # Slurm requeued it by itself (NODE_FAIL), but slurm-ft will not retry it: hold it, visibly.
            self.slurm.run("scontrol", "hold", str(job.job_id), check=False)
        return True

    # ------------------------------------------------------------------ not faults
    def _notified(self, job_id: int, attempt: int) -> tuple[str | None, bool]:
        """(what slurm-ft's checkpoint signal to this attempt was for, or None; whether the
        attempt acked a saved checkpoint after it — or at all, when it was not signalled)."""
        from ..checkpoint.evacuate import CLOCK_SKEW_S, notify_purpose

        acts = self.journal.actions(job_id, attempt)
        notes = [a for a in acts if a["action"] == "ckpt-notify" and a["status"] in ("done", "skipped")]
        since = (notes[-1]["created"] - CLOCK_SKEW_S) if notes else 0.0
        saved = any(a["action"] == "ckpt-ack" and a["status"] == "done" and a["created"] >= since for a in acts)
        return (notify_purpose(notes[-1]["detail"]) if notes else None), saved

    def _count(self, job_id: int, action: str) -> int:
        """Requeues of one not-fault kind done for this job (``evacuation`` or ``continue``)."""
        return sum(1 for a in self.journal.actions(job_id) if a["action"] == action and a["status"] == "done")

    def _restart_at(self, job_id: int, state: str) -> str | None:
        """``StartTime`` for a job slurm-ft requeued (see steps.clear_requeue_delay)."""
        if state == policy.CONTINUED:
            # it may restart on the node it left: let the revoked credential's second pass, then
            # StartTime=now (an update makes slurmctld schedule at once; a StartTime in the
            # future waits for its next periodic pass, measured ~18 s on the lab)
            done = [a["created"] for a in self.journal.actions(job_id) if a["action"] == "continue"]
            return "now" if done and time.time() - done[-1] >= CONTINUE_SETTLE_S else None
        if state == policy.EVACUATED:
            return "now"
        return None if self._last_failover_unblamed(job_id) else "now"

    def _requeue_not_fault(self, job: Job, attempt: int, kind: str, reason: str) -> None:
        """Requeue after an evacuation (excluding the job's drained nodes, priority boosted as
        for a failover: an admin, not the job, chose to end it) or a time-limit continuation
        (no exclusion, priority kept). Counted apart from the retry budget."""
        action, state = (("evacuation", policy.EVACUATED) if kind == policy.EVACUATE
                         else ("continue", policy.CONTINUED))
        nodes = _split_nodes(job.nodes) or _split_nodes(self._attempt_nodes(job.job_id, attempt))
        drained = sorted(n.name for n in self._nodes if n.name in nodes and n.drained) if action == "evacuation" else []
        self.journal.record(job.job_id, attempt, "decide", ",".join(drained), f"{kind}: {reason}")
        aid = self.journal.intend(job.job_id, attempt, action, ",".join(drained), reason)
        self.journal.set_ft_state(job.job_id, state)
        log.info("job %s attempt %s: %s", job.job_id, attempt, reason)
        refused = steps.requeue_in_place(self.slurm, self.journal, job.job_id, attempt)
        if refused:
            self.journal.finish(aid, "failed", f"requeue refused: {refused}")
            self.journal.set_ft_state(job.job_id, policy.INTERNAL_ERROR)
            log.error("job %s: requeue refused: %s", job.job_id, refused)
            return
        if action == "evacuation":
            steps.exclude_and_boost(self.slurm, self.journal, job.job_id, attempt, drained, nodes=self._nodes,
                                    top=self._top_priority, priority_boost=self.cfg.failover.priority_boost,
                                    ceiling=self.cfg.failover.priority_ceiling,
                                    unsatisfiable=self.cfg.failover.unsatisfiable)
            self._boosted.add(job.job_id)
        self._try_update(job.job_id, AdminComment=admin_comment(self.journal, job.job_id,
                                                                f"{state} (attempt {attempt + 1} next)"))
        self.journal.finish(aid)

    def _time_limit(self, job: Job, opts) -> bool:
        """A running ft job near its time limit: send the checkpoint signal (to the processes that
        catch it, checkpoint/deliver.py) ``--ft-ckpt-wait`` + :data:`TIME_LIMIT_MARGIN_S` before
        the limit (at most half the limit early), and requeue it as soon as it acks ``saved``.
        Returns True when the job needs no look until its Slurm record changes (else the daemon
        comes back at the time noted in ``_wake``)."""
        from ..checkpoint import evacuate

        limit_s = _time_limit_s(job)
        if limit_s is None or not job.start_time or self.cfg.failover.max_continuations == 0:
            return True
        attempt = job.restart_count
        notified, saved = self._notified(job.job_id, attempt)
        if notified == policy.NOTIFY_TIME_LIMIT:
            if saved and not self._decided(job.job_id, attempt):
                self._requeue_not_fault(job, attempt, policy.CONTINUE,
                                        "time limit: continued after its exit checkpoint")
            return True
        if notified is not None:
            return True   # an evacuation is under way
        at = job.start_time + limit_s - min(opts.ckpt_wait_s + TIME_LIMIT_MARGIN_S, limit_s / 2)
        if time.time() < at:
            self._wake[job.job_id] = at
            return True
        self._wake.pop(job.job_id, None)
        if self._count(job.job_id, "continue") >= self.cfg.failover.max_continuations:
            if not any(a["action"] == "ckpt-notify" for a in self.journal.actions(job.job_id, attempt)):
                self.journal.record(job.job_id, attempt, "ckpt-notify", job.nodes,
                                    f"{policy.NOTIFY_TIME_LIMIT}: not sent: continuation bound "
                                    f"{self.cfg.failover.max_continuations} used up", status="failed")
            return True
        delivery = evacuate.notify(self.slurm, self.journal, job, opts, "time limit near",
                                   purpose=policy.NOTIFY_TIME_LIMIT)
        log.info("job %s: time limit near: %s", job.job_id, delivery.summary())
        return True

    def _record_ckpt_ack(self, job: Job) -> None:
        """Journal a checkpoint ack the job wrote into its comment (``slurm_ft.checkpoint``) for
        this attempt, once: acks after Slurm's own ``--signal`` (time limit) reach the record this
        way; acks awaited by ``slurm-ft drain --checkpoint`` are journaled there and not repeated."""
        from ..checkpoint import channel
        from ..checkpoint.evacuate import ack_detail

        ack = channel.find(job.comment)
        if ack is None or ack.attempt != job.restart_count or ack.state not in ("saved", "failed"):
            return
        detail = ack_detail(ack)
        if any(a["action"] == "ckpt-ack" and a["detail"] == detail
               for a in self.journal.actions(job.job_id, job.restart_count)):
            return
        self.journal.record(job.job_id, job.restart_count, "ckpt-ack", job.nodes, detail,
                            status="done" if ack.state == "saved" else "failed")

    def _requeued_by_slurm(self, job: Job, row: dict) -> bool:
        """The job is pending again but slurm-ft did not requeue it: Slurm did (NODE_FAIL of a
        requeueable job) or an admin did. A lost node is a hardware fault of the attempt."""
        attempt = job.restart_count - 1
        nodes = _split_nodes(self._attempt_nodes(job.job_id, attempt))
        down = {n.name for n in self._nodes if _lost(n) and n.name in nodes}
        if not down and not any(policy.retry_class(v) == "hardware" for v in self.journal.verdicts(job.job_id, attempt)):
            # an admin's requeue (often with the node drained for maintenance): an evacuation,
            # not a fault; nothing blamed, no retry spent, the admin's drain reason kept
            self.journal.record(job.job_id, attempt, "decide", detail="evacuate: requeued by an admin or Slurm")
            self.journal.record(job.job_id, attempt, "evacuation", "", "requeued by an admin or Slurm")
            self.journal.set_ft_state(job.job_id, policy.EVACUATED)
            self._try_update(job.job_id, AdminComment=admin_comment(self.journal, job.job_id,
                                                                    f"{policy.EVACUATED} (requeued by an admin)"))
            return False
        return self._decide(job, row, attempt, "NODE_FAIL" if down else "FAILED", requeued=True)

    def _failover_kinds(self, job_id: int) -> list[str]:
        """This job's failovers, oldest first: ``"blamed"`` or ``"unblamed"`` (the daemon's own,
        whose detail is JSON with ``blamed`` nodes) or ``"evacuation"`` (checkpoint-before-exit,
        plain-text detail: the node is excluded, and it is not a fault)."""
        kinds = []
        for a in self.journal.actions(job_id):
            if a["action"] != "failover":
                continue
            try:
                detail = json.loads(a["detail"] or "{}")
            except ValueError:
                kinds.append("evacuation")
                continue
            kinds.append("unblamed" if isinstance(detail, dict) and not detail.get("blamed") else "blamed")
        return kinds

    def _unblamed_failovers(self, job_id: int) -> int:
        """Failovers of this job that blamed no node (site limit ``unblamed_retries``)."""
        return self._failover_kinds(job_id).count("unblamed")

    def _last_failover_unblamed(self, job_id: int) -> bool:
        """Whether this job's newest failover blamed no node (then Slurm's requeue delay stays)."""
        kinds = self._failover_kinds(job_id)
        return bool(kinds) and kinds[-1] == "unblamed"

    def _runtime_s(self, job_id: int) -> float:
        """Seconds the job ran over all its attempts (journal start/end)."""
        total = 0.0
        for a in self.journal.attempts(job_id):
            if a.get("start") and a.get("end"):
                total += max(0.0, a["end"] - a["start"])
        return total

    def _attempt_nodes(self, job_id: int, attempt: int) -> str:
        return next((a["nodes"] or "" for a in self.journal.attempts(job_id) if a["attempt"] == attempt), "")

    def _decided(self, job_id: int, attempt: int) -> bool:
        return any(a["action"] in ("decide", "failover", "release", "evacuation", "continue")
                   for a in self.journal.actions(job_id, attempt))

    # ------------------------------------------------------------------ failover steps
    def _do_failover(self, job: Job, attempt: int, decision: policy.Decision, aid: int) -> None:
        """Drain, requeue in place, exclude, boost, clear the requeue delay (``steps``).
        Idempotent: safe to run again for the same attempt after a crash at any point."""
        j = self.journal
        self._drain(job, attempt, decision)
        refused = steps.requeue_in_place(self.slurm, j, job.job_id, attempt)
        if refused:
            j.finish(aid, "failed", f"requeue refused: {refused}")
            j.set_ft_state(job.job_id, policy.INTERNAL_ERROR)
            log.error("job %s: requeue refused: %s", job.job_id, refused)
            return
        outcome = steps.exclude_and_boost(self.slurm, j, job.job_id, attempt, list(decision.blamed_nodes),
                                          nodes=self._nodes, top=self._top_priority,
                                          # a retry that blames no node (the job's own output
                                          # may have chosen it) keeps the job's priority
                                          priority_boost=self.cfg.failover.priority_boost if decision.blamed_nodes else 0,
                                          ceiling=self.cfg.failover.priority_ceiling,
                                          unsatisfiable=self.cfg.failover.unsatisfiable)
        if decision.blamed_nodes:
            self._boosted.add(job.job_id)
        j.finish(aid)
        if outcome == "held":
            return
        fresh = self.slurm.job(job.job_id)
        if fresh is not None:
            steps.clear_requeue_delay(self.slurm, j, fresh, start="now" if decision.blamed_nodes else None)

    def _drain(self, job: Job, attempt: int, decision: policy.Decision) -> None:
        """Drain the blamed nodes within the circuit breaker (slurm_ft.breaker): once it opens,
        it stays open (journaled) until ``slurm-ft breaker reset``; the job still fails over."""
        if not self.cfg.failover.drain:
            return
        for node in decision.blamed_nodes:
            verdict = next((v for v in decision.verdicts if v["node"] == node), {})
            reason = drain_reason(job.job_id, verdict)
            step = self.journal.intend(job.job_id, attempt, "drain", node, reason)
            if self._breaker_latched:
                self.journal.finish(step, "skipped", f"circuit breaker open since {self._breaker_latched}: {reason}")
                log.warning("job %s: not draining %s: circuit breaker open (slurm-ft breaker reset)", job.job_id, node)
                continue
            try:
                outcome = drain_node(self.slurm, node, reason, breaker=self.cfg.breaker, nodes=self._nodes)
                self.journal.finish(step, "done" if outcome == "drained" else "skipped",
                                    None if outcome == "drained" else f"{outcome}: {reason}")
                if outcome.startswith("breaker-open"):
                    self.journal.record(job.job_id, attempt, "breaker-open", node, outcome)
                    self._breaker_latched = self.journal.breaker_latched()
                    log.error("ALERT %s (job %s); slurm-ft stops draining until `slurm-ft breaker reset`",
                              outcome, job.job_id)
                elif outcome == "drained":
                    self._nodes = self.slurm.nodes()  # the next drain this cycle counts this one
            except SlurmCommandError as exc:
                self.journal.finish(step, "failed", str(exc))

    def _try_update(self, job_id: int, **fields: str) -> None:
        try:
            self.slurm.update_job(job_id, **fields)
        except SlurmCommandError as exc:
            log.debug("job %s: update %s refused: %s", job_id, fields, exc)

    # ------------------------------------------------------------------ prolog refusals
    def _prolog_refused(self, job: Job) -> bool:
        """True (and handled) if the job is pending because a prolog health check refused a node."""
        attempt = job.restart_count - 1
        health = [v for v in self.journal.verdicts(job.job_id, attempt) if v["rule"].startswith(policy.HEALTH_RULE)]
        if not health or any(a["action"] == "release" for a in self.journal.actions(job.job_id, attempt)):
            return False
        blamed = sorted({v["node"] for v in health})
        aid = self.journal.intend(job.job_id, attempt, "release", ",".join(blamed),
                                  f"prolog health check failed ({health[0]['rule']})")
        log.info("job %s: prolog health check failed on %s: releasing elsewhere", job.job_id, ",".join(blamed))
        self._do_release(job, attempt, blamed, aid)
        return True

    def _do_release(self, job: Job, attempt: int, blamed: list[str], aid: int) -> None:
        """A prolog health check failed the node before the job ran: Slurm requeued the job held
        (``launch_failed_requeued_held`` on 22.05) with the 121 s delay. Send it elsewhere now:
        exclude the node, release, restore its priority, ``StartTime=now``. Applies to every job
        (ft-enabled or not), and does not count against the retry budget: the job never ran."""
        excluded = sorted(set(_split_nodes(job.excluded_nodes)) | set(blamed))
        self.slurm.update_job(job.job_id, ExcNodeList=",".join(excluded))
        if job.priority == 0:
            self.slurm.release(job.job_id)
        fields = {"StartTime": "now"}
        target = steps.boosted_priority(self._top_priority, self.cfg.failover.priority_boost,
                                        self.cfg.failover.priority_ceiling, job.priority or 0)
        if target:
            fields["Priority"] = str(target)
            self._boosted.add(job.job_id)
        self.slurm.update_job(job.job_id, **fields)
        self.journal.finish(aid, detail=f"released, ExcNodeList={','.join(excluded)}")


def _health_drain(node) -> tuple[str, int | None] | None:
    """(check, GPU index or None) if slurm-ft drained ``node`` for a failing health check
    (reason ``slurm-ft: <check>: [GPU<n> ]<measurement>``), else None."""
    from ..health.config import CHECK_NAMES

    if not node.drained or not node.reason.startswith(LEADER):
        return None
    check, sep, rest = node.reason[len(LEADER):].strip().partition(":")
    if not sep or check not in CHECK_NAMES:
        return None
    m = re.search(r"\bGPU(\d+)\b", rest)
    return check, int(m.group(1)) if m else None


def _lost(node) -> bool:
    """Slurm lost the node (down, not responding): a job requeued off it lost its node. A node
    that is only drained still answers (an admin took it out of service)."""
    states = [node.state.lower(), *(f.lower() for f in node.flags)]
    return any(s.startswith(u) for s in states for u in LOST)


def _time_limit_s(job: Job) -> float | None:
    """The job's time limit in seconds (``time_limit``: minutes; 22.05 int, 24.11 number
    object), None when unlimited."""
    v = job.raw.get("time_limit")
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    if not isinstance(v, int) or v <= 0 or v >= INFINITE_MINUTES:
        return None
    return v * 60.0


