"""``slurm-ft`` command line: click entry points only; library errors become ``Error: ...``."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from slurm_ft import config as config_mod
from slurm_ft import logfmt
from slurm_ft.errors import SlurmFTError
from slurm_ft.lab import layout as lab_layout


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


@click.group()
@click.version_option(package_name="slurm-ft")
def main() -> None:
    """Automatic fault tolerance for GPU training jobs on Slurm."""


@main.command()
@click.option("--once", is_flag=True, help="Run one cycle and exit (cron-style).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file (default: lookup order).")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.option("--log-format", type=click.Choice(logfmt.FORMATS), default="text", show_default=True,
              help="Log lines on stderr as plain text, or one JSON object per line (time, level, logger, message).")
@click.option("--log-file", metavar="PATH",
              help="Log to PATH instead of stderr (a run without systemd), rotated at --log-file-max-mb; "
                   "its directory must be root's and writable by root only.")
@click.option("--log-file-max-mb", type=click.IntRange(1, 10240), default=20, show_default=True,
              help="Rotate the --log-file at this size (PATH.1 .. PATH.N kept).")
@click.option("--log-file-backups", type=click.IntRange(0, 100), default=5, show_default=True,
              help="How many rotated --log-file copies to keep.")
def daemon(once: bool, config_path: str | None, verbose: bool, log_format: str, log_file: str | None,
           log_file_max_mb: int, log_file_backups: int) -> None:
    """Requeue daemon: fail hardware-faulted jobs over to healthy nodes (runs as root on the controller).
    One daemon per journal: it holds a lock in the journal's directory, and a second one exits
    with an error. Each cycle it records a heartbeat there (slurm-ft doctor, ft-history)."""
    logfmt.setup(log_format, verbose=verbose)
    if os.geteuid() != 0:
        raise click.ClickException("slurm-ft daemon runs as root: it writes the journal and runs scontrol "
                                   "requeue/update/drain (systemd: slurm-ft install, docs/install.md)")
    if log_file:
        from slurm_ft.failover import logfile
        try:
            logfile.attach(log_file, max_bytes=log_file_max_mb * 1024 * 1024, backups=log_file_backups)
        except SlurmFTError as exc:
            raise _fail(exc) from None
    from slurm_ft.failover import daemonlock
    from slurm_ft.failover.daemon import Daemon
    from slurm_ft.journal import open_daemon_journal
    try:
        cfg = config_mod.load(config_path)
        open_daemon_journal(cfg).close()    # the journal's directory, with the journal's permissions
        from slurm_ft.history.service import (  # users' ft-history from login nodes ([history] serve)
            serving)
        with daemonlock.acquire(cfg.journal.path), serving(cfg, enabled=not once):
            Daemon(cfg).run(once=once)
    except SlurmFTError as exc:
        raise _fail(exc) from None


@main.command()
@click.argument("node")
@click.option("--checkpoint", is_flag=True,
              help="Also evacuate NODE's ft-enabled jobs: the daemon signals each to checkpoint, waits for its "
                   "save (the job's --ft-ckpt-wait) and requeues it excluding NODE; this command follows the "
                   "daemon journal and reports.")
@click.option("--reason", help="Drain reason (default: 'slurm-ft: drain --checkpoint by admin').")
@click.option("--timeout", "timeout_s", type=click.IntRange(1, 7200),
              help="With --checkpoint: follow the daemon journal at most this long (default: the longest "
                   "--ft-ckpt-wait of the jobs + 60 s); the evacuation itself goes on in the daemon.")
@click.option("--job", "only_jobs", type=click.IntRange(min=1), multiple=True,
              help="With --checkpoint: evacuate only this job (repeatable; default: every ft job on NODE).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file (default: lookup order).")
def drain(node: str, checkpoint: bool, reason: str | None, timeout_s: int | None, only_jobs: tuple[int, ...],
          config_path: str | None) -> None:
    """Drain NODE (root, controller host). With --checkpoint, ask the daemon to evacuate its
    ft-enabled jobs (an evacuate-request row in the daemon journal; the daemon carries it out as
    any evacuation, within [failover] max_evacuations, priority_boost and priority_ceiling) and
    report each job from the journal. Exit status 3 when a job did not save within its wait,
    ended instead of saving, was not evacuated, or the daemon did not answer within --timeout;
    0 when each one saved (or had nothing that could save and was requeued)."""
    from slurm_ft.failover import evacuation
    from slurm_ft.journal import open_daemon_journal
    from slurm_ft.slurm import Slurm
    from slurm_ft.textsafe import terminal_safe
    say = lambda line: click.echo(terminal_safe(line))  # noqa: E731  (journal text is job text)
    try:
        cfg = config_mod.load(config_path)
        slurm = Slurm.from_config(cfg)
        if not checkpoint:
            say(f"{node}: {evacuation.drain(slurm, node, reason or 'drained by admin')}")
            return
        with open_daemon_journal(cfg) as journal:
            line, requests, left = evacuation.request(slurm, journal, node, cfg.failover, reason=reason,
                                                      only_jobs=list(only_jobs) or None)
            say(f"{node}: {line}")
            for o in left:
                say(f"job {o.job_id}: {o.line()}")
            if not requests:
                say(f"{node}: no ft-enabled job to evacuate")
                return
            limit = timeout_s or evacuation.default_timeout_s(requests)
            say(f"{node}: asked the daemon to evacuate job(s) {', '.join(str(r.job_id) for r in requests)}; "
                f"following its journal for up to {limit:g} s")
            outcomes = evacuation.follow(journal, requests, limit, report=say)
    except SlurmFTError as exc:
        raise _fail(exc) from None
    if not all(o.ok for o in outcomes):
        raise SystemExit(3)   # the admin must know: a job did not save, or was not evacuated


@main.command()
@click.option("--format", "fmt", type=click.Choice(["text", "html", "json"]), default=None,
              help="Plain text (default), an HTML page (every reason and name escaped), or JSON.")
@click.option("--json", "as_json", is_flag=True, help="JSON; the same as --format json.")
@click.option("-o", "--output", metavar="FILE", help="Write to this file (replaced whole, never through a symlink).")
@click.option("--days", type=click.FloatRange(min=0, min_open=True), default=7.0, show_default=True,
              help="Look-back window in days.")
@click.option("--flap-threshold", type=click.IntRange(min=2), default=3, show_default=True,
              help="Flag a node or GPU with at least this many hardware faults in the window as flapping "
                   "(RMA candidate).")
@click.option("--node-journals", metavar="GLOB",
              help="Also read these node journals: health-check episodes and GPU indices.")
@click.option("--ack", "ack_nodes", metavar="NODES",
              help="First acknowledge the hardware faults of these nodes so far (hostlist; journaled with "
                   "--ack-reason): they no longer make a node or its GPUs flapping (test drains, a repaired GPU).")
@click.option("--ack-reason", metavar="TEXT", help="Why the faults of --ack do not count (required with --ack).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file (default: lookup order).")
def report(fmt: str | None, as_json: bool, output: str | None, days: float, flap_threshold: int,
           node_journals: str | None, config_path: str | None, ack_nodes: str | None = None,
           ack_reason: str | None = None) -> None:
    """Drain report for admins: nodes out of service and who took them out (slurm-ft for a fault
    or a health check, an admin, Slurm), drains in the window with counts that add up, flapping
    nodes and GPUs (RMA candidates), Xids and failed health checks per node and GPU."""
    from slurm_ft.report import check_output, collect, render, write_report
    from slurm_ft.slurm import Slurm
    from slurm_ft.textsafe import terminal_safe
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} contradict each other")
    fmt = "json" if as_json else fmt or "text"
    try:
        if output:
            check_output(output)           # before asking Slurm: a typo in -o fails at once
        cfg = config_mod.load(config_path)
        if ack_nodes is not None:          # slurm_ft/report/ack.py (docs/drain-report.md)
            from slurm_ft.journal import open_daemon_journal
            from slurm_ft.report.ack import acknowledge
            try:
                with open_daemon_journal(cfg) as journal:
                    acknowledge(journal, ack_nodes, ack_reason or "", by=os.environ.get("SUDO_USER", ""))
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
        data = collect(cfg, Slurm.from_config(cfg), since_s=days * 86400, node_journals=node_journals,
                       flap_threshold=flap_threshold)
        text = render(data, fmt)
        if output:
            write_report(output, text)
    except SlurmFTError as exc:
        raise click.ClickException(terminal_safe(str(exc))) from None
    click.echo(f"wrote {terminal_safe(output)}" if output else text)


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--restarts", type=click.IntRange(0, 100), default=3, show_default=True,
              help="In-place restarts of the step after infra or hang failures, per job attempt (apart from "
                   "--ft-retries, the requeue budget).")
@click.option("--delay", "delay_s", type=click.FloatRange(0, 600), default=2.0, show_default=True,
              help="Seconds between a failure and the restart.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_command(restarts: int, delay_s: float, command: tuple[str, ...]) -> None:
    """Run a job step (slurm-ft run -- srun ...) inside a batch script and re-launch it in the same
    allocation when it fails for an infra or hang reason, up to --restarts times; a user error is
    not retried; hardware and anything else ends the job so that slurm-ft requeues it (elsewhere,
    for a hardware fault). Exits with the step's status. Each restart is recorded in the job's
    comment and shown by ft-history."""
    from slurm_ft.job.inplace import run
    argv = list(command[1:] if command and command[0] == "--" else command)
    if not argv:
        raise click.UsageError("no command to run (slurm-ft run -- srun ...)")
    sys.exit(run(argv, restarts, delay_s=delay_s))


# ------------------------------------------------------------------------------------------ lab
@main.group()
def lab() -> None:
    """The local lab cluster (munge + slurmctld + N slurmd on this host) for the demo and tests."""


_dir_option = click.option("--dir", "lab_dir", type=click.Path(file_okay=False), default=str(lab_layout.DEFAULT_DIR),
                           envvar="SLURM_FT_LAB_DIR", show_default=True, show_envvar=True,
                           help="Lab directory (config, state, logs, journals); `lab env` exports it as "
                                "$SLURM_FT_LAB_DIR for the next lab commands.")


def _lab(lab_dir: str):
    from slurm_ft.lab.cluster import Lab
    return Lab(lab_dir)


def _engine_options(f):
    f = click.option("--slurm", type=click.Choice(["22.05", "24.11", "26.05"]), envvar="SLURM_FT_LAB_SLURM",
                     show_envvar=True, default=None,
                     help="Slurm version of the Docker lab [default: 24.11].")(f)
    return click.option("--engine", type=click.Choice(["native", "docker"]), default="native", show_default=True,
                        help="native: daemons on this host (Debian's Slurm); docker: one container per node.")(f)


def _docker_lab(slurm: str | None, lab_dir: str):
    from slurm_ft.lab.docker_engine import DockerLab
    # the native default directory is not the Docker lab's (/var/tmp/slurm-ft-dlab-<version>)
    return DockerLab(slurm, None if lab_dir == str(lab_layout.DEFAULT_DIR) else lab_dir)


@lab.command("up")
@click.option("--nodes", type=click.IntRange(1, lab_layout.MAX_NODES), default=3, show_default=True,
              help="Number of slurmd nodes.")
@click.option("--no-daemon", is_flag=True, help="Do not start the slurm-ft requeue daemon.")
@click.option("--controllers", type=click.IntRange(1, 2), default=1, show_default=True,
              help="Docker lab: slurmctld containers (2: ctl primary, ctl2 backup, a daemon in each).")
@click.option("--port-base", type=click.IntRange(1024, 60000), default=None,
              help="slurmctld listens on BASE+17, node nK on BASE+200+K [default: 16800, or the lab's last].")
@_dir_option
@_engine_options
def lab_up(nodes: int, no_daemon: bool, controllers: int, port_base: int | None, lab_dir: str, engine: str,
           slurm: str | None) -> None:
    """Start the lab cluster (idempotent; copes with stale state from a killed lab). With
    ``--engine docker``: a controller and NODES compute containers of Slurm ``--slurm``
    (docs/lab.md; the image is built on first use, then cached)."""
    from slurm_ft.lab.cluster import Lab
    try:
        if engine == "docker":
            _docker_lab(slurm, lab_dir).up(nodes=nodes, daemon=not no_daemon, log=click.echo,
                                           controllers=controllers)
        else:
            if controllers != 1:
                raise click.UsageError("--controllers 2 needs --engine docker")
            Lab(lab_dir, port_base).up(nodes=nodes, daemon=not no_daemon, log=click.echo)
    except SlurmFTError as exc:
        raise _fail(exc) from None


@lab.command("down")
@_dir_option
@_engine_options
def lab_down(lab_dir: str, engine: str, slurm: str | None) -> None:
    """Stop the processes the lab started (by pid); leaves nothing running. With ``--engine
    docker``: remove that version's lab containers and network."""
    try:
        if engine == "docker":
            _docker_lab(slurm, lab_dir).down(log=click.echo)
        else:
            _lab(lab_dir).down(log=click.echo)
    except SlurmFTError as exc:
        raise _fail(exc) from None


@lab.command("build-image")
@click.option("--slurm", type=click.Choice(["22.05", "24.11", "26.05"]), envvar="SLURM_FT_LAB_SLURM", show_envvar=True,
              multiple=True, help="Slurm version(s) [default: 24.11].")
def lab_build_image(slurm: tuple[str, ...]) -> None:
    """Build (or find cached) the Docker lab image of each Slurm version (offline, from Debian's
    packages); prints the time each takes."""
    from slurm_ft.lab.docker_engine import build_image
    try:
        for version in slurm or ("24.11",):
            t0 = time.monotonic()
            tag = build_image(version, log=click.echo)
            click.echo(f"image {tag} ready in {time.monotonic() - t0:.1f} s")
    except SlurmFTError as exc:
        raise _fail(exc) from None


@lab.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_dir_option
def lab_status(as_json: bool, lab_dir: str) -> None:
    """Show the lab's processes and nodes; exit 1 if it is not running."""
    st = _lab(lab_dir).status()
    if as_json:
        click.echo(json.dumps(st, indent=2))
    else:
        click.echo(f"lab {st['dir']}: {'running' if st['running'] else 'not running'}")
        for p in st["processes"]:
            click.echo(f"  {p['name']:<16} pid {p['pid']:<7} {'alive' if p['alive'] else 'dead'}")
        for line in st.get("sinfo", []):
            click.echo(f"  {line}")
    sys.exit(0 if st["running"] else 1)


@lab.command("inject-xid")
@click.argument("node")
@click.argument("xid", type=click.IntRange(1, 999))
@click.option("--gpu", type=click.IntRange(min=0), default=0, show_default=True, help="GPU index on the node.")
@click.option("--no-kill", is_flag=True, help="Only write the kernel log line; leave the job running.")
@_dir_option
def lab_inject_xid(node: str, xid: int, gpu: int, no_kill: bool, lab_dir: str) -> None:
    """Write a real-format NVRM Xid line for NODE's GPU into /dev/kmsg and kill the job processes
    on that GPU, as a lost GPU does."""
    from slurm_ft.lab.inject import inject_xid
    nodes = _lab(lab_dir).nodes()
    if node not in nodes:
        raise click.BadParameter(f"{node!r} is not a node of the lab in {lab_dir} ({', '.join(nodes) or 'none'})",
                                 param_hint="NODE")
    try:
        done = inject_xid(node, xid, gpu, kill=not no_kill, lab_dir=lab_dir)
    except SlurmFTError as exc:
        raise _fail(exc) from None
    click.echo(f"kmsg: {done['line']}")
    for k in done["killed"]:
        click.echo(f"killed pid {k['pid']} (job {k['job']})")


@lab.command("inject-infra")
@click.argument("node")
@click.option("--job", "job_id", type=click.IntRange(min=1), default=None,
              help="Only this job's step tasks on NODE (default: every job's).")
@click.option("--message", default=None,
              help="Line the killed tasks print on stderr [default: an NCCL InfiniBand completion error].")
@_dir_option
def lab_inject_infra(node: str, job_id: int | None, message: str | None, lab_dir: str) -> None:
    """Make the step tasks of the jobs on NODE fail as a network fault does: each task prints an
    infra error line on its stderr and is killed (SIGKILL). The batch script is left alone."""
    from slurm_ft.lab.inject import inject_infra
    lab_ = _lab(lab_dir)
    if node not in lab_.nodes():
        raise click.BadParameter(f"{node!r} is not a node of the lab in {lab_dir}", param_hint="NODE")
    try:
        done = inject_infra(node, conf=str(lab_.lay.slurm_conf), job_id=job_id, message=message)
    except SlurmFTError as exc:
        raise _fail(exc) from None
    for k in done["killed"]:
        click.echo(f"killed pid {k['pid']} (job {k['job']} step {k['step']})")
    if not done["killed"]:
        raise click.ClickException(f"no step task of {'job ' + str(job_id) if job_id else 'any job'} on {node}")


@lab.command("set-gpu")
@click.argument("node")
@click.argument("gpu", type=click.IntRange(min=0))
@click.argument("assignments", nargs=-1, required=True)
@_dir_option
def lab_set_gpu(node: str, gpu: int, assignments: tuple[str, ...], lab_dir: str) -> None:
    """Change a fake GPU's state: slurm-ft lab set-gpu n1 0 row_remap_pending=1."""
    from slurm_ft.lab.cluster import check_lab_dir
    from slurm_ft.nvml import fake
    lab_ = _lab(lab_dir)
    path = lab_.lay.inventory(node)
    if not path.exists():
        raise click.ClickException(f"no fake GPU inventory for node {node!r} ({path})")
    try:
        check_lab_dir(lab_.lay.dir)  # root writes the inventory: only in a lab directory only root controls
        for a in assignments:
            key, sep, value = a.partition("=")
            if not sep:
                raise click.UsageError(f"{a!r}: expected key=value")
            fake.set_gpu_field(str(path), gpu, key, value)
            click.echo(f"{node} GPU{gpu}: {key}={value}")
    except SlurmFTError as exc:
        raise _fail(exc) from None


@lab.command("env")
@_dir_option
def lab_env(lab_dir: str) -> None:
    """Print the shell exports that point Slurm's commands, slurm-ft and the other `slurm-ft lab`
    commands at the lab: eval "$(.venv/bin/slurm-ft lab env --dir DIR)"."""
    import shlex
    lay = _lab(lab_dir).lay
    click.echo(f"export SLURM_FT_LAB_DIR={shlex.quote(str(lay.dir))}")
    click.echo(f"export SLURM_CONF={shlex.quote(str(lay.slurm_conf))}")
    click.echo(f"export SLURM_FT_CONFIG={shlex.quote(str(lay.ft_conf))}")


@lab.command("reset")
@_dir_option
def lab_reset(lab_dir: str) -> None:
    """Cancel the lab's jobs, resume every drained node, make every fake GPU healthy again."""
    from slurm_ft.lab.demo import reset_nodes
    from slurm_ft.slurm import Slurm
    lab_ = _lab(lab_dir)
    try:
        reset_nodes(lab_, Slurm(conf=str(lab_.lay.slurm_conf)))
    except SlurmFTError as exc:
        raise _fail(exc) from None
    click.echo("lab reset: no jobs, every node idle, every GPU healthy")


@lab.command("snapshot-ctld")
@_dir_option
def lab_snapshot_ctld(lab_dir: str) -> None:
    """Keep a copy of slurmctld's saved state as it is now (for ``restart-ctld --lose-state``)."""
    try:
        click.echo(f"slurmctld state saved in {_lab(lab_dir).snapshot_ctld()}")
    except (SlurmFTError, OSError) as exc:
        raise _fail(exc) from None


@lab.command("restart-ctld")
@click.option("--lose-state", "lose_state", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Restart from the state saved SECONDS ago (the newest `lab snapshot-ctld` that old), as a "
                   "crash that lost its last writes does.")
@_dir_option
def lab_restart_ctld(lose_state: float | None, lab_dir: str) -> None:
    """Crash slurmctld (kill -9) and start it again alone, with the same arguments; slurmd and the
    jobs keep running (docs/lab.md)."""
    try:
        _lab(lab_dir).restart_ctld(lose_state, log=click.echo)
    except (SlurmFTError, OSError) as exc:
        raise _fail(exc) from None


@lab.command("demo")
@_dir_option
def lab_demo(lab_dir: str) -> None:
    """Failover demo: train on the lab, inject Xid 79 on its node, watch it resume elsewhere."""
    from slurm_ft.lab.demo import run_demo
    try:
        ok = run_demo(lab_dir, log=click.echo)
    except SlurmFTError as exc:
        raise _fail(exc) from None
    sys.exit(0 if ok else 1)


from slurm_ft.cli.admin import doctor_command, install_command, metrics_command  # noqa: E402
from slurm_ft.cli.bisect import bisect_command  # noqa: E402
from slurm_ft.cli.breaker import breaker_command  # noqa: E402
from slurm_ft.cli.classify import classify_command  # noqa: E402
from slurm_ft.cli.health import health_command  # noqa: E402
from slurm_ft.cli.wait import wait_command  # noqa: E402

main.add_command(bisect_command)
main.add_command(breaker_command)
main.add_command(doctor_command)
main.add_command(install_command)
main.add_command(metrics_command)
main.add_command(classify_command)
main.add_command(health_command)
main.add_command(wait_command)

if __name__ == "__main__":
    main()
