"""Bisect diagnosis: find the node(s) that make a multi-node test fail (docs/bisect.md).

``search`` is the algorithm (pure), ``runner`` runs each test as a Slurm job and records the
rounds, ``collective`` is the test shipped with slurm-ft, ``cli`` is ``slurm-ft bisect``.
:func:`run_bisect` puts them together; :func:`auto_bisect_wanted` and :func:`spawn` are what
the daemon needs to start one by itself (``[bisect] auto``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from slurm_ft.errors import SlurmFTError
from slurm_ft.bisect.runner import (
    BisectError, Spec, Tickets, check_nodes, drain_reason, journal_rounds, run_round, summary)
from slurm_ft.bisect.search import Outcome, Result, Round, Test, bisect

__all__ = ["BisectError", "Outcome", "Result", "Round", "Spec", "Test", "auto_bisect_wanted", "bisect",
           "run_bisect", "spawn"]


@dataclass
class Report:
    result: Result
    drained: dict[str, str]          # node -> drain outcome ("drained", "kept-admin-reason", ...)
    journal_job: int | None          # job id the rounds were journaled under (None: not journaled)
    journal_error: str = ""


def run_bisect(cfg, slurm, nodes: list[str], spec: Spec, *, confirm: bool = True, drain: bool = True,
               job: int | None = None, attempt: int = 0, min_nodes: int = 2, breaker=None, journal=None,
               log=print) -> Report:
    """Check the nodes, search, drain the culprits (``drain``), journal every round.

    ``job``/``attempt``: the failed job this bisect is about (the rounds are journaled under it);
    None: under the first test job's id. ``journal``: an open daemon journal, or None to open one
    (a failure to open it is reported, not fatal: the rounds are printed anyway).
    ``breaker``: the ``[breaker]`` config when the daemon started the bisect; None for an admin's
    own command (no limit, as ``slurm-ft drain``)."""
    from slurm_ft.drain import drain_node

    gpus = check_nodes(slurm, nodes)
    if not spec.gpus_per_node and spec.argv is None:
        spec.gpus_per_node = min(gpus.values()) if gpus else 0
    session = time.strftime("%H%M%S")
    log(f"bisect {len(nodes)} nodes with {spec.name}: {', '.join(nodes)}")
    with Tickets() as tickets:
        result = bisect(nodes, lambda number, tests: run_round(slurm, spec, session, number, tests, log, tickets),
                        min_nodes=min_nodes, confirm=confirm)
    log(summary(result))
    drained: dict[str, str] = {}
    if drain and cfg.bisect.drain and len(result.culprits) * 2 > len(nodes):
        log(f"not draining: {len(result.culprits)} of {len(nodes)} nodes fail the test; a test failing on most "
            f"nodes is more likely broken itself (run it by hand on one of them)")
    elif drain and cfg.bisect.drain:
        for node in result.culprits:
            reason = drain_reason(spec, node, result)
            try:
                drained[node] = drain_node(slurm, node, reason, breaker=breaker)
            except SlurmFTError as exc:
                drained[node] = f"failed: {exc}"
            log(f"{node}: {drained[node]} ({reason})")
    journal_job = job if job is not None else next(
        (o.job_id for r in result.rounds for o in r.outcomes if o.job_id), None)
    err = ""
    if journal_job is not None:
        try:
            if journal is None:
                from slurm_ft.journal import open_daemon_journal
                with open_daemon_journal(cfg) as j:
                    journal_rounds(j, journal_job, attempt, spec, result)
            else:
                journal_rounds(journal, journal_job, attempt, spec, result)
        except SlurmFTError as exc:
            err = str(exc)
            log(f"rounds not journaled: {exc}")
    return Report(result, drained, journal_job if not err else None, err)


def auto_bisect_wanted(cfg, decision, job_nodes: list[str]) -> bool:
    """Whether the daemon should start a bisect for an ended attempt: the site turned it on
    (``[bisect] auto``) and :func:`slurm_ft.failover.policy.bisect_candidate` holds."""
    from slurm_ft.failover.policy import bisect_candidate
    return bool(cfg.bisect.auto) and bisect_candidate(decision, job_nodes)


def spawn(cfg, job_id: int, attempt: int, nodes: list[str]) -> subprocess.Popen:
    """Start ``python -I -u -m slurm_ft.cli.main bisect --nodes ... --job J --attempt A`` as a child
    process (what the daemon does: a bisect takes minutes and must not hold a daemon cycle), in
    ``/`` with a minimal environment (fixed ``PATH``, ``LC_ALL``, and the daemon's
    ``SLURM_CONF``/``SLURM_FT_CONFIG`` when set): root never runs Python that a working directory
    or a ``PYTHON*`` variable could redirect. Its output goes to the daemon's stderr."""
    from slurm_ft.slurm import SAFE_PATH, compress_nodes
    argv = [sys.executable, "-I", "-u", "-m", "slurm_ft.cli.main", "bisect", "--nodes", compress_nodes(nodes),
            "--job", str(job_id), "--attempt", str(attempt), "--from-daemon"]
    if cfg.source:
        argv += ["--config", cfg.source]
    env = {"PATH": SAFE_PATH, "LC_ALL": "C"}
    env.update({k: os.environ[k] for k in ("SLURM_CONF", "SLURM_FT_CONFIG") if os.environ.get(k)})
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, cwd="/", env=env)
