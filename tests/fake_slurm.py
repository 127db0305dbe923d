"""An in-memory Slurm with the semantics the lab measured (shared/SLURM_LAB_NOTES.md, 22.05), for
the daemon's unit and property-based tests. It answers the calls slurm-ft makes through
:class:`slurm_ft.slurm.Slurm` (same method names, same record types, same errors) and lets a test
drive the world: submit, schedule, end a job (COMPLETING while its node epilogs run), post a node
verdict into the node's mailbox field, lose a node, refuse or time out a call, restart slurmctld.

Measured behaviour modelled here:

- every requeue sets the eligible time to now + 121 s (:data:`REQUEUE_DELAY_S`); a job requeued
  while running or completing stays COMPLETING until its epilogs finish, and that end sets the
  delay again (a ``StartTime=now`` sent while COMPLETING is overwritten);
- ``scontrol requeue`` keeps the job id and its priority and bumps the restart count; a job
  submitted ``--no-requeue`` is refused (``Requested operation is presently disabled``);
- a finished job refuses updates (``Job has already finished``); it is forgotten ``MinJobAge``
  (600 s) after its end;
- hold: priority 0; release: a fresh priority below every job submitted so far (priority/basic:
  ``requeuehold`` + ``release`` sends a job to the back of the queue);
- a prolog failure requeues the job held (``launch_failed_requeued_held``, priority 0, +121 s);
- a lost node (NODE_FAIL): its running requeueable jobs are requeued by Slurm (+121 s), others
  end ``NODE_FAIL``; no epilog runs there; the node is DOWN + NOT_RESPONDING, and with
  ``failed_node=True`` (Slurm >= 23.02, e.g. 24.11) the job's record names it (``FailedNode=``,
  ``failed_node``) until the job starts again; 22.05 (the default) names none;
- ``squeue --json`` (``jobs()``) is one full job-info RPC whatever its filter; ``scontrol show job
  J`` (``job()``) is a single-job RPC; ``sinfo --json`` (``nodes()``) a node and a partition RPC.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field

from slurm_ft.errors import SlurmCommandError
from slurm_ft.failover import mailbox
from slurm_ft.slurm import Job, Node, Slurm, compress_nodes, split_nodes

REQUEUE_DELAY_S = 121.0
MIN_JOB_AGE_S = 600.0
FIRST_PRIORITY = 4294901760
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
MUTATING = ("update", "requeue", "requeuehold", "release", "hold")


class Crash(BaseException):
    """Stands for SIGKILL of the daemon: raised inside a Slurm call, caught by nothing in slurm-ft."""


class FakeEvents:
    """The Prolog/EpilogSlurmctld hook's events of a :class:`FakeSlurm` (ft jobs only, as the hook
    filters), in the daemon's :class:`slurm_ft.failover.events.EventSpool` interface."""

    def __init__(self, slurm: "FakeSlurm", lose: float = 0.0):
        self.slurm = slurm

    def read(self) -> list:
        from slurm_ft.failover.events import Event
        out = []
        for ctx, job_id, restart, nodes in self.slurm.events:
            job = self.slurm.jobs_by_id.get(job_id)
            if job is not None and job.comment.startswith("ft"):
                start = ctx.startswith("prolog")
                # the hook's SLURM_JOB_EXIT_CODE: the job's wait status (0 after a requeue that
                # left it untouched, as a NODE_FAIL requeue may)
                out.append(Event("start" if start else "end", job_id, restart, nodes,
                                 None if start else job.exit_status))
        self.slurm.events.clear()
        return out


class FakeClock:
    """Epoch seconds that move only when told (``advance``)."""

    def __init__(self, start: float = 1_800_000_000.0):
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@dataclass
class FakeJob:
    job_id: int
    name: str
    user: str
    uid: int
    comment: str
    admin_comment: str
    requeue: bool
    priority: int
    submit: float
    state: str = "PENDING"
    reason: str = "None"
    nodes: list[str] = field(default_factory=list)
    restart: int = 0
    exit_status: int = 0
    start: float = 0.0
    end: float = 0.0
    eligible: float = 0.0
    excluded: set[str] = field(default_factory=set)
    required: list[str] = field(default_factory=list)
    node_count: int = 1
    time_limit_min: int | None = None
    held: str = ""                      # "", "user", "admin"
    dependency: str = ""                # "afterok:J" or ""
    completing: set[str] = field(default_factory=set)   # nodes whose epilog has not finished
    catches_signal: bool = True
    #: verdict records an epilog of the current attempt will post: node -> mailbox.Record
    verdicts: dict[str, mailbox.Record] = field(default_factory=dict)
    failed_node: str = ""               # Slurm >= 23.02: the node whose failure ended the attempt

    @property
    def ended(self) -> bool:
        return self.state in ENDED


@dataclass
class FakeNode:
    name: str
    state: str = "IDLE"
    drain: bool = False
    reason: str = ""
    reason_by: str = ""
    reason_time: float = 0.0
    extra: str = ""
    comment: str = ""
    down: bool = False


@dataclass
class Call:
    t: float
    cmd: str
    args: tuple
    job_id: int | None
    rpc: tuple[str, ...]


@dataclass
class Fault:
    """An injected failure: the next ``count`` calls matching ``match(cmd, args)`` fail."""
    match: object
    count: int
    mode: str     # refuse | timeout-before | timeout-after


class FakeSlurm:
    def __init__(self, nodes: int | list[str] = 4, clock: FakeClock | None = None, *, partition: str = "gpu",
                 mailbox_field: str = "Extra", mailbox_keep: int = 16, failed_node: bool = False):
        self.clock = clock or FakeClock()
        self.failed_node = failed_node   # print FailedNode (Slurm >= 23.02) in job records
        names = [f"n{i}" for i in range(1, nodes + 1)] if isinstance(nodes, int) else list(nodes)
        self.node_recs: dict[str, FakeNode] = {n: FakeNode(n) for n in names}
        self.partition = partition
        self.jobs_by_id: dict[int, FakeJob] = {}
        self.next_id = 1
        self.next_prio = FIRST_PRIORITY
        self.calls: list[Call] = []
        self.faults: list[Fault] = []
        self.down_until = 0.0
        self.crash_at: tuple[int, bool] | None = None   # (n-th mutating call, after it took effect)
        self.crash_on: tuple[object, bool] | None = None  # (match(cmd, args), after): the next such call
        self.mutations = 0
        self.requeues: dict[tuple[int, int], int] = {}   # (job, attempt) -> requeues of that attempt
        self.requeue_log: list[tuple[int, int, str]] = []  # (job, attempt, "scontrol" | "node_fail")
        self.retired_requeues: list[tuple[tuple[int, int], int]] = []  # requeues of purged jobs (purge)
        self.mailbox_field = mailbox_field
        self.mailbox_keep = mailbox_keep
        self.events: list[tuple[str, int, int, str]] = []   # (context, job, restart count, nodes)
        self.timeout_s = 10.0
        self.hooks: list[tuple[object, object]] = []     # (match(cmd, args), fn): run once before a call
        self.fault_hits: list[tuple[str, tuple, str]] = []  # calls an injected fault hit
        self.observed: list[list[str]] = []               # writes the observe gate held back
        self.booted = self.clock() - 3600.0               # slurmctld's start time (BOOT_TIME)
        self.starts: list[tuple[int, int, float]] = []    # (job, restart count, when): every start, never rolled back

    def on(self, match, fn) -> None:
        """Run ``fn()`` (once) just before the next call matching ``match(cmd, args)`` is answered:
        something happening in the world between two of the daemon's reads."""
        self.hooks.append((match, fn))

    # ================================================================== the world (test driver)
    def submit(self, *, ft: bool = True, retries: int = 3, requeue: bool = True, user: str = "alice",
               uid: int = 1000, name: str = "train", hold: bool = False, dependency: str = "",
               time_limit_min: int | None = None, exclude=(), required=(), node_count: int = 1,
               comment: str | None = None, catches_signal: bool = True, job_id: int | None = None) -> int:
        """A new job; ``job_id``: that id (handed out again when the id sequence wraps at MaxJobId,
        or after a state loss), which must be free (the old job purged: :meth:`purge`)."""
        if job_id is not None:
            assert job_id not in self.jobs_by_id, f"job id {job_id} is in use"
            jid = job_id
        else:
            jid = self.next_id
            self.next_id += 1
        if comment is None:
            comment = f"ft:retries={retries},ckpt_signal=USR1,ckpt_wait=60,hang_timeout=0" if ft else "plain"
        admin = f"slurm-ft:submitted {comment.split()[0]}" if comment.startswith("ft:") else ""
        job = FakeJob(jid, name, user, uid, comment, admin, requeue, self._priority(), self.clock(),
                      eligible=self.clock(), excluded=set(exclude), required=list(required), node_count=node_count,
                      time_limit_min=time_limit_min, dependency=dependency, catches_signal=catches_signal)
        if hold:
            job.held, job.priority, job.reason = "user", 0, "JobHeldUser"
        self.jobs_by_id[jid] = job
        return jid

    def _priority(self) -> int:
        p = self.next_prio
        self.next_prio -= 1
        return p

    def _free(self) -> list[str]:
        busy = {n for j in self.jobs_by_id.values() if j.state == "RUNNING" or j.completing for n in j.nodes}
        return [n for n, r in self.node_recs.items() if not (r.drain or r.down) and n not in busy]

    def schedule(self) -> list[int]:
        """One scheduling pass: start every eligible pending job that fits, highest priority first."""
        started = []
        now = self.clock()
        self.forget_old()
        pending = sorted((j for j in self.jobs_by_id.values() if j.state == "PENDING" and not j.completing),
                         key=lambda j: (-j.priority, j.job_id))
        for job in pending:
            if job.held or job.priority == 0 or job.eligible > now:
                job.reason = job.reason if job.held or job.priority == 0 else "BeginTime"
                continue
            if job.dependency:
                dep = self.jobs_by_id.get(int(job.dependency.split(":")[1]))
                if dep is None or dep.state != "COMPLETED":
                    job.reason = "Dependency"
                    continue
            free = [n for n in self._free() if n not in job.excluded and (not job.required or n in job.required)]
            if len(free) < job.node_count:
                job.reason = "Resources"
                continue
            job.state, job.reason, job.nodes, job.start = "RUNNING", "None", free[:job.node_count], now
            job.failed_node = ""
            job.end, job.exit_status, job.verdicts = 0.0, 0, {}
            self.starts.append((job.job_id, job.restart, now))
            self.events.append(("prolog_slurmctld", job.job_id, job.restart, compress_nodes(job.nodes)))
            started.append(job.job_id)
        return started

    def end(self, job_id: int, state: str = "FAILED", exit_code: int = 1, verdicts: dict | None = None,
            epilogs: bool = False) -> None:
        """The job ends (its processes exit): ``state`` with COMPLETING while node epilogs run.
        ``verdicts``: node -> (verdict, rule, xids) the epilog on that node will post (non-ok only),
        ``epilogs``: run them at once."""
        job = self.jobs_by_id[job_id]
        assert job.state == "RUNNING", job
        job.state, job.end = state, self.clock()
        job.exit_status = (exit_code & 0xFF) << 8
        job.reason = "NonZeroExitCode" if exit_code else "None"
        job.completing = set(job.nodes)
        for node, (verdict, rule, xids) in (verdicts or {}).items():
            job.verdicts[node] = mailbox.Record(job_id, job.restart, verdict, rule, tuple(xids), exit_code,
                                                self.clock())
        self.events.append(("epilog_slurmctld", job_id, job.restart, compress_nodes(job.nodes)))
        if epilogs:
            self.run_epilogs(job_id)

    def run_epilogs(self, job_id: int | None = None, node: str | None = None) -> None:
        """Finish the pending node epilogs (of one job / on one node / all): each posts its verdict
        to the node's mailbox field, as slurm_ft.node.epilog does; the job leaves COMPLETING with the last."""
        for job in list(self.jobs_by_id.values()):
            if job_id is not None and job.job_id != job_id:
                continue
            for n in sorted(job.completing):
                if node is not None and n != node:
                    continue
                rec = job.verdicts.pop(n, None)
                if rec is not None:
                    self.post(n, rec)
                job.completing.discard(n)
            if not job.completing and job.state == "PENDING" and job.restart > 0 and job.nodes:
                job.eligible = self.clock() + REQUEUE_DELAY_S   # the requeue delay, again, at the end
                job.nodes = []

    def post(self, node: str, rec: mailbox.Record) -> None:
        """A node epilog/prolog appends a verdict record to its mailbox field (one writer per node)."""
        r = self.node_recs[node]
        records = [*mailbox.parse(r.extra if self.mailbox_field == "Extra" else r.comment), rec]
        text = mailbox.render(records, self.mailbox_keep)
        if self.mailbox_field == "Extra":
            r.extra = text
        else:
            r.comment = text

    def drain_by_node(self, node: str, reason: str) -> None:
        """A node-side drain (epilog, prolog, health check)."""
        r = self.node_recs[node]
        if r.reason and not r.reason.startswith("slurm-ft:"):
            return
        r.drain, r.reason, r.reason_by, r.reason_time = True, reason, "root", self.clock()

    def prolog_fail(self, job_id: int, check: str = "gpu-count", drain: bool = True) -> None:
        """The node prolog's health check refuses the node of a just-started job: it drains the
        node, posts a ``health:`` verdict and exits 1; Slurm requeues the job held."""
        job = self.jobs_by_id[job_id]
        assert job.state == "RUNNING"
        node = job.nodes[0]
        if drain:
            self.drain_by_node(node, f"slurm-ft: {check}: GPU0 missing")
        self.post(node, mailbox.Record(job_id, job.restart, "hardware", f"health:{check}", (), None, self.clock()))
        job.state, job.reason, job.priority, job.held = "PENDING", "launch_failed_requeued_held", 0, ""
        job.restart += 1
        job.eligible = self.clock() + REQUEUE_DELAY_S
        job.completing = set()
        job.nodes = []
        self.events.append(("epilog_slurmctld", job_id, job.restart, node))

    def node_fail(self, node: str) -> None:
        """slurmd stops answering: the node goes DOWN; Slurm requeues its requeueable jobs."""
        r = self.node_recs[node]
        r.down, r.state = True, "DOWN"
        if not r.reason:
            r.reason, r.reason_by, r.reason_time = "Not responding", "slurm", self.clock()
        for job in self.jobs_by_id.values():
            if job.state == "RUNNING" and node in job.nodes:
                job.end = self.clock()
                job.failed_node = node
                if job.requeue:
                    self._count_requeue(job, "node_fail")
                    job.state, job.reason, job.restart = "PENDING", "BeginTime", job.restart + 1
                    job.eligible = self.clock() + REQUEUE_DELAY_S
                    job.completing = set(job.nodes) - {node}
                    if not job.completing:
                        job.nodes = []
                else:
                    job.state, job.reason = "NODE_FAIL", "NodeDown"
                    job.completing = set(job.nodes) - {node}
                self.events.append(("epilog_slurmctld", job.job_id, job.restart, compress_nodes(job.nodes or [node])))

    def node_up(self, node: str) -> None:
        r = self.node_recs[node]
        r.down, r.state = False, "IDLE"
        if r.reason == "Not responding":
            r.reason = ""

    def ack(self, job_id: int, state: str = "saved", step: int = 10) -> None:
        """The job writes a checkpoint ack into its comment (slurm_ft.checkpoint.channel)."""
        from slurm_ft.checkpoint import channel
        job = self.jobs_by_id[job_id]
        job.comment = channel.merge(job.comment, channel.Ack(state, job.restart, step, self.clock(), "/ckpt"))

    def purge(self, job_id: int) -> None:
        """The ended job leaves slurmctld's memory now (MinJobAge passed) and its id may be handed
        out again (:meth:`submit` with ``job_id``); Slurm's requeue counts of the old job go with
        it (to ``retired_requeues``: a new job with the id starts its own)."""
        job = self.jobs_by_id.pop(job_id)
        assert job.ended and not job.completing, job
        self.retired_requeues += [(k, n) for k, n in self.requeues.items() if k[0] == job_id]
        self.requeues = {k: n for k, n in self.requeues.items() if k[0] != job_id}
        self.requeue_log = [e for e in self.requeue_log if e[0] != job_id]

    def forget_old(self) -> None:
        now = self.clock()
        for jid in [j.job_id for j in self.jobs_by_id.values()
                    if j.ended and not j.completing and now - j.end > MIN_JOB_AGE_S]:
            del self.jobs_by_id[jid]

    def restart_ctld(self, down_s: float = 5.0, state: dict | None = None) -> None:
        """slurmctld restarts: every call fails until it is back, with a new start time
        (``BOOT_TIME``). Its state is kept (StateSaveLocation), or, with ``state`` (a
        :meth:`saved_state` taken earlier), rolled back to it, as a crash that lost the last
        writes does (:meth:`_roll_back`)."""
        self.down_until = self.clock() + down_s
        self.booted = self.down_until
        if state is not None:
            self._roll_back(state)

    def saved_state(self) -> dict:
        """What slurmctld would have saved in StateSaveLocation now: jobs, nodes (drains, reasons,
        ``Extra``), and Slurm's own requeue counts (part of the job records)."""
        import copy

        return copy.deepcopy({"jobs": self.jobs_by_id, "nodes": self.node_recs, "requeues": self.requeues,
                              "next_prio": self.next_prio})

    def _roll_back(self, state: dict) -> None:
        """Restore ``state`` (measured on 22.05, issue 20): jobs submitted since are gone (purged;
        job ids are not handed out again here: that is another rule), drains and mailbox records
        since are lost, and a job the saved state shows RUNNING whose attempt no longer runs there
        (it was requeued, ended or moved since) ends ``FAILED`` (``JobLaunchFailure``: slurmd does not
        know it) with no epilog verdict; the copy started since is killed (it is not in the state)."""
        import copy

        old = copy.deepcopy(state)
        for jid, j in old["jobs"].items():
            cur = self.jobs_by_id.get(jid)
            if j.state == "RUNNING" and (cur is None or cur.state != "RUNNING" or cur.restart != j.restart
                                         or cur.nodes != j.nodes):
                j.state, j.reason, j.end, j.exit_status = "FAILED", "JobLaunchFailure", self.down_until, 1 << 8
                j.completing, j.verdicts = set(), {}
                self.events.append(("epilog_slurmctld", jid, j.restart, compress_nodes(j.nodes)))
        self.jobs_by_id, self.node_recs, self.requeues = old["jobs"], old["nodes"], old["requeues"]
        self.next_prio = min(self.next_prio, old["next_prio"])

    def boot_time(self) -> float | None:
        """slurmctld's start time (``scontrol show config``: one RPC)."""
        after = self._enter("scontrol", ("show", "config"), None, ("REQUEST_BUILD_INFO",))
        self._leave(after, "scontrol")
        return self.booted

    def fail(self, match=lambda cmd, args: True, count: int = 1, mode: str = "refuse") -> None:
        self.faults.append(Fault(match, count, mode))

    # ================================================================== plumbing
    def _enter(self, cmd: str, args: tuple, job_id: int | None, rpc: tuple[str, ...]) -> str | None:
        """Log the call, apply injected faults; returns a mode to apply after the effect."""
        self.calls.append(Call(self.clock(), cmd, args, job_id, rpc))
        for hook in [h for h in self.hooks if h[0](cmd, args)]:
            self.hooks.remove(hook)
            hook[1]()
        if self.clock() < self.down_until:
            raise SlurmCommandError(f"{cmd}: rc=1: Unable to contact slurm controller (connect failure)")
        mutating = cmd == "scontrol" and args and args[0] in MUTATING
        crash = False
        if mutating:
            self.mutations += 1
            crash = bool(self.crash_at and self.crash_at[0] == self.mutations)
        if self.crash_on is not None and self.crash_on[0](cmd, args):
            crash, self.crash_at = True, (self.mutations, self.crash_on[1])
            self.crash_on = None
        if crash and not self.crash_at[1]:
            self.crash_at = None
            raise Crash()
        for f in self.faults:
            if f.count > 0 and f.match(cmd, args):
                f.count -= 1
                self.fault_hits.append((cmd, args, f.mode))
                if f.mode == "refuse":
                    raise SlurmCommandError(f"{cmd} {' '.join(map(str, args))}: rc=1: Slurm refused (injected)")
                if f.mode == "timeout-before":
                    raise SlurmCommandError(f"{cmd}: timed out after {self.timeout_s:g} s")
                return "timeout"
        if crash and self.crash_at and self.crash_at[1]:
            self.crash_at = None
            return "crash"
        return None

    @staticmethod
    def _leave(after: str | None, cmd: str) -> None:
        if after == "timeout":
            raise SlurmCommandError(f"{cmd}: timed out after 10 s")
        if after == "crash":
            raise Crash()

    def rpc_count(self, since: float = float("-inf"), kinds: tuple[str, ...] | None = None) -> int:
        return sum(1 for c in self.calls if c.t >= since for r in c.rpc if kinds is None or r in kinds)

    # ================================================================== the Slurm interface
    def jobs(self) -> list[Job]:
        after = self._enter("squeue", ("--json", "--states=all"), None, ("REQUEST_JOB_INFO",))
        self.forget_old()
        out = [self._job(j) for j in sorted(self.jobs_by_id.values(), key=lambda j: j.job_id)]
        self._leave(after, "squeue")
        return out

    def job(self, job_id: int) -> Job | None:
        after = self._enter("scontrol", ("show", "job", str(job_id)), job_id, ("REQUEST_JOB_INFO_SINGLE",))
        self.forget_old()
        j = self.jobs_by_id.get(job_id)
        self._leave(after, "scontrol")
        return None if j is None else self._job(j)

    def nodes(self) -> list[Node]:
        after = self._enter("sinfo", ("--json",), None, ("REQUEST_NODE_INFO", "REQUEST_PARTITION_INFO"))
        out = [Node.from_json(self._node_json(n)) for n in self.node_recs.values()]
        self._leave(after, "sinfo")
        return out

    def show_node(self, node: str) -> dict[str, str]:
        after = self._enter("scontrol", ("show", "node", node), None, ("REQUEST_NODE_INFO", "REQUEST_PARTITION_INFO"))
        r = self.node_recs.get(node)
        if r is None:
            raise SlurmCommandError(f"scontrol show node {node}: rc=1: Node {node} not found")
        state = r.state if not self._busy(node) or r.down else "ALLOCATED"
        if r.drain:
            state += "+DRAIN"
        self._leave(after, "scontrol")
        return {"NodeName": node, "State": state, "Reason": r.reason, "Extra": r.extra, "Comment": r.comment}

    def job_gpus(self, job_id: int) -> dict[str, set[int]]:
        after = self._enter("scontrol", ("show", "job", "-d", str(job_id)), job_id, ("REQUEST_JOB_INFO_SINGLE",))
        j = self.jobs_by_id.get(job_id)
        self._leave(after, "scontrol")
        return {} if j is None or j.state != "RUNNING" else {n: {0} for n in j.nodes}

    # the real client's actions, spelled as it spells them, on top of this fake's ``run``
    update_job = Slurm.update_job
    update_node = Slurm.update_node
    requeue = Slurm.requeue
    release = Slurm.release
    drain = Slurm.drain
    resume = Slurm.resume

    def wait_job(self, job_id, pred, timeout_s, interval_s=0.1):
        job = self.job(job_id)
        return job if job is not None and pred(job) else None

    #: the real client's observe gate ([failover] mode = "observe") in front of this fake's commands
    run = Slurm.run
    observe, observer = False, None

    def _exec(self, cmd: str, *args: str, check: bool = True, timeout_s: float | None = None,
              as_user=None) -> subprocess.CompletedProcess:
        job_id = None
        for a in args:
            if a.startswith("JobId="):
                job_id = int(a[6:])
            elif a.isdigit():
                job_id = int(a)
            elif a.startswith("--jobid="):
                job_id = int(a[8:])
        verb = args[0] if args else ""
        rpc = ("REQUEST_UPDATE",) if cmd == "scontrol" and verb in MUTATING else \
            ("REQUEST_JOB_INFO",) if cmd == "squeue" else ("REQUEST_OTHER",)
        after = self._enter(cmd, args, job_id, rpc)
        try:
            out = self._apply(cmd, args, job_id)
        except SlurmCommandError:
            if check:
                raise
            return subprocess.CompletedProcess([cmd, *args], 1, "", "refused")
        self._leave(after, cmd)
        return subprocess.CompletedProcess([cmd, *args], 0, out, "")

    # ------------------------------------------------------------------ effects of commands
    def _get(self, job_id: int | None) -> FakeJob:
        job = self.jobs_by_id.get(job_id) if job_id is not None else None
        if job is None:
            raise SlurmCommandError(f"scontrol: rc=1: Invalid job id specified ({job_id})")
        return job

    def _apply(self, cmd: str, args: tuple, job_id: int | None) -> str:
        if cmd == "squeue" and "-o" in args:   # the light full scan (slurm_ft.slurm.jobinfo.list_jobs)
            self.forget_old()
            return "".join(f"{j.job_id}|{'COMPLETING' if j.completing else j.state}|{j.reason}|{j.priority}|"
                           f"{compress_nodes(j.nodes) or '(null)'}|{j.comment or '(null)'}\n"
                           for j in sorted(self.jobs_by_id.values(), key=lambda j: j.job_id))
        if cmd == "srun":
            return self._signal(self._get(job_id))
        if cmd != "scontrol" or not args:
            raise SlurmCommandError(f"{cmd}: not modelled by FakeSlurm")
        verb = args[0]
        if verb in ("requeue", "requeuehold"):
            self._requeue(self._get(job_id), hold=verb == "requeuehold")
        elif verb == "hold":
            job = self._get(job_id)
            if job.state != "PENDING":
                raise SlurmCommandError("scontrol hold: rc=1: Job is no longer pending execution")
            job.held, job.priority, job.reason = "admin", 0, "JobHeldAdmin"
        elif verb == "release":
            job = self._get(job_id)
            if job.state != "PENDING":
                raise SlurmCommandError("scontrol release: rc=1: Job is no longer pending execution")
            if job.priority == 0 or job.held:
                job.held, job.priority, job.reason = "", self._priority(), "None"
        elif verb == "update" and args[1].startswith("NodeName="):
            self._update_node(args[1][9:], dict(a.split("=", 1) for a in args[2:]))
        elif verb == "update":
            self._update_job(self._get(job_id), dict(a.split("=", 1) for a in args[2:]))
        elif verb == "show" and args[1] == "reservation":
            raise SlurmCommandError("scontrol: rc=1: Reservation not found")
        else:
            raise SlurmCommandError(f"scontrol {verb}: not modelled by FakeSlurm")
        return ""

    def _count_requeue(self, job: FakeJob, by: str = "scontrol") -> None:
        key = (job.job_id, job.restart)
        self.requeues[key] = self.requeues.get(key, 0) + 1
        self.requeue_log.append((job.job_id, job.restart, by))
        job.submit = self.clock()    # every requeue gives the job a new SubmitTime (22.05, checked)

    def _requeue(self, job: FakeJob, hold: bool) -> None:
        if job.state == "PENDING":
            raise SlurmCommandError("scontrol requeue: rc=1: Job is pending execution")
        if not job.requeue:
            raise SlurmCommandError("scontrol requeue: rc=1: Requested operation is presently disabled")
        self._count_requeue(job)
        if job.state == "RUNNING":
            job.completing = set(job.nodes)
            job.end = self.clock()
        job.state, job.reason, job.restart = "PENDING", "BeginTime", job.restart + 1
        job.eligible = self.clock() + REQUEUE_DELAY_S
        job.verdicts = {}
        if not job.completing:
            job.nodes = []
        if hold:
            job.held, job.priority, job.reason = "admin", 0, "JobHeldAdmin"
        self.events.append(("epilog_slurmctld", job.job_id, job.restart, compress_nodes(job.nodes)))

    def _update_job(self, job: FakeJob, fields: dict[str, str]) -> None:
        if job.ended:
            raise SlurmCommandError("scontrol update: rc=1: Job has already finished")
        for k, v in fields.items():
            if k == "StartTime":
                if job.state != "PENDING":
                    raise SlurmCommandError("scontrol update: rc=1: Job is no longer pending execution")
                job.eligible = self.clock() if v == "now" else float(v)
            elif k == "Priority":
                job.priority = int(v)
                if job.held == "admin" and job.priority:
                    job.held = ""
            elif k == "ExcNodeList":
                job.excluded = set(split_nodes(v))
            elif k == "ReqNodeList":
                job.required = split_nodes(v)
            elif k == "AdminComment":
                job.admin_comment = v
            elif k == "Comment":
                job.comment = v
            else:
                raise SlurmCommandError(f"scontrol update: rc=1: {k} not modelled by FakeSlurm")

    def _update_node(self, node: str, fields: dict[str, str]) -> None:
        r = self.node_recs.get(node)
        if r is None:
            raise SlurmCommandError(f"scontrol update: rc=1: Invalid node name specified ({node})")
        state = fields.get("State")
        if state == "DRAIN":
            r.drain, r.reason, r.reason_by, r.reason_time = True, fields.get("Reason", ""), "root", self.clock()
        elif state == "RESUME":
            if not r.drain and not r.down:
                raise SlurmCommandError("scontrol update: rc=1: Invalid node state specified")
            r.drain, r.reason = False, ""
        for k in ("Extra", "Comment"):
            if k in fields:
                setattr(r, k.lower(), fields[k])

    def _signal(self, job: FakeJob) -> str:
        if job.state != "RUNNING":
            raise SlurmCommandError("srun: rc=1: Job is not running")
        item = [{"pid": 100 + i, "comm": "python", "step": "batch"} for i in range(1 if job.catches_signal else 0)]
        return "\n".join(json.dumps({"node": n, "signalled": item, "skipped": []}) for n in job.nodes)

    # ------------------------------------------------------------------ records as Slurm prints them
    def _busy(self, node: str) -> bool:
        return any(node in j.nodes and (j.state == "RUNNING" or j.completing) for j in self.jobs_by_id.values())

    def _eligible_known(self, j: FakeJob) -> bool:
        """Slurm prints no eligible time (``Unknown``) for a held job or one whose dependency waits."""
        if j.state != "PENDING" or j.held or not j.priority:
            return False
        if j.dependency:
            dep = self.jobs_by_id.get(int(j.dependency.split(":")[1]))
            return dep is not None and dep.state == "COMPLETED"
        return True

    def _job(self, j: FakeJob) -> Job:
        state = "COMPLETING" if j.completing else j.state   # 22.05 prints the COMPLETING flag as the state
        return Job.from_json({
            "job_id": j.job_id, "name": j.name, "user_name": j.user, "user_id": j.uid, "group_id": j.uid,
            "job_state": state, "state_reason": j.reason, "nodes": compress_nodes(j.nodes),
            "restart_cnt": j.restart, "exit_code": j.exit_status, "start_time": int(j.start) if j.start else 0,
            "end_time": int(j.end) if j.end else 0, "submit_time": int(j.submit),
            "eligible_time": int(j.eligible) if self._eligible_known(j) else 0,
            "priority": j.priority, "comment": j.comment, "admin_comment": j.admin_comment,
            "requeue": j.requeue, "excluded_nodes": compress_nodes(sorted(j.excluded)),
            "required_nodes": compress_nodes(j.required), "partition": self.partition,
            "node_count": j.node_count, "time_limit": j.time_limit_min if j.time_limit_min else 4294967294,
            "dependency": j.dependency, "resv_name": "", "features": "", "shared": None,
            **({"failed_node": j.failed_node} if self.failed_node and j.failed_node else {}),
        })

    def _node_json(self, r: FakeNode) -> dict:
        state = "down" if r.down else ("allocated" if self._busy(r.name) else "idle")
        return {"name": r.name, "state": state, "state_flags": (["DRAIN"] if r.drain else [])
                + (["NOT_RESPONDING"] if r.down else []), "reason": r.reason, "reason_set_by_user": r.reason_by,
                "reason_changed_at": int(r.reason_time), "comment": r.comment, "extra": r.extra,
                "partitions": [self.partition]}
