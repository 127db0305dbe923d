"""Logging for the prolog/epilog/hang watcher: stderr plus, when configured, an append-only log
file (``[node_state] log``), since slurmd discards a script's stderr.

One message is exactly one line: every message goes through
:func:`slurm_ft.textsafe.terminal_safe` here, in one place, so a newline, a carriage return or an
undecodable byte in a job's path (or in any other text a message quotes) is escaped and can
neither forge a second log line nor make the write fail. A multi-line message (a traceback) is
kept as one line with ``\\x0a`` between its lines."""

from __future__ import annotations

import os
import sys
import time

from .textsafe import terminal_safe


def log_line(text: object) -> str:
    """``text`` as one log line: every control character (newline included), lone surrogate and
    line separator escaped (:func:`slurm_ft.textsafe.terminal_safe`); encodes as UTF-8."""
    return terminal_safe(text)


class NodeLog:
    def __init__(self, who: str, job=None, path_template: str = ""):
        self.who = who
        self.job = job
        self.path = path_template.replace("{node}", job.node) if (path_template and job) else ""

    def __call__(self, msg: str) -> None:
        prefix = f"slurm-ft {self.who}"
        if self.job is not None:
            prefix += f": job {self.job.job_id} attempt {self.job.attempt} on {self.job.node}"
        line = log_line(f"{prefix}: {msg}")
        try:
            print(line, file=sys.stderr)
        except (OSError, ValueError):
            pass
        if self.path:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
                try:  # one write(2) per line: O_APPEND keeps concurrent writers' lines whole
                    os.write(fd, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n".encode("utf-8"))
                finally:
                    os.close(fd)
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
