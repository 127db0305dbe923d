"""``slurm-ft wait JOBID`` (click only): the job's true final state is read by
:func:`slurm_ft.job.wait.look`; its exit code is the ft outcome (:data:`slurm_ft.job.wait.EXIT_CODES`).
Run by the job's owner, anywhere Slurm's commands work."""

from __future__ import annotations

import time

import click

from slurm_ft.errors import SlurmFTError
from slurm_ft.job.wait import TIMED_OUT, look
from slurm_ft.textsafe import terminal_safe


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
