"""``slurm-ft wait JOBID``: wait for a job's true final state; the exit code is its ft outcome.

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

import time
from dataclasses import dataclass

import click

from slurm_ft.errors import SlurmCommandError, SlurmFTError
from slurm_ft.failover import policy
from slurm_ft.failover.jobspec import ADMIN_LEADER
from slurm_ft.textsafe import terminal_safe

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


@click.command(name="wait")
@click.argument("job_id", type=click.IntRange(min=1))
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Give up after this many seconds (exit 124); 0: wait as long as it takes.")
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between looks at Slurm.")
@click.option("--settle", "settle_s", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Without accounting: seconds an ended ft job must stay ended before Slurm's state is taken "
                   "as final.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; the exit code says it.")
def wait_command(job_id: int, timeout_s: float, poll_s: float, settle_s: float, quiet: bool) -> None:
    """Wait until JOB_ID has truly ended (a failover's brief FAILED and a continuation's COMPLETED
    are not the end) and exit with its ft outcome: 0 completed, 3 user-error, 4 failed, 5
    max-retries-exceeded, 6 timeout, 7 cancelled, 8 internal-error, 9 held, 10 image-pull-failed, 124
    --timeout passed,
    1 error. Prints 'JOBID STATE: why' when it ends."""
    from slurm_ft.slurm import Slurm

    slurm = Slurm()
    start = time.monotonic()
    ended_since = None
    while True:
        try:
            outcome, ended = look(slurm, job_id, None if ended_since is None else time.monotonic() - ended_since,
                                  settle_s)
        except SlurmFTError as exc:
            raise click.ClickException(terminal_safe(str(exc))) from None
        if outcome is not None:
            if not quiet:
                click.echo(terminal_safe(f"{job_id} {outcome.state}" + (f": {outcome.detail}" if outcome.detail
                                                                         else "")))
            raise SystemExit(outcome.exit_code)
        ended_since = (ended_since or time.monotonic()) if ended else None
        if timeout_s and time.monotonic() - start >= timeout_s:
            if not quiet:
                click.echo(f"{job_id}: not ended after {timeout_s:g} s", err=True)
            raise SystemExit(TIMED_OUT)
        time.sleep(poll_s)
