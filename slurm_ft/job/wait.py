"""What ``slurm-ft wait JOBID`` reads (its command line: slurm_ft.cli.wait): a job's true final
state (:func:`look`), and the exit code of each ft outcome (:data:`EXIT_CODES`).

Run by the job's owner (or anyone Slurm lets see the job), anywhere Slurm's commands work.
Reads only Slurm: the live record (``scontrol show job``: state and AdminComment) and the
accounting record (``sacct -X -P -o State,AdminComment``). Never the journal.

Why it exists (measured on 22.05, docs/user-guide.md): between the end of a failed attempt and
slurm-ft's requeue, Slurm shows the job ``FAILED`` (``squeue`` drops it) for about a second, and
a continuation's attempt ends ``COMPLETED`` before it is requeued; neither is the end. An
ft-enabled job has ended for good only when slurm-ft wrote a final ft state
(:data:`slurm_ft.failover.policy.FINAL_STATES`): into the live AdminComment of a job it keeps
pending (held), else into the accounting record (``sacctmgr``, :mod:`slurm_ft.failover.owner`).
Without accounting (no slurmdbd), an ended job that stays ended ``--settle`` seconds is taken at
Slurm's word, and the message says so. A job that is not ft-enabled ends when Slurm says so.
"""

from __future__ import annotations

from dataclasses import dataclass


from slurm_ft.errors import SlurmCommandError, SlurmFTError
from slurm_ft.failover import policy
from slurm_ft.failover.jobspec import ADMIN_LEADER

#: Exit code per final ft state (documented in docs/user-guide.md; 1 and 2 are click's).
EXIT_CODES = {
    policy.COMPLETED: 0, policy.USER_ERROR: 3, policy.FAILED: 4, policy.MAX_RETRIES: 5, policy.TIMEOUT: 6,
    policy.CANCELLED: 7, policy.INTERNAL_ERROR: 8, policy.HELD: 9, policy.NOT_CONFIGURED: 4,
    policy.IMAGE_PULL_FAILED: 10,
}
#: Exit code when ``--timeout`` passed first (as timeout(1)).
TIMED_OUT = 124
#: Slurm's end states -> the ft outcome of a job slurm-ft does not look after.
SLURM_OUTCOME = {"COMPLETED": policy.COMPLETED, "CANCELLED": policy.CANCELLED, "TIMEOUT": policy.TIMEOUT,
                 "DEADLINE": policy.TIMEOUT}
#: Slurm states in which a job has not ended.
ACTIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT")


@dataclass(frozen=True)
class Outcome:
    state: str          # a final ft state (policy.FINAL_STATES)
    detail: str         # the sentence after it, or where it came from

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.state, 4)


def ft_word(admin_comment: str | None) -> tuple[str | None, str]:
    """(ft state word, the rest up to the options record) of an AdminComment ``slurm-ft:<state>
    <sentence> ft:...`` (``slurm-ft: held: <reason>`` too); (None, "") without one."""
    text = (admin_comment or "").strip()
    if not text.startswith(ADMIN_LEADER):
        return None, ""
    words = text[len(ADMIN_LEADER):].split()
    if not words:
        return None, ""
    rest = []
    for w in words[1:]:
        if w.startswith(("ft:", "slurm-ft-")):
            break
        rest.append(w)
    return words[0].rstrip(":"), " ".join(rest)


def _sacct(slurm, job_id: int) -> tuple[str, str] | None:
    """(state, AdminComment) of the job's latest accounting record, or None (no slurmdbd, or
    not recorded yet)."""
    try:
        proc = slurm.run("sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,AdminComment", check=False)
    except SlurmCommandError:
        return None
    if proc.returncode != 0:
        return None
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    state, _, admin = lines[-1].partition("|")
    return state.split()[0] if state.split() else "", admin


def look(slurm, job_id: int, ended_for_s: float | None, settle_s: float) -> tuple[Outcome | None, bool]:
    """(the job's final outcome or None while it may still run again, whether it has ended now).
    ``ended_for_s``: how long the caller has seen it ended without a final ft state."""
    job = slurm.job(job_id)
    acct = None
    if job is None:
        acct = _sacct(slurm, job_id)
        if acct is None:
            raise SlurmFTError(f"job {job_id}: unknown to Slurm (not in the queue, no accounting record)")
        state, admin = acct
    else:
        state, admin = job.state, job.admin_comment
    word, rest = ft_word(admin)
    if word in policy.FINAL_STATES:            # held by slurm-ft, or the accounting record
        return Outcome(word, rest), True
    if job is not None and (state in ACTIVE or job.completing):
        return None, False
    if word is None:                           # not ft-enabled: Slurm's word is final
        return Outcome(SLURM_OUTCOME.get(state, policy.FAILED), f"Slurm state {state}; not an ft job"), True
    if acct is None:
        acct = _sacct(slurm, job_id)
        if acct is not None:
            aword, arest = ft_word(acct[1])
            if aword in policy.FINAL_STATES:
                return Outcome(aword, arest), True
    if ended_for_s is not None and ended_for_s >= settle_s:
        return Outcome(SLURM_OUTCOME.get(state, policy.FAILED),
                       f"Slurm state {state} for {ended_for_s:.0f} s and no ft decision visible (no accounting "
                       f"record of it; see ft-history)"), True
    return None, True
