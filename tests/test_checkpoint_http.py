"""The checkpoint HTTP server runs inside the user's training process and any user of the node can
reach its port: whatever they send costs the job one thread, at most MAX_CONNECTIONS sockets, and
never stops the job's own requests (issue 27, item 9). The attacks are done for real, on loopback."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.checkpoint import auth, http
from slurm_ft.checkpoint.helper import ExitCheckpoint


def _serve(ckpt, start=9600):
    for port in range(start, 10000):
        try:
            ckpt.serve_http(port)
            return port
        except OSError:
            continue
    pytest.skip("no free port in 9600..9999")


@pytest.fixture
def served(tmp_path):
    env = {"SLURM_FT_RUNTIME_DIR": str(tmp_path), "SLURM_JOB_ID": "88"}
    saved = []
    ckpt = ExitCheckpoint(lambda s: saved.append(s) or f"/ckpt/{s}", report=False, env=env)
    port = _serve(ckpt)
    yield ckpt, port, env, ckpt._http
    ckpt.uninstall()


def _server_threads() -> int:
    return sum(t.name == "slurm-ft-notify" for t in threading.enumerate())


def _exchange(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``data``, half-close, read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:         # the server answered (413) and closed while we were still sending
            pass
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


def _status_line(answer: bytes) -> str:
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


def test_300_idle_connections_cost_one_thread_and_the_real_request_is_answered(served):
    ckpt, port, env, server = served
    threads = threading.active_count()
    idle = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        deadline = time.monotonic() + 10
        while len(server.conns) < http.MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.01)
        assert threading.active_count() == threads and _server_threads() == 1
        assert len(server.conns) <= http.MAX_CONNECTIONS
        t0 = time.monotonic()
        assert http.notify(port, env=env)["accepted"]            # the job's own request, amid the flood
        assert http.status(port, env=env)["status"] in ("notified", "saving", "saved")
        assert time.monotonic() - t0 < http.REQUEST_TIMEOUT_S  # served at once, not after the idle ones expire
        assert len(server.conns) <= http.MAX_CONNECTIONS
    finally:
        for s in idle:
            s.close()
    assert server.internal_errors == 0


def test_slow_loris_is_cut_at_the_request_deadline(served, monkeypatch):
    ckpt, port, env, server = served
    monkeypatch.setattr(http, "REQUEST_TIMEOUT_S", 0.5)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        t0 = time.monotonic()
        closed = None
        for byte in b"GET /v1/preempt/status HTTP/1.1\r\nX-Slow: " + b"a" * 200:
            try:
                s.sendall(bytes([byte]))
                s.settimeout(0.05)
                if s.recv(1) == b"":
                    closed = time.monotonic() - t0
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = time.monotonic() - t0
                break
        assert closed is not None and 0.4 <= closed < 3.0, closed
    assert not server.conns and not ckpt.requested
    assert http.status(port, env=env)["status"] == "idle"   # the server still serves


def test_oversized_header_and_body_are_refused_before_they_are_read(served):
    ckpt, port, env, server = served
    token = env[auth.ENV_TOKEN]
    big_header = b"GET /v1/preempt/status HTTP/1.1\r\nX-Big: " + b"a" * (2 * http.MAX_HEADER) + b"\r\n\r\n"
    assert _status_line(_exchange(port, big_header)).startswith("HTTP/1.0 413")
    many = b"GET /v1/preempt/status HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n"
    assert _status_line(_exchange(port, many)).startswith("HTTP/1.0 413")
    big_body = (f"POST /v1/preempt/notify HTTP/1.1\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Length: {http.MAX_BODY + 1}\r\n\r\n").encode()
    assert _status_line(_exchange(port, big_body)).startswith("HTTP/1.0 413")
    chunked = (f"POST /v1/preempt/notify HTTP/1.1\r\nAuthorization: Bearer {token}\r\n"
               "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n").encode()
    assert _status_line(_exchange(port, chunked)).startswith("HTTP/1.0 411")
    assert not ckpt.requested and server.internal_errors == 0
    good = (f"POST /v1/preempt/notify HTTP/1.1\r\nAuthorization: Bearer {token}\r\n"
            "Content-Length: 2\r\n\r\n{}").encode()
    answer = _exchange(port, good)
    assert _status_line(answer).startswith("HTTP/1.0 200") and json.loads(answer.split(b"\r\n\r\n", 1)[1])["accepted"]


# Requests that look like HTTP, then anything: the parser's every branch, not only random noise.
_methods = st.sampled_from([b"GET", b"POST", b"PUT", b"G\x00T", b"", b"get"])
_paths = st.sampled_from([http.NOTIFY.encode(), http.STATUS.encode(), b"/", b"*", b"/\xff\x1b[2J", b""])
_versions = st.sampled_from([b"HTTP/1.0", b"HTTP/1.1", b"HTTP/9", b""])
_fields = st.lists(st.tuples(st.sampled_from([b"Authorization", b"Content-Length", b"Transfer-Encoding",
                                              b"Host", b" folded", b"", b"X\x00"]),
                             st.one_of(st.binary(max_size=40), st.sampled_from([b"Bearer x", b"-1", b"99999999",
                                                                                b"0", b"3", b"chunked"]))),
                   max_size=6)
_requests = st.one_of(
    st.binary(max_size=2048),
    st.builds(lambda m, p, v, fs, sep, tail: m + b" " + p + b" " + v + b"\r\n"
              + b"".join(k + b":" + val + sep for k, val in fs) + sep + tail,
              _methods, _paths, _versions, _fields, st.sampled_from([b"\r\n", b"\n", b"\r"]),
              st.binary(max_size=64)),
)


def test_arbitrary_request_bytes_never_break_the_server(served):
    ckpt, port, env, server = served

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_requests)
    def check(data: bytes):
        answer = _exchange(port, data)
        assert answer == b"" or answer.startswith(b"HTTP/1.0 "), answer[:80]
        assert server.thread.is_alive() and _server_threads() == 1
        assert server.internal_errors == 0 and not ckpt.requested   # no guessable way past the secret

    check()
    assert http.status(port, env=env)["status"] == "idle"


@given(st.binary(max_size=4096))
@settings(max_examples=300, deadline=None)
def test_parse_request_raises_only_its_own_refusal(data):
    try:
        req = http.parse_request(data)
    except http._Bad as bad:
        assert bad.code in (400, 411, 413)
    else:
        assert req is None or (req.body_len <= http.MAX_BODY and req.path.startswith("/"))
