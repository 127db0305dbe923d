"""The daemon's checkpoint signal to a running job, and how it reads the job's answer.

Used by the state machine (:mod:`.machine`: what a notify was for, which ack is fresh) and the
effects (:mod:`.effects`: the signal itself). Runs as root on the controller host. The signal goes
to every process of the job that catches it (slurm_ft.checkpoint.deliver); the answer is the ack
the job writes into its comment (slurm_ft.checkpoint.channel), never trusted for more than
"this attempt saved / failed".
"""

from __future__ import annotations

from ..checkpoint import channel
from ..checkpoint.deliver import Delivery, signal_job
from . import policy

#: An ack may carry a time a little before the notify (clocks of nodes and controller differ).
CLOCK_SKEW_S = 5.0


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


def notify_purpose(detail: str | None) -> str:
    """What a journaled ``ckpt-notify`` was for (rows before purposes existed: evacuation)."""
    return policy.NOTIFY_TIME_LIMIT if (detail or "").startswith(policy.NOTIFY_TIME_LIMIT + ":") \
        else policy.NOTIFY_EVACUATION


def ack_detail(ack: channel.Ack) -> str:
    """Journal text of an ack: ``saved step=120 path=/ckpt/120.pt``."""
    parts = [ack.state]
    if ack.step is not None:
        parts.append(f"step={ack.step}")
    if ack.path:
        parts.append(f"path={ack.path}")
    return " ".join(parts)
