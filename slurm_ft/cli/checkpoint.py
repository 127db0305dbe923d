"""``python -m slurm_ft.checkpoint report STATE [--step N] [--path P]``: ack from a shell rank.
``python -m slurm_ft.checkpoint notify|status [--port 9000]``: the authenticated HTTP client.

Runs inside the job, as the job's user; reads ``SLURM_JOB_ID`` and ``SLURM_RESTART_COUNT``
(``notify``/``status`` may also run as root on the job's node, with ``--user`` and ``--job``).
Exit 0 on success, 1 if Slurm or the checkpoint server refused, 2 on usage errors.
"""

from __future__ import annotations

import json
import pwd

import click

from slurm_ft.errors import SlurmFTError
from slurm_ft.checkpoint.channel import STATES, Reporter


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


def _http_options(fn):
    for opt in reversed([
        click.option("--port", type=click.IntRange(9000, 9999), default=9000, show_default=True,
                     help="Port of the training program's checkpoint server."),
        click.option("--host", default="127.0.0.1", show_default=True,
                     help="Its address: loopback or one of this node's addresses."),
        click.option("--job", "job_id", type=click.IntRange(min=1),
                     help="Job id (default: $SLURM_JOB_ID), for finding its token file."),
        click.option("--user", help="The job's user (root only; default: you), for finding its token file."),
        click.option("--token-file", type=click.Path(dir_okay=False),
                     help="Read the secret from this file (mode 0600, yours or --user's)."),
        click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
                     help="Seconds to wait for the answer."),
    ]):
        fn = opt(fn)
    return fn


def _call(which, port, host, job_id, user, token_file, timeout_s) -> None:
    uid = None
    if user is not None:
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            raise click.UsageError(f"--user: no such user {user!r}") from None
    try:
        answer = which(port, host, timeout_s=timeout_s, token_file=token_file, uid=uid, job=job_id)
    except SlurmFTError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(answer, sort_keys=True))


@main.command()
@_http_options
def notify(port, host, job_id, user, token_file, timeout_s) -> None:
    """POST /v1/preempt/notify with the job's secret: the training program saves now.

    The secret comes from the token file of PORT (or $SLURM_FT_CKPT_TOKEN in a child of the
    training program); it is never taken on the command line."""
    from slurm_ft.checkpoint.http import notify as do
    _call(do, port, host, job_id, user, token_file, timeout_s)


@main.command()
@_http_options
def status(port, host, job_id, user, token_file, timeout_s) -> None:
    """GET /v1/preempt/status with the job's secret: idle, notified, saving, saved or failed (JSON)."""
    from slurm_ft.checkpoint.http import status as do
    _call(do, port, host, job_id, user, token_file, timeout_s)
