"""Controller side of checkpoint-before-exit: signal every task of a job, wait for its ack, requeue.

Used by ``slurm-ft drain NODE --checkpoint`` (root, controller host) and meant for any slurm-ft path
that is about to end a running job (a health check or Xid that leaves the job alive):
:func:`evacuate_node` / :func:`checkpoint_and_requeue`.

1. **notify**: the job's checkpoint signal (``--ft-ckpt-signal``) to every process of the job, on
   every node, that has a handler for it (deliver.py): step tasks and the batch script's
   children alike; a batch shell without a ``trap`` and a program without a handler are left
   alone, never killed. Journal: ``ckpt-notify`` (``evacuation: ...`` or ``time-limit: ...``, with
   what was signalled). Nothing catches the signal: no wait, the job is requeued at once
   ("evacuated without a checkpoint").
2. **wait** (bounded by ``--ft-ckpt-wait``): poll the job's comment for an ack of this attempt
   newer than the notify (channel.py); ``saved``/``failed`` end the wait, so does the job ending
   (then the daemon requeues it: an attempt that ends after slurm-ft's signal is an evacuation,
   never the user's error). Journal: ``ckpt-ack`` (done: saved; failed: failed) or ``ckpt-timeout``.
3. **requeue** within the site's evacuation bound (``[failover] max_evacuations``; not the
   retry budget: an evacuation is not a fault): ``scontrol requeue``, ``ExcNodeList`` += the
   node, priority above every waiting job, ``StartTime=now`` once out of COMPLETING. Past the
   bound the job is left to run to its end on the draining node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..drain import LEADER, drain_node
from ..errors import ConfigError
from ..failover import jobspec, policy, steps
from ..slurm import Job, Slurm, compress_nodes, split_nodes
from . import channel
from .deliver import Delivery, signal_job

#: An ack may carry a time a little before the notify (clocks of nodes and controller differ).
CLOCK_SKEW_S = 5.0


@dataclass
class Outcome:
    job_id: int
    attempt: int
    result: str                      # saved | failed | timeout | ended | unprepared | skipped
    step: int | None = None
    path: str | None = None
    waited_s: float = 0.0
    requeued: bool = False
    detail: str = ""
    opts: jobspec.FtOptions | None = field(default=None, repr=False)
    delivery: Delivery | None = field(default=None, repr=False)


def notify(slurm: Slurm, journal, job: Job, opts: jobspec.FtOptions, why: str,
           purpose: str = policy.NOTIFY_EVACUATION) -> Delivery:
    """Send the checkpoint signal to the job's processes that catch it (deliver.py); journal it
    as ``ckpt-notify`` with detail ``<purpose>: <what was signalled>; wait S s; <why>`` (status
    done: something was signalled; skipped: nothing catches the signal; failed: the step could not
    run). Returns the delivery; its journal time is the notify time."""
    delivery = signal_job(slurm, job, opts.ckpt_signal)
    status = "failed" if delivery.error else ("done" if delivery.signalled else "skipped")
    journal.record(job.job_id, job.restart_count, "ckpt-notify", job.nodes,
                   f"{purpose}: {delivery.summary()}; wait {opts.ckpt_wait_s} s; {why}", status=status)
    return delivery


def notify_purpose(detail: str | None) -> str:
    """What a journaled ``ckpt-notify`` was for (rows before purposes existed: evacuation)."""
    return policy.NOTIFY_TIME_LIMIT if (detail or "").startswith(policy.NOTIFY_TIME_LIMIT + ":") \
        else policy.NOTIFY_EVACUATION


def wait_acks(slurm: Slurm, journal, pending: dict[int, tuple[Job, jobspec.FtOptions, float, float]],
              poll_s: float = 0.5, now=time.time, sleep=time.sleep) -> dict[int, Outcome]:
    """Wait for every job in ``pending`` (job id -> (job, opts, notify time, deadline))."""
    done: dict[int, Outcome] = {}
    while pending:
        jobs = {j.job_id: j for j in slurm.jobs()}
        t = now()
        for job_id, (job, opts, t0, deadline) in list(pending.items()):
            cur = jobs.get(job_id)
            ack = channel.find(cur.comment) if cur is not None else None
            fresh = ack is not None and ack.attempt == job.restart_count and ack.time >= t0 - CLOCK_SKEW_S
            out = None
            if fresh and ack.state in ("saved", "failed"):
                out = Outcome(job_id, job.restart_count, ack.state, ack.step, ack.path, t - t0)
                journal.record(job_id, job.restart_count, "ckpt-ack", job.nodes,
                               ack_detail(ack), status="done" if ack.state == "saved" else "failed")
            elif cur is None or cur.ended or cur.restart_count != job.restart_count or cur.state == "PENDING":
                out = Outcome(job_id, job.restart_count, "ended", waited_s=t - t0,
                              detail=f"job left RUNNING ({cur.state if cur else 'gone'}) during the wait")
                journal.record(job_id, job.restart_count, "ckpt-timeout", job.nodes, out.detail, status="failed")
            elif t >= deadline:
                last = f"; last report: {ack.state} step {ack.step}" if fresh else ""
                out = Outcome(job_id, job.restart_count, "timeout", waited_s=t - t0,
                              detail=f"no saved/failed ack within {opts.ckpt_wait_s} s{last}")
                journal.record(job_id, job.restart_count, "ckpt-timeout", job.nodes, out.detail, status="failed")
            if out is not None:
                out.opts = opts
                done[job_id] = out
                del pending[job_id]
        if pending:
            sleep(poll_s)
    return done


def ack_detail(ack: channel.Ack) -> str:
    """Journal text of an ack: ``saved step=120 path=/ckpt/120.pt``."""
    parts = [ack.state]
    if ack.step is not None:
        parts.append(f"step={ack.step}")
    if ack.path:
        parts.append(f"path={ack.path}")
    return " ".join(parts)


def evacuations_done(journal, job_id: int) -> int:
    """Evacuation requeues done for the job (journal ``evacuation`` actions)."""
    return sum(1 for a in journal.actions(job_id) if a["action"] == "evacuation" and a["status"] == "done")


def requeue(slurm: Slurm, journal, job: Job, opts: jobspec.FtOptions, exclude: list[str], *, why: str,
            priority_boost: int = 1000, settle_s: float = 15.0, max_evacuations: int = 10,
            unsatisfiable: str = "hold") -> bool:
    """Requeue in place as an evacuation, excluding ``exclude``; False (journaled) when the site's
    evacuation bound is used up (then the job runs on) or Slurm refused.

    Journaled so the concurrently running daemon cooperates: a ``decide`` row (``evacuate: ...``)
    before the requeue tells it slurm-ft, not Slurm or an admin, requeued this attempt; an
    ``evacuation`` row (done) after it counts against ``max_evacuations`` (never the retry budget).
    While the job is pending in ``evacuated`` the daemon clears the requeue delay.
    """
    attempt = job.restart_count
    if evacuations_done(journal, job.job_id) >= max_evacuations:
        journal.record(job.job_id, attempt, "requeue", str(job.job_id),
                       f"not requeued: site bound of {max_evacuations} evacuations used up; the job runs on",
                       status="skipped")
        return False
    journal.upsert_attempt(job.job_id, attempt, nodes=job.nodes or None, start=job.start_time, end=time.time(),
                           state="REQUEUED")
    journal.record(job.job_id, attempt, "decide", compress_nodes(exclude), f"evacuate: checkpoint-before-exit ({why})")
    journal.set_ft_state(job.job_id, policy.EVACUATED)
    refused = steps.requeue_in_place(slurm, journal, job.job_id, attempt)
    if refused:
        journal.set_ft_state(job.job_id, policy.RUNNING)
        return False
    outcome = steps.exclude_and_boost(slurm, journal, job.job_id, attempt, list(exclude), nodes=slurm.nodes(),
                                      top=steps.top_priority(slurm.jobs(), journal.boosted_jobs()),
                                      priority_boost=priority_boost, unsatisfiable=unsatisfiable)
    journal.record(job.job_id, attempt, "evacuation", compress_nodes(exclude), f"checkpoint-before-exit: {why}")
    if outcome == "held":
        return True
    left = slurm.wait_job(job.job_id, lambda j: not j.completing, settle_s, 0.1)
    if left is not None and left.state == "PENDING":
        steps.clear_requeue_delay(slurm, journal, left)
    return True


def ensure_journal_job(journal, job: Job, opts: jobspec.FtOptions) -> None:
    if journal.job(job.job_id) is None:
        journal.upsert_job(job.job_id, name=job.name, user=job.user, ft_enabled=1, retries=opts.retries,
                           ft_state=policy.RUNNING, excluded_nodes="")
    journal.upsert_attempt(job.job_id, job.restart_count, nodes=job.nodes or None, start=job.start_time,
                           state=job.state)


def checkpoint_and_requeue(slurm: Slurm, journal, jobs: list[Job], *, exclude: list[str], why: str,
                           default_retries: int, wait_s: float | None = None, requeue_jobs: bool = True,
                           priority_boost: int = 1000, poll_s: float = 0.5, log=lambda *_: None,
                           failover_cfg=None) -> list[Outcome]:
    """Checkpoint-before-exit for running jobs: notify all, wait for all (in parallel), requeue.
    Each job's options (signal, wait, retry budget) are those fixed at submit
    (:func:`slurm_ft.failover.options.trusted_options`), never its live comment.
    ``failover_cfg``: ``[failover]`` (site default and maximum retries); default: built-in
    defaults with ``default_retries``."""
    import dataclasses

    from ..config import FailoverConfig
    from ..failover.options import trusted_options

    fcfg = failover_cfg or dataclasses.replace(FailoverConfig(), retries=default_retries,
                                               max_retries=max(default_retries, FailoverConfig().max_retries))
    pending: dict[int, tuple] = {}
    deliveries: dict[int, Delivery] = {}
    outcomes: list[Outcome] = []
    for job in jobs:
        try:
            opts = trusted_options(job, journal, fcfg)
        except ConfigError as exc:
            outcomes.append(Outcome(job.job_id, job.restart_count, "skipped", detail=f"bad ft options: {exc}"))
            continue
        if not opts.enabled or job.state != "RUNNING":
            outcomes.append(Outcome(job.job_id, job.restart_count, "skipped",
                                    detail="not ft-enabled" if not opts.enabled else f"state {job.state}"))
            continue
        ensure_journal_job(journal, job, opts)
        t0 = time.time()
        delivery = deliveries[job.job_id] = notify(slurm, journal, job, opts, why)
        log(f"job {job.job_id}: {delivery.summary()}")
        if not delivery.signalled:
            done_now = Outcome(job.job_id, job.restart_count, "unprepared", opts=opts, delivery=delivery,
                               detail="no process of the job catches the signal: requeued without a checkpoint"
                               if not delivery.error else delivery.error)
            outcomes.append(done_now)
            continue
        limit = opts.ckpt_wait_s if wait_s is None else min(wait_s, opts.ckpt_wait_s)
        pending[job.job_id] = (job, opts, t0, t0 + limit)
        log(f"job {job.job_id}: waiting up to {limit:g} s for its checkpoint")
    done = wait_acks(slurm, journal, pending, poll_s=poll_s)
    for job in jobs:
        out = done.get(job.job_id) or next((o for o in outcomes if o.job_id == job.job_id
                                            and o.result == "unprepared"), None)
        if out is None:
            continue
        out.delivery = deliveries.get(job.job_id)
        if out.result == "ended":
            log(f"job {job.job_id}: ended instead of saving ({out.detail}); "
                "the daemon requeues it as evacuated without a checkpoint")
        elif out.result != "unprepared":
            log(f"job {job.job_id}: checkpoint {out.result} after {out.waited_s:.1f} s"
                + (f" (step {out.step}, {out.path})" if out.step is not None or out.path else ""))
        if requeue_jobs and out.result != "ended":
            fresh = slurm.job(job.job_id)
            if fresh is not None and fresh.state == "RUNNING" and fresh.restart_count == job.restart_count:
                out.requeued = requeue(slurm, journal, fresh, out.opts, exclude, why=why,
                                       priority_boost=priority_boost, max_evacuations=fcfg.max_evacuations,
                                       unsatisfiable=fcfg.unsatisfiable)
                log(f"job {job.job_id}: " + ("requeued excluding " + ",".join(exclude) if out.requeued
                                             else f"not requeued (site bound of {fcfg.max_evacuations} "
                                                  "evacuations used up, or Slurm refused): it runs on"))
        if out not in outcomes:
            outcomes.append(out)
    return outcomes


def drain(slurm: Slurm, node: str, reason: str) -> str:
    """Drain ``node`` (slurm_ft.drain: a reason an admin set is kept); a line for the admin."""
    if not reason.startswith(LEADER):
        reason = f"{LEADER} {reason}"
    done = drain_node(slurm, node, reason)
    return f"drained ({reason})" if done == "drained" else "already drained by an admin: reason kept"


def evacuate_node(slurm: Slurm, journal, node: str, *, default_retries: int, reason: str | None = None,
                  wait_s: float | None = None, priority_boost: int = 1000, only_jobs: list[int] | None = None,
                  why: str | None = None, log=lambda *_: None, failover_cfg=None) -> list[Outcome]:
    """``slurm-ft drain NODE --checkpoint``: drain, then checkpoint-before-exit and requeue the
    ft-enabled jobs running on ``node`` (or just ``only_jobs``), excluding it. Other jobs keep
    running until they end."""
    reason = reason or f"{LEADER} drain --checkpoint by admin"
    log(f"{node}: {drain(slurm, node, reason)}")
    jobs = [j for j in slurm.jobs() if j.state == "RUNNING" and node in split_nodes(j.nodes)
            and (only_jobs is None or j.job_id in only_jobs)]
    return checkpoint_and_requeue(slurm, journal, jobs, exclude=[node], why=why or f"node {node} drained by admin",
                                  default_retries=default_retries, wait_s=wait_s, priority_boost=priority_boost,
                                  log=log, failover_cfg=failover_cfg)
