"""``slurm-ft breaker``: see and reset the circuit breaker on node actions (root, controller)."""

from __future__ import annotations

import json

import click

from slurm_ft import config as config_mod
from slurm_ft.errors import SlurmFTError


@click.group("breaker")
def breaker_command() -> None:
    """Circuit breaker on node drains: how many nodes slurm-ft took out of service, and the latch."""


def _open(config_path: str | None):
    from slurm_ft.journal import open_daemon_journal
    from slurm_ft.slurm import Slurm

    cfg = config_mod.load(config_path)
    return cfg, Slurm.from_config(cfg), open_daemon_journal(cfg)


@breaker_command.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file (default: lookup order).")
def status(as_json: bool, config_path: str | None) -> None:
    """Drains by slurm-ft in the window, per partition, against the limit; whether the daemon's
    latch is open. Exit status 0 closed, 3 open (for monitoring), 1 error."""
    from slurm_ft.drain import breaker
    from slurm_ft.textsafe import terminal_safe

    try:
        cfg, slurm, journal = _open(config_path)
        with journal:
            latched = journal.breaker_latched()
        nodes = slurm.nodes()
    except SlurmFTError as exc:
        raise click.ClickException(str(exc)) from None
    import time

    since = time.time() - cfg.breaker.window_s
    parts: dict[str, list] = {}
    for n in nodes:
        for p in (n.partitions or ["(none)"]):
            parts.setdefault(p, []).append(n)
    rows = []
    for p, members in sorted(parts.items()):
        drained = sorted(n.name for n in members if breaker.drained_by_us_since(n, since))
        rows.append({"partition": p, "nodes": len(members), "drained_by_slurm_ft": drained,
                     "limit": breaker.limit_for(cfg.breaker, len(members))})
    tripped = [r for r in rows if len(r["drained_by_slurm_ft"]) >= r["limit"]]
    is_open = bool(latched or tripped)
    if as_json:
        click.echo(json.dumps({"open": is_open, "latched_since": latched, "window_s": cfg.breaker.window_s,
                               "partitions": rows}, indent=2))
    else:
        click.echo(f"circuit breaker: {'OPEN' if is_open else 'closed'}"
                   + (f" (latched since {latched}; `slurm-ft breaker reset` after checking the nodes)" if latched else ""))
        for r in rows:
            names = ",".join(r["drained_by_slurm_ft"]) or "-"
            click.echo(f"  {terminal_safe(r['partition'])}: {len(r['drained_by_slurm_ft'])}/{r['limit']} drained "
                       f"by slurm-ft in the last {cfg.breaker.window_s:g} s ({terminal_safe(names)})")
    raise SystemExit(3 if is_open else 0)


@breaker_command.command("reset")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file (default: lookup order).")
def reset(config_path: str | None) -> None:
    """Close the daemon's latch: slurm-ft may drain again (resume or check the drained nodes first)."""
    try:
        _cfg, _slurm, journal = _open(config_path)
        with journal:
            was = journal.breaker_latched()
            journal.record(0, 0, "breaker-reset", "", f"reset by admin (was open since {was})" if was else "reset")
    except SlurmFTError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo("circuit breaker reset" + (f" (was open since {was})" if was else " (it was closed)"))
