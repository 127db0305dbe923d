"""The shipped bisect test's meeting point: an authenticated, deadline-bounded TCP rendezvous.

Runs inside the bisect test (``python -I -m slurm_ft.bisect.collective`` under ``srun``, as the
admin who started the bisect: root), on every node of one test. Anyone on the cluster can reach
the meeting's ports, so everything that arrives on them is hostile until proven otherwise:

* **Ticket** (:class:`Ticket`): the runner (``slurm_ft.bisect.runner``) draws a 32-byte secret per
  bisect and hands it, with the bisect id, round, test index, the test's nodes and tasks per node,
  to every rank on **stdin** (``srun --input=FILE``, a root-only file): never argv or the
  environment, which other users can read through ``/proc``.
* **One line per message**: ``<64 hex HMAC-SHA256> <JSON body>\\n``, at most :data:`MAX_LINE`
  bytes (:data:`MAX_SHORT_LINE` for the short ones). The MAC covers the body's bytes and is
  checked (``hmac.compare_digest``) **before** the body is parsed: unauthenticated bytes are never
  parsed. Every body names its ``kind``, the bisect id, round, test, Slurm ``tag`` (``job.step``)
  and the connection's nonces, so a message from another bisect, round, test, step or
  connection fails.
* **Handshake**: a rank opens each connection with a probe (a fresh client nonce); rank 0 replies
  with a ``hello`` MAC'd over that nonce and a fresh server nonce; the rank sends a ``join`` bound
  to both (its rank, node and payload); rank 0 ends with an ``answer`` bound to both. A rank
  trusts only a fresh MAC'd hello (so a squatter on a candidate port, or one replaying a hello it
  got from rank 0, is skipped) and a MAC'd answer; rank 0 accepts a join only for a
  rank in ``1..size-1`` not yet joined, from a node of the test holding no more than
  ``tasks_per_node`` ranks already (the first valid claim counts; later ones are refused).
* **Deadlines, concurrently**: rank 0 serves every connection at once (``selectors``); each
  connection must deliver a valid join within :data:`CONN_TIMEOUT_S` of being accepted (a byte at
  a time buys nothing), or it is closed; at most :data:`MAX_PENDING` unjoined connections are
  held (the oldest goes first). A rank probes every candidate port at once, each connection with
  its own :data:`HELLO_TIMEOUT_S`, so a silent listener delays nothing.
* A meeting that cannot complete (no free port, a rank missing at the deadline, a bad or absent
  answer) raises :class:`MeetingError`: the test reports NOT RUN, never a failing node.

Errors: :class:`MeetingError` (an ``OSError``) for every way the meeting can fail.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import re
import secrets
import selectors
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

#: Bytes of a join (a rank's vectors: 256 values per GPU, up to 64 GPUs, fit well below).
MAX_LINE = 1 << 20
#: Bytes of a hello or an answer.
MAX_SHORT_LINE = 8192
#: Seconds a connection to rank 0 has, from accept, to deliver a valid join.
CONN_TIMEOUT_S = 10.0
#: Seconds a rank waits for rank 0's hello on one connection before dropping it.
HELLO_TIMEOUT_S = 5.0
#: Seconds between a rank's attempts on candidate ports with no live connection.
SWEEP_S = 0.2
#: Unjoined connections rank 0 holds at once (beyond it, the oldest is closed).
MAX_PENDING = 256
#: Bytes of the ticket line on stdin.
MAX_TICKET = 65536
_MAC_HEX = 64
#: A rank's first line on a connection: its nonce, which rank 0's hello must carry back.
_PROBE = re.compile(rb"[0-9a-f]{32}\n")


class MeetingError(OSError):
    """The meeting could not complete: the test did not run (NOT RUN), nobody is to blame."""


# ------------------------------------------------------------------------------ ticket
@dataclass(frozen=True)
class Ticket:
    """What every rank of one test gets on stdin from the runner: the bisect's ``key`` (32 bytes),
    its ``bisect`` id, the ``round`` and ``test`` (1-based) numbers, the test's ``nodes`` (the
    only nodes whose ranks may join) and ``tasks_per_node``."""

    key: bytes
    bisect: str
    round: int
    test: int
    nodes: tuple[str, ...]
    tasks_per_node: int = 1

    def line(self) -> bytes:
        return json.dumps({"key": self.key.hex(), "bisect": self.bisect, "round": self.round, "test": self.test,
                           "nodes": list(self.nodes), "tasks_per_node": self.tasks_per_node}).encode() + b"\n"

    @classmethod
    def parse(cls, line: bytes) -> "Ticket":
        """The ticket in ``line`` (one JSON object). Raises :class:`MeetingError` for anything
        else: a key that is not 32 bytes of hex, a missing or mistyped field."""
        try:
            obj = json.loads(line)
            key = bytes.fromhex(obj["key"])
            ticket = cls(key, obj["bisect"], obj["round"], obj["test"], tuple(obj["nodes"]), obj["tasks_per_node"])
        except (ValueError, TypeError, KeyError) as exc:
            raise MeetingError(f"no valid meeting ticket on stdin ({type(exc).__name__})") from None
        ok = (len(key) == 32 and isinstance(obj["nodes"], list) and isinstance(ticket.bisect, str)
              and 0 < len(ticket.bisect) <= 64
              and all(type(v) is int and v >= 1 for v in (ticket.round, ticket.test, ticket.tasks_per_node))
              and ticket.nodes and all(isinstance(n, str) and 0 < len(n) <= 255 for n in ticket.nodes))
        if not ok:
            raise MeetingError("no valid meeting ticket on stdin (bad field)")
        return ticket

    @classmethod
    def read(cls, stream) -> "Ticket":
        """One ticket line from ``stream`` (a binary file: stdin), at most :data:`MAX_TICKET` bytes."""
        return cls.parse(stream.readline(MAX_TICKET))


# ------------------------------------------------------------------------------ messages
def seal(key: bytes, body: dict) -> bytes:
    """``body`` as one authenticated line: ``<hex HMAC-SHA256 of the JSON> <JSON>\\n``."""
    data = json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode()
    return hmac.new(key, data, hashlib.sha256).hexdigest().encode() + b" " + data + b"\n"


def unseal(key: bytes, line: bytes) -> dict | None:
    """The body of a line :func:`seal` made with ``key``, or None: a wrong or missing MAC (checked
    before anything is parsed), bytes that are not a JSON object."""
    line = line.rstrip(b"\n")
    if len(line) < _MAC_HEX + 2 or line[_MAC_HEX:_MAC_HEX + 1] != b" ":
        return None
    mac, data = line[:_MAC_HEX], line[_MAC_HEX + 1:]
    if not hmac.compare_digest(mac, hmac.new(key, data, hashlib.sha256).hexdigest().encode()):
        return None
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _nonce() -> str:
    return secrets.token_hex(16)


@dataclass
class _Conn:
    """One non-blocking connection: what came in (up to ``limit`` bytes, one line), its deadline."""

    sock: socket.socket
    deadline: float
    limit: int
    inbuf: bytearray = field(default_factory=bytearray)
    snonce: str = ""               # rank 0's nonce of this connection (in its hello)
    cnonce: str = ""               # the rank's nonce of this connection (its probe)
    port: int = 0
    connected: bool = False

    def read_line(self) -> bytes | None:
        """Read what is there; the line once complete (what follows it stays in ``inbuf``), b""
        while incomplete, None when the peer closed, failed or sent more than ``limit`` bytes."""
        try:
            chunk = self.sock.recv(65536)
        except BlockingIOError:
            return b""
        except OSError:
            return None
        if not chunk:
            return None
        self.inbuf += chunk
        end = self.inbuf.find(b"\n")
        if end < 0:
            return b"" if len(self.inbuf) <= self.limit else None
        if end + 1 > self.limit:
            return None
        line = bytes(self.inbuf[:end + 1])
        del self.inbuf[:end + 1]
        return line


def _send_now(sock: socket.socket, data: bytes, timeout_s: float) -> bool:
    """Send ``data`` within ``timeout_s``; False if the peer does not take it."""
    try:
        sock.settimeout(timeout_s)
        sock.sendall(data)
        return True
    except OSError:
        return False


# ------------------------------------------------------------------------------ rank 0
@dataclass
class Meeting:
    """One test's meeting, as every rank sees it: the ticket, the Slurm step ``tag``
    (``job.step``), the number of ranks ``size``. ``clock``: for tests."""

    ticket: Ticket
    tag: str
    size: int
    clock: Callable[[], float] = time.monotonic

    def _head(self, kind: str) -> dict:
        t = self.ticket
        return {"kind": kind, "bisect": t.bisect, "round": t.round, "test": t.test, "tag": self.tag}

    def _is(self, body: dict | None, kind: str) -> bool:
        return body is not None and all(type(body.get(k)) is type(v) and body.get(k) == v
                                        for k, v in self._head(kind).items())

    def check(self, node: str) -> None:
        """This rank's own node is one of the test's, and ``size`` matches the ticket; else
        :class:`MeetingError` (the runner and Slurm disagree: do not run)."""
        t = self.ticket
        if node not in t.nodes:
            raise MeetingError(f"node {node} is not one of the test's nodes")
        if self.size != len(t.nodes) * t.tasks_per_node:
            raise MeetingError(f"{self.size} ranks, expected {len(t.nodes)} nodes x {t.tasks_per_node}")

    def accept_join(self, body: dict | None, conn: _Conn, joined: dict[int, dict], per_node: Counter) -> str:
        """'' when ``body`` is a join rank 0 may count (and then it is counted), else why not."""
        if not self._is(body, "join"):
            return "bad mac or not this test's join"
        if body.get("snonce") != conn.snonce or body.get("cnonce") != conn.cnonce:
            return "wrong nonce (a replay)"
        rank, node = body.get("rank"), body.get("node")
        if type(rank) is not int or not 1 <= rank < self.size:
            return "rank out of range"
        if rank in joined:
            return f"rank {rank} claimed twice"
        if node not in self.ticket.nodes:
            return "node not in the test"
        if per_node[node] >= self.ticket.tasks_per_node:
            return f"more ranks from {node} than tasks per node"
        joined[rank] = body
        per_node[node] += 1
        return ""

    def serve(self, mine: dict, candidates: list[int], timeout_s: float, reduce: Callable[[dict], dict], *,
              conn_timeout_s: float = CONN_TIMEOUT_S, max_pending: int = MAX_PENDING,
              on_listen: Callable[[int], None] | None = None) -> dict:
        """Rank 0: listen on the first free candidate port, gather every rank's join concurrently,
        ``reduce({rank: payload})`` (``mine`` is rank 0's payload), send each rank its answer.
        Returns the answer (``{"ok": bool, "why": str}``). Raises :class:`MeetingError`: no free
        port, or a rank missing after ``timeout_s`` (the message counts what was refused)."""
        srv = _listen(candidates, self.size + 16)
        if on_listen:
            on_listen(srv.getsockname()[1])
        sel = selectors.DefaultSelector()
        sel.register(srv, selectors.EVENT_READ, None)
        deadline = self.clock() + timeout_s
        pending: dict[socket.socket, _Conn] = {}
        joined: dict[int, dict] = {}
        conns: dict[int, tuple[_Conn, dict]] = {}
        per_node: Counter = Counter({mine.get("node"): 1})
        refused: Counter = Counter()

        def drop(c: _Conn, why: str) -> None:
            refused[why] += 1
            pending.pop(c.sock, None)
            try:
                sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            c.sock.close()

        try:
            while len(joined) < self.size - 1:
                now = self.clock()
                if now >= deadline:
                    detail = ", ".join(f"{why}: {n}" for why, n in sorted(refused.items()))
                    raise MeetingError(f"{len(joined) + 1} of {self.size} ranks joined within {timeout_s:g} s"
                                       + (f" (refused {detail})" if detail else ""))
                for c in [c for c in pending.values() if c.deadline <= now]:
                    drop(c, "no valid join in time")
                wake = min([deadline, *(c.deadline for c in pending.values())])
                for key, _ in sel.select(max(0.0, min(wake - now, 0.5))):
                    if key.data is None:
                        self._accept(srv, sel, pending, conn_timeout_s, max_pending, drop)
                        continue
                    c = key.data
                    line = c.read_line()
                    if line == b"":
                        continue
                    if line is None:
                        drop(c, "closed, failed or oversized")
                        continue
                    if not c.cnonce:
                        self._hello(c, line, drop)
                        continue
                    body = unseal(self.ticket.key, line)
                    why = self.accept_join(body, c, joined, per_node)
                    if why:
                        drop(c, why)
                        continue
                    pending.pop(c.sock)
                    sel.unregister(c.sock)
                    conns[body["rank"]] = (c, body)
            payloads = {0: mine, **{r: {**(b["payload"] if isinstance(b.get("payload"), dict) else {}),
                                        "node": b["node"]} for r, b in joined.items()}}
            answer = reduce(payloads)
            for rank, (c, body) in conns.items():
                _send_now(c.sock, seal(self.ticket.key, {**self._head("answer"), "rank": rank, "snonce": c.snonce,
                                                         "cnonce": body["cnonce"], "ok": bool(answer.get("ok")),
                                                         "why": str(answer.get("why", ""))}), 5.0)
            return answer
        finally:
            for c in list(pending.values()):
                c.sock.close()
            for c, _ in conns.values():
                c.sock.close()
            sel.close()
            srv.close()

    def _accept(self, srv, sel, pending, conn_timeout_s, max_pending, drop) -> None:
        try:
            sock, _ = srv.accept()
        except OSError:
            return
        if len(pending) >= max_pending:
            drop(min(pending.values(), key=lambda c: c.deadline), "too many connections")
        c = _Conn(sock, self.clock() + conn_timeout_s, MAX_SHORT_LINE, snonce=_nonce())
        try:
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        pending[sock] = c
        sel.register(sock, selectors.EVENT_READ, c)

    def _hello(self, c: _Conn, line: bytes, drop) -> None:
        """``line`` is a rank's probe (its nonce): answer with a hello bound to it and ours."""
        if c.inbuf or not _PROBE.fullmatch(line):
            drop(c, "no probe")
            return
        c.cnonce, c.limit = line[:-1].decode(), MAX_LINE
        try:
            c.sock.send(seal(self.ticket.key, {**self._head("hello"), "snonce": c.snonce, "cnonce": c.cnonce}))
        except OSError:           # small: fits any fresh socket buffer, or the peer is gone
            drop(c, "closed, failed or oversized")

    # -------------------------------------------------------------------------- ranks 1..n-1
    def join(self, rank: int, node: str, payload: dict, addr: str, candidates: list[int], timeout_s: float, *,
             hello_timeout_s: float = HELLO_TIMEOUT_S) -> dict:
        """Rank ``rank``: find rank 0 among the candidate ports (all probed at once; a port whose
        listener sends no valid hello within ``hello_timeout_s`` is dropped and tried again
        later), send the join, return rank 0's answer (``{"ok": bool, "why": str}``). Raises
        :class:`MeetingError` when no rank 0 answered validly within ``timeout_s``."""
        deadline = self.clock() + timeout_s
        sel = selectors.DefaultSelector()
        live: dict[int, _Conn] = {}
        next_try: dict[int, float] = {p: 0.0 for p in candidates}
        try:
            while self.clock() < deadline:
                now = self.clock()
                for port in candidates:
                    c = live.get(port)
                    if c is not None and c.deadline <= now:
                        self._close(sel, live, c)
                        next_try[port] = now + SWEEP_S
                    if port not in live and next_try[port] <= now:
                        self._connect(sel, live, addr, port, now + hello_timeout_s)
                        next_try[port] = now + SWEEP_S
                for key, _ in sel.select(SWEEP_S / 2):
                    c = key.data
                    if not c.connected:
                        self._probe(sel, live, c, next_try)
                        continue
                    line = c.read_line()
                    if line == b"":
                        continue
                    hello = unseal(self.ticket.key, line) if line else None
                    if (c.inbuf or not self._is(hello, "hello") or hello.get("cnonce") != c.cnonce
                            or not isinstance(hello.get("snonce"), str)):
                        self._close(sel, live, c)
                        next_try[c.port] = self.clock() + SWEEP_S
                        continue
                    for other in [o for o in live.values() if o is not c]:
                        self._close(sel, live, other)
                    return self._finish(sel, live, c, hello["snonce"], rank, node, payload, deadline)
                if not live:
                    time.sleep(min(SWEEP_S, max(0.0, deadline - self.clock())))
            raise MeetingError(f"no rank 0 of this test on ports {candidates[0]}..{candidates[-1]} "
                               f"within {timeout_s:g} s")
        finally:
            for c in list(live.values()):
                c.sock.close()
            sel.close()

    def _finish(self, sel, live, c: _Conn, snonce: str, rank: int, node: str, payload: dict,
                deadline: float) -> dict:
        """Rank 0's hello was valid on ``c``: send the join, wait for the answer."""
        self._close(sel, live, c, close=False)
        cnonce = c.cnonce
        body = {**self._head("join"), "rank": rank, "node": node, "snonce": snonce, "cnonce": cnonce,
                "payload": payload}
        try:
            if not _send_now(c.sock, seal(self.ticket.key, body), max(0.1, deadline - self.clock())):
                raise MeetingError("rank 0 did not take the join")
            c.sock.setblocking(False)
            c.inbuf.clear()
            c.limit = MAX_SHORT_LINE
            with selectors.DefaultSelector() as one:
                one.register(c.sock, selectors.EVENT_READ)
                while True:
                    left = deadline - self.clock()
                    if left <= 0:
                        raise MeetingError("no answer from rank 0 in time")
                    if not one.select(left):
                        continue
                    line = c.read_line()
                    if line is None:
                        raise MeetingError("rank 0 closed without an answer")
                    if line:
                        break
        finally:
            c.sock.close()
        answer = unseal(self.ticket.key, line)
        if not (self._is(answer, "answer") and answer.get("rank") == rank and answer.get("snonce") == snonce
                and answer.get("cnonce") == cnonce and isinstance(answer.get("ok"), bool)):
            raise MeetingError("rank 0's answer is not valid")
        return {"ok": answer["ok"], "why": str(answer.get("why", ""))}

    def _connect(self, sel, live, addr: str, port: int, deadline: float) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        if s.connect_ex((addr, port)) not in (0, errno.EINPROGRESS, errno.EAGAIN):
            s.close()
            return
        c = _Conn(s, deadline, MAX_SHORT_LINE, port=port)
        live[port] = c
        sel.register(s, selectors.EVENT_WRITE, c)

    def _probe(self, sel, live, c: _Conn, next_try: dict[int, float]) -> None:
        """``c`` connected (or failed to): send the probe (our fresh nonce), then wait for a hello."""
        try:
            err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if not err:
                c.cnonce = _nonce()
                c.sock.send(c.cnonce.encode() + b"\n")
        except OSError:
            err = 1
        if err:
            self._close(sel, live, c)
            next_try[c.port] = self.clock() + SWEEP_S
            return
        c.connected = True
        sel.modify(c.sock, selectors.EVENT_READ, c)

    @staticmethod
    def _close(sel, live, c: _Conn, close: bool = True) -> None:
        live.pop(c.port, None)
        try:
            sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        if close:
            c.sock.close()


def _listen(candidates: list[int], backlog: int) -> socket.socket:
    for port in candidates:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen(backlog)
            s.setblocking(False)
            return s
        except OSError:
            s.close()
    raise MeetingError(f"no free port in {candidates[0]}..{candidates[-1]}")
