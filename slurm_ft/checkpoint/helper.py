"""What training code imports: catch the checkpoint signal, save, report.

    from slurm_ft.checkpoint import exit_checkpoint

    @exit_checkpoint                      # installs the handler for $SLURM_FT_CKPT_SIGNAL (USR1)
    def save(step):
        torch.save(state, path := f"{ckpt_dir}/step{step}.pt")
        return path                       # reported with the step

    with save:                            # handler installed for the block
        for step in range(start, steps):
            train_one_step()
            if save.poll(step):           # a notification arrived: saved (or failed) and reported
                save.wait()               # wait (or exit): slurm-ft requeues the job as soon as
                                          # the save is reported

Save, report, and wait (or exit), as docs/user-guide.md says: slurm-ft requeues the job as soon
as ``saved`` is reported (an evacuation also after ``--ft-ckpt-wait`` without a report), so
nothing after ``poll`` needs to run; waiting keeps the job from training past its checkpoint.
The signal handler only sets a flag: saving happens at ``poll`` (between steps, where the state is
consistent). ``saving``/``saved``/``failed`` go to Slurm by channel.py from one rank per job
(``report=`` overrides; default: global rank 0, ``RANK`` or ``SLURM_PROCID``). With torch.distributed,
save on every rank and let ``poll`` run a barrier before rank 0 reports ``saved``
(``barrier=torch.distributed.barrier``).
"""

from __future__ import annotations

import os
import signal as _signal
import sys
import threading
import time
from typing import Callable

from ..errors import ConfigError
from ..failover.jobspec import DEFAULT_CKPT_SIGNAL, parse_signal
from ..hang.heartbeat import heartbeat
from . import channel

IDLE, NOTIFIED, SAVING, SAVED, FAILED = "idle", "notified", "saving", "saved", "failed"


def _rank(env) -> int:
    for key in ("RANK", "SLURM_PROCID"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return 0


class ExitCheckpoint:
    """Signal (or HTTP notify) -> user's ``save(step)`` -> ack to Slurm. Context manager."""

    def __init__(self, save: Callable[[int], str | None], *, signal: str | int | None = None,
                 report: bool | None = None, reporter: "channel.Reporter | None" = None,
                 barrier: Callable[[], None] | None = None, env=None):
        env = os.environ if env is None else env
        self._env = env
        self._save = save
        self.signal_name = parse_signal(signal if signal is not None else
                                        env.get("SLURM_FT_CKPT_SIGNAL", DEFAULT_CKPT_SIGNAL), "signal")
        self.signum = int(getattr(_signal, "SIG" + self.signal_name))
        if report is None:
            report = _rank(env) == 0
        self.reporter = (reporter or channel.Reporter.from_env(env)) if report else None
        self.barrier = barrier
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._previous = None
        self._http = None
        self.state = IDLE
        self.step: int | None = None
        self.path: str | None = None
        self.error: str | None = None
        self.notified_at: float | None = None
        self.source: str | None = None

    # -- notification -----------------------------------------------------------------
    def install(self) -> "ExitCheckpoint":
        """Install the signal handler (main thread only, as Python requires)."""
        self._previous = _signal.signal(self.signum, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Restore the previous signal handler; stop the HTTP server (its token file is removed)."""
        if self._previous is not None:
            _signal.signal(self.signum, self._previous)
            self._previous = None
        if self._http is not None:
            self._http.stop()
            self._http = None

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

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a notification arrives (for loops that sleep)."""
        return self._event.wait(timeout)

    # -- saving -----------------------------------------------------------------------
    def poll(self, step: int) -> bool:
        """If a notification is pending: save at ``step``, report, return True; else False.
        Also the training step's heartbeat for the hang watcher (``--ft-hang-timeout``; one store
        into memory, see slurm_ft.hang.heartbeat)."""
        heartbeat(step)
        if not self._event.is_set():
            return False
        self.save_now(step)
        return True

    def save_now(self, step: int) -> str:
        """Run the user's save now; returns the final state (``saved`` or ``failed``)."""
        self._event.clear()
        with self._lock:
            self.state, self.step, self.path, self.error = SAVING, step, None, None
        channel.report_quietly(self.reporter, "saving", step)
        heartbeat(step, saving=True)       # a long save pauses the hang window
        try:
            path = self._save(step)
            if self.barrier is not None:
                self.barrier()
        except Exception as exc:  # the user's code: report and re-raise
            heartbeat(step)
            with self._lock:
                self.state, self.error = FAILED, f"{type(exc).__name__}: {exc}"
            channel.report_quietly(self.reporter, "failed", step)
            print(f"slurm-ft checkpoint: save at step {step} failed: {self.error}", file=sys.stderr, flush=True)
            raise
        heartbeat(step)
        with self._lock:
            self.state, self.path = SAVED, None if path is None else str(path)
        channel.report_quietly(self.reporter, "saved", step, self.path)
        return SAVED

    def status(self) -> dict:
        with self._lock:
            return {"status": self.state, "step": self.step, "path": self.path, "error": self.error,
                    "signal": self.signal_name, "notified_at": self.notified_at, "source": self.source}

    # -- HTTP convention ---------------------------------------------------------------
    def serve_http(self, port: int = 9000, host: str = "127.0.0.1", *, token: str | None = None) -> "ExitCheckpoint":
        """Also serve ``POST /v1/preempt/notify`` and ``GET /v1/preempt/status`` (see http.py) to
        holders of the job's secret (``Authorization: Bearer <secret>``).

        ``port``: 9000..9999; ``host``: loopback or one of the node's addresses. ``token``: the
        secret (default ``$SLURM_FT_CKPT_TOKEN``, else a new random one). The secret is exported as
        ``SLURM_FT_CKPT_TOKEN`` (children started later inherit it) and written to a 0600 file
        (``self.token_path``) for the job's other processes. Raises :class:`ConfigError` (bad
        port/host/secret, unsafe token directory) or :class:`OSError` (port in use)."""
        from .http import NotifyServer
        if self._http is not None:
            raise ConfigError("serve_http: already serving (one server per ExitCheckpoint)")
        self._http = NotifyServer(self, host, port, token=token, env=self._env).start()
        return self

    @property
    def token_path(self) -> str | None:
        """Path of the token file of the HTTP server (None when not serving)."""
        return None if self._http is None else self._http.token_path

    def __enter__(self) -> "ExitCheckpoint":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def __call__(self, step: int):
        """Calling the decorated object still calls the user's save function."""
        return self._save(step)


def exit_checkpoint(save: Callable[[int], str | None] | None = None, **kwargs):
    """Decorator (``@exit_checkpoint`` or ``@exit_checkpoint(signal="USR2")``) or plain call
    (``exit_checkpoint(save_fn)``): returns an :class:`ExitCheckpoint` around ``save``."""
    if save is None:
        return lambda fn: ExitCheckpoint(fn, **kwargs)
    return ExitCheckpoint(save, **kwargs)
