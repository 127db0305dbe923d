"""The daemon's state machine: one job as Slurm shows it + what the journal knows -> actions.

Pure: no Slurm call, no journal access, no clock; the loop (:mod:`slurm_ft.failover.daemon`)
reads Slurm and the journal, calls :func:`plan` and hands the actions to the effects
(:mod:`slurm_ft.failover.effects`), which journal and act. Every decision of the daemon is here,
testable from plain values (tests/test_machine.py), and the effects are idempotent against
Slurm's own state, so the loop may call :func:`plan` again for the same job at any time.

States (the ft state users see, docs/architecture.md) and what moves a job on:

- ``running``: time limit near → checkpoint signal (``Notify``), then ``continued`` once the job
  acks a save; a health check drained its node → ``StartEvacuation`` + ``Notify``, then
  ``evacuated`` on the ack, on the ``--ft-ckpt-wait`` deadline, or at once when nothing catches
  the signal (never a wait in the loop: ``Wake`` says when to look again);
- ended → :func:`slurm_ft.failover.policy.decide` over the attempt's node verdicts: ``Failover``
  (``failover-in-progress``), an evacuation or continuation requeue, or a final state; no
  verdict yet → ``Wake`` until ``grace_s`` after the daemon *first saw* the end (never Slurm's end
  time: a daemon that was down must not decide on its first look);
- a final no-fault decision (``failed``, ``user-error``, ``timeout``) is reopened when a
  hardware verdict of that attempt arrives later (a node's outbox); a late hardware verdict of
  an attempt decided otherwise drains its node (``DrainLate``): each acted on once;
- ``failover-in-progress``/``requeued``/``evacuated``/``continued`` while pending →
  ``ClearDelay`` (``StartTime=now``) only while the job waits on Slurm's requeue delay
  (reason ``BeginTime``), at most :data:`MAX_START_TRIES` times per attempt: a job its owner
  holds or that waits on a dependency costs nothing;
- pending again without slurm-ft's doing → a lost node (NODE_FAIL) is a hardware fault; an
  admin's requeue an evacuation (``AdminRequeue``);
- pending after a prolog health check refused its node (any job) → ``Release`` elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from slurm_ft.slurm.records import Job, compress_nodes, split_nodes
from slurm_ft.failover import policy
from slurm_ft.failover.verdict import NodeVerdict

#: Why an attempt runs, by the ft state it left (AdminComment of a running or finished job).
RESTART_WHY = {policy.FAILOVER: "after a failover", policy.REQUEUED: "after a failover",
               policy.EVACUATED: "after an evacuation", policy.CONTINUED: "after a time-limit continuation"}
#: Seconds between a continuation's requeue and ``StartTime=now`` (a job credential created in
#: the second its predecessor's was revoked is refused by slurmd).
REQUEUE_SETTLE_S = 2.0
#: Slurm's INFINITE time limit (``0xfffffffe``) and above: no limit.
INFINITE_MINUTES = 0xFFFFFFFE
#: Seconds of slack, besides the job's --ft-ckpt-wait, between the time-limit checkpoint signal
#: and the limit (the requeue itself takes ~1 s; slurmctld ends jobs at or after the limit).
TIME_LIMIT_MARGIN_S = 10.0
#: Seconds after a requeued job became eligible during which the daemon looks at it every second
#: (it usually starts within them); afterwards only the periodic full scan does.
STARTING_WATCH_S = 30.0
#: ``StartTime=now`` tries per attempt (one suffices once the job has left COMPLETING).
MAX_START_TRIES = 3
#: Seconds between two ``StartTime=now`` tries of one attempt.
START_RETRY_S = 2.0
#: Node states in which Slurm has lost a node (sinfo --json, lower- or upper-case).
LOST = ("down", "not_responding", "no_respond")
#: Final decisions made without a hardware verdict: a hardware verdict arriving later reopens them.
REOPEN = {policy.FAILED, policy.USER_ERROR, policy.TIMEOUT, policy.IMAGE_PULL_FAILED}
#: Journal actions that settle an attempt (a decision was made for it).
DECIDING = ("decide", "failover", "release", "evacuation", "continue")
#: Seconds between looks at a job whose checkpoint ack is awaited.
ACK_POLL_S = 2.0
#: Seconds a job Slurm shows running an attempt that its own node's epilog ended with a hardware
#: fault (a copy restored by a slurmctld state rollback) is left for slurmctld to end before the
#: daemon decides the attempt on that verdict (slurmctld ends such a copy within seconds once the
#: node's slurmd reports it gone; 22.05 restored one with no node allocated, which it never ends).
GHOST_GRACE_S = 60.0
#: Slurm's state reasons of a job that ended by its own exit status or signal (``_job_complete``:
#: ``FAIL_EXIT_CODE``, ``FAIL_LAUNCH``; the same names on 22.05, 24.11 and 26.05). While its epilogs
#: run, ``scontrol show job`` says only ``COMPLETING``: this reason is the one proof that the job
#: FAILED and was not cancelled (reason unchanged, ``None``), timed out (``TimeLimit``) or ran out
#: of memory (``OutOfMemory``): no other job may be decided before it leaves COMPLETING.
FAILED_REASONS = ("NonZeroExitCode", "JobLaunchFailure")
#: Journal action of ``slurm-ft drain --checkpoint``: an admin asks the daemon to evacuate a job
#: (status intent until :func:`_evacuation_request` answers it).
EVACUATE_REQUEST = "evacuate-request"


# ------------------------------------------------------------------------------ inputs
@dataclass(frozen=True)
class Facts:
    """What the daemon knows about one job besides Slurm's record: its journal rows and its own
    observations. ``opts``: the ft options fixed at submit (None: not ft-enabled; ``opts_error``:
    malformed); ``seen_ended``: when the daemon first saw the current attempt ended (its own
    clock); ``gpus``: GPUs the job holds per node, when a GPU-level health drain asked; ``ack``:
    the checkpoint ack the job wrote into its comment (``slurm_ft_job.Ack``: ``attempt``,
    ``state``, ``step``, ``path``; the daemon parses it, slurm_ft.checkpoint.channel), None when
    there is none."""

    job_id: int
    row: Mapping | None = None
    actions: tuple[Mapping, ...] = ()
    verdicts: tuple[NodeVerdict, ...] = ()
    attempts: tuple[Mapping, ...] = ()
    opts: object | None = None
    opts_error: str | None = None
    seen_ended: float | None = None
    gpus: Mapping[str, frozenset[int]] | None = None
    priority_seen: int = 0
    ack: object | None = None

    def acts(self, attempt: int | None = None, *names: str) -> list[Mapping]:
        return [a for a in self.actions if (attempt is None or a["attempt"] == attempt)
                and (not names or a["action"] in names)]

    def verdicts_of(self, attempt: int) -> list[NodeVerdict]:
        return [v for v in self.verdicts if v.attempt == attempt]

    def decided(self, attempt: int) -> bool:
        return bool(self.acts(attempt, *DECIDING))

    def count(self, action: str) -> int:
        """Requeues of one kind done for this job (``failover``, ``evacuation``, ``continue``)."""
        return sum(1 for a in self.actions if a["action"] == action and a["status"] == "done")

    def failover_kinds(self) -> list[str]:
        """The kinds of the job's ``failover`` rows, oldest first: their typed ``kind`` column
        (``blamed``, ``unblamed`` or, on a row from before that column whose text was no JSON,
        ``evacuation``; slurm_ft.journal.migrations ``FAILOVER_KINDS``), as the journal's
        ``actions`` gives it."""
        return [a["kind"] for a in self.actions if a["action"] == "failover"]

    def runtime_s(self) -> float:
        return sum(max(0.0, a["end"] - a["start"]) for a in self.attempts if a.get("start") and a.get("end"))

    def attempt_nodes(self, attempt: int) -> str:
        return next((a.get("nodes") or "" for a in self.attempts if a["attempt"] == attempt), "")

    def notified(self, attempt: int, extra_acks: tuple[Mapping, ...] = ()) -> tuple[str | None, bool, Mapping | None]:
        """(what slurm-ft's last checkpoint signal to this attempt was for, whether a ``saved``
        ack answered it, the notify row). An ack is only ever the answer to a signal slurm-ft
        itself journaled for *this* attempt and delivered (``ckpt-notify`` done): a ``saved`` ack
        journaled before that signal, with no signal at all, or after one nothing caught
        (skipped) buys nothing. ``extra_acks``: ack rows about to be journaled this cycle."""
        acts = [*self.acts(attempt), *extra_acks]
        notes = [a for a in acts if a["action"] == "ckpt-notify" and a["status"] in ("done", "skipped")]
        note = notes[-1] if notes else None
        saved = note is not None and note["status"] == "done" and any(
            a["action"] == "ckpt-ack" and a["status"] == "done" and a["attempt"] == attempt
            and a["created"] >= note["created"] - policy.CLOCK_SKEW_S for a in acts)
        return (policy.notify_purpose(note["detail"]) if note else None), saved, note


@dataclass(frozen=True)
class View:
    """The cluster as the daemon last read it, and the site's settings."""

    now: float
    nodes: Mapping[str, object]            # name -> slurm_ft.slurm.Node
    failover: object                       # config.FailoverConfig
    top_priority: int = 0
    grace_s: float = 3.0
    poll_s: float = 0.5
    bisect_auto: bool = False              # config [bisect] auto


# ------------------------------------------------------------------------------ actions
@dataclass(frozen=True)
class Action:
    job_id: int
    attempt: int


@dataclass(frozen=True)
class Wake(Action):
    """Look at the job again at ``at`` (epoch seconds)."""
    at: float = 0.0
    why: str = ""


@dataclass(frozen=True)
class RecordAttempt(Action):
    fields: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class CloseAttempts(Action):
    """Attempts before ``attempt`` that never ended on record are closed (REQUEUED)."""


@dataclass(frozen=True)
class NotConfigured(Action):
    error: str = ""
    plain: bool = False           # a failed job that never asked for ft (ft-history lists it)


@dataclass(frozen=True)
class MarkRunning(Action):
    why: str = ""


@dataclass(frozen=True)
class Eligible(Action):
    """A failed-over job left Slurm's requeue delay: ``failover-in-progress`` -> ``requeued``."""


@dataclass(frozen=True)
class ClearDelay(Action):
    start: str = "now"


@dataclass(frozen=True)
class RecordAck(Action):
    detail: str = ""
    saved: bool = True


@dataclass(frozen=True)
class Notify(Action):
    purpose: str = policy.NOTIFY_EVACUATION
    why: str = ""


@dataclass(frozen=True)
class NotifyRefused(Action):
    detail: str = ""


@dataclass(frozen=True)
class StartEvacuation(Action):
    node: str = ""
    reason: str = ""


@dataclass(frozen=True)
class AnswerRequest(Action):
    """Close ``slurm-ft drain --checkpoint``'s ``evacuate-request`` rows ``ids`` (journal action
    ids) with ``status`` (done: the evacuation started; skipped: not carried out, ``detail`` says why)."""
    ids: tuple[int, ...] = ()
    status: str = "done"
    detail: str | None = None


@dataclass(frozen=True)
class EvacuationTimeout(Action):
    detail: str = ""


@dataclass(frozen=True)
class Failover(Action):
    reason: str = ""
    blamed: tuple[str, ...] = ()
    verdicts: tuple[Mapping, ...] = field(default=(), compare=False)
    node_fail: tuple[str, ...] = ()
    slurm_state: str = ""


@dataclass(frozen=True)
class RequeueNotFault(Action):
    kind: str = policy.EVACUATE      # EVACUATE or CONTINUE
    reason: str = ""


@dataclass(frozen=True)
class Final(Action):
    kind: str = policy.FAILED
    reason: str = ""
    blamed: tuple[str, ...] = ()
    verdicts: tuple[Mapping, ...] = field(default=(), compare=False)
    node_fail: tuple[str, ...] = ()
    slurm_state: str = ""
    hold: bool = False               # Slurm requeued it by itself but slurm-ft will not retry it


@dataclass(frozen=True)
class AdminRequeue(Action):
    """Pending again, requeued by an admin (or Slurm) with no fault: an evacuation."""


@dataclass(frozen=True)
class Release(Action):
    """A prolog health check refused ``blamed``: release the job elsewhere, keeping its place."""
    blamed: tuple[str, ...] = ()
    rule: str = ""


@dataclass(frozen=True)
class RecordRestarts(Action):
    """The job's ``slurm-ft run`` wrapper reported in-place restarts in its comment: journal
    each once (slurm_ft.job.inplace.record_restarts; the job's own word, it buys nothing)."""


@dataclass(frozen=True)
class StartBisect(Action):
    """``[bisect] auto``: an unblamed multi-node failure; diagnose the attempt's ``nodes``."""
    nodes: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class DrainLate(Action):
    """Hardware verdicts of an attempt already decided otherwise: drain their nodes."""
    nodes: tuple[str, ...] = ()
    verdicts: tuple[Mapping, ...] = field(default=(), compare=False)


# ------------------------------------------------------------------------------ the machine
def plan(job: Job, f: Facts, v: View) -> list[Action]:
    """What to do about ``job`` now (possibly nothing). See the module doc."""
    attempt = job.restart_count
    if job.state == "PENDING" and attempt > 0:
        refusal = _prolog_refusal(job, f)
        if refusal is not None:
            return [refusal]
    if f.opts_error is not None:
        return [NotConfigured(job.job_id, attempt, f.opts_error)] if f.row is None else []
    if f.opts is None or not getattr(f.opts, "enabled", False):
        if job.ended and job.state in policy.FAILED_STATES and f.row is None:
            return [NotConfigured(job.job_id, attempt, plain=True)]
        return []
    out: list[Action] = _attempt_records(job, f)
    if policy.INPLACE_PREFIX in (job.comment or ""):
        out.append(RecordRestarts(job.job_id, attempt))
    state = (f.row or {}).get("ft_state") or policy.RUNNING
    if state == policy.INTERNAL_ERROR and attempt > 0 and f.decided(attempt - 1) and not f.decided(attempt):
        state = policy.REQUEUED   # slurm-ft failed the requeue, yet the job runs again: follow it again
    if job.state == "PENDING" and attempt > 0 and not f.decided(attempt - 1):
        return out + _requeued_by_slurm(job, f, v)
    if job.state == "PENDING" and state in policy.PENDING_STATES:
        return out + _restart(job, f, v, state)
    running = job.state == "RUNNING" and job.reason != "Prolog"
    if job.state == "RUNNING" and state in policy.PENDING_STATES:
        out.append(MarkRunning(job.job_id, attempt, RESTART_WHY[state]))
    ack = _ack(job, f)
    if ack is not None:
        out.append(ack)
    if running:
        ghost = _rolled_back(job, f, v)
        if ghost is not None:
            return out + ghost
        return out + _running(job, f, v, ack)
    if not job.ended:
        if job.completing:
            early = _decide_completing(job, f, v, attempt, state)
            if early:
                return out + early
            out.append(Wake(job.job_id, attempt, v.now + v.poll_s, "epilogs running"))
        elif job.state != "PENDING":   # configuring, prolog running: look again once it runs
            out.append(Wake(job.job_id, attempt, v.now + v.poll_s, "starting"))
        return out
    if state in policy.FINAL_STATES or f.decided(attempt):
        return out + _late_verdicts(job, f, v, state)
    return out + _decide(job, f, v, attempt, job.state)


def _attempt_records(job: Job, f: Facts) -> list[Action]:
    attempt = job.restart_count
    out: list[Action] = []
    if any(a["attempt"] < attempt and a.get("end") is None for a in f.attempts):
        out.append(CloseAttempts(job.job_id, attempt))
    have = next((a for a in f.attempts if a["attempt"] == attempt), None)
    ran = (job.state == "RUNNING" and job.reason != "Prolog") or job.ended
    if ran or (job.state != "PENDING" and have is not None):
        # an attempt a prolog refused never ran: it is on record through its verdict only
        want = {"nodes": job.nodes or None, "start": job.start_time, "end": job.end_time if job.ended else None,
                "exit_code": job.exit_code, "signal": job.exit_signal, "state": job.state}
        want = {k: val for k, val in want.items() if val is not None}
        if have is None or any(have.get(k) != val for k, val in want.items()):
            out.append(RecordAttempt(job.job_id, attempt, tuple(sorted(want.items()))))
    return out


def _rolled_back(job: Job, f: Facts, v: View) -> list[Action] | None:
    """A running attempt that an epilog of one of its nodes already ended with a hardware fault:
    the copy a slurmctld state rollback restored (its saved state predates the fault). Left to
    slurmctld for :data:`GHOST_GRACE_S` after that verdict, then decided as a failed attempt:
    the failover requeues the job Slurm still shows running (``scontrol requeue`` ends the copy).
    None when there is no such verdict or the attempt is decided (reconcile redoes a lost requeue).

    Only an epilog's verdict proves the attempt ended (epilogs run after the job's end on that
    node; health and Slurm verdicts do not), and only one made after the attempt started."""
    attempt = job.restart_count
    if f.decided(attempt) or not job.start_time:
        return None
    nodes = set(split_nodes(job.nodes))
    ended = [x for x in f.verdicts_of(attempt) if x.node in nodes and x.time >= job.start_time
             and policy.retry_class(x) == "hardware" and x.source != policy.SLURM_SOURCE
             and not x.rule.startswith(policy.HEALTH_RULE)]
    if not ended:
        return None
    since = min(x.time for x in ended)
    if v.now - since < GHOST_GRACE_S:
        return [Wake(job.job_id, attempt, since + GHOST_GRACE_S, "running although its epilog ended it")]
    return _decide(job, f, v, attempt, "FAILED", reopen=True)


def _decide_completing(job: Job, f: Facts, v: View, attempt: int, state: str) -> list[Action]:
    """The failover of a 1-node attempt decided while its epilog still runs (issue 23; only with
    the hand-off on, ``[failover] handoff_wait_s`` > 0: slurm_ft.node.handoff): the
    epilog of its one node posted a hardware verdict (the only epilog there is, so no other
    verdict can come) and Slurm's reason says the job FAILED (:data:`FAILED_REASONS`). Requeued
    now, Slurm finishes the requeue in the epilog-complete RPC, and the exclusion and priority
    are set before that, on the job record whose accounting index is still valid (after the
    requeue slurmctld holds every ``scontrol update`` of the job up to 1 s while it asks slurmdbd
    for a new one: measured on 22.05). [] (decide once it has left COMPLETING, as before) for
    anything else: several nodes, another reason, a verdict that is not a hardware one from an
    epilog, a decision that is not a failover (a final state waits for the job's real state)."""
    nodes = split_nodes(job.nodes)
    if (not getattr(v.failover, "handoff_wait_s", 0) or len(nodes) != 1 or job.reason not in FAILED_REASONS
            or f.decided(attempt)
            or state in policy.FINAL_STATES):
        return []
    proof = [x for x in f.verdicts_of(attempt) if x.node == nodes[0] and policy.retry_class(x) == "hardware"
             and x.source != policy.SLURM_SOURCE and not x.rule.startswith(policy.HEALTH_RULE)]
    if not proof:
        return []
    out = _decide(job, f, v, attempt, "FAILED")
    return out if out and isinstance(out[0], Failover) else []


def _prolog_refusal(job: Job, f: Facts) -> Release | None:
    attempt = job.restart_count - 1
    health = [x for x in f.verdicts_of(attempt) if x.rule.startswith(policy.HEALTH_RULE)]
    if not health or f.acts(attempt, "release"):
        return None
    return Release(job.job_id, attempt, tuple(split_nodes([x.node for x in health])), health[0].rule)


def _requeued_by_slurm(job: Job, f: Facts, v: View) -> list[Action]:
    """Pending again but slurm-ft did not requeue it: Slurm did (NODE_FAIL of a requeueable
    job) or an admin did. A lost node is a hardware fault of the attempt."""
    attempt = job.restart_count - 1
    down = slurm_failed(job, split_nodes(f.attempt_nodes(attempt)), v)
    if not down and not any(policy.retry_class(x) == "hardware" for x in f.verdicts_of(attempt)):
        return [AdminRequeue(job.job_id, attempt)]
    return _decide(job, f, v, attempt, "NODE_FAIL" if down else "FAILED", requeued=True)


def _restart(job: Job, f: Facts, v: View, state: str) -> list[Action]:
    """A job slurm-ft requeued, pending: clear Slurm's requeue delay once it can stick."""
    attempt = job.restart_count
    if job.completing:   # StartTime=now sent now would be overwritten when the epilogs end
        return [Wake(job.job_id, attempt, v.now + v.poll_s, "leaving COMPLETING")]
    eligible = job.raw.get("eligible_time")
    eligible = eligible.get("number") if isinstance(eligible, dict) else eligible
    if eligible and eligible <= v.now + 3:
        out: list[Action] = [Eligible(job.job_id, attempt)] if state == policy.FAILOVER else []
        if v.now - eligible < STARTING_WATCH_S:
            # a freed job usually starts within seconds: look again soon so ft-history and the
            # AdminComment say it runs (later, the periodic full scan notices it)
            out.append(Wake(job.job_id, attempt, v.now + 1.0, "eligible, waiting to start"))
        return out
    if not any(a["status"] == "done" for a in f.acts(attempt - 1, "failover", "evacuation", "continue")):
        # whoever requeued it (this daemon before a crash, `slurm-ft drain --checkpoint`) has not
        # set its exclusions yet: a job started now would run where it must not
        return [Wake(job.job_id, attempt, v.now + 1.0, "requeue not finished")]
    start, at = _restart_at(job, f, state, v.now)
    if start is None:
        return [Wake(job.job_id, attempt, at, "requeue settling")] if at else []
    if job.priority == 0 or job.reason not in ("BeginTime", "None", ""):
        return []    # held, a dependency, a reservation...: StartTime=now cannot help (owner's or admin's turn)
    tries = f.acts(attempt, "start-now")
    if len(tries) >= MAX_START_TRIES:
        return []
    if tries and v.now - tries[-1]["created"] < START_RETRY_S:
        return [Wake(job.job_id, attempt, tries[-1]["created"] + START_RETRY_S, "StartTime=now retry")]
    return [ClearDelay(job.job_id, attempt, start), Wake(job.job_id, attempt, v.now + v.poll_s, "eligible yet?")]


def _restart_at(job: Job, f: Facts, state: str, now: float) -> tuple[str | None, float | None]:
    """(``StartTime`` for a job slurm-ft requeued, or None = keep Slurm's delay; when to look
    again if that changes). A retry that blamed no node keeps the delay. Any other restart that
    may land on a node the attempt just left (a continuation, an evacuation that excluded no
    node, a multi-node job that excluded one of its nodes, nodes not on record) waits
    :data:`REQUEUE_SETTLE_S` after the requeue: that node's slurmd refuses a credential made in
    the second its predecessor's was revoked ("Job credential revoked", measured on 22.05: the
    job is killed at launch); one whose nodes are all excluded starts at once."""
    kinds = f.failover_kinds()
    if state in (policy.FAILOVER, policy.REQUEUED) and kinds and kinds[-1] == "unblamed":
        return None, None
    attempt = job.restart_count - 1
    left = set(split_nodes(f.attempt_nodes(attempt)))
    if left and left <= set(split_nodes(job.excluded_nodes)):
        return "now", None
    done = [a["created"] for a in f.acts(attempt, "failover", "evacuation", "continue") if a["status"] == "done"]
    if done and now - done[-1] >= REQUEUE_SETTLE_S:
        return "now", None
    return None, (done[-1] + REQUEUE_SETTLE_S) if done else None


def _ack(job: Job, f: Facts) -> RecordAck | None:
    """The checkpoint ack the job wrote into its comment for this attempt, once."""
    ack = f.ack
    if ack is None or ack.attempt != job.restart_count or ack.state not in ("saved", "failed"):
        return None
    detail = policy.ack_detail(ack)
    if any(a["detail"] == detail for a in f.acts(job.restart_count, "ckpt-ack")):
        return None
    return RecordAck(job.job_id, job.restart_count, detail, ack.state == "saved")


def _ack_rows(ack: RecordAck | None, now: float) -> tuple[Mapping, ...]:
    if ack is None:
        return ()
    return ({"action": "ckpt-ack", "status": "done" if ack.saved else "failed", "created": now,
             "detail": ack.detail, "attempt": ack.attempt},)


def _running(job: Job, f: Facts, v: View, ack: RecordAck | None) -> list[Action]:
    evac = _evacuation(job, f, v, ack)
    if evac is not None:
        return evac
    return _time_limit(job, f, v, ack)


def health_drain(node) -> tuple[str, int | None] | None:
    """(check, GPU index or None) if slurm-ft drained ``node`` (a :class:`slurm_ft.slurm.Node`, or
    None) for a failing health check, else None: the node's typed ``failed_check``, read once from
    its reason (``slurm-ft: <check>: [GPU<n> ]<measurement>``) when Slurm's record was read."""
    if node is None or not node.drained or node.failed_check is None:
        return None
    return node.failed_check.check, node.failed_check.gpu


def evacuation_target(job: Job, f: Facts, v: View) -> tuple[str, str, int | None] | None:
    """(node, check, GPU) of a health drain on one of the job's nodes that concerns the job."""
    for name in split_nodes(job.nodes):
        failing = health_drain(v.nodes.get(name))
        if failing is None:
            continue
        check, gpu = failing
        if gpu is not None and f.gpus is not None and gpu not in f.gpus.get(name, frozenset()):
            continue
        return name, check, gpu
    return None


def _evacuation(job: Job, f: Facts, v: View, ack: RecordAck | None) -> list[Action] | None:
    """The daemon's own health evacuation of this attempt, as a non-blocking state: start it
    (journal + checkpoint signal), then requeue on the ack, the deadline or at once when nothing
    caught the signal. None when there is none (the time-limit checks run instead)."""
    attempt = job.restart_count
    started = f.acts(attempt, "evacuate")
    if not started:
        asked = _evacuation_request(job, f, v)
        if asked is not None:
            return asked
        if f.acts(attempt, "ckpt-notify"):
            return None        # a signal already went out (time limit)
        target = evacuation_target(job, f, v)
        if target is None or (target[2] is not None and f.gpus is None):
            return None
        node, check, _ = target
        if f.count("evacuation") >= v.failover.max_evacuations:
            return None        # past the site's bound the job runs on to its end on the draining node
        reason = v.nodes[node].reason
        return [StartEvacuation(job.job_id, attempt, node, reason),
                Notify(job.job_id, attempt, policy.NOTIFY_EVACUATION, f"{node} degraded ({check}): {reason}"),
                Wake(job.job_id, attempt, v.now + ACK_POLL_S, "checkpoint ack")]
    if f.decided(attempt):
        return []
    purpose, saved, note = f.notified(attempt, _ack_rows(ack, v.now))
    if note is None:
        rows = f.acts(attempt, "ckpt-notify")
        if rows and rows[-1]["status"] == "failed":
            return [RequeueNotFault(job.job_id, attempt, policy.EVACUATE,
                                    "evacuated without a checkpoint (the signal could not be delivered)")]
        return [Notify(job.job_id, attempt, policy.NOTIFY_EVACUATION, started[-1]["detail"] or "health evacuation"),
                Wake(job.job_id, attempt, v.now + ACK_POLL_S, "checkpoint ack")]
    if note["status"] == "skipped":
        return [RequeueNotFault(job.job_id, attempt, policy.EVACUATE,
                                "evacuated without a checkpoint (nothing catches the signal)")]
    failed = ack is not None and not ack.saved or any(
        a["action"] == "ckpt-ack" and a["status"] == "failed" and a["created"] >= note["created"]
        for a in f.acts(attempt))
    if saved or failed:
        return [RequeueNotFault(job.job_id, attempt, policy.EVACUATE,
                                "evacuated after its exit checkpoint" if saved else
                                "evacuated; its checkpoint failed")]
    wait_s = getattr(f.opts, "ckpt_wait_s", 0)
    deadline = note["created"] + wait_s
    if v.now >= deadline:
        out: list[Action] = []
        if not f.acts(attempt, "ckpt-timeout"):
            out.append(EvacuationTimeout(job.job_id, attempt, f"no saved/failed ack within {wait_s} s"))
        return out + [RequeueNotFault(job.job_id, attempt, policy.EVACUATE,
                                      "evacuated without a checkpoint (no ack in time)")]
    return [Wake(job.job_id, attempt, min(deadline, v.now + ACK_POLL_S), "checkpoint ack")]


def _evacuation_request(job: Job, f: Facts, v: View) -> list[Action] | None:
    """An admin's ``slurm-ft drain NODE --checkpoint`` (an ``evacuate-request`` row of this
    attempt, status intent, target NODE; slurm_ft.failover.evacuation): start the same evacuation
    a health drain starts, within the same bounds (``max_evacuations``; the requeue then boosts
    within ``priority_boost``/``priority_ceiling``), and answer the request either way. None when
    nothing was asked."""
    attempt = job.restart_count
    asked = [a for a in f.acts(attempt, EVACUATE_REQUEST) if a["status"] == "intent"]
    if not asked:
        return None
    ids = tuple(a["id"] for a in asked)
    node = asked[-1]["target"]
    if node not in split_nodes(job.nodes):
        return [AnswerRequest(job.job_id, attempt, ids, "skipped", f"{node} is not a node of attempt {attempt}")]
    if f.acts(attempt, "ckpt-notify"):
        return [AnswerRequest(job.job_id, attempt, ids, "skipped",
                              "a checkpoint signal already went out to this attempt (time limit): it is "
                              "requeued once it saves")]
    if f.count("evacuation") >= v.failover.max_evacuations:
        return [AnswerRequest(job.job_id, attempt, ids, "skipped",
                              f"site bound of {v.failover.max_evacuations} evacuations ([failover] "
                              "max_evacuations) used up: the job runs on to its end")]
    why = f"{node} drained by an admin (slurm-ft drain --checkpoint): {asked[-1]['detail'] or ''}".rstrip(": ")
    return [StartEvacuation(job.job_id, attempt, node, why), AnswerRequest(job.job_id, attempt, ids, "done"),
            Notify(job.job_id, attempt, policy.NOTIFY_EVACUATION, why),
            Wake(job.job_id, attempt, v.now + ACK_POLL_S, "checkpoint ack")]


def time_limit_s(job: Job) -> float | None:
    """The job's time limit in seconds (``time_limit``: minutes; 22.05 int, 24.11 number
    object), None when unlimited."""
    val = job.raw.get("time_limit")
    if isinstance(val, dict):
        if not val.get("set", True) or val.get("infinite"):
            return None
        val = val.get("number")
    if not isinstance(val, int) or val <= 0 or val >= INFINITE_MINUTES:
        return None
    return val * 60.0


def _time_limit(job: Job, f: Facts, v: View, ack: RecordAck | None) -> list[Action]:
    """Near its time limit: the checkpoint signal ``--ft-ckpt-wait`` + :data:`TIME_LIMIT_MARGIN_S`
    before the limit (at most half the limit early); a continuation once it acks ``saved``."""
    limit_s = time_limit_s(job)
    if limit_s is None or not job.start_time or v.failover.max_continuations == 0:
        return []
    attempt = job.restart_count
    purpose, saved, note = f.notified(attempt, _ack_rows(ack, v.now))
    if purpose == policy.NOTIFY_TIME_LIMIT:
        if saved and not f.decided(attempt):
            return [RequeueNotFault(job.job_id, attempt, policy.CONTINUE,
                                    "time limit: continued after its exit checkpoint")]
        if not saved and not f.decided(attempt):
            return [Wake(job.job_id, attempt, v.now + ACK_POLL_S, "checkpoint ack")]
        return []
    if purpose is not None:
        return []   # an evacuation (`slurm-ft drain --checkpoint`) is under way
    wait_s = getattr(f.opts, "ckpt_wait_s", 0)
    at = job.start_time + limit_s - min(wait_s + TIME_LIMIT_MARGIN_S, limit_s / 2)
    if v.now < at:
        return [Wake(job.job_id, attempt, at, "time limit near")]
    if f.count("continue") >= v.failover.max_continuations:
        if not f.acts(attempt, "ckpt-notify"):
            return [NotifyRefused(job.job_id, attempt, f"{policy.NOTIFY_TIME_LIMIT}: not sent: continuation bound "
                                                       f"{v.failover.max_continuations} used up")]
        return []
    return [Notify(job.job_id, attempt, policy.NOTIFY_TIME_LIMIT, "time limit near"),
            Wake(job.job_id, attempt, v.now + ACK_POLL_S, "checkpoint ack")]


def signature(verdicts) -> tuple:
    """What an attempt died of, for fast-fail: the set of (class, rule, Xid codes) of its non-ok
    verdicts. Two consecutive attempts with the same non-empty signature stop the retries."""
    return tuple(sorted({(x["verdict"], x["rule"], tuple(sorted({y["xid"] for y in x.get("xids") or []})))
                         for x in verdicts if x["verdict"] != "ok"}))


def _decide(job: Job, f: Facts, v: View, attempt: int, slurm_state: str, requeued: bool = False,
            reopen: bool = False) -> list[Action]:
    verdicts = f.verdicts_of(attempt)
    seen = f.seen_ended if f.seen_ended is not None else v.now
    since_end = v.now - seen if not requeued and not reopen else 60.0
    failovers = f.count("failover")
    nodes = split_nodes(job.nodes) or split_nodes(f.attempt_nodes(attempt))
    purpose, saved, _ = f.notified(attempt)
    kinds = f.failover_kinds()
    decision = policy.decide(slurm_state=slurm_state, failovers_done=failovers,
                             retries=(f.row or {}).get("retries") or 0, verdicts=verdicts, job_nodes=nodes,
                             seconds_since_end=since_end, grace_s=v.grace_s,
                             unblamed_done=kinds.count("unblamed"), runtime_s=f.runtime_s(),
                             site=policy.SitePolicy.from_config(v.failover),
                             notified=None if requeued else purpose, saved=saved,
                             evacuations_done=f.count("evacuation"), continuations_done=f.count("continue"),
                             failed_nodes=slurm_failed(job, nodes, v) if slurm_state == "NODE_FAIL" else ())
    if decision.kind == "wait":
        return [Wake(job.job_id, attempt, seen + v.grace_s, "waiting for node verdicts")]
    if decision.kind in (policy.EVACUATE, policy.CONTINUE):
        return [RequeueNotFault(job.job_id, attempt, decision.kind, decision.reason)]
    node_fail = tuple(x["node"] for x in decision.verdicts
                      if x.get("source") == policy.SLURM_SOURCE and x["verdict"] == "hardware")
    if decision.kind == "failover" and failovers and attempt > 0 and not decision.blamed_nodes:
        # fast-fail is for faults that would repeat anywhere; two hardware faults on two
        # nodes are bad luck (and the first node is excluded, so it cannot repeat there)
        previous = f.verdicts_of(attempt - 1)
        if signature(previous) and signature(previous) == signature(list(decision.verdicts)):
            decision = policy.Decision(policy.FAILED, f"fast-fail: attempts {attempt - 1} and {attempt} "
                                       f"failed the same way ({decision.reason})", decision.blamed_nodes,
                                       decision.verdicts)
    if decision.kind == "failover":
        out: list[Action] = [Failover(job.job_id, attempt, decision.reason, tuple(decision.blamed_nodes),
                                      decision.verdicts, node_fail, slurm_state)]
    else:
        kind = policy.visible_final(decision.kind, decision.verdicts)
        out = [Final(job.job_id, attempt, kind, decision.reason, tuple(decision.blamed_nodes),
                     decision.verdicts, node_fail, slurm_state, hold=requeued and kind != policy.COMPLETED)]
    if v.bisect_auto and not f.acts(attempt, "bisect-start") and policy.bisect_candidate(decision, nodes):
        out.append(StartBisect(job.job_id, attempt, tuple(nodes), decision.reason))
    return out


def _late_verdicts(job: Job, f: Facts, v: View, state: str) -> list[Action]:
    """Hardware verdicts that reached the daemon after the attempt was decided."""
    attempt = job.restart_count
    hardware = [x for x in f.verdicts_of(attempt) if policy.retry_class(x) == "hardware"]
    if not hardware:
        return []
    last = f.acts(attempt, *DECIDING)
    kind = (last[-1]["detail"] or "").split(":", 1)[0] if last and last[-1]["action"] == "decide" else None
    if kind in REOPEN and state in REOPEN and not f.acts(attempt, "failover"):
        return _decide(job, f, v, attempt, job.state, reopen=True)
    drained = {a["target"] for a in f.acts(attempt, "drain")}
    late = sorted({x.node for x in hardware} - drained)
    if not late or not v.failover.drain:
        return []
    return [DrainLate(job.job_id, attempt, tuple(late), tuple(x for x in hardware if x.node in late))]


def slurm_failed(job: Job, nodes: list[str], v: View) -> list[str]:
    """The attempt's ``nodes`` that Slurm itself reports failed: down or not responding in its
    node records (``sinfo --json``, :func:`lost`) or named by the job's ``FailedNode``
    (:attr:`slurm_ft.slurm.Job.failed_nodes`, Slurm >= 23.02). With ``nodes`` unknown, the
    ``FailedNode`` names alone. The only nodes a lost node's ``NODE_FAIL`` may blame: a survivor
    is never in this list."""
    named = set(job.failed_nodes)
    if not nodes:
        return sorted(named)
    return [n for n in nodes if n in named or (n in v.nodes and lost(v.nodes[n]))]


def lost(node) -> bool:
    """Slurm lost the node (down, not responding): a job requeued off it lost its node. A node
    that is only drained still answers (an admin took it out of service)."""
    states = [node.state.lower(), *(fl.lower() for fl in node.flags)]
    return any(s.startswith(u) for s in states for u in LOST)


def hostlist(names) -> str:
    """Node names as one Slurm hostlist (what every target and ExcNodeList is written as)."""
    return compress_nodes(list(names))
