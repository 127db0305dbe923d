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

from slurm_ft.textsafe import terminal_safe


def log_line(text: object) -> str:
    """``text`` as one log line: every control character (newline included), lone surrogate and
    line separator escaped (:func:`slurm_ft.textsafe.terminal_safe`); encodes as UTF-8."""
    return terminal_safe(text)


#: Mode of a log directory the node log creates (root's: the log quotes job paths).
LOG_DIR_MODE = 0o750
_FILE_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
#: Log paths this process has already said it cannot write (said once, on stderr).
_warned: set[str] = set()


def make_log_dir(directory: str) -> int:
    """Create the missing directories of ``directory`` (mode :data:`LOG_DIR_MODE`, owned by the
    caller: root in a hook) and return an ``O_DIRECTORY`` fd of it (the caller closes it).

    The deepest existing ancestor (an admin's directory, e.g. ``/var/log``) is opened
    ``O_NOFOLLOW``: refused when it is itself a symlink. Every directory below it is made with
    ``mkdir`` at a directory fd and opened ``O_NOFOLLOW``, so a symlink put in place of one
    (before or after it is made) is never followed. Raises OSError (``ELOOP``/``ENOTDIR`` for
    such a symlink)."""
    directory = os.path.abspath(directory)
    missing: list[str] = []
    base = directory
    while not os.path.lexists(base):
        base, name = os.path.split(base)
        missing.insert(0, name)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name in missing:
            try:
                os.mkdir(name, LOG_DIR_MODE, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_log(path: str) -> int:
    """An append fd of the log file ``path`` (created 0640, never through a symlink), its
    directory made by :func:`make_log_dir` when missing. Raises OSError."""
    try:
        return os.open(path, _FILE_FLAGS, 0o640)
    except FileNotFoundError:
        pass
    dfd = make_log_dir(os.path.dirname(path) or ".")
    try:
        return os.open(os.path.basename(path), _FILE_FLAGS, 0o640, dir_fd=dfd)
    finally:
        os.close(dfd)


class NodeLog:
    """``log(msg)``: one line to stderr and, when ``path_template`` is set (``[node_state] log``,
    ``{node}`` replaced), appended to that file. A file that cannot be written is said once per
    process on stderr (slurmd's log); the message still goes to stderr."""

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
                fd = open_log(self.path)
                try:  # one write(2) per line: O_APPEND keeps concurrent writers' lines whole
                    os.write(fd, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n".encode("utf-8"))
                finally:
                    os.close(fd)
            except OSError as exc:
                self._cannot_write(exc)

    def _cannot_write(self, exc: OSError) -> None:
        if self.path in _warned:
            return
        _warned.add(self.path)
        try:
            print(log_line(f"slurm-ft {self.who}: node log {self.path} cannot be written "
                           f"({exc.strerror or exc}): messages go to stderr only ([node_state] log)"),
                  file=sys.stderr)
        except (OSError, ValueError):
            pass


def start_script(who: str, env: dict[str, str] | None = None):
    """Common start of the prolog and epilog: parse the ``SLURM_*`` environment, load the config,
    open the log. Returns ``(job, cfg, log)``; ``job`` or ``cfg`` is None (and the problem logged)
    when the environment or the config is unusable. Never raises."""
    from slurm_ft import config as config_mod
    from slurm_ft.errors import SlurmFTError
    from slurm_ft.node.job import BadEnvironment, NodeJob

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
