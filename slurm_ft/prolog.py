"""Node prolog: note when the job started here (for the epilog's kernel-log window) and check
the node's GPUs before the job runs on them.

Run by slurmd as root on every node of a job at allocation (``PrologFlags=Alloc``,
``Prolog=.../prolog/slurm-ft-prolog``). Reads ``SLURM_JOB_ID``, ``SLURMD_NODENAME``,
``SLURM_JOB_RESTART_COUNT``, ``SLURM_JOB_GPUS``. Writes the start marker under
``[node_state] dir`` and health results to the node's journal.

Exit status: 0 lets the job start. Non-zero only when a health check fails: Slurm then drains the
node and requeues the job (the daemon releases it elsewhere at once, see failover/daemon.py).
Our own errors never block a job: they are logged and the prolog exits 0; an unexpected one
(a bug) goes through slurm_ft.boundary, whose ``[node_state] on_internal_error`` decides (default
``pass``: exit 0).
"""

from __future__ import annotations

import sys

from .boundary import note, report, root_entry
from .errors import SlurmFTError
from .nodejob import NodeJob, write_start_marker
from .nodelog import start_script


@root_entry("prolog")
def run(env: dict[str, str] | None = None) -> int:
    """The whole prolog; returns the process exit status (see module doc)."""
    job, cfg, log = start_script("prolog", env)
    if cfg is None:
        return 0
    note(cfg=cfg, node=job.node, log=log)
    try:
        write_start_marker(cfg.node_state.dir, job)
    except OSError as exc:
        log(f"start marker not written: {exc}")
    rc = health_gate(cfg, job, log)
    if rc == 0:
        start_hang_watch(cfg, job, env, log)
    return rc


def start_hang_watch(cfg, job: NodeJob, env: dict[str, str] | None, log) -> None:
    """For a job submitted with ``--ft-hang-timeout`` (its SPANK hint ``SPANK_FT_HANG_TIMEOUT``):
    make its heartbeat directory and start its hang watcher, detached (slurm_ft.hang.watcher,
    docs/hang.md). Costs the prolog a directory and a fork; any failure is logged and the job
    starts unwatched (never refused for it)."""
    import os

    from .hang.watcher import start, wanted
    env = dict(os.environ if env is None else env)
    if not wanted(env):
        return
    try:
        start(cfg, job, env, log)
    except Exception as exc:  # the watcher is an extra: it must never keep a job from running
        log(f"hang watcher not started: {exc!r}")


def health_gate(cfg, job: NodeJob, log) -> int:
    """Run the GPU health checks; on a failing check, journal it, drain the node with a
    ``slurm-ft: <check>: <measurement>`` reason (an admin's reason is kept), tell the daemon through
    the node mailbox (it releases the job elsewhere at once) and return 1 so Slurm does not start
    the job here. A check that could not run is a fail (see slurm_ft.health); a broken config is
    logged and lets the job start (our bug must not take a node out of service)."""
    from .failover import mailbox, policy
    from .health import run_checks, unhealthy
    from .health.actions import act_on_node, journal_results
    from .slurm import Slurm

    try:
        results = run_checks(cfg, job.node)
    except SlurmFTError as exc:
        log(f"health checks not run: {exc}")
        return 0
    failing = unhealthy(results)
    try:
        journal_results(cfg, job.node, results, job.job_id, log)
    except Exception as exc:  # a bug while journaling must not let a job onto a failing GPU
        if not failing:
            raise
        report("prolog", exc, cfg=cfg, log=log)
    if not failing:
        return 0
    slurm = Slurm.from_config(cfg)
    try:
        outcome = act_on_node(cfg, job.node, results, slurm, log)
        if outcome.startswith("breaker-open"):
            # too many nodes out of service already: a cluster-wide cause (a driver update, a
            # broken rule) is likelier than this node; let the job run and say so loudly
            log(f"ALERT {outcome}; job {job.job_id} allowed to start despite {failing[0].check} failing")
            return 0
        mailbox.post(cfg, slurm, job.node, job.job_id, job.attempt, "hardware",
                     f"{policy.HEALTH_RULE}{failing[0].check}")
    except SlurmFTError as exc:
        log(f"could not drain/report: {exc}")
    except Exception as exc:  # a bug while acting: the check still failed, the job still may not start
        report("prolog", exc, cfg=cfg, log=log)
    return 1


if __name__ == "__main__":
    sys.exit(run())
