"""Checkpoint-before-exit: the helper training code imports (helper.py, http.py; the helper, the
ack and the heartbeat are the stdlib-only job client slurm_ft/data/client/slurm_ft_job.py,
re-exported), the ack channel
through Slurm (channel.py), and the delivery of the signal to a job's processes (deliver.py; the
daemon sends it: slurm_ft/failover/ckpt_signal.py)."""

from slurm_ft.checkpoint.channel import Ack, Reporter
from slurm_ft.checkpoint.helper import ExitCheckpoint, exit_checkpoint, heartbeat

__all__ = ["Ack", "ExitCheckpoint", "Reporter", "exit_checkpoint", "heartbeat"]
