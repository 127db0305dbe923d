"""The never-raises boundary at the top of every root entry point (prolog, epilog, hang watcher).

Runs as root on a compute node, inside whichever hook it wraps. A hook's *expected* outcomes
(a failing health check that drains on purpose, a :class:`~slurm_ft.errors.SlurmFTError` it logs)
are its own business; :func:`root_entry` catches everything else — any exception, and any
``BaseException`` other than ``SystemExit`` (a deliberate exit status) and ``KeyboardInterrupt``
(an operator's Ctrl-C on a manual run) — so that one slurm-ft bug cannot drain a whole cluster:

* the traceback goes to the node log (``[node_state] log``, else stderr), one line per frame;
* one line goes to syslog (``LOG_DAEMON | LOG_ERR``, ident ``slurm-ft``);
* the count ``slurm_ft_internal_errors_total{hook}`` is bumped in ``internal-errors.json`` under
  ``[node_state] dir`` (root-only; written temp-then-rename under ``flock``; read by
  ``slurm-ft metrics`` on that host, slurm_ft.admin.metrics);
* the hook returns ``0`` under ``[node_state] on_internal_error = "pass"`` (the default: the job
  runs, the node stays in service) or ``1`` under ``"drain"`` (Slurm drains the node: "Prolog
  error"/"Epilog error"; the watcher's status is read by nobody). As a process, a hook exits
  :data:`EXIT_DRAIN` for that 1, so that its wrapper can tell it from a crash before this
  boundary (an import error), which the wrapper answers per the same setting.

Reporting itself never raises: a node log, syslog or counter that cannot be written is skipped.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import syslog
import traceback

#: The counter file under ``[node_state] dir``: ``{"prolog": 3, ...}``.
COUNTER_FILE = "internal-errors.json"
#: Another counter file of the same shape: epilogs that could not read the kernel log
#: (``{"epilog": n}``; slurm_ft.node.epilog, ``slurm_ft_kernel_log_unavailable_total``).
KERNEL_LOG_FILE = "kernel-log-unavailable.json"
#: Exit status of a hook after an internal error, by ``[node_state] on_internal_error``.
EXIT = {"pass": 0, "drain": 1}
#: Exit status of a root entry *process* (``python -I -m slurm_ft.node.prolog`` / ``.epilog``) that
#: refuses the job or drains the node on purpose: a failing health check, or an internal error
#: under ``on_internal_error = "drain"`` (:func:`process_status`). The wrappers slurmd runs
#: (``prolog/``, ``epilog/``; ``slurm_ft/data/install/slurm-ft-*.in``) turn it into 1 (Slurm
#: drains the node) and every other non-zero status into a crash before this boundary (Python's
#: 1 for an exception at import, 126/127 for a missing interpreter, 128+n for a signal), which
#: they log to syslog and answer per ``on_internal_error`` themselves. Not 1 or 2: Python's own
#: statuses for an uncaught exception and a usage error.
EXIT_DRAIN = 3
#: Characters of the exception message kept in the syslog line.
SYSLOG_CHARS = 400
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

#: What the running entry point has learnt so far (config, node, log): see :func:`note`.
_context: dict = {}


def note(*, cfg=None, node: str | None = None, log=None) -> None:
    """Tell the boundary what the hook knows once it knows it (the loaded config, the node name,
    its node log), so an error after that point is reported with them. Before, the boundary
    loads the config itself from the environment."""
    for key, value in (("cfg", cfg), ("node", node), ("log", log)):
        if value is not None:
            _context[key] = value


def root_entry(hook: str):
    """Decorator for a root entry point ``fn(...) -> int`` (its exit status). ``hook`` names it
    in logs and in the metric's label (``prolog``, ``epilog``, ``hang-watcher``). A keyword or
    first positional argument that is a dict is taken as the hook's environment."""
    def wrap(fn):
        @functools.wraps(fn)
        def entry(*args, **kwargs):
            _context.clear()
            try:
                return fn(*args, **kwargs)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:  # noqa: BLE001 - the whole point: nothing escapes a root hook
                env = kwargs.get("env", args[0] if args and isinstance(args[0], dict) else None)
                return internal_error(hook, exc, env)
            finally:
                _context.clear()
        return entry
    return wrap


def process_status(rc: int) -> int:
    """The exit status of a root entry process whose hook returned ``rc``: ``0`` for ``0``,
    :data:`EXIT_DRAIN` for anything else (the hook's deliberate non-zero answer)."""
    return 0 if rc == 0 else EXIT_DRAIN


def exit_process(rc: int) -> None:
    """End a root entry process whose hook returned ``rc``: flush stdout and stderr, then
    ``os._exit(process_status(rc))`` (0, or :data:`EXIT_DRAIN`, which the wrapper turns into
    Slurm's 1). No interpreter teardown: about 10 ms less on every job (issue 24)."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(process_status(rc))


def internal_error(hook: str, exc: BaseException, env: dict | None = None) -> int:
    """Report ``exc`` (node log, syslog, counter) and return the hook's exit status per
    ``[node_state] on_internal_error``. Never raises."""
    cfg = _config(env)
    report(hook, exc, cfg=cfg, env=env)
    try:
        return EXIT[cfg.node_state.on_internal_error]
    except Exception:  # noqa: BLE001
        return 0


def report(hook: str, exc: BaseException, *, cfg=None, env: dict | None = None, log=None) -> None:
    """Log ``exc`` with its traceback, send one syslog line, bump the hook's counter. For a hook
    that carries on after the error (the prolog's drain path). Never raises."""
    if cfg is None:
        cfg = _config(env)
    try:
        line = _one_line(hook, exc)
    except BaseException:  # noqa: BLE001 - a __str__ that raises
        line = f"slurm-ft {hook}: internal error (unprintable exception)"
    try:
        log = log or _context.get("log") or _fallback_log(hook, cfg, env)
        log(f"INTERNAL ERROR (a slurm-ft bug; [node_state] on_internal_error = "
            f"{getattr(cfg.node_state, 'on_internal_error', 'pass')}): {line}")
        for frame in traceback.format_exception(type(exc), exc, exc.__traceback__):
            for text in frame.rstrip("\n").splitlines():
                log(f"  | {text}")
    except BaseException:  # noqa: BLE001
        pass
    try:
        syslog.openlog("slurm-ft", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR, line)
    except BaseException:  # noqa: BLE001
        pass
    try:
        bump(cfg.node_state.dir, hook)
    except BaseException:  # noqa: BLE001
        pass


def _one_line(hook: str, exc: BaseException) -> str:
    from slurm_ft.textsafe import terminal_safe
    msg = terminal_safe(str(exc))[:SYSLOG_CHARS]
    where = ""
    tb = traceback.extract_tb(exc.__traceback__)
    if tb:
        where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}"
    return f"slurm-ft {hook}: internal error {type(exc).__name__}{where}: {msg}"


def _config(env: dict | None):
    """The noted config, else the one the environment names, else the defaults (``pass``)."""
    from slurm_ft import config as config_mod
    if _context.get("cfg") is not None:
        return _context["cfg"]
    try:
        return config_mod.load(env=env)
    except BaseException:  # noqa: BLE001
        return config_mod.Config()


def _fallback_log(hook: str, cfg, env: dict | None):
    from slurm_ft.node.log import NodeLog
    log = NodeLog(hook)
    node = _context.get("node") or (env if env is not None else os.environ).get("SLURMD_NODENAME", "")
    template = getattr(cfg.node_state, "log", "")
    if template and _NODE.match(node or ""):
        log.path = template.replace("{node}", node)
    elif template and "{node}" not in template:
        log.path = template
    return log


# ------------------------------------------------------------------------------ the counter
def bump(state_dir: str, hook: str, name: str = COUNTER_FILE) -> None:
    """Add one to ``hook``'s count in ``<state_dir>/<name>`` (default ``internal-errors.json``;
    created 0600; ``flock`` on a lock file beside it; written temp-then-rename). Raises ``OSError``."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, name)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        counts = read_counts(state_dir, name)
        counts[hook] = counts.get(hook, 0) + 1
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(counts, fh, sort_keys=True)
        os.replace(tmp, path)
    finally:
        os.close(lock)


def read_counts(state_dir: str, name: str = COUNTER_FILE) -> dict[str, int]:
    """``{hook: count}`` from the counter file ``name``; ``{}`` when missing or unreadable (bounded read)."""
    try:
        fd = os.open(os.path.join(state_dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            data = json.loads(fh.read(1 << 16) or b"{}")
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items()
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0 and _NODE.match(str(k))}
