"""Node prolog: note when the job started here (for the epilog's kernel-log window) and check
the node's GPUs before the job runs on them.

Run by slurmd as root on every node of a job at allocation (``PrologFlags=Alloc``,
``Prolog=.../prolog/slurm-ft-prolog``). Reads ``SLURM_JOB_ID``, ``SLURMD_NODENAME``,
``SLURM_JOB_RESTART_COUNT``, ``SLURM_JOB_GPUS``. Writes the start marker under
``[node_state] dir`` and health results to the node's journal.

Exit status: 0 lets the job start. Non-zero only when a health check fails: Slurm then drains the
node and requeues the job (the daemon releases it elsewhere at once, see failover/daemon.py).
Our own errors never block a job: they are logged and the prolog exits 0.
"""

from __future__ import annotations

import sys

from . import config as config_mod
from .errors import SlurmFTError
from .nodejob import BadEnvironment, NodeJob, write_start_marker
from .nodelog import NodeLog


def run(env: dict[str, str] | None = None) -> int:
    try:
        job = NodeJob.from_env(env)
    except BadEnvironment as exc:
        NodeLog("prolog")(str(exc))
        return 0
    log = NodeLog("prolog", job)
    try:
        cfg = config_mod.load(env=env)
        log = NodeLog("prolog", job, cfg.node_state.log)
        write_start_marker(cfg.node_state.dir, job)
    except (SlurmFTError, OSError) as exc:
        log(f"error: {exc}")
        return 0
    return health_gate(cfg, job, log)


def health_gate(cfg, job: NodeJob, log) -> int:
    """Run the health checks (when configured); 1 if the node must not run the job."""
    return 0


if __name__ == "__main__":
    sys.exit(run())
