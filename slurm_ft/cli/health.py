"""``slurm-ft health``: run the GPU health checks on this node, print a table or JSON.

Exit status: 0 healthy (warnings allowed), 1 unhealthy (any fail), 2 usage error (bad option,
unknown check, invalid config). Library errors become ``Error: …`` on stderr, never a traceback.
"""

from __future__ import annotations

import json
import os
import socket

import click

from slurm_ft.errors import SlurmFTError
from slurm_ft.health.config import CHECK_NAMES
from slurm_ft.health.result import CheckResult


class UsageProblem(click.ClickException):
    """A config or usage error: ``Error: …`` and exit status 2."""

    exit_code = 2


def default_node() -> str:
    """Slurm's name for this node: ``$SLURMD_NODENAME`` (set for prolog and health check
    programs), else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def render_table(node: str, results: list[CheckResult]) -> str:
    """Fixed-width table, one row per result, the detail of each warn/fail (a crash: its last
    traceback line; the JSON has the whole traceback), then a one-line verdict."""
    rows = [("STATUS", "CHECK", "GPU", "MEASUREMENT")]
    for r in results:
        rows.append((r.status.upper(), r.check, "-" if r.gpu is None else str(r.gpu), r.measurement))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3])
    for r in results:
        if not r.detail or r.status == "pass":
            continue
        where = r.check if r.gpu is None else f"{r.check} GPU{r.gpu}"
        # a crash shows its last traceback line (the JSON has the whole traceback); a hint shows whole
        text = r.detail.strip().splitlines()[-1] if "Traceback" in r.detail else " ".join(r.detail.split())
        lines.append(f"  {where}: {text}")
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "warn", "fail")}
    state = "unhealthy" if counts["fail"] else "healthy"
    lines.append(f"{node}: {state} ({counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail)")
    return "\n".join(lines)


@click.command("health")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--check", "checks", multiple=True, type=click.Choice(CHECK_NAMES), metavar="NAME",
              help=f"Run only this check (repeatable): {', '.join(CHECK_NAMES)}.")
@click.option("--node", default=None, help="Slurm node name (default: $SLURMD_NODENAME or the short host name).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="slurm-ft TOML config (default: the usual lookup order).")
@click.option("--act", is_flag=True,
              help="As Slurm's HealthCheckProgram (root): run the checks the prolog runs on this node "
                   "(none on a node without gres/gpu in Slurm, docs/health-checks.md), journal the results, "
                   "drain the node on a fail (never over an admin's reason), resume a slurm-ft-drained node on a pass if "
                   "[failover] auto_resume is on.")
@click.pass_context
def health_command(ctx: click.Context, as_json: bool, checks: tuple[str, ...], node: str | None,
                   config_path: str | None, act: bool) -> None:
    """Run the GPU health checks on this node.

    Exit status 0 when healthy (warnings allowed), 1 when a check fails, 2 on a usage or
    config error. Fit for a Prolog or Slurm's HealthCheckProgram.
    """
    from slurm_ft import config as config_mod
    from slurm_ft.errors import ConfigError
    from slurm_ft.health import run_checks, unhealthy

    node = node or default_node()
    try:
        cfg = ctx.find_object(config_mod.Config) if config_path is None else None
        if cfg is None:
            cfg = config_mod.load(config_path)
        expected = None
        if act:  # as HealthCheckProgram: only the checks the prolog runs here (slurm_ft.health.scope)
            from slurm_ft.failover.mailbox import (  # verdicts a slurmctld rollback erased: re-posted
                check_node)
            check_node(cfg, node, lambda m: click.echo(m, err=True))
            from slurm_ft.health.config import from_config
            from slurm_ft.health.scope import decide, node_facts, scontrol_lookup

            hcfg = from_config(cfg.health)
            scope = decide(node_facts(cfg.node_state.dir, node, ttl_s=hcfg.scope_cache_s,
                                      lookup=scontrol_lookup(cfg), log=lambda m: click.echo(m, err=True)), hcfg)
            wanted = [c for c in scope.checks if not checks or c in checks]
            if not wanted:
                click.echo(f"{node}: {scope.why}")
                ctx.exit(0)
            checks, expected = tuple(wanted), scope.expected_gpus
        results = run_checks(cfg, node, only=list(checks) or None, expected_gpus=expected)
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None
    except SlurmFTError as exc:
        raise click.ClickException(str(exc)) from None
    bad = unhealthy(results)
    if act:
        from slurm_ft.slurm import Slurm
        from slurm_ft.health.actions import act_on_node, journal_results

        journal_results(cfg, node, results, None, lambda m: click.echo(m, err=True))
        try:
            act_on_node(cfg, node, results, Slurm.from_config(cfg), lambda m: click.echo(m, err=True))
        except SlurmFTError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"node": node, "healthy": not bad,
                               "results": [r.to_dict() for r in results]}, indent=2))
    else:
        click.echo(render_table(node, results))
    ctx.exit(1 if bad else 0)
