"""Admin commands: ``slurm-ft install``, ``slurm-ft doctor``, ``slurm-ft metrics`` (click only;
the work is in :mod:`slurm_ft.admin.install`, :mod:`slurm_ft.admin.doctor`, :mod:`slurm_ft.admin.metrics`)."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import click

from slurm_ft import config as config_mod
from slurm_ft.errors import ConfigError, SlurmFTError
from slurm_ft.textsafe import terminal_safe


def _default_conf_dir() -> str:
    conf = os.environ.get("SLURM_CONF")
    return str(Path(conf).parent) if conf else "/etc/slurm"


# ------------------------------------------------------------------------------------ install
# Roles and components are checked by slurm_ft.admin.install.components_for (the table is package data,
# read only when `install` runs: a broken table cannot break the other commands).
@click.command("install")
@click.option("--role", "role_names", multiple=True, metavar="ROLE",
              help="This host's role (repeatable for a host with two): controller (job_submit.lua, the ctld "
                   "event hook and its tmpfiles.d entry, the daemon's unit), compute (prolog/epilog wrappers), "
                   "login; all get cli_filter.lua, the SPANK plugin and the config (slurm_ft/data/install/roles.toml).")
@click.option("--prefix", default="/", show_default=True, type=click.Path(file_okay=False),
              help="Install below this directory instead of / (tests, packaging).")
@click.option("--dry-run", is_flag=True, help="Print what would be done; write nothing.")
@click.option("--only", "only", multiple=True, metavar="COMPONENT",
              help="Only these components (repeatable; experts), instead of --role: wrappers, job_submit, cli_filter, "
                   "spank, ctld_event, systemd, config; lua: job_submit and cli_filter.")
@click.option("--slurm-conf-dir", default=_default_conf_dir, show_default="directory of $SLURM_CONF, else /etc/slurm",
              help="Where slurm.conf is: job_submit.lua, cli_filter.lua and plugstack.conf.d/ go there.")
@click.option("--slurm-user", metavar="USER",
              help="Who runs the ctld event hook and owns its events directory (default: SlurmUser of slurm.conf).")
@click.option("--force", is_flag=True,
              help="Replace files slurm-ft did not write or an admin edited (the old file is kept as "
                   "NAME.slurm-ft-old); default: leave them and write NAME.slurm-ft-new beside them.")
@click.option("--uninstall", is_flag=True,
              help="Remove the files slurm-ft installed and nobody edited (of --role/--only; default: all); keep "
                   "the config and journals; warn on stderr about slurm.conf lines that still name them.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Config whose [failover] retries/max_retries (job_submit.lua) and events_dir (the ctld hook) "
                   "are used (default: lookup order; with --prefix: PREFIX/etc/slurm-ft/slurm-ft.toml if there).")
def install_command(role_names: tuple[str, ...], prefix: str, dry_run: bool, only: tuple[str, ...],
                    slurm_conf_dir: str, slurm_user: str | None, force: bool, uninstall: bool,
                    config_path: str | None) -> None:
    """Install slurm-ft beside Slurm on this host, from the installed package, for its --role
    (controller, compute, login): prolog/epilog wrappers (naming this venv's Python),
    job_submit.lua and cli_filter.lua, the SPANK plugin's source and plugstack.conf.d entry, the
    ctld event hook with its tmpfiles.d entry, the daemon's systemd unit, a default
    /etc/slurm-ft/slurm-ft.toml. Idempotent; files others wrote or edited are never overwritten
    without --force. Run as root. Exit 1 when a file was left in conflict."""
    from slurm_ft.admin import install as inst
    from slurm_ft.admin.assets import venv_python
    real = os.path.realpath(prefix) == "/"
    try:
        if real and not dry_run and os.geteuid() != 0:
            raise inst.InstallError("run as root (or --dry-run, or --prefix DIR)")
        components = (inst.COMPONENTS if uninstall and not role_names and not only
                      else inst.components_for(role_names, only))
        if config_path:
            cfg = config_mod.load(config_path)
        elif real:
            cfg = config_mod.load()
        else:
            staged = Path(prefix) / inst.assets.CONFIG_PATH.lstrip("/")
            cfg = config_mod.load(staged) if staged.is_file() else config_mod.Config()
        if slurm_user is None and "ctld_event" in components and not uninstall:
            conf = inst.read_slurm_conf(prefix, slurm_conf_dir)
            if conf is None:
                raise inst.InstallError(f"{Path(slurm_conf_dir) / 'slurm.conf'}: not readable; its SlurmUser runs "
                                        f"the ctld event hook: give it with --slurm-user USER")
            slurm_user = inst.slurm_user(conf)
        items = inst.plan(components=components, slurm_conf_dir=slurm_conf_dir,
                          max_retries=cfg.failover.max_retries, default_retries=cfg.failover.retries,
                          events_dir=cfg.failover.events_dir, slurm_user=slurm_user or "root")
        if not uninstall and {"wrappers", "systemd"} & set(components):
            import slurm_ft
            for what, path in (("Python", venv_python()), ("slurm_ft package", Path(slurm_ft.__file__).parent)):
                bad = inst.untrusted(path)
                if bad and real:
                    raise inst.InstallError(f"{bad}: the prolog and the daemon would run, as root, code another user "
                                            f"can change ({what} {path}); install slurm-ft into a root-owned venv "
                                            f"(docs/install.md)")
                if bad:
                    click.echo(f"warning: {terminal_safe(bad)} ({what}); refused when installing to /", err=True)
        outcomes = (inst.uninstall if uninstall else inst.apply)(
            items, prefix=prefix, dry_run=dry_run, **({} if uninstall else {"force": force}))
    except SlurmFTError as exc:
        raise click.ClickException(terminal_safe(str(exc))) from None
    if dry_run:
        click.echo("dry run: nothing written")
    if role_names:
        click.echo(f"role {'+'.join(role_names)}: {' '.join(components)}")
    if not uninstall and "job_submit" in components:
        click.echo(f"job_submit.lua limits: max_retries={cfg.failover.max_retries} retries={cfg.failover.retries} "
                   f"(from {cfg.source or 'the built-in defaults'})")
    for o in outcomes:
        detail = f"  ({terminal_safe(o.detail)})" if o.detail else ""
        click.echo(f"{o.action:<9} {terminal_safe(str(o.target))}{detail}")
    if uninstall:
        for line in inst.uninstall_warnings(outcomes, prefix=prefix, slurm_conf_dir=slurm_conf_dir):
            click.echo(f"warning: {terminal_safe(line)}", err=True)
    else:
        click.echo("next steps:")
        for step in inst.next_steps(items, outcomes, components):
            click.echo(f"  {step}")
    if any(o.action == "conflict" for o in outcomes):
        raise SystemExit(1)


# ------------------------------------------------------------------------------------- doctor
@click.command("doctor")
@click.option("--role", type=click.Choice(["auto", "node", "controller", "all"]), default="auto", show_default=True,
              help="Which checks: a compute node's, the controller's, or both; auto: controller on a "
                   "SlurmctldHost, else node.")
@click.option("--slurm-conf", type=click.Path(dir_okay=False),
              help="Read this slurm.conf instead of asking slurmctld (scontrol show config).")
@click.option("--node", help="Slurm node name of this host (default: $SLURMD_NODENAME or the short host name).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: a list of {name, status, detail, fix}.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file (default: lookup order).")
def doctor_command(role: str, slurm_conf: str | None, node: str | None, as_json: bool, config_path: str | None) -> None:
    """Check this host's slurm-ft setup: one line per check, OK/WARN/FAIL with the fix (slurm.conf
    Prolog/Epilog/PrologFlags, JobSubmitPlugins=lua and job_submit.lua, CliFilterPlugins, the
    plugstack line and the plugin, journals, the daemon's heartbeat, NVML, the config).
    Exit 1 when any check fails."""
    from slurm_ft.admin import doctor as doc
    cfg, cfg_error = None, None
    try:
        cfg = config_mod.load(config_path)
    except ConfigError as exc:
        cfg_error = str(exc)
    conf, source, conf_dir = doc.slurm_settings(slurm_conf, cfg)
    host = node or doc.short_host()
    roles = (doc.default_roles(conf, host) if role == "auto"
             else frozenset(doc.ROLES) if role == "all" else frozenset({role}))
    env = doc.Env(roles=roles, cfg=cfg, cfg_error=cfg_error, conf=conf, conf_source=source, conf_dir=conf_dir,
                  host=host, nvml_probe=doc.nvml_probe_for(cfg) if cfg is not None else None,
                  python_probe=doc.python_probe, node_facts=doc.node_facts_probe_for(cfg) if cfg is not None else None,
                  kernel_log_probe=doc.kernel_log_probe)
    checks = doc.run(env)
    if as_json:
        click.echo(json.dumps({"host": host, "roles": sorted(roles), "checks": [c.to_dict() for c in checks]},
                              indent=2, ensure_ascii=True))
    else:
        click.echo(f"slurm-ft doctor on {terminal_safe(host)} ({', '.join(sorted(roles))})")
        for c in checks:
            click.echo(terminal_safe(c.line()))
    raise SystemExit(1 if doc.failed(checks) else 0)


# ------------------------------------------------------------------------------------ metrics
@click.command("metrics")
@click.option("--textfile", metavar="FILE",
              help="Write the metrics to FILE (node_exporter's textfile collector: a .prom file in its "
                   "--collector.textfile.directory), replaced whole; run it from a timer.")
@click.option("--port", type=click.IntRange(1, 65535), help="Serve /metrics on this port until stopped.")
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to serve on (with --port).")
@click.option("--no-slurm", is_flag=True, help="Do not run sinfo (no slurm_ft_nodes_out_of_service).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Log lines (with --port) as text or JSON.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file (default: lookup order).")
def metrics_command(textfile: str | None, port: int | None, address: str, no_slurm: bool, log_format: str,
                    config_path: str | None) -> None:
    """Prometheus metrics from the daemon journal (and sinfo): verdicts and failovers by class
    and rule, drains, evacuations, continuations, max-retries, breaker state, daemon heartbeat
    age, time to recover. Prints them, writes a textfile-collector file, or serves them."""
    from slurm_ft import logfmt
    from slurm_ft.admin import metrics as m
    from slurm_ft.slurm import Slurm
    if textfile and port:
        raise click.UsageError("--textfile and --port: choose one")
    try:
        cfg = config_mod.load(config_path)
        slurm = None if no_slurm else Slurm.from_config(cfg)
        if textfile:
            m.write_textfile(textfile, cfg, slurm)
            click.echo(f"wrote {terminal_safe(textfile)}")
        elif port:
            from prometheus_client import start_http_server
            logfmt.setup(log_format)
            try:
                server, thread = start_http_server(port, addr=address, registry=m.registry(cfg, slurm))
            except OSError as exc:
                raise SlurmFTError(f"{address}:{port}: {exc.strerror or exc}") from None
            m.log.info("serving slurm-ft metrics on http://%s:%s/metrics", address, port)
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            try:
                stop.wait()
            except KeyboardInterrupt:
                pass
            server.shutdown()
        else:
            click.echo(m.exposition(cfg, slurm), nl=False)
    except SlurmFTError as exc:
        raise click.ClickException(terminal_safe(str(exc))) from None
    except OSError as exc:
        raise click.ClickException(terminal_safe(f"{textfile}: {exc.strerror or exc}")) from None
