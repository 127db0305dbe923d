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
   reconciliation: every job, light (one ``squeue -o`` listing, slurm_ft.slurm.jobinfo.list_jobs), and
   the ones that changed and may concern slurm-ft read in full;
2. **jobs first**, one ``scontrol show job`` each (a single-job RPC; ``squeue --jobs`` would ask
   for the whole queue), **then the nodes** (``sinfo --json``) when a job ended or was requeued,
   or every ``node_poll_s``: an epilog posts its verdict before its job leaves COMPLETING, so a job
   seen ended has its verdicts in the node mailboxes read after it; new mailbox records, and
   running ft jobs on a node a health check drained, add their jobs to the cycle;
3. unfinished actions are resumed (crash safety, :meth:`Effects.resume`), then each job is
   planned and acted on; an error with one job (a refused or timed-out command, a bug) is logged
   and that job retried later with a backoff, never stopping another job or the loop.

With a backup controller a daemon runs on each controller host and only the one whose slurmctld
is in control runs cycles (:mod:`.leader`; a takeover starts with a full scan). A cycle with
nothing due asks Slurm nothing. A journal another process holds locked costs no
wait: writes go to its spool (slurm_ft.journal.store) and every decision still sees them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import signal
import time

from slurm_ft.checkpoint import channel
from slurm_ft.errors import ConfigError, SlurmCommandError, SlurmFTError
from slurm_ft.journal import open_daemon_journal
from slurm_ft.slurm import Job, Slurm, split_nodes
from slurm_ft.slurm.jobinfo import list_jobs
from slurm_ft.journal import identity
from slurm_ft.failover import machine, mailbox, policy
from slurm_ft.failover.effects import RESUMED_ACTS, Effects
from slurm_ft.failover.intent import recover as recover_failover
from slurm_ft.failover.events import EventSpool
from slurm_ft.failover.reconcile import Reconciler
from slurm_ft.failover.options import trusted_options

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
#: After a job's failure end event (slurmctld's hook, exit status not 0), that job is looked at
#: every FOLLOW_POLL_S seconds for FOLLOW_WINDOW_S (its epilog ending, its requeue leaving
#: COMPLETING, StartTime=now taking), at most FOLLOW_MAX jobs at a time: a fault's next step is
#: seen within tens of ms, not a poll interval later. Each such look is one single-job read (the
#: node list only once the job has left COMPLETING): a cost per failure, never per queue.
FOLLOW_POLL_S = 0.05
FOLLOW_WINDOW_S = 3.0
FOLLOW_MAX = 4
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
            from slurm_ft.failover.observe import ObservedJournal

            self.journal = ObservedJournal(self.journal)
            self.slurm.observe, self.slurm.observer = True, self.journal.observed
            log.warning("[failover] mode = observe: decisions are journaled and logged as observed; "
                        "nothing is changed in Slurm")
        fcfg = cfg.failover
        self.events = events if events is not None else (EventSpool(fcfg.events_dir) if fcfg.events_dir else None)
        self.effects = Effects(self)
        self.reconciler = Reconciler(self)                     # journal vs Slurm after a controller restart
        self.remediator = None                                 # [remediate] break-fix (slurm_ft.remediate)
        if getattr(getattr(cfg, "remediate", None), "enabled", False):
            from slurm_ft.remediate.actions import Remediator

            self.remediator = Remediator(self)
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
        self._backlog: dict[int, None] = {}                    # routine reads not done yet, in order
        self.bisect_proc = None                                # the bisect [bisect] auto started (Popen)
        self._ft: set[int] = self.journal.active_ft_jobs()     # ft jobs on record, not yet final
        self._seen_keys: set[tuple] = set()                    # mailbox records journaled (node, key, time)
        self._renewed_ids: set[int] = set()                    # (identity, reset each cycle)
        self._identity_checked: set[int] = set()
        self._health_looked: set[tuple[int, int, str]] = set()
        self._errors: dict[int, int] = {}                      # job -> consecutive failures
        self._backoff: dict[int, float] = {}                   # job -> not before
        self._next_scan = 0.0
        self._next_nodes = 0.0
        self._nodes_at = float("-inf")     # clock() when the node list in self.nodes was read
        self._rows: list | None = None                         # this cycle's full scan, if any
        self.cycle_errors: list[str] = []                      # Slurm/journal trouble this cycle (logged, retried)
        self.leader = None                                     # .leader.Leader once the controllers are known
        self._discover_at = 0.0                                # next `scontrol show config` try for it
        self._waker = None                                     # .wake.EventWatch once the loop sleeps
        self._follow: dict[int, float] = {}                    # job -> followed closely until (FOLLOW_*)
        self._early = False                                    # this cycle came before the poll interval
        self._regular_at = 0.0                                 # when the next regular cycle is due (monotonic)

    # ------------------------------------------------------------------ loop
    def run(self, once: bool = False) -> None:
        from slurm_ft.failover import daemonlock

        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        from slurm_ft.failover.effects import warm

        warm()     # the first failover after a start pays no imports
        log.info("slurm-ft daemon started (journal %s, events %s)", self.journal.path,
                 getattr(self.events, "dir", None) or "none")
        while not self._stop:
            t0 = time.monotonic()
            ok = False
            try:
                if self._leading():    # a standby daemon (backup controller not in control) waits
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
            self._pause(t0)
        if getattr(self.journal, "unwritten", 0):   # a full disk: last try, else the count is logged
            self.journal.close()                     # (failovers stay in AdminComment: .intent)
        log.info("slurm-ft daemon stopped")

    def _pause(self, t0: float) -> None:
        """Sleep until the next regular cycle (``poll_interval_s`` after the last regular one
        began; ``t0``: this cycle's start, monotonic), ended early when slurmctld's hook drops a
        job-end event (slurm_ft.failover.wake: inotify on ``events_dir``; a plain sleep without
        it) or a followed job's next look is due (FOLLOW_*); never less than ``wake.MIN_GAP_S``
        after t0."""
        from slurm_ft.failover import wake

        if self._waker is None:
            self._waker = wake.EventWatch(getattr(self.events, "dir", None))
            if self._waker.fd is None:
                log.info("events: no inotify wake-up (%s): events are read every poll", self._waker.why_not)
        elapsed = time.monotonic() - t0
        if elapsed < wake.MIN_GAP_S:
            time.sleep(wake.MIN_GAP_S - elapsed)
        if not self._early:          # the cycle just run was a regular one: the next is a poll later
            self._regular_at = t0 + self.cfg.failover.poll_interval_s
        left = self._regular_at - time.monotonic()
        now = self.clock()
        due = min((self._watch[j] for j, until in self._follow.items()
                   if until > now and self._watch.get(j, 0.0) > now), default=None)
        by_due = due is not None and due - now < left    # a followed job's next look comes first
        woken = self._waker.wait(max(0.0, due - now if by_due else left))
        # an early cycle (an event, a followed job) reads only what is due; a flood of them never
        # delays the regular cycle past its time
        self._early = woken or by_due

    def _leading(self) -> bool:
        """Whether this daemon acts now: its host's slurmctld is in control (slurm_ft.failover.leader;
        always with one controller). A takeover starts from a full scan and the journal."""
        from slurm_ft.failover import leader

        if self.leader is None and time.monotonic() >= self._discover_at:
            self.leader = leader.discover(self.slurm)
            self._discover_at = time.monotonic() + leader.DISCOVER_RETRY_S
        if self.leader is None:
            return True
        active, changed = self.leader.check()
        if active and changed:   # what it knew while standing by (or before) may be stale
            self._light.clear()
            self._seen_keys.clear()
            self._next_scan = self._next_nodes = 0.0
            self._ft = self.journal.active_ft_jobs()
            self.boosted = self.journal.boosted_jobs()
        return active

    def cycle(self) -> None:
        """One pass (see the module doc): the journal, which jobs, the jobs read (those due, then
        the routine ones), the nodes, the journal against Slurm, unfinished actions resumed, every
        job read planned and acted on. Slurm trouble is logged and kept in :attr:`cycle_errors`
        (``daemon --once`` exits 1 on it); a failing job is logged and retried later
        (:meth:`_failed`). What else raises (a journal write outside a job's handling, such as a
        mailbox verdict, SlurmFTError; a bug) ends the cycle, and :meth:`run` logs it."""
        now = self.clock()
        had_errors = self._begin_cycle()
        intents = self._read_journal()
        full = self._scan_due(now, had_errors)
        targets = self._targets(now, intents)
        if full:
            full = self._full_scan(now, targets)
        jobs = self._read_targets(targets, full)
        self._read_routine(now, jobs)
        fresh = self._read_nodes(now, jobs, full)
        self.reconciler.after_reads(self._rows if full else None)   # journal vs Slurm (.reconcile)
        resumed = self._resume(now, intents, jobs)
        self._plan_jobs(now, jobs, fresh, resumed)

    def _begin_cycle(self) -> bool:
        """Forget the last cycle's scan rows, renewed ids, identity checks and errors; returns
        whether the last cycle had errors (then a controller restart is looked for)."""
        self._rows = None
        self._renewed_ids = set()                    # ids a new job took this cycle (identity)
        self._identity_checked = set()               # ids checked against Slurm this cycle
        had_errors, self.cycle_errors = bool(self.cycle_errors), []
        return had_errors

    def _read_journal(self) -> list[dict]:
        """Flush the journal's spool, read the breaker's latch into :attr:`breaker_latched` and
        return the unfinished actions (``pending_intents`` rows: dicts with ``job_id``,
        ``action``, ...). A journal that fails (SlurmFTError) is logged, kept in
        :attr:`cycle_errors` and read as no intents; never raises."""
        try:
            self.journal.flush()
            self.breaker_latched = self.journal.breaker_latched()  # `slurm-ft breaker reset` closes it
            return self.journal.pending_intents()
        except SlurmFTError as exc:
            log.error("journal: %s", exc)
            self.cycle_errors.append(f"journal: {exc}")
            return []

    def _scan_due(self, now: float, had_errors: bool) -> bool:
        """Whether this cycle reads every job: ``scan_interval_s`` is 0, the next scan's time
        (``now``, epoch seconds) came, or slurmctld restarted (asked of the reconciler only when
        a scan is due or the last cycle had errors; slurm_ft.failover.reconcile)."""
        full = self.cfg.failover.scan_interval_s == 0 or now >= self._next_scan
        if self.reconciler.ctld_restarted(full or had_errors):
            full = True                # slurmctld restarted: reconcile now (slurm_ft.failover.reconcile)
        return full

    def _targets(self, now: float, intents: list[dict]) -> set[int]:
        """The job ids read first this cycle: failure end events (each followed closely,
        FOLLOW_*), jobs whose wake-up time (``now`` or earlier, epoch seconds) came and jobs with
        an unfinished action, less those backing off. Routine events (a start, a clean end) go to
        the backlog instead (:meth:`_read_routine`). Reads the event spool."""
        targets: set[int] = set()
        if self.events is not None:
            for ev in self.events.read():
                if ev.routine:     # a start or a clean end: read after the others, within a budget
                    self._backlog.setdefault(ev.job_id, None)
                else:
                    targets.add(ev.job_id)
                    self._follow_failure(ev.job_id, now)
        targets |= {j for j, at in self._watch.items() if at <= now}
        targets |= {i["job_id"] for i in intents}
        return {j for j in targets if self._backoff.get(j, 0.0) <= now}

    def _full_scan(self, now: float, targets: set[int]) -> bool:
        """List every job (one ``squeue``, at most FULL_SCAN_TIMEOUT_S or the Slurm command
        timeout) into :attr:`_rows`, queue the changed ones that may concern slurm-ft and are not
        in ``targets`` in the backlog (:meth:`_reconcile`) and set the next scan's time: at least
        ``scan_interval_s`` and SCAN_SHARE times this scan's duration after ``now`` (epoch
        seconds). Returns False when the listing failed (SlurmFTError: logged, kept in
        :attr:`cycle_errors`, retried FULL_SCAN_RETRY_S later); never raises it."""
        fcfg = self.cfg.failover
        t_scan = time.monotonic()
        try:
            self._rows = list_jobs(self.slurm, timeout_s=max(FULL_SCAN_TIMEOUT_S, self.cfg.slurm.command_timeout_s))
        except SlurmFTError as exc:     # the full scan waits; this cycle's own jobs do not
            log.error("full scan: %s (retried in %g s)", exc, FULL_SCAN_RETRY_S)
            self.cycle_errors.append(f"full scan: {exc}")
            self._next_scan = now + FULL_SCAN_RETRY_S
            return False
        self._backlog.update(dict.fromkeys(sorted(self._reconcile(self._rows) - targets)))
        # at most 1/SCAN_SHARE of the time in full scans, however long the queue
        self._next_scan = now + max(fcfg.scan_interval_s, SCAN_SHARE * (time.monotonic() - t_scan)) \
            if fcfg.scan_interval_s else now
        return True

    def _read_targets(self, targets: set[int], full: bool) -> dict[int, Job | None]:
        """Read each of ``targets`` (one ``scontrol show job`` each, in id order; a job a full
        scan this cycle did not list is None without a read); returns job id -> Job, or None for
        a job Slurm no longer has. A failed read is logged and backs that job off (absent from
        the result). The jobs read leave the backlog."""
        jobs: dict[int, Job | None] = {}
        if full:
            listed = {r.job_id for r in self._rows}
            jobs.update({j: None for j in targets if j not in listed})
        for jid in sorted(targets - set(jobs)):
            self._read(jid, jobs)
        for jid in jobs:
            self._backlog.pop(jid, None)
        return jobs

    def _read_routine(self, now: float, jobs: dict[int, Job | None]) -> None:
        """Read backlog jobs (a full scan's changes, starts, clean ends) into ``jobs``, oldest
        first: at most MAX_SCAN_READS (none in an early cycle) and for about ``poll_interval_s``
        seconds, so a fault never waits behind hundreds of them, however slow Slurm answers. A
        job already in ``jobs`` or backing off at ``now`` (epoch seconds) leaves the backlog
        unread."""
        t_routine = time.monotonic()
        for jid in list(self._backlog)[:0 if self._early else MAX_SCAN_READS]:   # early: faults only
            if time.monotonic() - t_routine > self.cfg.failover.poll_interval_s:
                break
            del self._backlog[jid]
            if jid not in jobs and self._backoff.get(jid, 0.0) <= now:
                self._read(jid, jobs)

    def _read_nodes(self, now: float, jobs: dict[int, Job | None], full: bool) -> set[int]:
        """Read the node list when due (a full scan, ``node_poll_s`` passed, or a job read this
        cycle not RUNNING: an epilog posts before its job leaves COMPLETING; an early cycle skips
        it while its jobs are COMPLETING), journal the new mailbox verdicts, let the remediator
        scan the nodes, and read into ``jobs`` the jobs those verdicts name and the running ft
        jobs on a health-drained node. Returns the ids of the jobs with new verdicts. A failed
        node read (SlurmCommandError) is logged and kept in :attr:`cycle_errors`; a journal
        error (SlurmFTError) raises."""
        fresh: set[int] = set()
        # (an early cycle, for a followed fault, skips the node list while its jobs are COMPLETING)
        if full or now >= self._next_nodes or any(j is not None and j.state != "RUNNING"
                                                  and not (self._early and j.completing) for j in jobs.values()):
            try:
                self.refresh_nodes()
                self._next_nodes = now + self.cfg.failover.node_poll_s
                fresh = self.ingest_mailboxes(self.nodes)
                if self.remediator is not None:    # before reconcile: a repaired node's resume is ours
                    self.remediator.scan(self.nodes)
            except SlurmCommandError as exc:
                log.error("nodes: %s", exc)
                self.cycle_errors.append(f"nodes: {exc}")
            for jid in sorted((fresh | self._health_candidates()) - set(jobs)):
                if self._backoff.get(jid, 0.0) <= now:
                    self._read(jid, jobs)
        elif self._early and self.cfg.failover.handoff_wait_s > 0:
            fresh = self._peek_mailboxes(jobs)
        return fresh

    def _peek_mailboxes(self, jobs: dict[int, Job | None]) -> set[int]:
        """In an early cycle, with the hand-off on (``[failover] handoff_wait_s``): the mailbox of
        the one node of each followed 1-node job still COMPLETING (``scontrol show node N``, one
        RPC per job: never the node list), so that its epilog's verdict is seen while the epilog
        runs and the failover is decided before the job leaves COMPLETING
        (machine._decide_completing). Returns the ids of jobs with new verdicts; a refused read
        is logged at debug level (the next look, or the node list after COMPLETING, finds the
        verdict)."""
        from types import SimpleNamespace

        field = self.cfg.failover.mailbox_field
        peek = []
        for jid, job in jobs.items():
            names = split_nodes(job.nodes) if job is not None and job.completing and jid in self._follow else []
            if len(names) == 1:
                try:
                    rec = self.slurm.show_node(names[0])
                except SlurmCommandError as exc:
                    log.debug("job %s: mailbox of %s not read: %s", jid, names[0], exc)
                    continue
                peek.append(SimpleNamespace(name=names[0], **{field.lower(): rec.get(field, "")}))
        return self.ingest_mailboxes(peek) if peek else set()

    def _resume(self, now: float, intents: list[dict], jobs: dict[int, Job | None]) -> set[int]:
        """Resume each unfinished action (``intents``) whose job was read this cycle, is not
        backing off at ``now`` (epoch seconds) and whose id no new job took (:meth:`Effects.resume`,
        crash safety; an error is logged and backs the job off). Returns the ids of the jobs a
        resumed action changed (RESUMED_ACTS): planned next cycle, from a fresh read."""
        resumed: set[int] = set()
        for intent in intents:
            jid = intent["job_id"]
            if jid not in jobs or self._backoff.get(jid, 0.0) > now or jid in self._renewed_ids:
                continue
            self._guarded(jid, lambda: self.effects.resume(intent, jobs[jid]))
            if intent["action"] in RESUMED_ACTS:     # it changed the job: planned next cycle, fresh
                resumed.add(jid)
        return resumed

    def _plan_jobs(self, now: float, jobs: dict[int, Job | None], fresh: set[int], resumed: set[int]) -> None:
        """Plan and act on every job of ``jobs`` (:meth:`handle`), faults first (new verdicts in
        ``fresh``, a failed state), then in id order: a burst of ordinary ends never delays a
        failover. A job Slurm no longer has (None) is forgotten; one backing off is skipped; one
        in ``resumed`` is woken for the next cycle instead. An error with one job is logged and
        backs it off (never raises)."""
        urgent = {jid for jid, job in jobs.items()
                  if jid in fresh or (job is not None and job.state in policy.FAILED_STATES)}
        for jid, job in sorted(jobs.items(), key=lambda kv: (kv[0] not in urgent, kv[0])):
            if job is None:
                self._forget(jid)
                continue
            if self._watch.get(jid, float("inf")) <= now:
                del self._watch[jid]
            if self._backoff.get(jid, 0.0) > self.clock():
                continue     # its resumed action failed just now (e.g. a refused requeue): later
            if jid in resumed and job is not None:
                # read before its resumed action changed it (a requeue done now): planned from a
                # fresh read next cycle, never from this one (it would look like a requeue Slurm lost)
                self.wake(jid, self.clock())
                continue
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
            job = self.slurm.job(jid)
            if job is not None and identity.observe(self.journal, job) is not None:
                self._renewed(jid)     # a new job with a used id: the old record was retired
            self._identity_checked.add(jid)
            jobs[jid] = job
        except SlurmFTError as exc:
            log.error("job %s: %s", jid, exc)
            self._failed(jid)

    def _check_identity(self, jid: int) -> None:
        """Check Slurm's job ``jid`` against the journal's record of the id (identity), once a
        cycle, before a node verdict about it is journaled; if Slurm cannot be asked, the verdict
        is filed by its time alone (identity.record_for)."""
        if jid in self._identity_checked:
            return
        try:
            job = self.slurm.job(jid)
            if job is not None and identity.observe(self.journal, job) is not None:
                self._renewed(jid)
            self._identity_checked.add(jid)
        except SlurmFTError as exc:
            log.error("job %s: %s", jid, exc)

    def _renewed(self, jid: int) -> None:
        """Job id ``jid`` now names another job (slurm_ft.journal.identity): forget what was known
        of the old one; its intents read this cycle are not resumed."""
        log.warning("job %s: a new job with a used job id; the old job's record was retired "
                    "(ft-history -j %s shows both)", jid, jid)
        self._forget(jid)
        self.boosted.discard(jid)
        self._renewed_ids.add(jid)
        self._seen_keys = {k for k in self._seen_keys if not k[1].startswith(f"{jid}.")}  # mailbox keys: job.attempt

    def refresh_nodes(self) -> None:
        """Read the node list (``scontrol show nodes``) into :attr:`nodes`; raises
        SlurmCommandError."""
        at = self.clock()
        self.nodes = self.slurm.nodes()
        self._nodes_at = at

    def _nodes_predate(self, job: Job) -> bool:
        """The node view may be older than the running job's start while it shows one of the
        job's nodes health-drained: a drain lifted before the job started there (the node list is
        read every ``[failover] node_poll_s``, the jobs every cycle). Slurm's StartTime is whole
        seconds, so a view read within the start's second is not proof either."""
        if job.state != "RUNNING" or not job.start_time or self._nodes_at >= job.start_time + 1:
            return False
        view = {n.name: n for n in self.nodes}
        return any(machine.health_drain(view.get(name)) is not None for name in split_nodes(job.nodes))

    def fresh_top_priority(self, exclude: int) -> int:
        """Highest priority of the pending/running jobs slurm-ft did not boost, read now (one
        light full read, for a prolog refusal: a fault) unless this cycle read every job already."""
        rows = self._rows if self._rows is not None else list_jobs(
            self.slurm, timeout_s=max(FULL_SCAN_TIMEOUT_S, self.cfg.slurm.command_timeout_s))
        return max((r.priority for r in rows if r.state in ("PENDING", "RUNNING") and r.job_id != exclude
                    and r.job_id not in self.boosted), default=0)

    def boost_base(self, job: Job) -> int:
        """The priority a failed-over job is boosted above (``[failover] priority_boost``): the
        highest pending/running job slurm-ft did not boost, read now (:meth:`fresh_top_priority`:
        the last full scan may be a minute old, from before the jobs now waiting came or had their
        priority raised), the job itself included unless slurm-ft boosted it already (a boost
        never ratchets)."""
        own = 0 if job.job_id in self.boosted else max(job.priority or 0, self.priority_seen(job.job_id))
        return max(self.fresh_top_priority(exclude=job.job_id), own)

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
            for name in split_nodes(nodes):
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
                mem = (node.name, rec.key, rec.time)   # one record exactly: a reused job id repeats keys
                if mem in self._seen_keys:
                    continue
                key, seen = self._mailbox_target(node.name, rec)
                if not self.journal.mailbox_seen(*seen) and key == rec.job_id:
                    self._check_identity(rec.job_id)     # a new job with a used id: its own record
                    key, seen = self._mailbox_target(node.name, rec)
                if not self.journal.mailbox_seen(*seen):
                    v = rec.on(node.name, "mailbox")
                    self.journal.add_node_verdict(v if key == v.job_id else dataclasses.replace(v, job_id=key))
                    self.journal.mark_mailbox_seen(*seen)
                    log.info("verdict job %s attempt %s on %s: %s (%s)%s", rec.job_id, rec.attempt, node.name,
                             rec.verdict, rec.rule, "" if key == rec.job_id else " (an earlier job with this id)")
                    if key == rec.job_id:
                        fresh.add(rec.job_id)
                self._seen_keys.add(mem)
        return fresh

    def _mailbox_target(self, node: str, rec) -> tuple[int, tuple[str, str]]:
        """(journal record a node post belongs to, its ``mailbox_seen`` key): the current job of
        the id, or, for a post made before that job was submitted, the earlier job's retired
        record, seen under ``JOB.ATTEMPT@KEY`` (slurm_ft.journal.identity.record_for)."""
        key = identity.record_for(self.journal, rec.job_id, rec.time)
        return key, (node, rec.key if key == rec.job_id else f"{rec.key}@{key}")

    # ------------------------------------------------------------------ per job
    def handle(self, job: Job, replan: bool = False) -> None:
        """Plan and act for one job."""
        now = self.clock()
        self._light[job.job_id] = (job.state, job.reason, job.nodes)
        if self._nodes_predate(job):
            # a health drain acts on a running job only from a node read newer than the job
            # (its evacuation kills the attempt): read the nodes again, now, after the job's read
            try:
                self.refresh_nodes()
            except SlurmCommandError as exc:
                log.error("nodes: %s (job %s planned next cycle)", exc, job.job_id)
                self.cycle_errors.append(f"nodes: {exc}")
                self._watch[job.job_id] = now + self.cfg.failover.poll_interval_s
                return None
        facts = self.facts(job, now)
        fresh = None if replan else self.reconciler.redo(job, facts)   # Slurm lost a requeue: redone
        if fresh is not None:
            return self.handle(fresh, replan=True)
        view = machine.View(now, {n.name: n for n in self.nodes}, self.cfg.failover, self.top_priority,
                            poll_s=FOLLOW_POLL_S if self._follow.get(job.job_id, 0.0) > now
                            else self.cfg.failover.poll_interval_s, bisect_auto=self.cfg.bisect.auto)
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
        if enabled and job.restart_count > 0:
            recover_failover(j, job)   # a failover the journal lost (not writable), from the AdminComment
        row = j.job(job.job_id)
        needs_rows = enabled or (job.state == "PENDING" and job.restart_count > 0)
        return machine.Facts(
            job.job_id, row=row,
            actions=tuple(j.actions(job.job_id)) if needs_rows else (),
            verdicts=tuple(j.node_verdicts(job.job_id)) if needs_rows else (),
            attempts=tuple(j.attempts(job.job_id)) if enabled else (),
            opts=opts if enabled else None, opts_error=error, seen_ended=self._seen_ended.get(key),
            gpus=self._job_gpus(job) if enabled else None, priority_seen=self._priority.get(job.job_id, 0),
            ack=channel.find(job.comment) if enabled else None)

    def _job_gpus(self, job: Job) -> dict | None:
        """GPUs the job holds per node, asked of Slurm once per attempt, only when a health check
        drained one of its nodes for one GPU."""
        if job.state != "RUNNING":
            return None
        nodes = {n.name: n for n in self.nodes}
        if not any((machine.health_drain(nodes.get(name)) or (None, None))[1] is not None
                   for name in split_nodes(job.nodes)):
            return None
        key = (job.job_id, job.restart_count)
        if key not in self._gpus:
            self._gpus[key] = {k: frozenset(v) for k, v in self.slurm.job_gpus(job.job_id).items()}
        return self._gpus[key]

    def _follow_failure(self, job_id: int, now: float) -> None:
        """Look at ``job_id`` every FOLLOW_POLL_S for FOLLOW_WINDOW_S (a failure end event),
        unless FOLLOW_MAX other jobs are followed already."""
        self._follow = {j: until for j, until in self._follow.items() if until > now}
        if job_id in self._follow or len(self._follow) < FOLLOW_MAX:
            self._follow[job_id] = now + FOLLOW_WINDOW_S

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
        for d in (self._light, self._watch, self._running, self._priority, self._errors, self._backoff, self._follow,
                  self._backlog):
            d.pop(jid, None)
        self._ft.discard(jid)
        self._seen_ended = {k: v for k, v in self._seen_ended.items() if k[0] != jid}
        self._gpus = {k: v for k, v in self._gpus.items() if k[0] != jid}
