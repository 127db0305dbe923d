"""The requeue daemon's loop: Slurm I/O around the state machine, costing Slurm in proportion to
faults, not to the queue.

Runs as root on the controller host (``slurm-ft daemon``; ``--once`` for one cycle). The three
parts: this loop (what to read from Slurm, when), the pure state machine
(:mod:`slurm_ft.failover.machine`: a job's record + its journal facts -> actions) and the
effects (:mod:`slurm_ft.failover.effects`: actions -> Slurm commands + journal rows).

Each cycle (every ``[failover] poll_interval_s``; docs/architecture.md, "Event flow"):

1. **which jobs**: those named by events (slurmctld's Prolog/EpilogSlurmctld hook: an ft job
   started or ended; :mod:`.events`), those whose wake-up time came (``machine.Wake``: a grace
   period, a checkpoint ack awaited, a time limit, ``StartTime=now`` once out of COMPLETING), and
   those with an unfinished journaled action; every ``scan_interval_s`` (and at start-up) a full
   reconciliation: every job, light (one ``squeue -o`` listing, slurm_ft.jobinfo.list_jobs), and
   the ones that changed and may concern slurm-ft read in full;
2. **jobs first**, one ``scontrol show job`` each (a single-job RPC; ``squeue --jobs`` would ask
   for the whole queue), **then the nodes** (``sinfo --json``) when a job ended or was requeued,
   or every ``node_poll_s``: an epilog posts its verdict before its job leaves COMPLETING, so a job
   seen ended has its verdicts in the node mailboxes read after it; new mailbox records, and
   running ft jobs on a node a health check drained, add their jobs to the cycle;
3. unfinished actions are resumed (crash safety, :meth:`Effects.resume`), then each job is
   planned and acted on; an error with one job (a refused or timed-out command, a bug) is logged
   and that job retried later with a backoff, never stopping another job or the loop.

A cycle with nothing due asks Slurm nothing. A journal another process holds locked costs no
wait: writes go to its spool (slurm_ft.journal.store) and every decision still sees them.
"""

from __future__ import annotations

import logging
import re
import signal
import time

from ..errors import ConfigError, SlurmCommandError, SlurmFTError
from ..journal import open_daemon_journal
from ..slurm import Job, Slurm
from ..slurm import split_nodes as _split_nodes  # noqa: F401  (kept for importers)
from ..jobinfo import list_jobs
from . import machine, mailbox, policy
from .effects import Effects
from .events import EventSpool
from .machine import time_limit_s as _time_limit_s  # noqa: F401  (kept for importers)
from .options import trusted_options

log = logging.getLogger("slurm_ft.daemon")
#: Seconds a daemon journal write may wait for another process's lock before it is spooled.
JOURNAL_BUSY_S = 0.2
#: Routine reads one cycle makes at most (jobs a full scan found changed, starts and clean ends
#: the hook reported; the rest in the next cycles).
MAX_SCAN_READS = 50
#: A full scan (every job) every ``scan_interval_s``, but never more often than every SCAN_SHARE
#: times its own duration: a queue of 50,000 jobs makes one take seconds of slurmctld's time.
SCAN_SHARE = 20.0
#: Seconds a full scan may take (``squeue`` over the whole queue) before it is abandoned.
FULL_SCAN_TIMEOUT_S = 120.0
#: The ft token in a comment (job_submit.lua writes it first; legacy ``--comment=ft``).
FT_WORD = re.compile(r"(?:^|\s)ft(?::|\s|$)")
#: Seconds before a full scan that failed (slurmctld restarting, a timeout) is tried again.
FULL_SCAN_RETRY_S = 10.0
#: Longest pause (seconds) before a job whose handling failed is looked at again.
MAX_BACKOFF_S = 60.0
#: Actions after which the job's Slurm record has changed (planned again at once).
REQUEUES = (machine.Failover, machine.RequeueNotFault, machine.Release)


class Daemon:
    def __init__(self, cfg, slurm: Slurm | None = None, *, clock=time.time, events=None):
        self.cfg = cfg
        self.slurm = slurm or Slurm.from_config(cfg)
        self.clock = clock
        self.journal = open_daemon_journal(cfg, spool=True, busy_timeout_s=JOURNAL_BUSY_S)
        self.journal.clock = clock
        if cfg.failover.mode == "observe":   # every Slurm write through the gate, journaled (.observe)
            from .observe import ObservedJournal

            self.journal = ObservedJournal(self.journal)
            self.slurm.observe, self.slurm.observer = True, self.journal.observed
            log.warning("[failover] mode = observe: decisions are journaled and logged as observed; "
                        "nothing is changed in Slurm")
        fcfg = cfg.failover
        self.events = events if events is not None else (EventSpool(fcfg.events_dir) if fcfg.events_dir else None)
        self.effects = Effects(self)
        self._stop = False
        self.nodes: list = []
        self.top_priority = 0
        self.boosted: set[int] = self.journal.boosted_jobs()  # jobs slurm-ft set a priority for
        self.breaker_latched: str | None = None                # read from the journal each cycle
        self._watch: dict[int, float] = {}                     # job -> when to look at it again
        self._seen_ended: dict[tuple[int, int], float] = {}    # (job, attempt) -> first seen ended
        self._running: dict[int, tuple[str, int]] = {}        # ft job -> (nodes, attempt) while RUNNING
        self._priority: dict[int, int] = {}                    # job -> last priority > 0 seen
        self._gpus: dict[tuple[int, int], dict] = {}           # (job, attempt) -> node -> GPUs
        self._light: dict[int, tuple] = {}                     # job -> (state, reason, nodes) last seen
        self._backlog: dict[int, None] = {}
        self.bisect_proc = None                                # the bisect [bisect] auto started (Popen)                    # full-scan reads not done yet, in order
        self._ft: set[int] = self.journal.active_ft_jobs()     # ft jobs on record, not yet final
        self._seen_keys: set[tuple[str, str]] = set()          # mailbox records journaled
        self._health_looked: set[tuple[int, int, str]] = set()
        self._errors: dict[int, int] = {}                      # job -> consecutive failures
        self._backoff: dict[int, float] = {}                   # job -> not before
        self._next_scan = 0.0
        self._next_nodes = 0.0
        self._rows: list | None = None                         # this cycle's full scan, if any
        self.cycle_errors: list[str] = []                      # Slurm/journal trouble this cycle (logged, retried)

    # ------------------------------------------------------------------ loop
    def run(self, once: bool = False) -> None:
        from .. import daemonlock

        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        log.info("slurm-ft daemon started (journal %s, events %s)", self.journal.path,
                 getattr(self.events, "dir", None) or "none")
        while not self._stop:
            t0 = time.monotonic()
            ok = False
            try:
                self.cycle()
                ok = not self.cycle_errors
                if once and self.cycle_errors:
                    raise SlurmFTError(self.cycle_errors[0])   # `daemon --once` as a check: exit 1
            except SlurmFTError as exc:
                log.error("cycle failed: %s", exc)
                if once:
                    raise
            except Exception:  # a bug or an OS error must not crash-loop the daemon under systemd
                log.exception("cycle failed unexpectedly (retried next cycle)")
                if once:
                    raise
            finally:
                daemonlock.beat(self.cfg, ok=ok)
            if once:
                return
            time.sleep(max(0.0, self.cfg.failover.poll_interval_s - (time.monotonic() - t0)))
        log.info("slurm-ft daemon stopped")

    def cycle(self) -> None:
        """One pass (see the module doc)."""
        now = self.clock()
        fcfg = self.cfg.failover
        self._rows = None
        self.cycle_errors = []
        try:
            self.journal.flush()
            self.breaker_latched = self.journal.breaker_latched()  # `slurm-ft breaker reset` closes it
            intents = self.journal.pending_intents()
        except SlurmFTError as exc:
            log.error("journal: %s", exc)
            self.cycle_errors.append(f"journal: {exc}")
            intents = []
        full = fcfg.scan_interval_s == 0 or now >= self._next_scan
        targets: set[int] = set()
        if self.events is not None:
            for ev in self.events.read():
                if ev.routine:     # a start or a clean end: read after the others, within a budget
                    self._backlog.setdefault(ev.job_id, None)
                else:
                    targets.add(ev.job_id)
        targets |= {j for j, at in self._watch.items() if at <= now}
        targets |= {i["job_id"] for i in intents}
        targets = {j for j in targets if self._backoff.get(j, 0.0) <= now}
        # 1. jobs first ...
        if full:
            t_scan = time.monotonic()
            try:
                self._rows = list_jobs(self.slurm, timeout_s=max(FULL_SCAN_TIMEOUT_S, self.cfg.slurm.command_timeout_s))
            except SlurmFTError as exc:     # the full scan waits; this cycle's own jobs do not
                log.error("full scan: %s (retried in %g s)", exc, FULL_SCAN_RETRY_S)
                self.cycle_errors.append(f"full scan: {exc}")
                self._next_scan = now + FULL_SCAN_RETRY_S
                full = False
        jobs: dict[int, Job | None] = {}
        if full:
            self._backlog.update(dict.fromkeys(sorted(self._reconcile(self._rows) - targets)))
            # at most 1/SCAN_SHARE of the time in full scans, however long the queue
            self._next_scan = now + max(fcfg.scan_interval_s, SCAN_SHARE * (time.monotonic() - t_scan)) \
                if fcfg.scan_interval_s else now
            listed = {r.job_id for r in self._rows}
            jobs.update({j: None for j in targets if j not in listed})
        for jid in sorted(targets - set(jobs)):
            self._read(jid, jobs)
        for jid in jobs:
            self._backlog.pop(jid, None)
        # routine reads (a full scan's changes, starts, clean ends) come after those and are spread
        # over cycles: at most MAX_SCAN_READS and about one poll interval of reading per cycle, so
        # a fault never waits behind hundreds of them, however slow Slurm answers
        t_routine = time.monotonic()
        for jid in list(self._backlog)[:MAX_SCAN_READS]:
            if time.monotonic() - t_routine > fcfg.poll_interval_s:
                break
            del self._backlog[jid]
            if jid not in jobs and self._backoff.get(jid, 0.0) <= now:
                self._read(jid, jobs)
        # 2. ... then the nodes: an epilog posts before its job leaves COMPLETING
        fresh: set[int] = set()
        if full or now >= self._next_nodes or any(j is not None and j.state != "RUNNING" for j in jobs.values()):
            try:
                self.refresh_nodes()
                self._next_nodes = now + fcfg.node_poll_s
                fresh = self.ingest_mailboxes(self.nodes)
            except SlurmCommandError as exc:
                log.error("nodes: %s", exc)
                self.cycle_errors.append(f"nodes: {exc}")
            for jid in sorted((fresh | self._health_candidates()) - set(jobs)):
                if self._backoff.get(jid, 0.0) <= now:
                    self._read(jid, jobs)
        # 3. unfinished actions
        for intent in intents:
            jid = intent["job_id"]
            if jid not in jobs or self._backoff.get(jid, 0.0) > now:
                continue
            self._guarded(jid, lambda: self.effects.resume(intent, jobs[jid]))
        # 4. every job in this cycle, faults first: a burst of ordinary ends never delays a failover
        urgent = {jid for jid, job in jobs.items()
                  if jid in fresh or (job is not None and job.state in policy.FAILED_STATES)}
        for jid, job in sorted(jobs.items(), key=lambda kv: (kv[0] not in urgent, kv[0])):
            if job is None:
                self._forget(jid)
                continue
            if self._watch.get(jid, float("inf")) <= now:
                del self._watch[jid]
            self._guarded(jid, lambda: self.handle(job))

    def _reconcile(self, rows) -> set[int]:
        """The jobs of a full scan worth reading: those that changed since the last scan and may
        concern slurm-ft (an ft job, a job whose comment carries the ft token, a prolog refusal, a
        failed job not on record); forgets the jobs Slurm no longer lists."""
        self.top_priority = max((r.priority for r in rows if r.state in ("PENDING", "RUNNING")
                                 and r.job_id not in self.boosted), default=0)
        out = set()
        for r in rows:
            if r.priority:
                self._priority[r.job_id] = r.priority
            seen = (r.state, r.reason, r.nodes)
            if self._light.get(r.job_id) == seen:
                continue            # as the daemon last saw it (events keep ft jobs current)
            self._light[r.job_id] = seen
            if (r.job_id in self._ft or FT_WORD.search(r.comment)
                    or (r.state == "PENDING" and r.reason.startswith("launch_failed"))
                    or r.state in policy.FAILED_STATES):
                out.add(r.job_id)
        for gone in set(self._light) - {r.job_id for r in rows}:
            self._forget(gone)
        return out

    # ------------------------------------------------------------------ Slurm reads
    def _read(self, jid: int, jobs: dict) -> None:
        try:
            jobs[jid] = self.slurm.job(jid)
        except SlurmFTError as exc:
            log.error("job %s: %s", jid, exc)
            self._failed(jid)

    def refresh_nodes(self) -> None:
        self.nodes = self.slurm.nodes()

    def fresh_top_priority(self, exclude: int) -> int:
        """Highest priority of the pending/running jobs slurm-ft did not boost, read now (one
        light full read, for a prolog refusal: a fault) unless this cycle read every job already."""
        rows = self._rows if self._rows is not None else list_jobs(
            self.slurm, timeout_s=max(FULL_SCAN_TIMEOUT_S, self.cfg.slurm.command_timeout_s))
        return max((r.priority for r in rows if r.state in ("PENDING", "RUNNING") and r.job_id != exclude
                    and r.job_id not in self.boosted), default=0)

    def priority_seen(self, job_id: int) -> int:
        """The last priority above 0 the daemon saw the job have (0: never seen)."""
        return self._priority.get(job_id, 0)

    def _health_candidates(self) -> set[int]:
        """Running ft jobs on nodes a health check drained, not yet looked at for it."""
        out = set()
        drained = {n.name: n.reason for n in self.nodes if machine.health_drain(n) is not None}
        if not drained:
            return out
        for jid, (nodes, attempt) in self._running.items():
            for name in _split_nodes(nodes):
                if name in drained and (jid, attempt, drained[name]) not in self._health_looked:
                    self._health_looked.add((jid, attempt, drained[name]))
                    out.add(jid)
        return out

    # ------------------------------------------------------------------ mailboxes
    def ingest_mailboxes(self, nodes) -> set[int]:
        """Journal the new verdict records of the node mailbox fields; returns their job ids."""
        field = self.cfg.failover.mailbox_field.lower()
        fresh: set[int] = set()
        for node in nodes:
            for rec in mailbox.parse(getattr(node, field, ""), node.name):
                seen = (node.name, rec.key)
                if seen in self._seen_keys:
                    continue
                if not self.journal.mailbox_seen(*seen):
                    self.journal.add_node_verdict(rec.on(node.name, "mailbox"))
                    self.journal.mark_mailbox_seen(*seen)
                    log.info("verdict job %s attempt %s on %s: %s (%s)", rec.job_id, rec.attempt, node.name,
                             rec.verdict, rec.rule)
                    fresh.add(rec.job_id)
                self._seen_keys.add(seen)
        return fresh

    # ------------------------------------------------------------------ per job
    def handle(self, job: Job, replan: bool = False) -> None:
        """Plan and act for one job."""
        now = self.clock()
        self._light[job.job_id] = (job.state, job.reason, job.nodes)
        facts = self.facts(job, now)
        view = machine.View(now, {n.name: n for n in self.nodes}, self.cfg.failover, self.top_priority,
                            poll_s=self.cfg.failover.poll_interval_s, bisect_auto=self.cfg.bisect.auto)
        actions = machine.plan(job, facts, view)
        for action in actions:
            self.effects.apply(job, action, facts.opts)
        if any(isinstance(a, REQUEUES) for a in actions) and not replan:
            # the job moved (requeued, released): its next step (StartTime=now once out of
            # COMPLETING) is planned from a fresh record now, not a poll interval later
            fresh = self.slurm.job(job.job_id)
            if fresh is not None:
                return self.handle(fresh, replan=True)
        self._errors.pop(job.job_id, None)
        self._backoff.pop(job.job_id, None)

    def facts(self, job: Job, now: float) -> machine.Facts:
        """The journal's rows and the daemon's observations of ``job`` (first sight: its ft
        options are recorded, slurm_ft.failover.options)."""
        if job.priority:
            self._priority[job.job_id] = job.priority
        try:
            opts, error = trusted_options(job, self.journal, self.cfg.failover), None
        except ConfigError as exc:
            opts, error = None, str(exc)
        enabled = opts is not None and opts.enabled
        if enabled:
            self._ft.add(job.job_id)
        if enabled and job.state == "RUNNING":
            self._running[job.job_id] = (job.nodes, job.restart_count)
        else:
            self._running.pop(job.job_id, None)
        key = (job.job_id, job.restart_count)
        if job.ended:
            self._seen_ended.setdefault(key, now)
        j = self.journal
        row = j.job(job.job_id)
        needs_rows = enabled or (job.state == "PENDING" and job.restart_count > 0)
        return machine.Facts(
            job.job_id, row=row,
            actions=tuple(j.actions(job.job_id)) if needs_rows else (),
            verdicts=tuple(j.node_verdicts(job.job_id)) if needs_rows else (),
            attempts=tuple(j.attempts(job.job_id)) if enabled else (),
            opts=opts if enabled else None, opts_error=error, seen_ended=self._seen_ended.get(key),
            gpus=self._job_gpus(job) if enabled else None, priority_seen=self._priority.get(job.job_id, 0))

    def _job_gpus(self, job: Job) -> dict | None:
        """GPUs the job holds per node, asked of Slurm once per attempt, only when a health check
        drained one of its nodes for one GPU."""
        if job.state != "RUNNING":
            return None
        nodes = {n.name: n for n in self.nodes}
        if not any((machine.health_drain(nodes.get(name)) or (None, None))[1] is not None
                   for name in _split_nodes(job.nodes)):
            return None
        key = (job.job_id, job.restart_count)
        if key not in self._gpus:
            self._gpus[key] = {k: frozenset(v) for k, v in self.slurm.job_gpus(job.job_id).items()}
        return self._gpus[key]

    def wake(self, job_id: int, at: float) -> None:
        """Look at the job again at ``at`` (or sooner)."""
        self._watch[job_id] = min(self._watch.get(job_id, float("inf")), at)

    def _guarded(self, jid: int, fn) -> None:
        try:
            fn()
        except SlurmFTError as exc:
            log.error("job %s: %s", jid, exc)
            self._failed(jid)
        except Exception:  # a bug with one job must not stop failover for every other job
            log.exception("job %s: internal error (retried later)", jid)
            self._failed(jid)

    def _failed(self, jid: int) -> None:
        """Look at a job whose handling failed again later: 1, 2, 4 ... 60 s (bounded calls)."""
        n = self._errors.get(jid, 0) + 1
        self._errors[jid] = n
        at = self.clock() + min(MAX_BACKOFF_S, 2.0 ** (n - 1))
        self._backoff[jid] = at
        self.wake(jid, at)

    def _forget(self, jid: int) -> None:
        for d in (self._light, self._watch, self._running, self._priority, self._errors, self._backoff,
                  self._backlog):
            d.pop(jid, None)
        self._ft.discard(jid)
        self._seen_ended = {k: v for k, v in self._seen_ended.items() if k[0] != jid}
        self._gpus = {k: v for k, v in self._gpus.items() if k[0] != jid}
