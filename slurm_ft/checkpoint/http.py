"""The HTTP convention of the platform we model (shared/seeds/000_*): the training program serves
``POST /v1/preempt/notify`` (save now) and ``GET /v1/preempt/status`` (the save result) on a port in
9000-9999. :class:`NotifyServer` serves both for an :class:`~slurm_ft.checkpoint.helper.ExitCheckpoint`,
so a program integrated with that convention keeps working on Slurm: a notify is the same as the
checkpoint signal, and the status is also acked to Slurm.

Listens on loopback or on one of this host's own addresses only (never ``0.0.0.0``). Every user of
the node can reach such a port, so every request must carry ``Authorization: Bearer <secret>``
(auth.py: the secret is in the serving process's environment and in a 0600 token file only the
job's user and root can read). Without it: 401; a wrong secret: 403; neither triggers a save, and
both are logged (``slurm_ft.checkpoint.http`` logger, control characters escaped, rate-limited).
:func:`notify` and :func:`status` are the matching client.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, MutableMapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..errors import ConfigError, SlurmFTError
from . import auth

PORT_RANGE = (9000, 9999)
NOTIFY, STATUS = "/v1/preempt/notify", "/v1/preempt/status"
MAX_BODY = 65536

log = logging.getLogger(__name__)


class NotifyError(SlurmFTError):
    """A checkpoint server refused a request (401/403/other) or could not be reached."""


def check_bind(host: str, port: int) -> None:
    """Raises :class:`ConfigError` unless port is 9000..9999 and host is loopback or this host's."""
    if not PORT_RANGE[0] <= int(port) <= PORT_RANGE[1]:
        raise ConfigError(f"port: must be {PORT_RANGE[0]}..{PORT_RANGE[1]}, got {port}")
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"host: must be an IP address (loopback or this node's), got {host!r}") from None
    if addr.is_loopback:
        return
    if addr.is_unspecified:
        raise ConfigError(f"host: {host} would listen on every interface; use 127.0.0.1 or the node's address")
    own = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    if str(addr) not in own:
        raise ConfigError(f"host: {host} is not an address of this node ({', '.join(sorted(own))})")


def printable(text: str, limit: int = 200) -> str:
    """``text`` safe for one log line: control and non-ASCII characters escaped, cut at ``limit``."""
    cut = text[:limit]
    return cut.encode("unicode_escape").decode("ascii") + ("..." if len(text) > limit else "")


class _RefusalLog:
    """At most ``burst`` log lines per ``window_s``; the rest are counted and summed up later."""

    def __init__(self, burst: int = 20, window_s: float = 60.0, clock=time.monotonic):
        self.burst, self.window_s, self.clock = burst, window_s, clock
        self.start, self.count, self.dropped = clock(), 0, 0
        self.lock = threading.Lock()

    def __call__(self, msg: str, *args) -> None:
        with self.lock:
            now = self.clock()
            if now - self.start >= self.window_s:
                if self.dropped:
                    log.warning("slurm-ft checkpoint: %d more refused requests in the last %.0f s (not logged)",
                                self.dropped, now - self.start)
                self.start, self.count, self.dropped = now, 0, 0
            if self.count >= self.burst:
                self.dropped += 1
                return
            self.count += 1
        log.warning(msg, *args)


class NotifyServer:
    """``POST /v1/preempt/notify`` and ``GET /v1/preempt/status`` for one ``ExitCheckpoint``,
    on ``host:port`` (checked by :func:`check_bind`), for holders of the job's secret only.

    ``token``: the secret (default: ``$SLURM_FT_CKPT_TOKEN`` of ``env``, else a new one, see
    :func:`auth.server_token`). ``env`` (default ``os.environ``): read for ``SLURM_JOB_ID`` and
    ``SLURM_FT_RUNTIME_DIR``; with ``export``, the secret is put there for child processes. The
    token file (:class:`auth.TokenLocation`) is written once the port is bound and removed by
    :meth:`stop`.

    Raises :class:`ConfigError` (bad host/port/secret, unsafe token directory) or :class:`OSError`
    (port in use); nothing is left behind then."""

    def __init__(self, ckpt, host: str = "127.0.0.1", port: int = 9000, *, token: str | None = None,
                 env: MutableMapping[str, str] | None = None, export: bool = True):
        check_bind(host, port)
        env = os.environ if env is None else env
        self.ckpt = ckpt
        self.token = auth.server_token(env, token)
        secret = self.token
        ckpt_ref = ckpt
        refused = _RefusalLog()

        class Handler(BaseHTTPRequestHandler):
            server_version = "slurm-ft"
            sys_version = ""

            def _send(self, code: int, body: dict, headers: Mapping[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                code = auth.check_bearer(self.headers.get("Authorization"), secret)
                if code is None:
                    return True
                self.close_connection = True
                why = "no bearer secret" if code == 401 else "wrong secret"
                refused("slurm-ft checkpoint: refused %s %s from %s:%s (%d, %s)", printable(self.command or "?", 16),
                        printable(self.path or ""), self.client_address[0], self.client_address[1], code, why)
                if code == 401:
                    self._send(401, {"error": "authentication required"},
                               {"WWW-Authenticate": 'Bearer realm="slurm-ft checkpoint"', "Connection": "close"})
                else:
                    self._send(403, {"error": "forbidden"}, {"Connection": "close"})
                return False

            def do_POST(self):  # noqa: N802 (http.server API)
                if not self._authorized():
                    return
                raw = self.headers.get("Content-Length") or "0"
                if not raw.isdigit():
                    self.close_connection = True
                    return self._send(400, {"error": "bad Content-Length"})
                length = min(int(raw), MAX_BODY)
                if length:
                    self.rfile.read(length)
                if self.path.split("?")[0] != NOTIFY:
                    return self._send(404, {"error": "not found"})
                ckpt_ref.request("http")
                self._send(200, {"accepted": True, **ckpt_ref.status()})

            def do_GET(self):  # noqa: N802
                if not self._authorized():
                    return
                if self.path.split("?")[0] != STATUS:
                    return self._send(404, {"error": "not found"})
                self._send(200, ckpt_ref.status())

            def log_message(self, *args):  # quiet: the training log is not ours
                pass

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

            def handle_error(self, request, client_address):  # one line, never a traceback
                exc = sys.exc_info()[1]
                log.warning("slurm-ft checkpoint: request from %s failed: %s", client_address[0],
                            printable(f"{type(exc).__name__}: {exc}"))

        self.server = Server((host, int(port)), Handler)
        try:
            self.location = auth.TokenLocation.for_port(self.address[1], env=env)
            self.token_path = auth.write_token(self.location, self.token)
        except BaseException:
            self.server.server_close()
            raise
        if export and isinstance(env, MutableMapping):
            auth.export_token(env, self.token)
        self.thread = threading.Thread(target=self.server.serve_forever, name="slurm-ft-notify", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on."""
        return self.server.server_address[:2]

    def start(self) -> "NotifyServer":
        """Serve in a daemon thread; returns self."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the port, remove the token file."""
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()
        auth.remove_token(self.location)


# -- client ----------------------------------------------------------------------------------------

def _call(method: str, path: str, port: int, host: str, timeout_s: float, lookup: dict) -> dict:
    check_bind(host, port)  # the secret never leaves the node
    token = auth.client_token(port, **lookup)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{int(port)}{path}"
    req = urllib.request.Request(url, data=b"{}" if method == "POST" else None, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        raise NotifyError(f"{method} {url}: refused with HTTP {exc.code}"
                          + (" (wrong or missing secret)" if exc.code in (401, 403) else "")) from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        raise NotifyError(f"{method} {url}: {why}") from None
    except ValueError:
        raise NotifyError(f"{method} {url}: the answer is not JSON") from None


def notify(port: int = 9000, host: str = "127.0.0.1", *, timeout_s: float = 10.0, token: str | None = None,
           token_file: str | None = None, uid: int | None = None, job: str | int | None = None,
           env: Mapping[str, str] | None = None) -> dict:
    """``POST /v1/preempt/notify`` with the job's secret: ask the server on ``host:port`` to save.

    The secret: ``token``, else ``token_file``, else the token file of ``port`` for job ``job`` of
    user ``uid`` (defaults: ``$SLURM_JOB_ID``, the caller; root passes the job's), else
    ``$SLURM_FT_CKPT_TOKEN`` (see :func:`auth.client_token`). Returns the server's JSON answer
    (``{"accepted": true, "status": ..., "step": ..., ...}``). Raises :class:`NotifyError` (refused,
    unreachable), :class:`auth.TokenError` (no usable secret), :class:`ConfigError` (bad
    host/port, unsafe token path)."""
    return _call("POST", NOTIFY, port, host, timeout_s,
                 dict(token=token, token_file=token_file, uid=uid, job=job, env=env))


def status(port: int = 9000, host: str = "127.0.0.1", *, timeout_s: float = 10.0, token: str | None = None,
           token_file: str | None = None, uid: int | None = None, job: str | int | None = None,
           env: Mapping[str, str] | None = None) -> dict:
    """``GET /v1/preempt/status`` with the job's secret: ``{"status": "idle|notified|saving|saved|failed",
    "step", "path", "error", "signal", "notified_at", "source"}``. Arguments and errors as :func:`notify`."""
    return _call("GET", STATUS, port, host, timeout_s,
                 dict(token=token, token_file=token_file, uid=uid, job=job, env=env))
