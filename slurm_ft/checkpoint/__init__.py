"""Checkpoint-before-exit: the helper training code imports (helper.py, http.py), the ack channel
through Slurm (channel.py), and the delivery of the signal to a job's processes (deliver.py; the
daemon sends it: slurm_ft/failover/ckpt_signal.py)."""

from .channel import Ack, Reporter
from .helper import ExitCheckpoint, exit_checkpoint, heartbeat

__all__ = ["Ack", "ExitCheckpoint", "Reporter", "exit_checkpoint", "heartbeat"]
