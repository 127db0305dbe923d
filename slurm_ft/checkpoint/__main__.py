"""``python -m slurm_ft.checkpoint report STATE [--step N] [--path P]``: ack from a shell rank.

Runs inside the job, as the job's user; reads ``SLURM_JOB_ID`` and ``SLURM_RESTART_COUNT``.
Exit 0 on success, 1 if Slurm refused, 2 on usage errors.
"""

from __future__ import annotations

import click

from ..errors import SlurmFTError
from .channel import STATES, Reporter


@click.group()
def main() -> None:
    """Exit-checkpoint helper for job scripts."""


@main.command()
@click.argument("state", type=click.Choice(STATES))
@click.option("--step", type=click.IntRange(min=0), help="Training step the checkpoint holds.")
@click.option("--path", "ckpt_path", help="Where the checkpoint was written.")
def report(state: str, step: int | None, ckpt_path: str | None) -> None:
    """Report STATE (saving, saved, failed) of this job's exit checkpoint to slurm-ft."""
    reporter = Reporter.from_env()
    if reporter is None:
        raise click.UsageError("not inside a Slurm job (SLURM_JOB_ID unset)")
    try:
        ack = reporter.report(state, step, ckpt_path)
    except SlurmFTError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(ack.encode())


if __name__ == "__main__":
    main(prog_name="python -m slurm_ft.checkpoint")
