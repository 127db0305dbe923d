"""The HTTP convention of the platform we model (shared/seeds/000_*): the training program serves
``POST /v1/preempt/notify`` (save now) and ``GET /v1/preempt/status`` (the save result) on a port in
9000-9999. :class:`NotifyServer` serves both for an :class:`~slurm_ft.checkpoint.helper.ExitCheckpoint`,
so a program integrated with that convention keeps working on Slurm: a notify is the same as the
checkpoint signal, and the status is also acked to Slurm.

Listens on loopback or on one of this host's own addresses only (never ``0.0.0.0``).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..errors import ConfigError

PORT_RANGE = (9000, 9999)
NOTIFY, STATUS = "/v1/preempt/notify", "/v1/preempt/status"


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


class NotifyServer:
    def __init__(self, ckpt, host: str = "127.0.0.1", port: int = 9000):
        check_bind(host, port)
        self.ckpt = ckpt
        ckpt_ref = ckpt

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 (http.server API)
                length = min(int(self.headers.get("Content-Length") or 0), 65536)
                if length:
                    self.rfile.read(length)
                if self.path.split("?")[0] != NOTIFY:
                    return self._send(404, {"error": "not found"})
                ckpt_ref.request("http")
                self._send(200, {"accepted": True, **ckpt_ref.status()})

            def do_GET(self):  # noqa: N802
                if self.path.split("?")[0] != STATUS:
                    return self._send(404, {"error": "not found"})
                self._send(200, ckpt_ref.status())

            def log_message(self, *args):  # quiet: the training log is not ours
                pass

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self.server = Server((host, int(port)), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="slurm-ft-notify", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.server_address[:2]

    def start(self) -> "NotifyServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
