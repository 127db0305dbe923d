"""In-place step restarts: ``slurm-ft run [--restarts N] -- srun ...`` inside a batch script.

The wrapper runs the step, passing its output through (and keeping the last
:data:`TAIL_BYTES` for evidence). When the step fails it judges the failure with the same
classifier the epilog uses (docs/classifier.md), on what a job's own user can see:

- the step's output and exit status (the job's own text: good enough for a decision about the
  job's own allocation, never for blaming a node);
- this node's kernel log since the step started, where the user may read it (``dmesg_restrict``
  usually forbids it: then the epilog's trusted reading decides, after escalation);
- a ``hang`` verdict the hang watcher (root) posted for this job attempt on any of the job's
  nodes, newer than the step's start (the node's mailbox field in Slurm, written only by root).

Then: ``infra`` and ``hang`` are restarted in place (same allocation, same nodes) up to
``--restarts`` times, counted apart from the job's requeue budget (``--ft-retries``) and per job
attempt; a ``user`` verdict (the job's own bug) is not retried: the wrapper exits with the step's
status; anything else (``hardware``, output that only *looks* like hardware, ``unknown``) and an
exhausted budget **escalate**: the wrapper exits with the step's status, the job ends, and the
epilog and daemon decide with root's evidence (a hardware fault: the node drained and excluded,
the job requeued elsewhere; infra/hang: requeued within the site's unblamed retries).

Each restart (and an escalation) is written into the job's own comment as one word,
``slurm-ft-run:attempt=A,restarts=N,of=M,state=restarted|escalated,verdict=V,rule=R,t=T``
(one writer: the wrapper; other words kept), where the daemon reads it
(:func:`record_restarts`) and journals each restart as an ``inplace-restart`` action that
``ft-history`` shows. The record is the job's own word about its own allocation: it buys
nothing (no retry, no priority, no blame).
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass
from urllib.parse import quote, unquote

from slurm_ft.errors import SlurmFTError
from slurm_ft.failover.policy import INPLACE_PREFIX

PREFIX = INPLACE_PREFIX
#: Bytes of the step's output kept for the classifier (the end of it).
TAIL_BYTES = 64 << 10
#: Most restarts a wrapper takes (and the daemon journals from one record).
MAX_RESTARTS = 100
#: Restart causes one record carries (the newest), and the longest record word (characters).
MAX_CAUSES = 8
MAX_WORD = 400
#: Verdict classes restarted in place.
RESTART_CLASSES = ("infra", "hang")
#: Rules that mean Slurm itself ended the step (preemption, requeue): never restarted.
NOT_A_FAULT = ("preempted", "slurm-preempted")
#: Rule of the hang watcher's verdict (slurm_ft.hang.watcher).
HANG_RULE = "no-progress"


# --------------------------------------------------------------------------- the comment record
@dataclass(frozen=True)
class Record:
    attempt: int
    restarts: int          # restarts done so far in this attempt
    of: int                # the budget (--restarts)
    state: str             # restarted | escalated
    verdict: str
    rule: str
    time: float
    #: why each of the last restarts happened (``verdict (rule)``), oldest first, ending with
    #: restart ``restarts``: a daemon that reads the record late still journals each one's cause
    causes: tuple[str, ...] = ()

    def encode(self) -> str:
        head = (f"{PREFIX}attempt={self.attempt},restarts={self.restarts},of={self.of},state={self.state},"
                f"verdict={quote(self.verdict, safe='')},rule={quote(self.rule[:80], safe='-_.:')},t={self.time:.1f}")
        causes = [quote(c[:60], safe="-_.:()") for c in self.causes[-MAX_CAUSES:]]
        while causes and len(head) + len(",causes=") + len("|".join(causes)) > MAX_WORD:
            causes.pop(0)        # the word stays within what decode takes: the oldest cause goes first
        return head + (f",causes={'|'.join(causes)}" if causes else "")

    @classmethod
    def decode(cls, word: str) -> "Record | None":
        """One record, or None when malformed or out of range (the comment is the user's)."""
        if not word.startswith(PREFIX) or len(word) > MAX_WORD:
            return None
        f = dict(item.partition("=")[::2] for item in word[len(PREFIX):].split(",") if item)
        try:
            causes = tuple(unquote(c) for c in f["causes"].split("|")) if f.get("causes") else ()
            r = cls(int(f["attempt"]), int(f["restarts"]), int(f["of"]), f["state"], unquote(f["verdict"]),
                    unquote(f["rule"]), float(f["t"]), causes)
        except (KeyError, ValueError):
            return None
        if (not 0 <= r.restarts <= MAX_RESTARTS or not 0 <= r.of <= MAX_RESTARTS or r.attempt < 0
                or r.state not in ("restarted", "escalated") or len(causes) > min(r.restarts, MAX_CAUSES)):
            return None
        return r


def find(comment: str) -> Record | None:
    for word in (comment or "").split():
        if word.startswith(PREFIX):
            return Record.decode(word)
    return None


def merge(comment: str, rec: Record) -> str:
    """``comment`` with its in-place record replaced by ``rec`` (slurm_ft.slurm.records.replace_comment_record)."""
    from slurm_ft.slurm.records import replace_comment_record
    return replace_comment_record(comment, PREFIX, rec.encode())


def record_restarts(journal, job) -> int:
    """Daemon side: journal the in-place restarts the job's wrapper reported in its comment
    (``job``: a :class:`slurm_ft.slurm.Job`), once each, as ``inplace-restart`` actions of the
    attempt they happened in (detail ``restart K/M in place: infra (rule), reported by the
    job``; typed columns ``restart`` K and ``restart_of`` M, by which a restart already
    journaled is known), and an escalation as one ``inplace-escalate``. Returns how many rows it
    wrote. Restarts the daemon missed (two within one cycle) are journaled from the count."""
    rec = find(job.comment)
    if rec is None or rec.attempt > job.restart_count:
        return 0
    done = journal.actions(job.job_id, rec.attempt)
    have = {(a["restart"], a["restart_of"]) for a in done if a["action"] == "inplace-restart"}
    wrote = 0
    for k in range(1, rec.restarts + 1):
        if (k, rec.of) in have:
            continue
        known = k - (rec.restarts - len(rec.causes)) - 1     # index of restart k in rec.causes
        if rec.causes:
            why = rec.causes[known] if known >= 0 else "(reported late: cause not kept)"
        else:      # a wrapper that sends no causes: the record's verdict is its last restart's
            why = f"{rec.verdict} ({rec.rule})" if k == rec.restarts else "(reported late: cause not kept)"
        journal.record(job.job_id, rec.attempt, "inplace-restart", job.nodes,
                       f"restart {k}/{rec.of} in place: {why}, reported by the job", restart=k, restart_of=rec.of)
        wrote += 1
    if rec.state == "escalated" and not any(a["action"] == "inplace-escalate" for a in done):
        journal.record(job.job_id, rec.attempt, "inplace-escalate", job.nodes,
                       f"in-place budget {rec.of} used up or not retryable: {rec.verdict} ({rec.rule}), "
                       f"reported by the job")
        wrote += 1
    return wrote


class CommentReporter:
    """Writes the record into the job's comment (``squeue`` + ``scontrol update``, as the job's
    user may); a refusal is printed, never raised: restarts must not depend on it."""

    def __init__(self, job_id: int, slurm=None):
        from slurm_ft.slurm import Slurm
        self.job_id = job_id
        self.slurm = slurm or Slurm(timeout_s=20.0)

    def report(self, rec: Record) -> None:
        try:
            from slurm_ft.slurm import put_comment_record
            put_comment_record(self.slurm, self.job_id, PREFIX, rec.encode())
        except SlurmFTError as exc:
            print(f"slurm-ft run: could not record the restart in the job's comment: {exc}", file=sys.stderr,
                  flush=True)


# --------------------------------------------------------------------------- running the step
@dataclass
class StepEnd:
    code: int                      # the step's exit status (128+N when a signal ended it)
    signal: int | None
    tail: str
    started_mono: float
    started_wall: float


def launch(argv: list[str], out=None, err=None) -> StepEnd:
    """Run ``argv`` (no shell), copy its stdout/stderr to ours as they come, keep the tail.

    ``SLURM_KILL_BAD_EXIT=1`` is set for it unless the job set it (srun's ``--kill-on-bad-exit``):
    one rank dying ends the step at once, instead of the others running on (or hanging in a
    collective) without it, so the restart comes at once."""
    out = out if out is not None else sys.stdout.buffer
    err = err if err is not None else sys.stderr.buffer
    t_mono, t_wall = time.monotonic(), time.time()
    env = {**os.environ}
    env.setdefault("SLURM_KILL_BAD_EXIT", "1")
    try:
        proc = subprocess.Popen(argv, stdin=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        msg = f"slurm-ft run: cannot run {argv[0]}: {exc.strerror}\n"
        err.write(msg.encode())
        err.flush()
        return StepEnd(127, None, msg, t_mono, t_wall)
    tail = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    open_streams = 2
    while open_streams:
        for key, _ in sel.select():
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            key.data.write(chunk)
            key.data.flush()
            tail += chunk
            if len(tail) > 2 * TAIL_BYTES:
                del tail[:-TAIL_BYTES]
    rc = proc.wait()
    sig = -rc if rc < 0 else None
    return StepEnd(128 + sig if sig else rc, sig, bytes(tail[-TAIL_BYTES:]).decode(errors="replace"),
                   t_mono, t_wall)


# --------------------------------------------------------------------------- judging a failure
@dataclass(frozen=True)
class Judgement:
    verdict: str               # hardware | user | infra | hang | unknown | ok
    rule: str
    action: str                # restart | stop (the job's own error) | escalate
    why: str


def hang_posted(cfg, slurm, env, since_wall: float) -> str | None:
    """The node that posted a ``hang`` verdict for this job attempt after ``since_wall`` (the
    hang watcher, through the node's mailbox field), or None."""
    from slurm_ft.failover import mailbox
    from slurm_ft.slurm import split_nodes
    try:
        job_id, attempt = int(env["SLURM_JOB_ID"]), int(env.get("SLURM_RESTART_COUNT") or 0)
        mine = set(split_nodes(env.get("SLURM_JOB_NODELIST", "")))
        nodes = slurm.nodes()
    except (KeyError, ValueError, SlurmFTError):
        return None
    field = cfg.failover.mailbox_field.lower()
    for node in nodes:
        if node.name not in mine:
            continue
        for rec in mailbox.parse(getattr(node, field, "") or ""):
            if rec.job_id == job_id and rec.attempt == attempt and rec.verdict == "hang" and rec.time >= since_wall - 2:
                return node.name
    return None


def kernel_since(cfg, env, since_mono: float) -> tuple[list[str], dict | None, frozenset | None, str]:
    """This node's kernel log since the step started, with its GPUs' bus ids for attribution (the
    job's GPUs from ``SLURM_JOB_GPUS``: none set, the job owns no GPU and its bus-id set is empty);
    ([], None, None, why) when the user may not read it."""
    from slurm_ft.classify.sources import read_kmsg
    try:
        lines = read_kmsg(since_mono - 1.0)
    except SlurmFTError as exc:
        return [], None, None, f"kernel log not read ({exc})"
    node_bus = job_bus = None
    try:
        from slurm_ft import nvml
        from slurm_ft.node.job import parse_gpu_list
        mine = parse_gpu_list(env.get("SLURM_JOB_GPUS")) or ()  # none: the job owns no GPU
        node_bus, job_bus = nvml.gpu_map(cfg, env.get("SLURMD_NODENAME", ""), mine)
    except Exception:  # no NVML: Xids are then not attributed to this node's GPUs at all
        return [], None, None, "kernel log not used (this node's GPUs unknown)"
    return lines, node_bus, job_bus, ""


def judge(cfg, end: StepEnd, env, slurm=None, read_kernel: bool = True, kernel_unavailable=None) -> Judgement:
    """What to do with a failed step (see the module doc). ``read_kernel`` False: the kernel log is
    not read (known unreadable). ``kernel_unavailable(why)``: called when it cannot be read or
    used, instead of adding ``why`` to the judgement (:func:`run` says it once per run)."""
    from slurm_ft.classify import Evidence, classify, default_policy, from_config
    if slurm is not None:
        node = hang_posted(cfg, slurm, env, end.started_wall)
        if node:
            return Judgement("hang", HANG_RULE, "restart", f"the hang watcher on {node} found no progress")
    kernel, node_bus, job_bus, why = kernel_since(cfg, env, end.started_mono) if read_kernel else ([], None, None, "")
    if why and kernel_unavailable is not None:
        kernel_unavailable(why)
        why = ""
    policy = from_config(cfg.classify) if cfg.classify else default_policy()
    v = classify(Evidence(kernel_lines=kernel, stderr_tail=end.tail, exit_code=None if end.signal else end.code,
                          signal=end.signal, job_bus_ids=job_bus, node_bus_ids=node_bus, now=time.time(),
                          kernel_records=True), policy)
    note = f"; {why}" if why else ""
    if v.verdict in RESTART_CLASSES and v.rule not in NOT_A_FAULT:
        return Judgement(v.verdict, v.rule, "restart", f"{v.verdict} ({v.rule}){note}")
    if v.verdict == "user":
        return Judgement(v.verdict, v.rule, "stop", f"the job's own error ({v.rule}): not retried")
    if v.verdict == "hardware" or v.action == "verify":
        return Judgement(v.verdict, v.rule, "escalate", f"looks like hardware ({v.rule}): the node's epilog "
                         f"checks it and slurm-ft requeues the job elsewhere if it is")
    return Judgement(v.verdict, v.rule, "escalate", f"{v.verdict} ({v.rule}): left to slurm-ft's failover{note}")


def run(argv: list[str], restarts: int, *, cfg=None, env=None, delay_s: float = 2.0, slurm=None, reporter=None,
        log=None, launcher=launch, sleep=time.sleep) -> int:
    """Run the step; restart it in place on infra/hang up to ``restarts`` times; return the exit
    status the batch script should end with (0, or the last step's)."""
    from slurm_ft import config as config_mod
    from slurm_ft.slurm import Slurm
    env = dict(os.environ if env is None else env)
    log = log or (lambda msg: print(f"slurm-ft run: {msg}", file=sys.stderr, flush=True))
    if cfg is None:
        try:
            cfg = config_mod.load(env=env)
        except SlurmFTError as exc:
            log(f"config: {exc}; using the defaults")
            cfg = config_mod.Config()
    job_id = env.get("SLURM_JOB_ID", "")
    in_job = job_id.isdigit()
    if slurm is None and in_job:
        slurm = Slurm(timeout_s=20.0)
    if reporter is None and in_job:
        reporter = CommentReporter(int(job_id), slurm)
    attempt = int(env.get("SLURM_RESTART_COUNT") or 0) if (env.get("SLURM_RESTART_COUNT") or "0").isdigit() else 0
    if in_job:
        from slurm_ft.hang.heartbeat import mark_inplace
        mark_inplace(env)      # a hang watcher on this node then ends only the step's tasks
    done = 0
    causes: list[str] = []      # why each restart happened, carried in every record
    kernel = {"readable": True}

    def kernel_unavailable(why: str) -> None:
        # the kernel log is root's (dmesg_restrict) or this node's GPUs are unknown: that does not
        # change between steps of one run, so it is said once and not read again
        if kernel["readable"]:
            log(f"kernel evidence is not available to the job: {why}; a fault only the kernel log shows "
                f"is judged by the node's epilog after escalation")
        kernel["readable"] = False

    while True:
        end = launcher(argv)
        if end.code == 0:
            if done:
                log(f"step succeeded after {done} in-place restart{'s' if done > 1 else ''}")
            return 0
        j = judge(cfg, end, env, slurm if in_job else None, read_kernel=kernel["readable"],
                  kernel_unavailable=kernel_unavailable)
        how = f"signal {end.signal}" if end.signal else f"exit {end.code}"
        if j.action == "restart" and done < restarts:
            done += 1
            causes.append(f"{j.verdict} ({j.rule})")
            log(f"step failed ({how}): {j.why}; restart {done}/{restarts} in place")
            if reporter is not None:
                reporter.report(Record(attempt, done, restarts, "restarted", j.verdict, j.rule, time.time(),
                                       tuple(causes)))
            sleep(delay_s)
            continue
        if j.action == "restart":
            log(f"step failed ({how}): {j.why}; in-place budget {restarts} used up: escalating (the job ends and "
                f"slurm-ft decides whether to requeue it)")
        elif j.action == "escalate":
            log(f"step failed ({how}): {j.why}; escalating")
        else:
            log(f"step failed ({how}): {j.why}")
        if reporter is not None and j.action != "stop":
            reporter.report(Record(attempt, done, restarts, "escalated", j.verdict, j.rule, time.time(),
                                   tuple(causes)))
        return end.code or 1
