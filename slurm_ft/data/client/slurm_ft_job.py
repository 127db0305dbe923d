"""slurm-ft's job-side client: the exit-checkpoint helper, the ``saved`` ack and the training-step
heartbeat, in one file that needs nothing but the Python standard library (Python 3.8 or later;
no slurm-ft install, no ClusterShell, no third-party package).

``slurm-ft install`` puts it at ``/usr/share/slurm-ft/python/slurm_ft_job.py`` on compute and
login hosts (docs/install.md, docs/user-guide.md). A training program imports it by path::

    import sys
    sys.path.insert(0, "/usr/share/slurm-ft/python")     # or PYTHONPATH=/usr/share/slurm-ft/python
    from slurm_ft_job import exit_checkpoint

    @exit_checkpoint                      # handler for $SLURM_FT_CKPT_SIGNAL (USR1 by default)
    def save(step):
        torch.save(state, path)
        return path                       # reported with the step

    with save:                            # handler installed for the block
        for step in range(start, steps):
            train_one_step()
            if save.poll(step):           # a notification arrived: saved (or failed) and reported
                save.wait_for_requeue()   # slurm-ft requeues the job now; returns (to train on)
                                          # only if nothing ends the job within the bound

``slurm_ft.checkpoint`` and ``slurm_ft.hang.heartbeat`` re-export what is here: this file is the
one implementation of the job's side of three protocols whose readers run as root:

* **the ack** (read by the daemon, slurm_ft/checkpoint/channel.py ``find``): one whitespace-free
  word in the job's own Slurm comment, written with ``scontrol update JobId=J Comment=...`` (a job's
  owner may), other words of the comment kept::

      slurm-ft-ckpt:state=saved,attempt=0,step=120,t=1712345678.2,path=%2Fckpt%2Fstep120.pt

  ``state`` in :data:`STATES`; ``attempt`` is ``SLURM_RESTART_COUNT`` (0 on the first run);
  ``step`` a decimal integer; ``t`` epoch seconds with one decimal; ``path`` percent-encoded
  (every byte but ``[A-Za-z0-9_.~-]``), cut to :data:`MAX_PATH` characters first.
* **the heartbeat** (read by the hang watcher, slurm_ft/hang/heartbeat.py ``read_dir``): a 64-byte
  file ``<pid>.hb`` in the job's directory ``<heartbeat root>/<SLURM_JOB_ID>``, memory-mapped, so a
  beat is one store into memory (see :class:`Writer` for the layout).
* **the signal**: ``$SLURM_FT_CKPT_SIGNAL`` (one of :data:`CKPT_SIGNALS`) means "save now".

Programs that want no Python speak the same protocols directly: write the ack word with
``scontrol update``, or serve the HTTP endpoints of docs/user-guide.md ("No Python").

Errors: a bad signal name raises :class:`ClientError` (a ``ValueError``); reporting to Slurm and
the heartbeat never raise into the training loop (a failure is printed to stderr / returned False).
"""

from __future__ import annotations

import math
import mmap
import os
import signal as _signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Union
from urllib.parse import quote, unquote

__all__ = ["Ack", "ClientError", "ExitCheckpoint", "Reporter", "Writer", "exit_checkpoint", "find",
           "heartbeat", "mark_inplace", "merge", "parse_signal", "report_quietly"]


class ClientError(ValueError):
    """A value given to the client is not one it accepts (e.g. an unknown checkpoint signal)."""


# ------------------------------------------------------------------------------ the signal
#: Signals a job may choose for "save now" (slurm_ft/failover/jobspec.py CKPT_SIGNALS).
CKPT_SIGNALS = ("USR1", "USR2", "HUP", "INT", "TERM", "ALRM", "URG", "WINCH")
DEFAULT_CKPT_SIGNAL = "USR1"


def parse_signal(value: Union[str, int], where: str = "signal") -> str:
    """``USR2``, ``SIGUSR2``, ``usr2`` or ``12`` -> ``"USR2"``. Raises :class:`ClientError`."""
    text = str(value).strip().upper()
    if text.isdigit():
        for name in CKPT_SIGNALS:
            if int(getattr(_signal, "SIG" + name)) == int(text):
                return name
    if text.startswith("SIG"):
        text = text[3:]
    if text in CKPT_SIGNALS:
        return text
    raise ClientError("%s: %r is not one of %s" % (where, value, " ".join(CKPT_SIGNALS)))


# ------------------------------------------------------------------------------ the ack
PREFIX = "slurm-ft-ckpt:"
STATES = ("saving", "saved", "failed")
#: Slurm keeps comments well below this; a long path is cut rather than the update refused.
MAX_PATH = 512


@dataclass(frozen=True)
class Ack:
    """One ack record: ``state`` (:data:`STATES`), ``attempt`` (int), ``step`` (int or None),
    ``time`` (epoch s), ``path`` (str or None)."""

    state: str
    attempt: int
    step: Optional[int]
    time: float
    path: Optional[str]

    def encode(self) -> str:
        """The comment word (see the module docstring). Raises :class:`ClientError` for a record
        the root side would not read back as written: a state not in :data:`STATES`, an attempt
        or step that is not an integer (``bool`` included), a negative attempt, a time that is
        not a finite number >= 0, a path that is not text encodable as UTF-8."""
        if self.state not in STATES:
            raise ClientError("ack: state must be one of %s, got %r" % (", ".join(STATES), self.state))
        for name, value, optional in (("attempt", self.attempt, False), ("step", self.step, True)):
            if not (optional and value is None) and (isinstance(value, bool) or not isinstance(value, int)):
                raise ClientError("ack: %s must be an integer, got %r" % (name, value))
        if self.attempt < 0:
            raise ClientError("ack: attempt must be >= 0, got %r" % (self.attempt,))
        if isinstance(self.time, bool) or not isinstance(self.time, (int, float)) \
                or not math.isfinite(self.time) or self.time < 0:
            raise ClientError("ack: time must be finite epoch seconds, got %r" % (self.time,))
        if self.path is not None and not isinstance(self.path, str):
            raise ClientError("ack: path must be text, got %r" % (self.path,))
        items = ["state=%s" % self.state, "attempt=%d" % self.attempt]
        if self.step is not None:
            items.append("step=%d" % self.step)
        items.append("t=%.1f" % self.time)
        if self.path:
            try:
                items.append("path=" + quote(self.path[:MAX_PATH], safe=""))
            except UnicodeEncodeError:
                raise ClientError("ack: path is not encodable as UTF-8") from None
        return PREFIX + ",".join(items)

    @classmethod
    def decode(cls, word: str) -> "Optional[Ack]":
        """One record, or None when malformed (a comment is user-writable input)."""
        if not word.startswith(PREFIX):
            return None
        fields = dict(item.partition("=")[::2] for item in word[len(PREFIX):].split(",") if item)
        try:
            state = fields["state"]
            if state not in STATES:
                return None
            return cls(state, int(fields["attempt"]), int(fields["step"]) if "step" in fields else None,
                       float(fields["t"]), unquote(fields["path"]) if fields.get("path") else None)
        except (KeyError, ValueError):
            return None


def find(comment: str) -> "Optional[Ack]":
    """The ack record in a job comment, if any."""
    for word in (comment or "").split():
        if word.startswith(PREFIX):
            return Ack.decode(word)
    return None


def merge(comment: str, ack: Ack) -> str:
    """``comment`` with its ack record replaced by ``ack`` (other words kept, in order)."""
    words = [w for w in (comment or "").split() if not w.startswith(PREFIX)]
    return " ".join(words + [ack.encode()])


class Reporter:
    """Writes acks for one job attempt into the job's comment: ``squeue -h --jobs=J -o %k`` to read
    it, ``scontrol update JobId=J Comment=<merged>`` to write it (argv items, never a shell).
    :meth:`read_comment` / :meth:`write_comment` are the two Slurm calls (slurm-ft's
    ``channel.Reporter`` runs them through its own Slurm wrapper)."""

    #: Seconds each Slurm command may take.
    TIMEOUT_S = 20.0

    def __init__(self, job_id: int, attempt: int):
        self.job_id = int(job_id)
        self.attempt = int(attempt)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, **kwargs) -> "Optional[Reporter]":
        """For the current job (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``); None outside a job."""
        env = os.environ if env is None else env
        job = env.get("SLURM_JOB_ID", "")
        if not job or not job.isdigit():
            return None
        restart = env.get("SLURM_RESTART_COUNT", "0")
        return cls(int(job), int(restart) if restart.isdigit() else 0, **kwargs)

    def _run(self, *argv: str) -> str:
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=self.TIMEOUT_S, universal_newlines=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise OSError("%s: %s" % (argv[0], exc)) from None
        if done.returncode != 0:
            raise OSError("%s: exit %d: %s" % (" ".join(argv[:2]), done.returncode, done.stderr.strip()[:200]))
        return done.stdout

    def read_comment(self) -> str:
        """The job's comment now ("" for none)."""
        current = self._run("squeue", "-h", "--jobs=%d" % self.job_id, "-o", "%k").strip()
        return "" if current == "(null)" else current

    def write_comment(self, comment: str) -> None:
        self._run("scontrol", "update", "JobId=%d" % self.job_id, "Comment=" + comment)

    def report(self, state: str, step: Optional[int] = None, path: Optional[str] = None) -> Ack:
        """Record ``state`` in the job's comment. Raises :class:`ClientError` (unknown state) and
        whatever the Slurm calls raise (``OSError`` here) when Slurm refuses."""
        if state not in STATES:
            raise ClientError("checkpoint state must be one of %s, got %r" % (", ".join(STATES), state))
        ack = Ack(state, self.attempt, step, time.time(), path)
        self.write_comment(merge(self.read_comment(), ack))
        return ack


def report_quietly(reporter, state: str, step=None, path=None) -> "Optional[Ack]":
    """``reporter.report`` for training code: a Slurm hiccup is printed, never raised."""
    if reporter is None:
        return None
    try:
        return reporter.report(state, step, path)
    except Exception as exc:  # training must not die of a report
        print("slurm-ft checkpoint: could not report %r to Slurm: %s" % (state, exc), file=sys.stderr, flush=True)
        return None


# ------------------------------------------------------------------------------ the heartbeat
MAGIC = b"SFTHB\x01\x00\x00"
#: magic 8s | seq u64 | mono f64 | wall f64 | step i64 | state u32 | pid u32 | since f64 (little-endian)
FORMAT = struct.Struct("<8sQddqIId")
SIZE = 64
RUNNING, SAVING = 0, 1
#: The in-place wrapper's mark in the directory (slurm_ft.job.inplace): end only the step on a hang.
INPLACE_MARK = "inplace"
#: Seconds between two tries to find the job's heartbeat directory when it is not there.
RETRY_S = 30.0
#: The site's ``[hang] heartbeat_dir`` default (slurm_ft/config.py), ``{node}`` = SLURMD_NODENAME.
DEFAULT_HEARTBEAT_DIR = "/run/slurm-ft/heartbeat"
ENV_HEARTBEAT_DIR = "SLURM_FT_HEARTBEAT_DIR"
DEFAULT_CONFIG = "/etc/slurm-ft/slurm-ft.toml"


class Writer:
    """One process's heartbeat file ``<directory>/<pid>.hb``, 64 bytes, memory-mapped::

        magic "SFTHB\\x01\\0\\0" | seq u64 | mono f64 | wall f64 | step i64 | state u32 | pid u32 | since f64

    ``mono``/``since``: ``time.monotonic()`` s (CLOCK_MONOTONIC); ``wall``: epoch s; ``state`` 0
    running, 1 saving since ``since``; ``seq`` counts beats. :meth:`beat` is the hot-path call
    (one store into memory). Raises ``OSError`` when the file cannot be made."""

    def __init__(self, directory: str, pid: Optional[int] = None):
        self.pid = os.getpid() if pid is None else pid
        self.path = os.path.join(directory, "%d.hb" % self.pid)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._seq = 0
        self._since = 0.0

    def beat(self, step: int, saving: bool = False) -> None:
        """Record a training step (``saving``: a checkpoint is being written). ``step`` must fit
        a signed 64-bit integer (``struct.error`` otherwise)."""
        self._seq += 1
        now = time.monotonic()
        if saving and not self._since:
            self._since = now
        elif not saving:
            self._since = 0.0
        FORMAT.pack_into(self._mm, 0, MAGIC, self._seq, now, time.time(), int(step), SAVING if saving else RUNNING,
                         self.pid, self._since)

    def close(self) -> None:
        self._mm.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _config_heartbeat_dir(env: Mapping[str, str]) -> Optional[str]:
    """``[hang] heartbeat_dir`` of the site's config (slurm_ft/config.py lookup order), read with
    :mod:`tomllib` where the interpreter has it (3.11+); None when absent or unreadable."""
    try:
        import tomllib
    except ImportError:
        return None
    paths = [env.get("SLURM_FT_CONFIG", "")]
    if env.get("SLURM_CONF"):
        paths.append(os.path.join(os.path.dirname(env["SLURM_CONF"]), "slurm-ft.toml"))
    paths.append(DEFAULT_CONFIG)
    for path in paths:
        if path and os.path.isfile(path):
            try:
                with open(path, "rb") as fh:
                    value = tomllib.load(fh).get("hang", {}).get("heartbeat_dir")
            except (OSError, ValueError, AttributeError):
                return None
            return value if isinstance(value, str) else None
    return None


def heartbeat_dir(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This job's heartbeat directory on this node if it exists, else None (not in a job, or
    not hang-watched here). The root: ``$SLURM_FT_HEARTBEAT_DIR``, else the site config's
    ``[hang] heartbeat_dir`` (Python 3.11+), else :data:`DEFAULT_HEARTBEAT_DIR`; ``{node}`` is
    ``$SLURMD_NODENAME``; the directory is ``<root>/$SLURM_JOB_ID`` (made by the prolog)."""
    env = os.environ if env is None else env
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    if not job.isdigit() or not node:
        return None
    root = env.get(ENV_HEARTBEAT_DIR) or _config_heartbeat_dir(env) or DEFAULT_HEARTBEAT_DIR
    root = root.replace("{node}", node)
    if not os.path.isabs(root):
        return None
    d = os.path.join(root, str(int(job)))
    return d if os.path.isdir(d) else None


_writer = None  # type: Optional[Writer]
_next_try = 0.0


def _forked() -> None:
    """In a forked child (a DataLoader worker...): the parent's mapping is not this process's."""
    global _writer, _next_try
    _writer, _next_try = None, 0.0


os.register_at_fork(after_in_child=_forked)


def heartbeat(step: int, saving: bool = False, env: Optional[Mapping[str, str]] = None) -> bool:
    """Record one training step for the hang watcher (``saving``: a checkpoint is in progress,
    which pauses the hang window). After the first call it is one store into shared memory.
    Returns False when the job is not hang-watched on this node (then it looks again at most
    every :data:`RETRY_S` s). ``env`` given: look for the directory in it now (tests, one-shot
    tools). Never raises."""
    global _writer, _next_try
    try:
        if env is None:
            if _writer is not None:
                _writer.beat(step, saving)
                return True
            now = time.monotonic()
            if now < _next_try:
                return False
            _next_try = now + RETRY_S
        d = heartbeat_dir(os.environ if env is None else env)
        if d is None:
            return False
        if _writer is None or os.path.dirname(_writer.path) != d:
            _writer = Writer(d)
        _writer.beat(step, saving)
        return True
    except (OSError, ValueError, OverflowError, struct.error):
        return False


def mark_inplace(env: Optional[Mapping[str, str]] = None) -> bool:
    """The in-place wrapper's mark (slurm_ft.job.inplace): on a hang, the watcher ends only the step's
    tasks, so the wrapper can restart it. Returns whether it was made."""
    try:
        d = heartbeat_dir(os.environ if env is None else env)
        if d is None:
            return False
        os.close(os.open(os.path.join(d, INPLACE_MARK), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600))
        return True
    except OSError:
        return False


# ------------------------------------------------------------------------------ the helper
IDLE, NOTIFIED, SAVING_STATE, SAVED, FAILED = "idle", "notified", "saving", "saved", "failed"
#: Seconds :meth:`ExitCheckpoint.wait_for_requeue` waits by default for slurm-ft to end the job
#: when the job's ``$SLURM_FT_CKPT_WAIT`` (``--ft-ckpt-wait``, 1..3600) is not set: slurm-ft's
#: own default save wait (seed 000's exit-checkpoint wait shows at most 600 s).
REQUEUE_WAIT_S = 600.0


def _rank(env: Mapping[str, str]) -> int:
    for key in ("RANK", "SLURM_PROCID"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return 0


class ExitCheckpoint:
    """Signal (or another notification) -> user's ``save(step)`` -> ack to Slurm. Context manager.

    ``signal``: name or number (default ``$SLURM_FT_CKPT_SIGNAL``, else USR1; :class:`ClientError`
    if not one of :data:`CKPT_SIGNALS`). ``report``: whether this process acks (default: global
    rank 0 by ``RANK`` / ``SLURM_PROCID``). ``reporter``: what acks (default :class:`Reporter`
    for ``$SLURM_JOB_ID``). ``barrier``: called after the save, before the ack (e.g.
    ``torch.distributed.barrier``). The signal handler only sets a flag; saving happens in
    :meth:`poll`, between steps."""

    #: What makes the default reporter (slurm-ft's subclass uses its own Slurm wrapper).
    reporter_class = Reporter

    def __init__(self, save: Callable[[int], Optional[str]], *, signal: Union[str, int, None] = None,
                 report: Optional[bool] = None, reporter=None,
                 barrier: Optional[Callable[[], None]] = None, env: Optional[Mapping[str, str]] = None):
        env = os.environ if env is None else env
        self._env = env
        self._save = save
        self.signal_name = parse_signal(signal if signal is not None else
                                        env.get("SLURM_FT_CKPT_SIGNAL", DEFAULT_CKPT_SIGNAL), "signal")
        self.signum = int(getattr(_signal, "SIG" + self.signal_name))
        if report is None:
            report = _rank(env) == 0
        self.reporter = (reporter or self.reporter_class.from_env(env)) if report else None
        self.barrier = barrier
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._previous = None
        self.state = IDLE
        self.step = None  # type: Optional[int]
        self.path = None  # type: Optional[str]
        self.error = None  # type: Optional[str]
        self.notified_at = None  # type: Optional[float]
        self.source = None  # type: Optional[str]
        #: Set when :meth:`wait_for_requeue` reached its bound: ``{"source", "step", "waited_s"}``.
        self.wait_expired = None  # type: Optional[dict]

    # -- notification -----------------------------------------------------------------
    def install(self) -> "ExitCheckpoint":
        """Install the signal handler (main thread only, as Python requires)."""
        self._previous = _signal.signal(self.signum, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Restore the previous signal handler."""
        if self._previous is not None:
            _signal.signal(self.signum, self._previous)
            self._previous = None

    def _on_signal(self, signum, frame) -> None:
        self.request("signal")

    def request(self, source: str = "api") -> None:
        """Ask for an exit checkpoint (what the signal and ``POST /v1/preempt/notify`` do)."""
        with self._lock:
            if self.state in (IDLE, SAVED, FAILED):
                self.state, self.source, self.notified_at = NOTIFIED, source, time.time()
                self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until a notification arrives (for loops that sleep); False on ``timeout`` s."""
        return self._event.wait(timeout)

    def wait_for_requeue(self, timeout: Optional[float] = None) -> bool:
        """After a reported save: wait for slurm-ft to end the job (it requeues it as soon as it
        reads ``saved``), at most ``timeout`` s (default :data:`REQUEUE_WAIT_S`). Returns (False)
        when nothing ended the job by then — a notification that did not come from slurm-ft
        (your own ``kill -USR1``, a notify by hand) — or True early when a new notification
        arrives; either way the loop goes on training. ``timeout`` None: the job's
        ``$SLURM_FT_CKPT_WAIT`` seconds, else :data:`REQUEUE_WAIT_S`. On the bound it says why on
        stderr (one line) and sets :attr:`wait_expired` (the notification's source and the seconds
        waited)."""
        if timeout is None:
            given = str(self._env.get("SLURM_FT_CKPT_WAIT", ""))
            timeout = float(given) if given.isdigit() and 1 <= int(given) <= 3600 else REQUEUE_WAIT_S
        if self._event.wait(timeout):
            return True
        with self._lock:
            self.wait_expired = {"source": self.source, "step": self.step, "waited_s": timeout}
        print("slurm-ft checkpoint: saved at step %s, but nothing ended the job within %g s: the "
              "notification (%s) did not come from slurm-ft, or slurm-ft is not running; training on"
              % (self.step, timeout, self.source or "unknown"), file=sys.stderr, flush=True)
        return False

    # -- saving -----------------------------------------------------------------------
    def poll(self, step: int) -> bool:
        """If a notification is pending: save at ``step``, report, return True; else False.
        Also the training step's :func:`heartbeat` for the hang watcher."""
        heartbeat(step)
        if not self._event.is_set():
            return False
        self.save_now(step)
        return True

    def save_now(self, step: int) -> str:
        """Run the user's save now; returns the final state (``saved``), or re-raises the save's
        exception after reporting ``failed``."""
        self._event.clear()
        with self._lock:
            self.state, self.step, self.path, self.error = SAVING_STATE, step, None, None
        report_quietly(self.reporter, "saving", step)
        heartbeat(step, saving=True)       # a long save pauses the hang window
        try:
            path = self._save(step)
            if self.barrier is not None:
                self.barrier()
        except Exception as exc:  # the user's code: report and re-raise
            heartbeat(step)
            with self._lock:
                self.state, self.error = FAILED, "%s: %s" % (type(exc).__name__, exc)
            report_quietly(self.reporter, "failed", step)
            print("slurm-ft checkpoint: save at step %s failed: %s" % (step, self.error), file=sys.stderr, flush=True)
            raise
        heartbeat(step)
        with self._lock:
            self.state, self.path = SAVED, None if path is None else str(path)
        report_quietly(self.reporter, "saved", step, self.path)
        return SAVED

    def status(self) -> dict:
        """``{"status", "step", "path", "error", "signal", "notified_at", "source"}`` (the body of
        ``GET /v1/preempt/status``)."""
        with self._lock:
            return {"status": self.state, "step": self.step, "path": self.path, "error": self.error,
                    "signal": self.signal_name, "notified_at": self.notified_at, "source": self.source}

    def __enter__(self) -> "ExitCheckpoint":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def __call__(self, step: int):
        """Calling the decorated object still calls the user's save function."""
        return self._save(step)


def exit_checkpoint(save=None, **kwargs):
    """Decorator (``@exit_checkpoint`` or ``@exit_checkpoint(signal="USR2")``) or plain call
    (``exit_checkpoint(save_fn)``): returns an :class:`ExitCheckpoint` around ``save``."""
    if save is None:
        return lambda fn: ExitCheckpoint(fn, **kwargs)
    return ExitCheckpoint(save, **kwargs)
