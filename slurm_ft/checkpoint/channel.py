"""The exit-checkpoint ack channel: the job's own Slurm comment.

Facts (verified on the 22.05 lab, docs/spank.md): a job's owner may ``scontrol update JobId=J
Comment=...`` (AdminComment is refused to the owner, another user's job is refused), and the daemon
reads every job's comment with one ``squeue --json``. So training code reports across hosts with
no shared filesystem and no new network service.

The record is one whitespace-free word in the comment; everything else in the comment (the ``ft:``
options token, the user's text) is kept::

    slurm-ft-ckpt:state=saved,attempt=0,step=120,t=1712345678.2,path=%2Fckpt%2Fstep120.pt

``state`` is ``saving``, ``saved`` or ``failed``; ``attempt`` is ``SLURM_RESTART_COUNT`` (0 on the
first run) so a stale copy of an old attempt cannot ack for the new one; ``t`` is when the report
was made (epoch s). One writer per job (the reporting rank, see helper.py): the comment is one
value, last writer wins.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from urllib.parse import quote, unquote

from ..errors import SlurmFTError

PREFIX = "slurm-ft-ckpt:"
STATES = ("saving", "saved", "failed")
#: Slurm keeps comments well below this; a long path is cut rather than the update refused.
MAX_PATH = 512


@dataclass(frozen=True)
class Ack:
    state: str
    attempt: int
    step: int | None
    time: float
    path: str | None

    def encode(self) -> str:
        items = [f"state={self.state}", f"attempt={self.attempt}"]
        if self.step is not None:
            items.append(f"step={self.step}")
        items.append(f"t={self.time:.1f}")
        if self.path:
            items.append(f"path={quote(self.path[:MAX_PATH], safe='')}")
        return PREFIX + ",".join(items)

    @classmethod
    def decode(cls, word: str) -> "Ack | None":
        """One record, or None when malformed (a comment is user-writable input)."""
        if not word.startswith(PREFIX):
            return None
        fields = dict(item.partition("=")[::2] for item in word[len(PREFIX):].split(",") if item)
        try:
            state = fields["state"]
            if state not in STATES:
                return None
            return cls(state, int(fields["attempt"]), int(fields["step"]) if "step" in fields else None,
                       float(fields["t"]), unquote(fields["path"]) if fields.get("path") else None)
        except (KeyError, ValueError):
            return None


def find(comment: str) -> Ack | None:
    """The ack record in a job comment, if any."""
    for word in (comment or "").split():
        if word.startswith(PREFIX):
            return Ack.decode(word)
    return None


def merge(comment: str, ack: Ack) -> str:
    """``comment`` with its ack record replaced by ``ack`` (other words kept, in order)."""
    words = [w for w in (comment or "").split() if not w.startswith(PREFIX)]
    return " ".join([*words, ack.encode()])


class Reporter:
    """Writes acks for one job attempt through Slurm (``squeue`` + ``scontrol update``)."""

    def __init__(self, job_id: int, attempt: int, slurm=None):
        from ..slurm import Slurm
        self.job_id = job_id
        self.attempt = attempt
        self.slurm = slurm or Slurm(timeout_s=20.0)

    @classmethod
    def from_env(cls, env=None, slurm=None) -> "Reporter | None":
        """For the current job (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``); None outside a job."""
        env = os.environ if env is None else env
        job = env.get("SLURM_JOB_ID", "")
        if not job or not job.isdigit():
            return None
        restart = env.get("SLURM_RESTART_COUNT", "0")
        return cls(int(job), int(restart) if restart.isdigit() else 0, slurm)

    def report(self, state: str, step: int | None = None, path: str | None = None) -> Ack:
        """Record ``state`` in the job's comment. Raises :class:`SlurmFTError` if Slurm refuses."""
        if state not in STATES:
            raise SlurmFTError(f"checkpoint state must be one of {', '.join(STATES)}, got {state!r}")
        ack = Ack(state, self.attempt, step, time.time(), path)
        current = self.slurm.run("squeue", "-h", f"--jobs={self.job_id}", "-o", "%k").stdout.strip()
        if current == "(null)":
            current = ""
        self.slurm.update_job(self.job_id, Comment=merge(current, ack))
        return ack


def report_quietly(reporter: Reporter | None, state: str, step=None, path=None) -> Ack | None:
    """``reporter.report`` for training code: a Slurm hiccup is printed, never raised."""
    if reporter is None:
        return None
    try:
        return reporter.report(state, step, path)
    except SlurmFTError as exc:
        print(f"slurm-ft checkpoint: could not report {state!r} to Slurm: {exc}", file=sys.stderr, flush=True)
        return None
