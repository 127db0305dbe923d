"""``slurm-ft bisect``: click entry point only (slurm_ft/bisect/__init__.py does the work)."""

from __future__ import annotations

import json

import click

from slurm_ft import config as config_mod
from slurm_ft.errors import SlurmFTError


@click.command("bisect")
@click.option("--nodes", "nodes_expr", required=True, metavar="HOSTLIST",
              help="Nodes to search, a Slurm hostlist (n[1-8]); every one must be usable (not drained or down).")
@click.option("--test", "test", metavar="CMD",
              help="Program each task runs, split like a shell would (no shell runs it); exit 0 = pass. "
                   "Default: slurm-ft's health checks plus an all-reduce across the nodes' GPUs.")
@click.option("--ntasks-per-node", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Tasks per node of each test job.")
@click.option("--gpus-per-node", type=click.IntRange(0, 64), default=None,
              help="GPUs each test job takes per node (--gres=gpu:N) [default: all of them for the shipped test, "
                   "none for --test].")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=10), default=None,
              help="Seconds one test may run [default: [bisect] test_timeout_s, 600].")
@click.option("--partition", help="Partition for the test jobs [default: [bisect] partition, else Slurm's].")
@click.option("--min-nodes", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Nodes a test needs to mean something (a collective: 2); smaller groups are padded with "
                   "nodes that passed.")
@click.option("--no-confirm", is_flag=True, help="Skip round 1 (the whole set) when it is known to fail.")
@click.option("--no-drain", is_flag=True, help="Only report the culprit; do not drain it.")
@click.option("--job", "job_id", type=click.IntRange(min=1), default=None,
              help="The failed job this bisect is about: the rounds are journaled under it (ft-history).")
@click.option("--attempt", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --job: its attempt.")
@click.option("--from-daemon", is_flag=True, hidden=True, help="Started by the daemon: drains count against "
              "the circuit breaker.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object at the end.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file (default: lookup order).")
def bisect_command(nodes_expr: str, test: str | None, ntasks_per_node: int, gpus_per_node: int | None,
                   timeout_s: float | None, partition: str | None, min_nodes: int, no_confirm: bool, no_drain: bool,
                   job_id: int | None, attempt: int, from_daemon: bool, as_json: bool,
                   config_path: str | None) -> None:
    """Find the node(s) that make a multi-node test fail, by running the test as Slurm jobs on
    subsets of NODES in rounds (each round's jobs at once), and drain what it finds with a reason
    naming the test. Prints every round; journals every round (root, controller host). Exit 0: a
    culprit was found, or the test passed on all nodes; 3: no single node explains the failure
    (a combination, or the round limit); 1: error."""
    from slurm_ft.bisect import Spec, run_bisect
    from slurm_ft.bisect.runner import round_record, summary
    from slurm_ft.slurm import Slurm, split_nodes
    from slurm_ft.textsafe import terminal_safe

    try:
        cfg = config_mod.load(config_path)
        nodes = split_nodes(nodes_expr)
        if not nodes:
            raise click.UsageError("--nodes: no node named")
        spec = Spec.from_cli(test, tasks_per_node=ntasks_per_node, gpus_per_node=gpus_per_node or 0,
                             timeout_s=timeout_s or cfg.bisect.test_timeout_s,
                             partition=partition if partition is not None else cfg.bisect.partition)
        report = run_bisect(cfg, Slurm.from_config(cfg), nodes, spec, confirm=not no_confirm, drain=not no_drain,
                            job=job_id, attempt=attempt, min_nodes=min_nodes,
                            breaker=cfg.breaker if from_daemon else None,
                            log=lambda line: click.echo(terminal_safe(line)))
    except SlurmFTError as exc:
        raise click.ClickException(terminal_safe(str(exc))) from None
    r = report.result
    if as_json:
        click.echo(json.dumps({"culprits": r.culprits, "combinations": r.combinations, "good": r.good,
                               "reproduced": r.reproduced, "stopped": r.stopped, "summary": summary(r),
                               "rounds": [round_record(x) for x in r.rounds], "drained": report.drained,
                               "journal_job": report.journal_job}, ensure_ascii=True))
    if r.reproduced and not r.culprits:
        raise SystemExit(3)
