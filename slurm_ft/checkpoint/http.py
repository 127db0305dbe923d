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

The server runs inside the training process, so what other users send is bounded there: one
thread (a ``selectors`` loop), at most :data:`MAX_CONNECTIONS` sockets, each request whole within
:data:`REQUEST_TIMEOUT_S`, at most :data:`MAX_HEADER` / :data:`MAX_BODY` bytes, one request per
connection; :func:`parse_request` is the one parser of what arrives (tests/test_checkpoint_http.py).
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import json
import logging
import os
import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, MutableMapping
from http import HTTPStatus

from slurm_ft.errors import ConfigError, SlurmFTError
from slurm_ft.checkpoint import auth

PORT_RANGE = (9000, 9999)
NOTIFY, STATUS = "/v1/preempt/notify", "/v1/preempt/status"
#: Bytes of request body accepted (Content-Length above: 413).
MAX_BODY = 65536
#: Bytes of request line + header fields accepted (more: 413).
MAX_HEADER = 8192
#: Header fields accepted.
MAX_HEADERS = 64
#: Connections open at once (one more closes the oldest still waiting for its request).
MAX_CONNECTIONS = 64
#: Seconds from a connection to its whole request (then to its whole answer) before it is closed.
REQUEST_TIMEOUT_S = 5.0
#: listen() backlog, and most connections accepted in one loop turn.
LISTEN_BACKLOG = 128
RECV_CHUNK = 16384

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


class _Conn:
    """One client connection: what arrived so far, what is left to send, and its deadline."""

    __slots__ = ("sock", "peer", "data", "out", "deadline")

    def __init__(self, sock: socket.socket, peer, deadline: float):
        self.sock, self.peer, self.data, self.out, self.deadline = sock, peer, bytearray(), b"", deadline


class _Request:
    """A parsed request: ``method``, ``path``, ``version``, ``headers`` (http.client.HTTPMessage),
    ``body_len`` (the Content-Length; the body itself is never used)."""

    __slots__ = ("method", "path", "version", "headers", "body_len")

    def __init__(self, method: str, path: str, version: str, headers, body_len: int):
        self.method, self.path, self.version, self.headers, self.body_len = method, path, version, headers, body_len


class _Bad(Exception):
    """The request cannot be served: answer ``code`` with ``error`` and close."""

    def __init__(self, code: int, error: str):
        super().__init__(error)
        self.code, self.error = code, error


def parse_request(data: bytes) -> _Request | None:
    """Parse one HTTP/1.x request from the bytes received so far.

    Returns None while the request is incomplete (header block or ``Content-Length`` body not all
    there yet); raises :class:`_Bad` (400 malformed, 413 over :data:`MAX_HEADER`/:data:`MAX_BODY`,
    411 a body without ``Content-Length``) as soon as the bytes cannot become a request this server
    serves. Never raises anything else (tests/test_checkpoint_http.py feeds it arbitrary bytes)."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_HEADER:
            raise _Bad(413, "request header too large")
        return None
    if end + 4 > MAX_HEADER:
        raise _Bad(413, "request header too large")
    head = data[:end].decode("iso-8859-1")
    line, _, rest = head.partition("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/") \
            or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise _Bad(400, "bad request line")
    fields = rest.split("\r\n") if rest else []
    if len(fields) > MAX_HEADERS:
        raise _Bad(413, "too many header fields")
    try:
        headers = http.client.parse_headers(io.BytesIO(rest.encode("iso-8859-1") + b"\r\n\r\n"))
    except Exception:  # noqa: BLE001  (http.client raises HTTPException, LineTooLong, email errors)
        raise _Bad(400, "bad header fields") from None
    if headers.defects or any(not f or f[0] in " \t" or ":" not in f for f in fields):
        raise _Bad(400, "bad header fields")
    if headers.get_all("Transfer-Encoding"):
        raise _Bad(411, "a body needs Content-Length")
    lengths = headers.get_all("Content-Length") or ["0"]
    raw = lengths[0].strip()
    if len(lengths) != 1 or not raw.isascii() or not raw.isdigit():
        raise _Bad(400, "bad Content-Length")
    body_len = int(raw)
    if body_len > MAX_BODY:
        raise _Bad(413, "request body too large")
    if len(data) - (end + 4) < body_len:
        return None
    return _Request(parts[0], parts[1], parts[2], headers, body_len)


class NotifyServer:
    """``POST /v1/preempt/notify`` and ``GET /v1/preempt/status`` for one ``ExitCheckpoint``,
    on ``host:port`` (checked by :func:`check_bind`), for holders of the job's secret only.

    It runs inside the training process, so its cost is bounded whatever the node's other users
    send: **one** thread (a ``selectors`` loop, never a thread per connection), at most
    :data:`MAX_CONNECTIONS` connections open (past it, the oldest connection still waiting for its
    request is closed to make room), each request complete within :data:`REQUEST_TIMEOUT_S` of its
    connection (else closed: slow-loris), at most :data:`MAX_HEADER` bytes of header and
    :data:`MAX_BODY` of body (else 413), one request per connection (``Connection: close``).

    ``token``: the secret (default: ``$SLURM_FT_CKPT_TOKEN`` of ``env``, else a new one, see
    :func:`auth.server_token`). ``env`` (default ``os.environ``): read for ``SLURM_JOB_ID`` and
    ``SLURM_FT_RUNTIME_DIR``; with ``export``, the secret is put there for child processes. The
    token file (:class:`auth.TokenLocation`) is written once the port is bound and removed by
    :meth:`stop`. ``clock``: monotonic seconds (tests).

    Raises :class:`ConfigError` (bad host/port/secret, unsafe token directory) or :class:`OSError`
    (port in use); nothing is left behind then."""

    def __init__(self, ckpt, host: str = "127.0.0.1", port: int = 9000, *, token: str | None = None,
                 env: MutableMapping[str, str] | None = None, export: bool = True, clock=time.monotonic):
        check_bind(host, port)
        env = os.environ if env is None else env
        self.ckpt = ckpt
        self.token = auth.server_token(env, token)
        self.clock = clock
        self.refused = _RefusalLog()
        #: Unexpected errors while serving a connection (each closed that connection; tests assert 0).
        self.internal_errors = 0
        self.conns: dict[int, _Conn] = {}
        self._stop = threading.Event()
        self._listen(host, int(port), env)
        self._open_selector()
        if export and isinstance(env, MutableMapping):
            auth.export_token(env, self.token)
        self.thread = threading.Thread(target=self.serve_forever, name="slurm-ft-notify", daemon=True)

    def _listen(self, host: str, port: int, env: Mapping[str, str]) -> None:
        """Bind and listen on ``host:port`` (non-blocking, backlog :data:`LISTEN_BACKLOG`) as
        :attr:`sock`, then write the token file for the bound port (:attr:`location`,
        :attr:`token_path`; ``env``: ``SLURM_JOB_ID``, ``SLURM_FT_RUNTIME_DIR``). Raises
        :class:`OSError` (port in use) or :class:`ConfigError` (unsafe token directory); the
        socket is closed then."""
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.sock.listen(LISTEN_BACKLOG)
            self.sock.setblocking(False)
            self.location = auth.TokenLocation.for_port(self.address[1], env=env)
            self.token_path = auth.write_token(self.location, self.token)
        except BaseException:
            self.sock.close()
            raise

    def _open_selector(self) -> None:
        """The loop's selector (:attr:`sel`) over the listening socket (``"listen"``) and the
        read end of a non-blocking socket pair (``"wake"``) through which :meth:`stop` wakes
        the loop."""
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, "listen")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on."""
        return self.sock.getsockname()[:2]

    def start(self) -> "NotifyServer":
        """Serve in one daemon thread; returns self."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the port and every connection, remove the token file."""
        self._stop.set()
        if self.thread.is_alive():
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
            self.thread.join(5.0)
        for conn in list(self.conns.values()):
            self._close(conn)
        for s in (self.sock, self._wake_r, self._wake_w):
            s.close()
        self.sel.close()
        auth.remove_token(self.location)

    # -- the loop ----------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """The selector loop (the server's only thread) until :meth:`stop`. Never raises: an
        unexpected error closes the connection it came from and is logged in one line."""
        while not self._stop.is_set():
            now = self.clock()
            soonest = min((c.deadline for c in self.conns.values()), default=now + 1.0)
            try:
                events = self.sel.select(max(0.0, min(1.0, soonest - now)))
            except (OSError, ValueError) as exc:   # closed under us by stop(), or EINTR
                if self._stop.is_set():
                    return
                log.warning("slurm-ft checkpoint: select failed: %s", printable(str(exc)))
                self._stop.wait(0.1)
                continue
            for key, mask in events:
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    try:
                        self._wake_r.recv(64)
                    except OSError:
                        pass
                else:
                    conn = self.conns.get(key.fd)
                    if conn is not None:
                        self._guarded(conn, self._readable if mask & selectors.EVENT_READ else self._writable)
            now = self.clock()
            for conn in [c for c in self.conns.values() if c.deadline <= now]:
                self._close(conn)        # slow-loris, or a client that never reads its answer

    def _guarded(self, conn: _Conn, step) -> None:
        try:
            step(conn)
        except Exception as exc:  # noqa: BLE001  (one bad connection never stops the server)
            self.internal_errors += 1
            log.warning("slurm-ft checkpoint: request from %s failed: %s", conn.peer[0] if conn.peer else "?",
                        printable(f"{type(exc).__name__}: {exc}"))
            self._close(conn)

    def _accept(self) -> None:
        for _ in range(LISTEN_BACKLOG):
            try:
                sock, peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:       # EMFILE and friends: the process's limit, not ours to fix
                log.warning("slurm-ft checkpoint: accept failed: %s", printable(str(exc)))
                return
            sock.setblocking(False)
            if len(self.conns) >= MAX_CONNECTIONS:
                waiting = [c for c in self.conns.values() if not c.out] or list(self.conns.values())
                self._close(min(waiting, key=lambda c: c.deadline))
            conn = _Conn(sock, peer, self.clock() + REQUEST_TIMEOUT_S)
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, "conn")

    def _readable(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(RECV_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._close(conn)
        if not chunk:                    # the client gave up before a whole request
            return self._close(conn)
        conn.data += chunk
        try:
            req = parse_request(bytes(conn.data))
        except _Bad as bad:
            return self._answer(conn, bad.code, {"error": bad.error})
        if req is not None:
            self._serve(conn, req)

    def _writable(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._close(conn)
        conn.out = conn.out[sent:]
        if not conn.out:
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self.conns.pop(conn.sock.fileno(), None) is None:
            return
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    # -- one request -------------------------------------------------------------------------------
    def _serve(self, conn: _Conn, req: _Request) -> None:
        code = auth.check_bearer(req.headers.get("Authorization"), self.token)
        if code is not None:
            why = "no bearer secret" if code == 401 else "wrong secret"
            self.refused("slurm-ft checkpoint: refused %s %s from %s:%s (%d, %s)", printable(req.method, 16),
                         printable(req.path), conn.peer[0], conn.peer[1], code, why)
            if code == 401:
                return self._answer(conn, 401, {"error": "authentication required"},
                                    {"WWW-Authenticate": 'Bearer realm="slurm-ft checkpoint"'})
            return self._answer(conn, 403, {"error": "forbidden"})
        path = req.path.split("?")[0]
        if req.method == "POST" and path == NOTIFY:
            self.ckpt.request("http")
            return self._answer(conn, 200, {"accepted": True, **self.ckpt.status()})
        if req.method == "GET" and path == STATUS:
            return self._answer(conn, 200, self.ckpt.status())
        if req.method not in ("GET", "POST"):
            return self._answer(conn, 501, {"error": "unsupported method"})
        return self._answer(conn, 404, {"error": "not found"})

    def _answer(self, conn: _Conn, code: int, body: dict, headers: Mapping[str, str] | None = None) -> None:
        """Queue the answer (HTTP/1.0, JSON, ``Connection: close``) and send it from the loop."""
        data = json.dumps(body).encode()
        reason = HTTPStatus(code).phrase
        lines = [f"HTTP/1.0 {code} {reason}", "Server: slurm-ft", "Content-Type: application/json",
                 f"Content-Length: {len(data)}", "Cache-Control: no-store", "Connection: close",
                 *(f"{k}: {v}" for k, v in (headers or {}).items())]
        conn.out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data
        conn.deadline = self.clock() + REQUEST_TIMEOUT_S
        self.sel.modify(conn.sock, selectors.EVENT_WRITE, "conn")


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
