"""Node epilog: classify how the job ended on this node and hand the verdict on.

Run by slurmd as root on every node of a job when it ends (``Epilog=.../epilog/slurm-ft-epilog``).
Reads: ``SLURM_JOB_ID``, ``SLURMD_NODENAME``, ``SLURM_JOB_RESTART_COUNT``, ``SLURM_JOB_EXIT_CODE``
(wait status), ``SLURM_JOB_GPUS``, ``SLURM_JOB_UID``, ``SLURM_JOB_STDOUT``/``STDERR``,
``SLURM_JOB_WORK_DIR``; the kernel log since the job started (``/dev/kmsg``); this node's GPU
inventory (NVML). Writes: the node's own journal; a non-ok verdict also goes to the node's mailbox
field in Slurm (see ``failover.mailbox``), where the daemon picks it up. The verdict is filed under
the attempt that ran here (the prolog's start marker), not Slurm's restart count at the end.

Exits 0: a non-zero epilog would make Slurm drain the node as "Epilog error", and a bug of ours
must never take a healthy node out of service (an unexpected error goes through slurm_ft.node.boundary;
only ``[node_state] on_internal_error = "drain"`` makes :func:`run` return 1, and the process
exit ``boundary.EXIT_DRAIN``, which the wrapper maps to 1). Errors go to stderr (slurmd's log) and
the node log.
"""

from __future__ import annotations

import time

from slurm_ft.node.boundary import KERNEL_LOG_FILE, bump, note, root_entry
from slurm_ft.errors import SlurmFTError
from slurm_ft.node.job import NodeJob, pop_start_marker
from slurm_ft.node.log import start_script
from slurm_ft.node.output_pattern import (
    PatternError, expand_pattern, pattern_needs_job_record, with_job_record)

#: If the prolog left no start marker, look this far back in the kernel log (seconds).
FALLBACK_WINDOW_S = 3600.0
#: Bytes of the job's output read for evidence.
STDERR_TAIL_BYTES = 64 << 10


def gather_evidence(cfg, job: NodeJob, since_monotonic: float, log):
    """Collect the Evidence for this job on this node. Each source is optional: a failing source
    is logged and skipped, never fatal. A kernel log that cannot be read (a container, no
    CAP_SYSLOG, ``kernel.dmesg_restrict`` without dmesg) is said in ``Evidence.kernel_log_error``
    and counted (``<[node_state] dir>/kernel-log-unavailable.json``, the
    ``slurm_ft_kernel_log_unavailable_total`` metric): :func:`verify_untrusted` then asks the
    trusted GPU checks."""
    from slurm_ft import nvml
    from slurm_ft.classify import Evidence
    from slurm_ft.classify.sources import read_kmsg, read_tail_safely

    node_bus: dict[str, int] | None = None
    # without a GPU map a job without GPUs still owns none (a GPU job's bus ids are then unknown)
    job_bus: frozenset[str] | None = frozenset() if job.gpus is None else None
    try:
        node_bus, job_bus = nvml.gpu_map(cfg, job.node, job.gpus)  # SLURM_JOB_GPUS unset: the job owns no GPU
    except Exception as exc:  # NVML down is evidence-poor, not fatal
        log(f"GPU inventory unavailable: {exc}")
    kernel_error = ""
    try:
        kernel = read_kmsg(since_monotonic)
    except SlurmFTError as exc:
        log(f"kernel log unavailable: {exc}")
        kernel, kernel_error = [], str(exc) or type(exc).__name__
        try:
            bump(cfg.node_state.dir, "epilog", KERNEL_LOG_FILE)
        except OSError as err:
            log(f"kernel-log counter not written: {err}")
    tail, unread = read_outputs(cfg, job, log, read_tail_safely)
    return Evidence(kernel_lines=kernel, stderr_tail=tail, exit_code=job.exit_code, signal=job.signal,
                    job_bus_ids=job_bus, node_bus_ids=node_bus, now=time.time(), kernel_records=True,
                    kernel_log_error=kernel_error, output_unread=unread)


def read_outputs(cfg, job: NodeJob, log, read_tail) -> tuple[str, tuple[str, ...]]:
    """The tail of the job's stderr then stdout (each at most :data:`STDERR_TAIL_BYTES`, read by
    ``read_tail(path, expected_uid=, max_bytes=)``: as the job's user, symlinks never followed,
    bounded in bytes and seconds, slurm_ft.node.userfile), and one ``output not read: <reason>`` line
    per output that could not be read (a pattern slurm-ft will not expand, a file it may not
    read). One ``scontrol show job`` only when a pattern needs the job name or array ids the
    environment lacks (:func:`pattern_needs_job_record`); the same file named twice is read once."""
    from slurm_ft.textsafe import terminal_safe

    if any(pattern_needs_job_record(p, job) for p in (job.stderr, job.stdout)):
        job = with_job_record(cfg, job, log)
    tail, unread, seen = "", [], set()
    for pattern in (job.stderr, job.stdout):
        if not pattern:
            continue
        try:
            path = expand_pattern(pattern, job)
            if path in seen:
                continue
            seen.add(path)
            text = read_tail(path, expected_uid=job.uid, max_bytes=STDERR_TAIL_BYTES)
        except (PatternError, SlurmFTError) as exc:
            line = terminal_safe(f"output not read: {exc}")[:MAX_UNREAD_CHARS]
            log(f"job {line}")
            if line not in unread:
                unread.append(line)
            continue
        tail += text if not tail or tail.endswith("\n") else "\n" + text
    return tail, tuple(unread)


#: At most this many characters of an ``output not read`` evidence line.
MAX_UNREAD_CHARS = 300


def with_unread_outputs(verdict, evidence):
    """``verdict`` with the ``output not read: <reason>`` lines of ``evidence``
    (``Evidence.output_unread``, from :func:`gather_evidence`) after its own evidence lines, within
    the verdict's line bound (``classify.model.MAX_EVIDENCE_LINES``; the deciding lines stay first)."""
    import dataclasses

    from slurm_ft.classify.model import MAX_EVIDENCE_LINES
    unread = tuple(getattr(evidence, "output_unread", ()) or ())
    if not unread:
        return verdict
    keep = max(0, MAX_EVIDENCE_LINES - len(unread))
    return dataclasses.replace(verdict, evidence=tuple(verdict.evidence[:keep]) + unread[:MAX_EVIDENCE_LINES])


def window_start(cfg, job: NodeJob, marker: dict | None, log) -> float:
    """Monotonic time (seconds, the kernel log's clock) from which kernel lines belong to this job:
    the prolog's start marker; else the job's start time from Slurm; else the last hour."""
    if marker:
        return marker["monotonic"] - 1.0
    try:
        from slurm_ft.slurm import Slurm
        info = Slurm.from_config(cfg).job(job.job_id)
        if info is not None and info.start_time:
            return time.monotonic() - (time.time() - info.start_time) - 1.0
    except SlurmFTError as exc:
        log(f"job start time unavailable: {exc}")
    return time.monotonic() - FALLBACK_WINDOW_S


def with_prior_xids(cfg, job: NodeJob, evidence, policy, log):
    """``evidence`` plus this node's earlier Xids from the node journal (``prior_xids``), for
    count/window rules across jobs ("Xid 31 three times on the same GPU within 1 h").

    Only when the kernel lines hold a GPU Xid some count rule counts; then one bounded query:
    verdicts recorded within the longest rule window, at most the newest few thousand rows.  The
    current job+attempt's own earlier record (an epilog run twice) is left out.  A journal that
    cannot be read is logged and the evidence returned unchanged."""
    import dataclasses

    from slurm_ft.classify.history import (
        MAX_PRIOR_VERDICTS, SCAN_VERDICTS, lookback_s, needs_history, prior_xids)
    from slurm_ft.journal import open_node_journal

    if not needs_history(evidence.kernel_lines, policy):
        return evidence
    now = evidence.now if evidence.now is not None else time.time()
    try:
        with open_node_journal(cfg, job.node) as journal:
            rows = journal.recent_xid_verdicts(now - lookback_s(policy), limit=MAX_PRIOR_VERDICTS,
                                               scan=SCAN_VERDICTS)
    except SlurmFTError as exc:
        log(f"earlier Xids unavailable: {exc}")
        return evidence
    prior = prior_xids(rows, exclude=(job.job_id, job.attempt))
    return dataclasses.replace(evidence, prior_xids=prior, now=now) if prior else evidence


def classify_window(evidence, policy):
    """:func:`slurm_ft.classify.classify` of the epilog's evidence: through grep's candidate lines
    when the window is large (``slurm_ft.classify.prefilter.GREP_MIN_BYTES``, the threshold every
    caller shares; grep missing or failing falls back to the pure-Python scan inside the
    classifier)."""
    from slurm_ft.classify import classify

    return classify(evidence, policy)


def job_uid(job: NodeJob) -> int | None:
    """The job's owner as slurmd gave the epilog: ``SLURM_JOB_UID``, else the passwd uid of
    ``SLURM_JOB_USER``; None when neither is known.  Always a uid, so one user is never counted
    as two (a name on one verdict, a uid on another)."""
    if job.uid is not None:
        return job.uid
    if not job.user:
        return None
    import pwd
    try:
        return pwd.getpwnam(job.user).pw_uid
    except (KeyError, UnicodeEncodeError, ValueError):
        return None


def with_recurrence(cfg, job: NodeJob, evidence, verdict, policy, log):
    """``(evidence, verdict)`` after the per-node recurrence rules (slurm_ft.classify.recurrence):
    when ``verdict``'s rule is a crash kind some rule counts (``segfault``, ``signal-other``...:
    :func:`slurm_ft.classify.history.needs_crash_history`), this node's verdicts of those kinds
    within the longest rule window are read from its journal (one bounded query) and the job is
    classified again with them (``Evidence.prior_crashes``, its own id and owner: :func:`job_uid`).
    A suspect node gives rule ``node-crash-recurring``, action ``verify``: :func:`verify_untrusted`
    then runs the trusted checks, which alone may drain; otherwise the job is ``unknown`` and
    retried elsewhere, unblamed.  Owners are uids from slurmd, never from the job: one user's jobs
    alone never make a node suspect.  Every other verdict, and a journal that cannot be read
    (logged), leave both unchanged."""
    import dataclasses

    from slurm_ft.classify.history import (MAX_PRIOR_VERDICTS, SCAN_VERDICTS, crash_lookback_s, crash_rules,
                                   needs_crash_history, prior_crashes)
    from slurm_ft.journal import open_node_journal

    if not needs_crash_history(verdict.rule, policy):
        return evidence, verdict
    now = evidence.now if evidence.now is not None else time.time()
    counted = crash_rules(policy)
    rules = counted | {f"{p}{r}" for r in counted for p in (VERIFIED, UNVERIFIED)}
    try:
        with open_node_journal(cfg, job.node) as journal:
            rows = journal.recent_rule_verdicts(now - crash_lookback_s(policy), rules, limit=MAX_PRIOR_VERDICTS,
                                                scan=SCAN_VERDICTS)
    except SlurmFTError as exc:
        log(f"earlier crashes on this node unavailable: {exc}")
        return evidence, verdict
    prior = prior_crashes([{**r, "user": r.get("uid")} for r in rows], policy, exclude=job.job_id)
    if not prior:
        return evidence, verdict
    uid = job_uid(job)
    evidence = dataclasses.replace(evidence, prior_crashes=prior, job_id=str(job.job_id), now=now,
                                   user=None if uid is None else str(uid))
    again = classify_window(evidence, policy)
    if again.rule != verdict.rule:
        log(f"{again.rule}: {again.evidence[0] if again.evidence else ''}")
    return evidence, again


@root_entry("epilog")
def run(env: dict[str, str] | None = None) -> int:
    """The whole epilog; returns the process exit status (0; an unexpected error goes through
    slurm_ft.node.boundary: 0 under ``[node_state] on_internal_error = "pass"``, 1 under ``"drain"``)."""
    job, cfg, log = start_script("epilog", env)
    if cfg is None:
        return 0
    note(cfg=cfg, node=job.node, log=log)
    try:
        marker = pop_start_marker(cfg.node_state.dir, job)
        job = attempt_that_ran(job, marker)
        since = window_start(cfg, job, marker, log)
        from slurm_ft.classify import default_policy, from_config
        policy = from_config(cfg.classify) if cfg.classify else default_policy()
        evidence = with_prior_xids(cfg, job, gather_evidence(cfg, job, since, log), policy, log)
        evidence, verdict = with_recurrence(cfg, job, evidence, classify_window(evidence, policy), policy, log)
        verdict = verify_untrusted(cfg, job, verdict, log, evidence=evidence)
        verdict = with_unread_outputs(verdict, evidence)
        posted = record_verdict(cfg, job, verdict, start=marker.get("time") if marker else None, log=log)
        from slurm_ft.hang.watcher import epilog_cleanup
        if epilog_cleanup(cfg, job.job_id, job.node):
            log("hang watcher still running at the job's end: stopped")
        if posted is not None and posted.verdict == "hardware":
            hand_off(cfg, job, log)
    except SlurmFTError as exc:
        log(f"error: {exc}")
    return 0


#: Rule prefixes of a verdict whose untrusted (job output) hardware evidence the trusted GPU checks
#: confirmed / did not confirm (docs/security.md).
VERIFIED, UNVERIFIED = "verified:", "unverified:"
#: Rule of a failed GPU job's verdict made ``hardware`` by the trusted checks because the kernel
#: log could not be read (docs/health-checks.md, "Without a kernel log").
NO_KERNEL_LOG = "no-kernel-log"


def ended_badly(evidence) -> bool:
    """Did the job not end cleanly: a non-zero exit code, a terminating signal, or a Slurm state
    other than ``COMPLETED`` (``Evidence.exit_code``/``signal``/``slurm_state``; unknown is clean)."""
    return bool(evidence.exit_code or evidence.signal
                or (evidence.slurm_state or "COMPLETED").split()[0].upper() != "COMPLETED")


def trusted_failures(cfg, job: NodeJob, log, run_checks=None):
    """Run the trusted GPU checks on this node (``slurm_ft.health.run_checks(cfg, node)``, read by
    root through NVML), journal their results, and return ``(results, failing, mine)``: every
    result, the failing ones, and the failing ones that are node-level or on one of the job's GPUs
    (``SLURM_JOB_GPUS``: a job without GPUs owns none). Checks that cannot run give three empty
    lists (logged). ``run_checks``: for tests."""
    from slurm_ft.health import unhealthy
    from slurm_ft.health.actions import journal_results

    if run_checks is None:
        from slurm_ft.health import run_checks
    try:
        results = run_checks(cfg, job.node)
    except SlurmFTError as exc:
        log(f"trusted GPU checks not run: {exc}")
        results = []
    if results:
        journal_results(cfg, job.node, results, job.job_id, log)
    failing = unhealthy(results)
    return results, failing, [r for r in failing if r.gpu is None or r.gpu in (job.gpus or ())]


def verify_untrusted(cfg, job: NodeJob, verdict, log, run_checks=None, evidence=None):
    """Resolve a verdict whose hardware evidence is only the job's own output (action ``verify``),
    or that carries *unplaced* kernel records (``verdict.unplaced``: hardware records that name no
    GPU of this job or node, e.g. ``NVRM: Xid: 79,`` without a bus id), or that was reached
    without a kernel log (``evidence.kernel_log_error``).

    The job's output is untrusted: it may print ``uncorrectable ECC error encountered`` without
    any fault.  So the trusted checks (NVML, read by root: ``slurm_ft.health``) run on this node
    and decide: a failing check on one of the job's GPUs (or a node-level one) makes the verdict
    ``hardware`` (rule ``verified:<row>``, drain); otherwise it is ``unknown`` (rule
    ``unverified:<row>``, action ``retry``: the daemon may retry the job elsewhere without
    blaming the node, within the site's unblamed-retry budget).  Checks that cannot run never
    confirm.  The job's GPUs are ``SLURM_JOB_GPUS``: a job without GPUs owns none, so only a
    node-level check confirms for it; another job's failing GPU never does.

    Unplaced records are attributed to no job and decide nothing by themselves: they only make the
    trusted checks run.  A failing check drains the node (rule ``verified:unplaced``; the verdict
    becomes ``hardware`` only when the failing check is node-level or on one of the job's GPUs and
    the job did not end cleanly, else the verdict stays and ``cause`` names it); none failing (or
    checks that cannot run) leaves the verdict unchanged.

    No kernel log (``evidence.kernel_log_error``, from :func:`gather_evidence`): a GPU that fell
    off the bus leaves no Xid to read, only a failed job.  When the job held GPUs here and did not
    end cleanly (:func:`ended_badly`) the trusted checks run once; a failing one on the job's GPUs
    (or node-level) makes the verdict ``hardware`` (rule ``verified:no-kernel-log``, drain);
    otherwise the verdict is unchanged.  A clean exit or a job without GPUs runs no check.  Every
    non-ok verdict reached without a kernel log carries the line ``kernel log unavailable:
    <reason>``.  Every other verdict is returned unchanged.  ``run_checks``: for tests.
    """
    from slurm_ft.classify.model import MAX_EVIDENCE_LINES

    missing = getattr(evidence, "kernel_log_error", "") if evidence is not None else ""
    unplaced = tuple(getattr(verdict, "unplaced", ()) or ())
    if verdict.action == "verify" or (unplaced and verdict.action not in ("drain_node", "reset_gpu")):
        out = _verify(cfg, job, verdict, log, run_checks, unplaced)
    elif missing and job.gpus and ended_badly(evidence) and verdict.action not in ("drain_node", "reset_gpu"):
        out = _verify_without_kernel_log(cfg, job, verdict, log, run_checks, missing)
    else:
        out = verdict
    if missing and out.verdict != "ok":
        import dataclasses
        line = kernel_log_line(missing)
        if line not in out.evidence:
            out = dataclasses.replace(out, evidence=(*out.evidence[:MAX_EVIDENCE_LINES - 1], line))
    return out


def kernel_log_line(missing: str) -> str:
    """The evidence line ``kernel log unavailable: <reason>``: one line (controls escaped,
    slurm_ft.textsafe), at most ``MAX_EVIDENCE_CHARS`` characters."""
    from slurm_ft.classify.model import MAX_EVIDENCE_CHARS
    from slurm_ft.textsafe import terminal_safe
    return f"kernel log unavailable: {terminal_safe(missing)}"[:MAX_EVIDENCE_CHARS]


def _verify_without_kernel_log(cfg, job: NodeJob, verdict, log, run_checks, missing: str):
    import dataclasses

    from slurm_ft.classify.model import MAX_EVIDENCE_LINES

    results, failing, mine = trusted_failures(cfg, job, log, run_checks)
    gpus = ",".join(map(str, job.gpus or ()))
    if not mine:
        log(f"kernel log unavailable; the job failed ({verdict.rule}); trusted checks ({len(results)} results) "
            f"found no fault on GPUs {gpus}: verdict unchanged")
        return verdict
    first = mine[0]
    lines = (f"trusted check {first.check} failed: {first.measurement}",
             kernel_log_line(missing), *verdict.evidence)
    log(f"kernel log unavailable; the job failed ({verdict.rule}); trusted check {first.check} failed on "
        f"{'the node' if first.gpu is None else f'GPU {first.gpu}'}: draining {job.node}")
    return dataclasses.replace(verdict, verdict="hardware", rule=f"{VERIFIED}{NO_KERNEL_LOG}", action="drain_node",
                               evidence=lines[:MAX_EVIDENCE_LINES])


def _verify(cfg, job: NodeJob, verdict, log, run_checks, unplaced: tuple):
    """The ``verify`` / unplaced part of :func:`verify_untrusted`."""
    import dataclasses

    from slurm_ft.classify.model import MAX_EVIDENCE_LINES

    results, failing, mine = trusted_failures(cfg, job, log, run_checks)
    if verdict.action != "verify":  # only unplaced records: they decide nothing by themselves
        if not failing:
            log(f"unplaced kernel record(s) ({unplaced[0][:120]!r}); trusted checks found nothing")
            return verdict
        first = (mine or failing)[0]
        lines = (f"trusted check {first.check} failed: {first.measurement}", *unplaced, *verdict.evidence)
        log(f"unplaced kernel record(s); trusted check {first.check} failed: draining {job.node}")
        if mine and verdict.verdict != "ok":
            return dataclasses.replace(verdict, verdict="hardware", rule=f"{VERIFIED}unplaced", action="drain_node",
                                       evidence=lines[:MAX_EVIDENCE_LINES])
        return dataclasses.replace(verdict, action="drain_node", cause=f"{VERIFIED}unplaced",
                                   evidence=lines[:MAX_EVIDENCE_LINES])
    if mine:
        first = mine[0]
        lines = (f"trusted check {first.check} failed: {first.measurement}", *verdict.evidence)
        log(f"job output suggested hardware ({verdict.rule}); confirmed by {first.check}")
        return dataclasses.replace(verdict, verdict="hardware", rule=f"{VERIFIED}{verdict.rule}", action="drain_node",
                                   evidence=lines[:MAX_EVIDENCE_LINES])
    gpus = ",".join(map(str, job.gpus)) if job.gpus else "none"
    lines = (f"trusted GPU checks ({len(results)} results, GPUs {gpus}) found no fault", *verdict.evidence)
    log(f"job output suggested hardware ({verdict.rule}); trusted checks found nothing: not blaming {job.node}")
    return dataclasses.replace(verdict, verdict="unknown", rule=f"{UNVERIFIED}{verdict.rule}", action="retry",
                               evidence=lines[:MAX_EVIDENCE_LINES])


def attempt_that_ran(job: NodeJob, marker: dict | None) -> NodeJob:
    """``job`` with the attempt that ran on this node: the prolog's start marker records it.
    Slurm's ``SLURM_JOB_RESTART_COUNT`` in the epilog is already the *next* attempt's when the
    job was requeued while it ran (an evacuation, a continuation, a prolog failure)."""
    import dataclasses

    ran = marker.get("attempt") if marker else None
    if isinstance(ran, int) and not isinstance(ran, bool) and 0 <= ran < job.attempt:
        return dataclasses.replace(job, attempt=ran)
    return job


class SlurmOnUse:
    """``Slurm.from_config(cfg)`` (slurm_ft.slurm), made (and its module imported) at the first
    attribute used: the epilog of a clean job with nothing in its node's outbox never calls Slurm,
    and pays no import for it (issue 24, docs/architecture.md "Per-job cost")."""

    def __init__(self, cfg):
        self._cfg, self._slurm = cfg, None

    def __getattr__(self, name: str):
        if self._slurm is None:
            from slurm_ft.slurm import Slurm
            self._slurm = Slurm.from_config(self._cfg)
        return getattr(self._slurm, name)


#: Seconds the epilog waits for a locked node journal before it spools the rows instead.
JOURNAL_BUSY_S = 1.0


def hand_off(cfg, job: NodeJob, log) -> None:
    """Wait (at most ``[failover] handoff_wait_s``) for the daemon to requeue this failed 1-node
    ft job before the epilog ends (slurm_ft.node.handoff: why, and what is trusted)."""
    from slurm_ft.node.handoff import wait_for_requeue

    if cfg.failover.handoff_wait_s <= 0:
        return
    t0 = time.monotonic()
    why = wait_for_requeue(SlurmOnUse(cfg), job.job_id, job.attempt, cfg.failover.handoff_wait_s)
    if why in ("requeued", "timeout"):
        log(f"hand-off: {why} after {time.monotonic() - t0:.2f} s")


def record_verdict(cfg, job: NodeJob, verdict, start: float | None, log):
    """Drain (trusted hardware only, within the circuit breaker) and post the verdict to the
    mailbox for the daemon (non-ok verdicts only; a refused post waits in the node's outbox),
    then the node journal. Nothing waits on the journal: one another process holds locked gets
    the rows through its spool (``<journal>.spool``) a moment later. Returns the verdict record
    (:class:`~slurm_ft.failover.verdict.NodeVerdict`) when the mailbox has it now, else None."""
    from slurm_ft.failover import mailbox
    from slurm_ft.failover.verdict import NodeVerdict
    from slurm_ft.journal import identity, open_node_journal
    from slurm_ft.node.job import node_key

    v = NodeVerdict.from_classified(verdict, job_id=job.job_id, attempt=job.attempt, node=job.node,
                                    exit_code=job.exit_code, time=time.time())
    log(f"verdict {v.verdict} ({v.rule})")
    slurm = SlurmOnUse(cfg)     # an ok verdict with an empty outbox never calls Slurm: no import
    if v.action == "drain_node" and cfg.failover.drain:
        # Drain before the epilog ends: the job's resources are freed right after, and the
        # scheduler must not hand the sick GPU to the next job in the meantime.
        from slurm_ft.drain import drain_node, drain_reason
        try:
            log(f"drain: {drain_node(slurm, job.node, drain_reason(job.job_id, v), breaker=cfg.breaker)}")
        except SlurmFTError as exc:
            log(f"drain failed ({exc}); the daemon drains the node from the verdict")
    posted = None
    if v.verdict != "ok":
        if mailbox.post_verdict(cfg, slurm, v, log=log):
            posted = v
        else:
            log("verdict not posted (Slurm refused); kept in this node's outbox for the next prolog/epilog")
    else:
        mailbox.flush_outbox(cfg, slurm, job.node, log=log)
    trouble = None
    try:
        with open_node_journal(cfg, job.node, spool=True, busy_timeout_s=JOURNAL_BUSY_S) as journal:
            if identity.observe_node(journal, *node_key(job, {"time": start}),   # a reused job id here
                                     array=(job.array_job_id, job.array_task_id)) is not None:
                log(f"job id {job.job_id} reused on this node: the earlier job's record was retired")
            journal.upsert_attempt(job.job_id, job.attempt, nodes=job.node, start=start, end=v.time,
                                   exit_code=job.exit_code, signal=job.signal)
            journal.add_node_verdict(v, uid=job_uid(job))
            if journal.unwritten:     # its storage refuses them (a full disk): the trouble names why
                trouble = journal.trouble.message() if journal.trouble else "not writable"
            elif journal.spooled:
                log(f"node journal busy: {journal.spooled} row(s) spooled")
    except SlurmFTError as exc:
        trouble = str(exc)      # names the real error (slurm_ft.journal.trouble): disk full, I/O error...
    if trouble is not None:
        # the node action and the mailbox post never depend on the journal; the verdict and its
        # evidence are never dropped silently: the daemon gets the verdict from the mailbox (an ok
        # one too, posted now), the evidence goes to this node's log
        log(f"verdict not journaled on this node: {trouble}")
        log(f"verdict evidence: {' | '.join(v.evidence)[:4000] or 'none'}")
        if v.verdict == "ok" and not mailbox.post_verdict(cfg, slurm, v):
            log("verdict not posted (Slurm refused); kept in this node's outbox for the next prolog/epilog")
    return posted


def main() -> None:
    """The process entry (``python -m slurm_ft.node.epilog``; the checkout's wrapper calls it after its
    ``-S`` start): run the epilog and exit (slurm_ft.node.boundary.exit_process)."""
    from slurm_ft.node.boundary import exit_process
    exit_process(run())


if __name__ == "__main__":
    main()
