"""Property-based stateful tests of the requeue daemon against the in-memory Slurm (issue 14).

Hypothesis drives random interleavings of: jobs submitted, started, ending with a hardware /
user / infra verdict or cleanly; node epilogs posting before, after or long after the daemon
sees the end (or never: the post waits in the node's outbox and comes much later); the daemon
killed at any Slurm call (before or after it took effect) and restarted; any scontrol call
refused or timing out (before or after taking effect); slurmctld restarting; a reader holding
the daemon journal locked; lost nodes; owners holding their jobs; time passing.

Invariants, checked after every step:
- no job is requeued twice for one attempt (Slurm's own count, in the fake);
- no attempt has two ``failover`` rows in the journal (one decision per attempt);
- bounded Slurm calls per job per minute;
- a cycle never raises (a refused or timed-out call, a failed full scan, a locked journal: logged,
  retried later; ``run()`` would survive even that).

And at the end, after the faults are lifted and time passes (quiescence): every hardware verdict
of an ft job was acted on exactly once (a failover or a final decision, never none, never two),
and every job that got a failover runs again or is pending only for a reason that is not
slurm-ft's (held by its owner, no resources).

Budget: ``SLURM_FT_STATEFUL_EXAMPLES`` x ``SLURM_FT_STATEFUL_STEPS`` (default 60 x 50: about
15-30 s on a 2-core machine; raise them for a longer search).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from daemon_world import INFRA, USER, XID79, World
from slurm_ft.failover import mailbox
from fake_slurm import Crash

EXAMPLES = int(os.environ.get("SLURM_FT_STATEFUL_EXAMPLES", "60"))
STEPS = int(os.environ.get("SLURM_FT_STATEFUL_STEPS", "50"))
#: Mutating Slurm calls one job may cost in any minute (failover: drain, requeue, update,
#: StartTime, AdminComment; resumed after crashes; retried with a backoff after refusals).
CALLS_PER_JOB_PER_MINUTE = 40
NODES = 6
VERDICTS = {"hardware": XID79, "user": USER, "infra": INFRA}


class DaemonStateMachine(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    def __init__(self):
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="slurm-ft-stateful-"))
        self.w = World(self.tmp, nodes=NODES)
        self.slurm = self.w.slurm
        self.hardware: dict[tuple[int, int], str] = {}   # (job, attempt) -> node, posted to Slurm
        self.outbox: list[mailbox.Record] = []            # posts that failed: sent much later
        self.lock = None
        self.alive = True
        self.poisoned: set[int] = set()
        self.kills = 0
        self.reused: dict[int, int] = {}                  # job id -> times a new job took it (id reuse)
        self.saves: list[tuple[int, dict]] = []          # slurmctld's saved states, newest last (rollback)
        self.rollbacks = 0
        self.rolled_hw: list[tuple[int, int]] = []        # hardware faults a rollback purged or erased
        self.retired_hw: list[tuple[int, int]] = []       # hardware faults (job, attempt) of purged jobs

    def teardown(self):
        try:
            if self.lock is not None:
                self.lock.rollback()
                self.lock.close()
            self.w.daemon.journal.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ the world
    @initialize(target=jobs)
    def first_jobs(self):
        jids = [self.slurm.submit(retries=r) for r in (1, 2, 3)]
        self.slurm.schedule()
        return jids[0]

    @rule(target=jobs, ft=st.booleans(), retries=st.integers(0, 3), requeue=st.booleans())
    def submit(self, ft, retries, requeue):
        jid = self.slurm.submit(ft=ft, retries=retries, requeue=requeue or ft)
        self.slurm.schedule()
        return jid

    def _running(self) -> list[int]:
        return sorted(j.job_id for j in self.slurm.jobs_by_id.values() if j.state == "RUNNING")

    @precondition(lambda self: self._running())
    @rule(data=st.data(), when=st.sampled_from(["now", "later", "outbox"]))
    def hardware_fault(self, data, when):
        self._end(data.draw(st.sampled_from(self._running())), "hardware", when)

    @precondition(lambda self: self._running())
    @rule(data=st.data(), kind=st.sampled_from(["hardware", "user", "infra", "clean", "silent"]),
          when=st.sampled_from(["now", "later", "outbox"]))
    def job_ends(self, data, kind, when):
        self._end(data.draw(st.sampled_from(self._running())), kind, when)

    def _end(self, jid, kind, when):
        job = self.slurm.jobs_by_id[jid]
        node = job.nodes[0]
        verdicts = {node: VERDICTS[kind]} if kind in VERDICTS and when != "outbox" else {}
        if kind == "hardware" and when != "outbox":
            self.hardware[(jid, job.restart)] = node
        if kind in VERDICTS and when == "outbox":
            v, rule_, xids = VERDICTS[kind]
            self.outbox.append(mailbox.Record(jid, job.restart, v, rule_, xids, 1, self.slurm.clock()).on(node))
        self.slurm.end(jid, "COMPLETED" if kind == "clean" else "FAILED", 0 if kind == "clean" else 1,
                       verdicts=verdicts, epilogs=when == "now")

    @rule()
    def epilogs_finish(self):
        self.slurm.run_epilogs()

    @precondition(lambda self: self.outbox)
    @rule()
    def outbox_flushed(self):
        """A later prolog/epilog on the node sends what an earlier post could not."""
        rec = self.outbox.pop(0)
        if rec.verdict == "hardware":
            self.hardware[(rec.job_id, rec.attempt)] = rec.node
        self.slurm.post(rec.node, rec)

    def _purgeable(self) -> list[int]:
        """Ended jobs Slurm may purge, as it does MinJobAge (>= 300 s) after the end: epilogs done,
        every post in and read by the daemon, its record (if any) final."""
        from slurm_ft.failover import policy

        j = self.w.daemon.journal
        posted = {(n.name, rec.job_id, rec.key) for n in self.slurm.node_recs.values()
                  for rec in mailbox.parse(getattr(n, self.slurm.mailbox_field.lower(), ""), n.name)}
        out = []
        for job in self.slurm.jobs_by_id.values():
            if not job.ended or job.completing or job.job_id in self.poisoned or \
                    any(r.job_id == job.job_id for r in self.outbox):
                continue
            if not all(j.mailbox_seen(node, key) for node, jid, key in posted if jid == job.job_id):
                continue
            row = j.job(job.job_id)
            if row is None or row["ft_state"] in policy.FINAL_STATES:
                out.append(job.job_id)
        return sorted(out)

    def _ended(self) -> list[int]:
        return sorted(j.job_id for j in self.slurm.jobs_by_id.values() if j.ended and j.job_id not in self.poisoned
                      and not any(r.job_id == j.job_id for r in self.outbox))

    @precondition(lambda self: self.lock is None and self.alive and not self.outbox and not self.rollbacks
                  and self._ended())
    @rule(data=st.data(), retries=st.integers(0, 3))
    def job_id_reused(self, data, retries):
        """An ended job is purged and a new ft job gets its id (after a state loss, or when the
        id sequence wraps at MaxJobId): the new job must get its own record and its own
        decisions, the old record kept apart (slurm_ft.journal.identity), never merged."""
        jid = data.draw(st.sampled_from(self._ended()))
        for _ in range(5):              # MinJobAge: time passes before Slurm purges it
            self.slurm.run_epilogs()
            self.slurm.clock.advance(20.0)
            self.slurm.schedule()
            self._cycle()
        if jid not in self._purgeable():
            event("job id reuse: not purgeable yet")
            return
        self.slurm.purge(jid)
        self.retired_hw += [k for k in self.hardware if k[0] == jid]
        self.hardware = {k: v for k, v in self.hardware.items() if k[0] != jid}
        self.reused[jid] = self.reused.get(jid, 0) + 1
        self.slurm.clock.advance(1.0)
        self.slurm.submit(retries=retries, job_id=jid)
        self.slurm.schedule()

    @rule(dt=st.sampled_from([0.1, 0.5, 0.5, 1.0, 3.0, 30.0, 130.0]))
    def time_passes(self, dt):
        self.slurm.clock.advance(dt)
        self.slurm.schedule()
        self._cycle()

    @rule(n=st.integers(1, 4))
    def daemon_cycles(self, n):
        for _ in range(n):
            self.slurm.clock.advance(0.5)
            self.slurm.schedule()
            self._cycle()

    @rule(k=st.integers(1, 3), after=st.booleans())
    def daemon_killed_at_a_call(self, k, after):
        self.slurm.crash_at = (self.slurm.mutations + k, after)

    @rule(verb=st.sampled_from(["requeue", "update", "release", "hold", "show"]), after=st.booleans())
    def daemon_killed_at_the_next(self, verb, after):
        self.slurm.crash_on = (lambda cmd, args, v=verb: cmd == "scontrol" and args[:1] == (v,), after)

    @precondition(lambda self: not self.alive)
    @rule()
    def daemon_restarts(self):
        self.w.restart_daemon()
        self.alive = True

    @precondition(lambda self: self.alive)
    @rule()
    def daemon_restarts_cleanly(self):
        self.w.restart_daemon()

    @rule(verb=st.sampled_from(["requeue", "update", "release", "hold", "show", None]),
          mode=st.sampled_from(["refuse", "timeout-before", "timeout-after"]), count=st.integers(1, 3))
    def slurm_call_fails(self, verb, mode, count):
        self.slurm.fail(lambda cmd, args, v=verb: cmd == "scontrol" and (v is None or args[:1] == (v,)), count, mode)

    @rule(cmd=st.sampled_from(["squeue", "sinfo"]), count=st.integers(1, 2))
    def slurm_read_fails(self, cmd, count):
        self.slurm.fail(lambda c, args, want=cmd: c == want, count, "timeout-before")

    @rule(down_s=st.sampled_from([0.5, 2.0, 10.0]))
    def slurmctld_restarts(self, down_s):
        self.slurm.restart_ctld(down_s)

    # ------------------------------------------------------------------ slurmctld state rollback (issue 20)
    def _save_state(self):
        """slurmctld saves its state (StateSaveLocation) as time goes on: the last few are kept
        for :meth:`slurmctld_loses_state`, tagged with the id reuses so far (a rollback never
        brings back a job whose id another rule handed out again since)."""
        self.saves = [*self.saves[-5:], (sum(self.reused.values()), self.slurm.saved_state())]

    def _saves(self) -> list[dict]:
        reuses = sum(self.reused.values())
        return [st_ for n, st_ in self.saves if n == reuses]

    @precondition(lambda self: not self.reused and self._saves())   # explored apart from id reuse (H2)
    @rule(data=st.data(), down_s=st.sampled_from([0.5, 2.0, 10.0]))
    def slurmctld_loses_state(self, data, down_s):
        """slurmctld crashes and restarts from a state saved some cycles earlier: requeues, drains,
        mailbox records and jobs since are lost (FakeSlurm._roll_back). The daemon must redo what
        Slurm lost once (slurm_ft.failover.reconcile), never twice."""
        saves = self._saves()
        state = saves[data.draw(st.integers(0, len(saves) - 1))]
        self.slurm.restart_ctld(down_s, state=state)
        self.rollbacks += 1
        self.saves = []
        j = self.w.daemon.journal
        for key, node in list(self.hardware.items()):
            jid, attempt = key
            job = self.slurm.jobs_by_id.get(jid)
            field = getattr(self.slurm.node_recs[node], self.slurm.mailbox_field.lower())
            kept = any(v["node"] == node for v in j.verdicts(jid, attempt)) or any(
                r.job_id == jid and r.attempt == attempt for r in mailbox.parse(field, node)) or (
                job is not None and job.restart == attempt and node in job.verdicts)
            if job is None or not kept:
                # purged with its job, or erased from the node's field before the daemon read it
                # (a node re-posts nothing it sent successfully: not a reconciliation of Slurm's)
                self.rolled_hw.append(key)
                del self.hardware[key]

    def _check_rollbacks_reconciled(self, j):
        """After rollbacks: every node slurm-ft drained is drained in Slurm (nobody resumes nodes
        here, so no drain is ever taken as lifted); every failover the journal holds is in Slurm's
        timeline (the job's restart count passed the attempt) or the job is gone and booked final."""
        from slurm_ft.failover import policy, reconcile

        event(f"slurmctld state rollbacks: {min(self.rollbacks, 3)}")
        if not self.rollbacks:
            return
        kinds = {reconcile.parse_detail(a["detail"]).get("kind") for a in j.actions_named(("reconcile",))}
        for kind in sorted(k for k in kinds if k):
            event(f"reconciled: {kind}")
        facts = reconcile.drain_facts(j.actions_named(("drain", "reconcile")))
        for node, fact in facts.items():
            assert fact["kind"] != reconcile.DRAIN_LIFTED, (node, fact)
            assert self.slurm.node_recs[node].drain, (node, fact)
        refused = {int(args[1]) for _, args, _ in self.slurm.fault_hits if args[:1] == ("requeue",)}
        for (jid, attempt) in [*self.hardware, *self.rolled_hw]:
            if jid in self.poisoned or jid in self.reused or jid in refused:
                continue
            row = j.job(jid)
            if row is None or not row["ft_enabled"]:
                continue
            done = [a for a in j.actions(jid, attempt) if a["action"] == "failover" and a["status"] == "done"]
            job = self.slurm.jobs_by_id.get(jid)
            if job is None:
                assert row["ft_state"] in policy.FINAL_STATES, (jid, row["ft_state"])
            elif done:
                assert job.restart > attempt, (jid, attempt, job)

    @precondition(lambda self: self.lock is None)
    @rule()
    def journal_locked(self):
        self.lock = self.w.lock()

    @precondition(lambda self: self.lock is not None)
    @rule()
    def journal_unlocked(self):
        self.lock.rollback()
        self.lock.close()
        self.lock = None

    @rule(i=st.integers(1, NODES))
    def node_lost(self, i):
        if sum(r.down for r in self.slurm.node_recs.values()) < NODES // 2:
            self.slurm.node_fail(f"n{i}")

    @rule(i=st.integers(1, NODES))
    def node_back(self, i):
        self.slurm.node_up(f"n{i}")

    @rule(jid=jobs)
    def owner_holds(self, jid):
        job = self.slurm.jobs_by_id.get(jid)
        if job is not None and job.state == "PENDING" and not job.completing:
            job.held, job.priority, job.reason = "user", 0, "JobHeldUser"

    @rule(jid=jobs)
    def owner_releases(self, jid):
        job = self.slurm.jobs_by_id.get(jid)
        if job is not None and job.held == "user":
            job.held, job.priority, job.reason = "", self.slurm._priority(), "None"

    @precondition(lambda self: len(self.poisoned) < 1)
    @rule(jid=jobs)
    def one_job_always_fails(self, jid):
        """Every call about one job is refused from now on: it must not delay any other job."""
        self.poisoned.add(jid)
        self.slurm.fail(lambda cmd, args, j=jid: str(j) in args or f"JobId={j}" in args, 10**6, "refuse")

    # ------------------------------------------------------------------ the daemon
    def _cycle(self):
        self._save_state()
        if not self.alive:
            return
        try:
            self.w.daemon.cycle()
        except Crash:
            self.alive = False           # SIGKILL: nothing of it runs any more until restarted
            self.kills += 1
            self.slurm.crash_at = None
        # anything else fails the test: a cycle never raises, whatever Slurm or the journal do

    # ------------------------------------------------------------------ invariants
    @invariant()
    def never_requeued_twice_for_one_attempt(self):
        assert all(n <= 1 for n in self.slurm.requeues.values()), self.slurm.requeues

    @invariant()
    def every_requeue_was_decided_for_that_attempt(self):
        """slurm-ft requeues an attempt only after deciding so for that very attempt (journaled
        first, spool included): never a later attempt by mistake, e.g. when resuming after a crash."""
        j = self.w.daemon.journal
        for jid, attempt, by in self.slurm.requeue_log:
            if by != "scontrol":
                continue
            acts = j.actions(jid, attempt)
            assert any(a["action"] in ("failover", "evacuation", "continue") for a in acts), \
                (jid, attempt, [(a["action"], a["status"]) for a in acts])

    @invariant()
    def one_failover_per_attempt(self):
        with self.w.journal() as j:
            seen = j.db.execute("SELECT job_id, attempt, count(*) FROM actions WHERE action = 'failover' "
                                "GROUP BY job_id, attempt HAVING count(*) > 1").fetchall()
        spooled = [op for op in self.w.daemon.journal._pending
                   if op["table"] == "actions" and op["op"] == "insert" and op["row"]["action"] == "failover"]
        keys = [(op["row"]["job_id"], op["row"]["attempt"]) for op in spooled]
        assert not seen and len(keys) == len(set(keys)), (seen, keys)

    @invariant()
    def bounded_calls_per_job_per_minute(self):
        now = self.slurm.clock()
        recent: dict[int, int] = {}
        for c in reversed(self.slurm.calls):
            if c.t < now - 60:
                break
            if c.job_id is not None and c.cmd == "scontrol" and c.args and c.args[0] != "show" \
                    and c.job_id not in self.poisoned:
                recent[c.job_id] = recent.get(c.job_id, 0) + 1
        assert all(n <= CALLS_PER_JOB_PER_MINUTE for n in recent.values()), recent

    # ------------------------------------------------------------------ quiescence: liveness
    def check_every_hardware_verdict_acted_on_once(self):
        if self.lock is not None:
            self.lock.rollback()
            self.lock.close()
            self.lock = None
        self.slurm.faults = [f for f in self.slurm.faults if f.count >= 10**5]   # the poisoned job stays
        self.slurm.down_until = 0.0
        self.slurm.crash_at = self.slurm.crash_on = None
        for rec in self.outbox:
            if rec.verdict == "hardware":
                self.hardware[(rec.job_id, rec.attempt)] = rec.node
            self.slurm.post(rec.node, rec)
        self.outbox = []
        for r in self.slurm.node_recs.values():
            r.down, r.state = False, "IDLE"
        if not self.alive:
            self.w.restart_daemon()
            self.alive = True
        for _ in range(60):
            self.slurm.run_epilogs()
            self.slurm.clock.advance(3.0)
            self.slurm.schedule()
            self._cycle()
        event(f"hardware faults: {min(len(self.hardware), 5)}")
        event(f"requeues: {min(len(self.slurm.requeue_log), 5)}")
        event(f"daemon killed: {self.kills > 0}")
        with self.w.journal() as j:
            self._check_reused_ids_never_merged(j)
            self._check_rollbacks_reconciled(j)
            for (jid, attempt), node in self.hardware.items():
                if jid in self.poisoned:
                    continue
                row = j.job(jid)
                if row is None or not row["ft_enabled"]:
                    continue
                acts = j.actions(jid, attempt)
                failovers = [a for a in acts if a["action"] == "failover"]
                finals = [a for a in acts if a["action"] == "decide"
                          and a["detail"].split(":")[0] in ("max-retries-exceeded", "cancelled", "held", "completed")]
                assert len(failovers) <= 1
                assert failovers or finals, (jid, attempt, [(a["action"], a["detail"], a["status"]) for a in acts])
                assert self.slurm.requeues.get((jid, attempt), 0) <= 1
                if failovers and failovers[0]["status"] != "done":
                    # only a requeue Slurm refused (an injected fault) may leave a failover undone
                    assert any(args[:2] == ("requeue", str(jid)) for _, args, _ in self.slurm.fault_hits), \
                        (jid, attempt, failovers[0]["detail"])
                if failovers and failovers[0]["status"] == "done":
                    job = self.slurm.jobs_by_id.get(jid)
                    if job is not None and job.restart == attempt + 1 and job.state == "PENDING" \
                            and not job.completing and not job.held and job.priority:
                        # pending only for want of nodes, never on slurm-ft's account
                        assert job.eligible <= self.slurm.clock() or job.reason == "BeginTime"


    def _check_reused_ids_never_merged(self, j):
        """A reused id's current record holds only the new job's failovers (Slurm's requeues of
        it), and each hardware fault of a purged job was acted on in a retired record of its id."""
        from slurm_ft.journal import identity

        event(f"job ids reused: {min(sum(self.reused.values()), 3)}")
        retired = identity.retired(j)
        for jid in self.reused:
            if jid in self.poisoned:
                continue
            requeued = sum(n for (k, _), n in self.slurm.requeues.items() if k == jid)
            assert j.failovers_done(jid) <= requeued, (jid, j.failovers_done(jid), requeued)
        for jid, attempt in self.retired_hw:
            keys = [k for k, r in retired.items() if r["job_id"] == jid]
            acted = [k for k in keys for a in j.actions(k, attempt) if a["action"] in ("failover", "decide")]
            row = next((j.job(k) for k in keys if j.job(k)), None)
            assert acted or row is None or not row["ft_enabled"], (jid, attempt, keys)


class QuiescentDaemonStateMachine(DaemonStateMachine):
    def teardown(self):
        try:
            self.check_every_hardware_verdict_acted_on_once()
        finally:
            super().teardown()


QuiescentDaemonStateMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
test_daemon_state_machine = QuiescentDaemonStateMachine.TestCase
