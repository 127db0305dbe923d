"""Checkpoint-before-exit: the helper training code imports (helper.py, http.py), the ack channel
through Slurm (channel.py), and the controller side that signals a job and waits (evacuate.py)."""

from .channel import Ack, Reporter
from .helper import ExitCheckpoint, exit_checkpoint, heartbeat

__all__ = ["Ack", "ExitCheckpoint", "Reporter", "exit_checkpoint", "heartbeat"]
