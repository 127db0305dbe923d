"""What training code imports: catch the checkpoint signal, save, report.

The implementation is the job-side client, slurm_ft/data/client/slurm_ft_job.py (stdlib only,
installed at ``/usr/share/slurm-ft/python/slurm_ft_job.py`` for jobs that have no slurm-ft
install: docs/user-guide.md). This module re-exports it for programs that do have slurm-ft, and
adds what needs slurm-ft itself: its signal checks (:class:`ConfigError`), its Slurm wrapper for
the ack (channel.Reporter) and the authenticated HTTP server (:meth:`ExitCheckpoint.serve_http`).

    from slurm_ft.checkpoint import exit_checkpoint

    @exit_checkpoint                      # installs the handler for $SLURM_FT_CKPT_SIGNAL (USR1)
    def save(step):
        torch.save(state, path := f"{ckpt_dir}/step{step}.pt")
        return path                       # reported with the step

    with save:                            # handler installed for the block
        for step in range(start, steps):
            train_one_step()
            if save.poll(step):           # a notification arrived: saved (or failed) and reported
                save.wait_for_requeue()   # slurm-ft requeues the job as soon as the save is
                                          # reported; returns after a bound if nothing did
"""

from __future__ import annotations

import os
from typing import Callable

from slurm_ft.data.client import slurm_ft_job as _job
from slurm_ft.errors import ConfigError
from slurm_ft.failover.jobspec import DEFAULT_CKPT_SIGNAL, parse_signal
from slurm_ft.hang.heartbeat import heartbeat  # noqa: F401 (re-export)
from slurm_ft.checkpoint import channel


class ExitCheckpoint(_job.ExitCheckpoint):
    """The client's :class:`slurm_ft_job.ExitCheckpoint` with slurm-ft's Slurm wrapper for the
    ack, :class:`ConfigError` for a bad signal, and :meth:`serve_http`."""

    reporter_class = channel.Reporter

    def __init__(self, save: Callable[[int], str | None], *, signal: str | int | None = None, env=None, **kwargs):
        env = os.environ if env is None else env
        name = parse_signal(signal if signal is not None else env.get("SLURM_FT_CKPT_SIGNAL", DEFAULT_CKPT_SIGNAL),
                            "signal")
        super().__init__(save, signal=name, env=env, **kwargs)
        self._http = None

    def uninstall(self) -> None:
        """Restore the previous signal handler; stop the HTTP server (its token file is removed)."""
        super().uninstall()
        if self._http is not None:
            self._http.stop()
            self._http = None

    # -- HTTP convention ---------------------------------------------------------------
    def serve_http(self, port: int = 9000, host: str = "127.0.0.1", *, token: str | None = None) -> "ExitCheckpoint":
        """Also serve ``POST /v1/preempt/notify`` and ``GET /v1/preempt/status`` (see http.py) to
        holders of the job's secret (``Authorization: Bearer <secret>``).

        ``port``: 9000..9999; ``host``: loopback or one of the node's addresses. ``token``: the
        secret (default ``$SLURM_FT_CKPT_TOKEN``, else a new random one). The secret is exported as
        ``SLURM_FT_CKPT_TOKEN`` (children started later inherit it) and written to a 0600 file
        (``self.token_path``) for the job's other processes. Raises :class:`ConfigError` (bad
        port/host/secret, unsafe token directory) or :class:`OSError` (port in use)."""
        from slurm_ft.checkpoint.http import NotifyServer
        if self._http is not None:
            raise ConfigError("serve_http: already serving (one server per ExitCheckpoint)")
        self._http = NotifyServer(self, host, port, token=token, env=self._env).start()
        return self

    @property
    def token_path(self) -> str | None:
        """Path of the token file of the HTTP server (None when not serving)."""
        return None if self._http is None else self._http.token_path


def exit_checkpoint(save: Callable[[int], str | None] | None = None, **kwargs):
    """Decorator (``@exit_checkpoint`` or ``@exit_checkpoint(signal="USR2")``) or plain call
    (``exit_checkpoint(save_fn)``): returns an :class:`ExitCheckpoint` around ``save``."""
    if save is None:
        return lambda fn: ExitCheckpoint(fn, **kwargs)
    return ExitCheckpoint(save, **kwargs)
