"""The epilog's hand-off: hold a failed 1-node ft job in COMPLETING until the daemon requeued it.

Why (issue 23; docs/architecture.md, "Fault to RUNNING"): slurmctld finishes a requeue
(``batch_requeue_fini``) when the job's last epilog completes, and the epilog-complete RPC is
the one place where it runs the scheduler at once; a requeue made after that RPC starts the job
only at the next pass of slurmctld's once-a-second background loop. So the epilog that posted a
hardware verdict for a 1-node ft job waits (at most ``[failover] handoff_wait_s``; 0, the
default, is off) until Slurm shows the job requeued (its restart count past this attempt): the
daemon decides while the job is COMPLETING (slurm_ft.failover.machine._decide_completing), sets
the exclusion and priority on the requeued job, and the epilog's exit lets Slurm finish the
requeue. It pays only where that RPC also makes the job eligible: Slurm >= 25.11 with
``SchedulerParameters=requeue_delay=-1`` (Xid 79 fault -> RUNNING 1.55 -> 0.68 s, measured on
26.05.5); elsewhere Slurm's requeue delay still applies and the job is eligible later than
without the hand-off (measured on 22.05), which ``slurm-ft doctor`` warns about.

Trust: only Slurm's own job record is read (``scontrol show job``), the job id and attempt come
from slurmd's environment, and whether the job is fault-tolerant comes from its AdminComment
(written by job_submit.lua; its owner cannot set it): a user can make no epilog wait, and the
wait is bounded whatever Slurm answers. The wait never changes what the epilog did: the drain
and the verdict are posted before it.
"""

from __future__ import annotations

import time

from slurm_ft.errors import SlurmFTError
from slurm_ft.slurm.records import split_nodes

#: Seconds between two reads of the job while waiting.
POLL_S = 0.05


def wait_for_requeue(slurm, job_id: int, attempt: int, bound_s: float, *, clock=time.monotonic,
                     sleep=time.sleep) -> str:
    """Wait until Slurm shows job ``job_id`` requeued past ``attempt`` (restart count greater),
    at most ``bound_s`` seconds, reading it every :data:`POLL_S`. Returns why it stopped:
    ``"requeued"``, ``"off"`` (``bound_s`` is 0), ``"not ft"`` (no slurm-ft options in its
    AdminComment), ``"several nodes"``, ``"gone"`` (Slurm no longer has it), ``"not completing"``
    (it left COMPLETING some other way), ``"unreadable"`` (Slurm refused the read) or
    ``"timeout"``. Never raises for Slurm's answers."""
    from slurm_ft.failover.jobspec import from_admin_comment

    if bound_s <= 0:
        return "off"
    deadline = clock() + bound_s
    first = True
    while True:
        try:
            job = slurm.job(job_id)
        except SlurmFTError:
            return "unreadable"
        if job is None:
            return "gone"
        if job.restart_count > attempt:
            return "requeued"
        if first:
            try:
                opts = from_admin_comment(job.admin_comment)
            except SlurmFTError:       # a malformed record (ConfigError): not acted on
                opts = None
            if opts is None or not opts.enabled:
                return "not ft"
            if len(split_nodes(job.nodes)) != 1:
                return "several nodes"
            first = False
        if not job.completing:
            return "not completing"
        if clock() >= deadline:
            return "timeout"
        sleep(POLL_S)
