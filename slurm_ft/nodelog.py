"""Logging for the prolog/epilog: stderr plus, when configured, an append-only log file
(``[node_state] log``), since slurmd discards a script's stderr."""

from __future__ import annotations

import os
import sys
import time


class NodeLog:
    def __init__(self, who: str, job=None, path_template: str = ""):
        self.who = who
        self.job = job
        self.path = path_template.replace("{node}", job.node) if (path_template and job) else ""

    def __call__(self, msg: str) -> None:
        prefix = f"slurm-ft {self.who}"
        if self.job is not None:
            prefix += f": job {self.job.job_id} attempt {self.job.attempt} on {self.job.node}"
        line = f"{prefix}: {msg}"
        print(line, file=sys.stderr)
        if self.path:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o640)
                with os.fdopen(fd, "a") as fh:
                    fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
            except OSError:
                pass


def start_script(who: str, env: dict[str, str] | None = None):
    """Common start of the prolog and epilog: parse the ``SLURM_*`` environment, load the config,
    open the log. Returns ``(job, cfg, log)``; ``job`` or ``cfg`` is None (and the problem logged)
    when the environment or the config is unusable. Never raises."""
    from . import config as config_mod
    from .errors import SlurmFTError
    from .nodejob import BadEnvironment, NodeJob

    try:
        job = NodeJob.from_env(env)
    except BadEnvironment as exc:
        log = NodeLog(who)
        log(str(exc))
        return None, None, log
    log = NodeLog(who, job)
    try:
        cfg = config_mod.load(env=env)
    except SlurmFTError as exc:
        log(f"config: {exc}")
        return job, None, log
    return job, cfg, NodeLog(who, job, cfg.node_state.log)
