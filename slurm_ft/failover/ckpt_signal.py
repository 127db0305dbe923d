"""The daemon's checkpoint signal to a running job (the effects, :mod:`.effects`). Runs as root on
the controller host. The signal goes to every process of the job that catches it
(slurm_ft.checkpoint.deliver); the answer is the ack the job writes into its comment
(slurm_ft.checkpoint.channel), never trusted for more than "this attempt saved / failed": what a
notify was for and which ack is fresh are the state machine's facts (slurm_ft.failover.policy
``notify_purpose``, ``ack_detail``, ``CLOCK_SKEW_S``).
"""

from __future__ import annotations

from slurm_ft.checkpoint.deliver import Delivery, signal_job
from slurm_ft.failover import policy


def notify(slurm, journal, job, opts, why: str, purpose: str = policy.NOTIFY_EVACUATION) -> Delivery:
    """Send the checkpoint signal (``opts.ckpt_signal``) to the job's processes that catch it;
    journal it as ``ckpt-notify`` with detail ``<purpose>: <what was signalled>; wait S s; <why>``
    (status done: something was signalled; skipped: nothing catches the signal; failed: the step
    could not run). Returns the delivery; its journal time is the notify time."""
    delivery = signal_job(slurm, job, opts.ckpt_signal)
    status = "failed" if delivery.error else ("done" if delivery.signalled else "skipped")
    journal.record(job.job_id, job.restart_count, "ckpt-notify", job.nodes,
                   f"{purpose}: {delivery.summary()}; wait {opts.ckpt_wait_s} s; {why}", status=status)
    return delivery
