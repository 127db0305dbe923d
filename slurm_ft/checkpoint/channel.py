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

The record's one encoder/decoder and writer are in the job-side client
(slurm_ft/data/client/slurm_ft_job.py, stdlib only); this module re-exports them for the root side.
"""

from __future__ import annotations

import os
import time

from slurm_ft.data.client import slurm_ft_job as _job
from slurm_ft.data.client.slurm_ft_job import (  # noqa: F401 (re-exports)
    PREFIX, STATES, Ack, find, merge)
from slurm_ft.errors import SlurmFTError


class Reporter(_job.Reporter):
    """The client's reporter (slurm_ft_job.Reporter: the ack's one writer), with its two Slurm
    calls run through :class:`slurm_ft.slurm.Slurm` (timeouts, :class:`SlurmFTError`)."""

    def __init__(self, job_id: int, attempt: int, slurm=None):
        super().__init__(job_id, attempt)
        if slurm is None:
            from slurm_ft.slurm import Slurm
            slurm = Slurm(timeout_s=20.0)
        self.slurm = slurm

    @classmethod
    def from_env(cls, env=None, slurm=None) -> "Reporter | None":
        """For the current job (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``); None outside a job."""
        return super().from_env(os.environ if env is None else env, slurm=slurm)

    def read_comment(self) -> str:
        """The job's comment, read through the Slurm layer (the client's own reader runs squeue)."""
        return self.slurm.job_comment(self.job_id)

    def report(self, state: str, step: int | None = None, path: str | None = None) -> Ack:
        """Record ``state`` in the job's comment through the comment's one writer
        (:func:`slurm_ft.slurm.put_comment_record`). Raises :class:`SlurmFTError` if Slurm
        refuses or ``state`` is not one of :data:`STATES`."""
        if state not in STATES:
            raise SlurmFTError(f"checkpoint state must be one of {', '.join(STATES)}, got {state!r}")
        ack = Ack(state, self.attempt, step, time.time(), path)
        try:
            word = ack.encode()
        except _job.ClientError as exc:
            raise SlurmFTError(str(exc)) from None
        from slurm_ft.slurm import put_comment_record
        put_comment_record(self.slurm, self.job_id, PREFIX, word)
        return ack


#: Training code's report: a Slurm hiccup is printed, never raised (slurm_ft_job.report_quietly).
report_quietly = _job.report_quietly
