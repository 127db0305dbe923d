"""The history service: ``ft-history`` for ordinary users on login nodes, answered by the
controller from the daemon's journal, for the uid MUNGE vouches for (docs/architecture.md,
"Users' own history"; docs/user-guide.md).

Runs on the controller host as root: a child process of ``slurm-ft daemon`` (:func:`serving`,
off with ``[history] serve = false``), ``python -m slurm_ft.history.service``. Reads the journal
read-only; writes only a hang report's row (below) and, from a background thread, ``ft-history``'s
text of finished jobs rendered ahead (slurm_ft.history.memo), never a decision.

Protocol (one TCP connection per query, ``[history] port``, default 6827):

* request: one line, a MUNGE credential (ASCII, at most :data:`MAX_REQUEST` bytes, ending in
  ``\\n``, sent within :data:`REQUEST_READ_S`) whose **payload is the query**, a JSON object
  ``{"service": "slurm-ft-history", "v": 1, "jobs": [...], "users": [...], "all_users": bool,
  "start": s, "end": s|null, "states": [...], "duplicates": bool, "accounts": [...]|null}`` and, only
  with ``ft-history -N``, ``"nodes": [hostlist, ...]`` (a service that predates it refuses that
  query as an unknown field) (:func:`parse_query`).
  MUNGE's MAC binds the query to the uid that made it; munged refuses a credential decoded
  before (replay), expired or from the future; the service also refuses one older than
  :data:`MAX_AGE_S` and one whose payload is not its own kind (a credential minted for
  anything else, e.g. a Slurm RPC, is refused).
* answer (the connection is then closed): a **proof** line, then one JSON object (ASCII):
  ``{"v": 1, "ok": true, "user": NAME, "jobs": [history, ...], "error": str|null,
  "warnings": [str]}`` (with ``nodes`` asked: also ``"nodes": {node: [step, ...]}``,
  :func:`slurm_ft.history.query.node_steps`) -- ``jobs`` exactly as :func:`slurm_ft.history.query.select` returns them,
  evidence lines included -- or ``{"v": 1, "ok": false, "error": str}``. Never a traceback.
  The proof of an answer is a MUNGE credential made by the service (root) that only the
  asking uid can decode, whose payload holds the SHA-256 of the request line and of the JSON
  (:func:`proof_payload`): ``ft-history`` takes jobs only from an answer whose proof decodes to
  uid 0 and matches, so a program squatting the port (the service down) can neither read a
  query (the request credential decodes for root only) nor feed a user a made-up history. A
  refusal before the caller is known has the proof ``-``.

A second request kind, the **hang report** (:mod:`slurm_ft.hang.report`): the same one line, a
credential of uid 0 (the hang watcher, root on a node) whose payload is tagged ``slurm-ft-hang``:
a hung attempt's stack frames, which must not travel in Slurm's node field. It is accepted only
from uid 0, of exactly its shape, for a job and attempt the journal holds; it is stored as the
job's ``hang-stack`` action row (a write connection opened for that row alone; queries stay
read-only) and answered ``-`` + ``{"v": 1, "ok": true, "error": null}``, or refused as any request.
No decision reads that row; ``ft-history`` shows it to whoever may see the job.

Who sees what: the caller's uid (from MUNGE, never a name the request or a job sets) is matched
against each job's owner as Slurm recorded it (``jobs.user``: Slurm's ``UserId`` of the job,
slurm_ft.slurm.jobinfo); root and ``SlurmUser`` see every job; under ``PrivateData=jobs`` everyone
else sees only their own, and another user's job reads exactly like an unknown one
(:class:`slurm_ft.history.query.Viewer`, the rules ``ft-history`` applies to the file's readers).
``PrivateData`` and ``SlurmUser`` are read with ``scontrol show config`` every
:data:`ACCESS_TTL_S`; when Slurm cannot be asked, every caller but root is treated as under
``PrivateData=jobs`` (fail closed).

Limits: ``[history] workers`` queries at once, at most 4x that many waiting (more are answered
"busy"); a request must arrive within :data:`REQUEST_READ_S`; an answer larger than
:data:`MAX_RESPONSE` is refused with a message asking for a narrower query; the process's
address space is capped (:data:`MEMORY_LIMIT`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from slurm_ft.slurm import munge
from slurm_ft.errors import SlurmFTError
from slurm_ft.hang import report as hang_report
from slurm_ft.history.protocol import (MAX_ITEMS, MAX_QUERY, MAX_REQUEST, MAX_RESPONSE, SERVICE, VERSION, BadRequest,
                               proof_payload)

log = logging.getLogger("slurm_ft.history.service")

#: Seconds a client has to send its request.
REQUEST_READ_S = 10.0
#: Oldest credential accepted (seconds since it was encoded; munged's own TTL is 300 s).
MAX_AGE_S = 60.0
#: A credential encoded this far in the future (another host's clock) is still accepted (s).
CLOCK_SKEW_S = 10.0
#: Seconds between two reads of Slurm's PrivateData/SlurmUser.
ACCESS_TTL_S = 300.0
#: Address-space cap of the service process (bytes).
MEMORY_LIMIT = 4 * 1024 ** 3
#: Seconds between two starts of the service by the daemon after it exited.
RESTART_BACKOFF_S = 30.0
#: Seconds the service waits for the journal's write lock to store a hang report.
REPORT_BUSY_S = 2.0
#: Seconds between the daemon's looks at its service process.
SUPERVISE_S = 5.0

_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}\$?")
#: A Slurm account name (as ft-history -A takes it): printable ASCII, no space or comma.
_ACCOUNT = re.compile(r"[!-+\--~]{1,64}")


class NotYet(BadRequest):
    """A hang report about a job or an attempt the journal has not booked yet (the daemon books
    an attempt on its next cycle): refused with ``"retry": true``, the watcher sends it again."""


# ------------------------------------------------------------------------------ the query
def _strings(q: dict, key: str, *, optional: bool = False) -> list[str] | None:
    value = q.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, list) or len(value) > MAX_ITEMS or \
            not all(isinstance(v, str) and 0 < len(v) <= 256 for v in value):
        raise BadRequest(f"{key}: expected a list of at most {MAX_ITEMS} short strings")
    return value


def _time(q: dict, key: str, *, optional: bool = False) -> float | None:
    value = q.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value < 1e11:
        raise BadRequest(f"{key}: expected a time in epoch seconds")
    return float(value)


def parse_query(payload: bytes):
    """A :class:`slurm_ft.history.query.Selection` from a credential's payload. Raises
    :class:`BadRequest` naming what is wrong, for anything but a well-formed query of this
    service's version (whatever ``payload`` holds)."""
    from slurm_ft.history.query import Selection, parse_job_ids, parse_states
    from slurm_ft.history.format import user_name

    if len(payload) > MAX_QUERY:
        raise BadRequest(f"the query is larger than {MAX_QUERY} bytes")
    try:
        q = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest("the credential carries no slurm-ft history query") from None
    if not isinstance(q, dict) or q.get("service") != SERVICE:
        raise BadRequest("the credential carries no slurm-ft history query")
    if q.get("v") != VERSION or isinstance(q.get("v"), bool):
        raise BadRequest(f"query version {q.get('v')!r} not understood (this service speaks {VERSION}): "
                         f"update slurm-ft on this host or on the controller")
    known = {"service", "v", "jobs", "users", "all_users", "start", "end", "states", "duplicates", "accounts",
             "nodes"}
    if set(q) - known:
        raise BadRequest(f"unknown query fields: {', '.join(sorted(set(q) - known))[:200]}")
    specs = []
    for item in _strings(q, "jobs"):
        try:
            specs.extend(parse_job_ids(item))
        except ValueError as exc:
            raise BadRequest(str(exc)[:300]) from None
    users = _strings(q, "users", optional=True)
    if users is not None:
        names = set()
        for u in users:
            if u.isdigit() and len(u) <= 10:
                names.add(user_name(u))
            elif _USER.fullmatch(u):
                names.add(u)
            else:
                raise BadRequest(f"{u[:64]!r} is not a user name or uid")
        users = frozenset(names)
    states: set[str] = set()
    for s in _strings(q, "states"):
        try:
            states |= parse_states(s)
        except ValueError:
            raise BadRequest(f"{s[:64]!r} is not a state") from None
    for key in ("all_users", "duplicates"):
        if not isinstance(q.get(key), bool):
            raise BadRequest(f"{key}: expected true or false")
    start, end = _time(q, "start"), _time(q, "end", optional=True)
    extra = {}
    accounts = _strings(q, "accounts", optional=True)
    if accounts is not None:
        if not all(_ACCOUNT.fullmatch(a) for a in accounts):
            raise BadRequest("accounts: not Slurm account names")
        if "accounts" not in {f.name for f in dataclasses.fields(Selection)}:
            raise BadRequest("this history service does not select by account (-A): update slurm-ft on the "
                             "controller")
        extra["accounts"] = frozenset(a.lower() for a in accounts)
    pieces = _strings(q, "nodes", optional=True)
    if pieces is not None:
        from slurm_ft.history.query import MAX_NODES, parse_nodelist

        names: set[str] = set()
        for piece in pieces:
            try:
                names |= parse_nodelist(piece)
            except ValueError as exc:
                raise BadRequest(f"nodes: {str(exc)[:200]}") from None
            if len(names) > MAX_NODES:
                raise BadRequest(f"nodes: more than {MAX_NODES} nodes")
        if not names:
            raise BadRequest("nodes: an empty node list")
        extra["nodes"] = frozenset(names)
    return Selection(job_ids=tuple(specs), users=users, all_users=q["all_users"], start=start, end=end,
                     states=frozenset(states), duplicates=q["duplicates"], **extra)


# ------------------------------------------------------------------------------ who asks
@dataclass(frozen=True)
class Access:
    """Slurm's ``PrivateData`` includes ``jobs`` (True when unknown: fail closed) and ``SlurmUser``."""

    private_jobs: bool = True
    slurm_user: str = "root"


class SlurmAccess:
    """:class:`Access` from ``scontrol show config``, read at most every :data:`ACCESS_TTL_S`
    (a failure too: Slurm is not asked once per query)."""

    def __init__(self, cfg, slurm=None, clock=time.monotonic):
        self.cfg, self._slurm, self.clock = cfg, slurm, clock
        self._value: Access | None = None
        self._at = -math.inf
        self._lock = threading.Lock()

    def __call__(self) -> Access:
        with self._lock:
            if self._value is None or self.clock() - self._at >= ACCESS_TTL_S:
                self._value, self._at = self._read(), self.clock()
            return self._value

    def _read(self) -> Access:
        from slurm_ft.slurm import Slurm, private_data
        try:
            conf = (self._slurm or Slurm.from_config(self.cfg)).show_config()
        except SlurmFTError as exc:
            log.warning("history service: cannot read Slurm's PrivateData (%s): every user sees only their own "
                        "jobs until it can", exc)
            return Access()
        return Access("jobs" in private_data(conf), conf.get("SlurmUser", "root").split("(")[0].strip() or "root")


def viewer_for(uid: int, access: Access):
    """The :class:`slurm_ft.history.query.Viewer` of MUNGE-authenticated ``uid``: its name on this host
    (the controller, where Slurm names job owners); a job recorded under the uid's digits counts
    as its own too."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        name = str(uid)
    cls = _viewer_class()
    if uid == 0:
        return cls(0, "root", False)
    return cls(uid, name, access.private_jobs, access.slurm_user)


@functools.lru_cache(maxsize=1)
def _viewer_class():
    from slurm_ft.history.query import Viewer

    class UidViewer(Viewer):
        def may_see(self, job) -> bool:
            return self.sees_all or bool(job and job.get("user") and job["user"] in (self.user, str(self.uid)))

    return UidViewer


# ------------------------------------------------------------------------------ one query
def _reply(**fields) -> bytes:
    return json.dumps({"v": VERSION, **fields}, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def refusal(message: str, retry: bool = False) -> bytes:
    """The (unproved) answer that refuses a request with ``message``; ``retry``: the same request
    may be taken a little later (the service's journal busy or behind), said as ``"retry": true``."""
    return b"-\n" + (_reply(ok=False, error=message, retry=True) if retry else _reply(ok=False, error=message))


class HistoryService:
    """Answers one request (bytes of the line, without its newline) with the answer's bytes;
    :meth:`handle` never raises.

    ``authenticate``: credential text -> :class:`slurm_ft.slurm.munge.Credential` (default
    :func:`slurm_ft.slurm.munge.decode`); ``sign``: (payload, uid) -> the proof credential (default
    :func:`slurm_ft.slurm.munge.encode` for that uid alone); ``access``: () -> :class:`Access`;
    ``journal_path``: the journal (default ``[journal] path``)."""

    def __init__(self, cfg, *, authenticate: Callable | None = None, sign: Callable | None = None,
                 access: Callable | None = None, journal_path: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.authenticate = authenticate or munge.decode
        self.sign = sign or (lambda payload, uid: munge.encode(payload, decoder_uid=uid))
        self.access = access or SlurmAccess(cfg)
        self.journal_path = journal_path or cfg.journal.path
        self.clock = clock
        self._local = threading.local()

    def _journal(self):
        from slurm_ft.journal import open_journal

        j = getattr(self._local, "journal", None)
        if j is None:
            j = self._local.journal = open_journal(self.journal_path, readonly=True)
        return j

    def _drop_journal(self) -> None:
        j = getattr(self._local, "journal", None)
        self._local.journal = None
        if j is not None:
            try:
                j.close()
            except Exception:   # a broken connection: it is dropped either way
                pass

    def handle(self, request: bytes, peer: str = "?") -> bytes:
        t0 = time.monotonic()
        try:
            cred = self._credential(request)
            if hang_report.is_report(cred.payload):       # the second request kind: a watcher's stack
                return self._report(cred, peer)
            sel = parse_query(cred.payload)
            viewer = viewer_for(cred.uid, self.access())
            answer = self._answer(sel, viewer)
        except BadRequest as exc:
            log.info("history service: refused a request from %s: %s", peer, exc)
            return refusal(str(exc), retry=isinstance(exc, NotYet))
        except SlurmFTError as exc:
            log.warning("history service: %s", exc)
            self._drop_journal()
            return refusal(f"the history service could not answer: {exc}", retry=True)
        except MemoryError:
            self._drop_journal()
            return refusal("the answer is too large for the history service: narrow the query (-S/-E, -j, -u)")
        except Exception:   # a bug: logged here with its traceback, never sent to the user
            log.exception("history service: unexpected error answering %s", peer)
            self._drop_journal()
            return refusal("the history service failed on this query (its log on the controller says why)")
        if len(answer) > MAX_RESPONSE:
            return refusal(f"the answer is {len(answer) // 2 ** 20} MiB, more than the history service sends "
                           f"({MAX_RESPONSE // 2 ** 20} MiB): narrow the query (-S/-E, -j, -u, -s)")
        try:
            proof = self.sign(proof_payload(request, answer), viewer.uid)
        except munge.MungeError as exc:
            log.warning("history service: cannot sign an answer: %s", exc)
            return refusal(f"the history service could not answer: MUNGE is not usable on the controller: {exc}")
        log.info("history service: %s (uid %d) from %s: %d bytes in %.3f s", viewer.user, viewer.uid, peer,
                 len(answer), time.monotonic() - t0)
        return proof.encode("ascii") + b"\n" + answer

    def _report(self, cred, peer: str) -> bytes:
        """Store a hang watcher's report (:mod:`slurm_ft.hang.report`) as the job's ``hang-stack``
        action row; raises :class:`BadRequest` for one not from root, malformed, or about a job or
        attempt the journal does not know. The answer carries no proof (``-``): the watcher only
        logs it."""
        if cred.uid != 0:
            raise BadRequest(f"a hang report is accepted only from root on a node (this credential is uid {cred.uid})")
        try:
            r = hang_report.parse_report(cred.payload)
        except ValueError as exc:
            raise BadRequest(str(exc)[:300]) from None
        journal = self._journal()
        if journal.job(r.job_id) is None:
            raise NotYet(f"hang report for job {r.job_id}: not in the journal")
        attempt = next((a for a in journal.attempts(r.job_id) if a["attempt"] == r.attempt), None)
        if attempt is None:
            raise NotYet(f"hang report for job {r.job_id}: attempt {r.attempt} not in the journal")
        if attempt.get("nodes"):
            from slurm_ft.history.query import parse_nodelist
            try:
                nodes = parse_nodelist(attempt["nodes"])
            except ValueError:
                nodes = frozenset()
            if r.node not in nodes:
                raise BadRequest(f"hang report for job {r.job_id} attempt {r.attempt}: {r.node} is not one of its "
                                 f"nodes")
        if sum(1 for a in journal.actions(r.job_id, r.attempt)
               if a["action"] == hang_report.ACTION) >= hang_report.MAX_PER_ATTEMPT:
            raise BadRequest(f"hang report for job {r.job_id} attempt {r.attempt}: "
                             f"{hang_report.MAX_PER_ATTEMPT} reports already stored")
        from slurm_ft.journal import open_journal
        with open_journal(self.journal_path, read_group=self.cfg.journal.read_group,
                          busy_timeout_s=REPORT_BUSY_S) as writer:
            writer.record(r.job_id, r.attempt, hang_report.ACTION, r.node, hang_report.stored_detail(r))
        log.info("history service: hang report of job %d attempt %d on %s (%d process(es)) from %s: stored",
                 r.job_id, r.attempt, r.node, len(r.frames), peer)
        return b"-\n" + _reply(ok=True, error=None)

    def _credential(self, request: bytes):
        text = request.strip()
        if not text or len(text) > MAX_REQUEST or not text.startswith(b"MUNGE:"):
            raise BadRequest("not a slurm-ft history request (expected a MUNGE credential)")
        try:
            cred = self.authenticate(text.decode("ascii"))
        except UnicodeDecodeError:
            raise BadRequest("not a slurm-ft history request (expected a MUNGE credential)") from None
        except munge.MungeError as exc:
            if exc.code == munge.EMUNGE_SOCKET or exc.code == 0:
                raise SlurmFTError(f"MUNGE is not usable on the controller: {exc}") from None
            raise BadRequest(f"credential refused: {exc}") from None
        now = self.clock()
        if cred.encoded < now - MAX_AGE_S:
            raise BadRequest(f"credential refused: made {now - cred.encoded:.0f} s ago (at most {MAX_AGE_S:.0f} s): "
                             f"check the clocks of this host and the controller")
        if cred.encoded > now + CLOCK_SKEW_S:
            raise BadRequest("credential refused: made in the future: check the clocks of this host and the "
                             "controller")
        return cred

    def _answer(self, sel, viewer) -> bytes:
        from slurm_ft.history.query import not_in_journal, select

        now = self.clock()
        journal = self._journal()
        found, missing = select(journal, sel, viewer=viewer, now=now)
        error = str(not_in_journal(journal, missing, viewer)) if missing else None
        extra = {}
        if getattr(sel, "nodes", None) is not None:     # -N: each node's drains and repairs, as the viewer may see them
            from slurm_ft.history.query import node_steps
            extra["nodes"] = node_steps(journal, sel.nodes, sel.start, now if sel.end is None else sel.end, viewer)
        return _reply(ok=True, user=viewer.user, jobs=found, error=error, warnings=self._warnings(now), **extra)

    def _warnings(self, now: float) -> list[str]:
        """What ``ft-history`` on the controller would warn about: a daemon whose cycles stopped
        (this service may outlive a stuck loop), rows waiting to be written."""
        from slurm_ft.failover import daemonlock
        from slurm_ft.journal import trouble

        out = []
        state, age = daemonlock.staleness(self.journal_path, self.cfg.failover.poll_interval_s, now)
        if state == "stale":
            out.append(f"the slurm-ft daemon has not run for {age:.0f} s: the journal may be behind Slurm")
        jt = trouble.check_writable(self.journal_path)
        if jt is not None or trouble.waiting_rows(self.journal_path):
            why = f"its filesystem is {jt}" if jt else f"{trouble.waiting_rows(self.journal_path)} row(s) wait in " \
                                                       f"its spool"
            out.append(f"journal: {why}: the newest decisions may not be shown yet")
        return out


# ------------------------------------------------------------------------------ the server
class Server:
    """A TCP listener answering with ``service`` (:class:`HistoryService`): one accept thread,
    a pool of ``workers`` threads, at most ``4 * workers`` connections in hand (more are told
    "busy" and closed)."""

    def __init__(self, service: HistoryService, host: str = "", port: int = 6827, workers: int = 4,
                 read_s: float = REQUEST_READ_S, send_s: float = 30.0):
        self.service, self.read_s, self.send_s = service, read_s, send_s
        self.sock = _listen(host, port)
        self.address = self.sock.getsockname()[:2]
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ft-history")
        self._slots = threading.BoundedSemaphore(4 * workers)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Server":
        """Serve in a background thread (tests, benchmarks); :meth:`serve_forever` blocks instead."""
        self._thread = threading.Thread(target=self.serve_forever, name="ft-history-accept", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self, keep_going: Callable[[], bool] = lambda: True) -> None:
        self.sock.settimeout(1.0)
        while not self._stop.is_set() and keep_going():
            try:
                conn, peer = self.sock.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    break
                log.warning("history service: accept failed: %s", exc)
                time.sleep(0.1)
                continue
            if not self._slots.acquire(blocking=False):
                _send_quietly(conn, refusal("the history service is busy: try again in a minute"), 1.0)
                continue
            try:
                self._pool.submit(self._one, conn, _peer(peer))
            except RuntimeError:           # the pool is shut down: stopping
                self._slots.release()
                conn.close()
                break

    def _one(self, conn: socket.socket, peer: str) -> None:
        try:
            request = _read_line(conn, self.read_s)
            if request is None:
                answer = refusal(f"no request line within {self.read_s:.0f} s, or longer than {MAX_REQUEST} bytes")
            else:
                answer = self.service.handle(request, peer)
            _send_quietly(conn, answer, self.send_s)
        finally:
            self._slots.release()

    def stop(self) -> None:
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host`` ("" = every address, IPv6 and IPv4 where the host has
    both). Raises :class:`SlurmFTError` when the port cannot be had."""
    try:
        if not host and socket.has_dualstack_ipv6():
            try:
                return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=64)
            except OSError:
                pass                          # IPv6 disabled on this host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family, backlog=64)
    except OSError as exc:
        raise SlurmFTError(f"history service: cannot listen on {host or '*'}:{port}: {exc.strerror or exc}") from None


def _peer(addr) -> str:
    try:
        return f"{addr[0]}:{addr[1]}"
    except (TypeError, IndexError):
        return "?"


def _read_line(conn: socket.socket, timeout_s: float) -> bytes | None:
    """The first line the client sends, read within ``timeout_s`` in all; None if none came in
    time, it is longer than :data:`MAX_REQUEST`, or the connection failed."""
    deadline = time.monotonic() + timeout_s
    data = bytearray()
    try:
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or len(data) > MAX_REQUEST:
                return None
            conn.settimeout(left)
            chunk = conn.recv(8192)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    line = bytes(data).split(b"\n", 1)[0]
    return line if len(line) <= MAX_REQUEST else None


def _send_quietly(conn: socket.socket, data: bytes, timeout_s: float) -> None:
    try:
        conn.settimeout(timeout_s)
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass                                  # the client went away: nothing to tell it
    finally:
        conn.close()


# ------------------------------------------------------------------------------ in the daemon
@contextlib.contextmanager
def serving(cfg, enabled: bool = True):
    """``slurm-ft daemon``'s service process for as long as the block runs (``[history] serve``;
    not for ``--once``): a :class:`Supervisor` checked every :data:`SUPERVISE_S` by a thread."""
    if not enabled or not cfg.history.serve:
        yield None
        return
    sup, stop = Supervisor(cfg), threading.Event()

    def watch():
        while not stop.is_set():
            try:
                sup.check()
            except Exception:     # never let the supervisor take the daemon down
                log.exception("history service: supervisor failed")
            stop.wait(SUPERVISE_S)

    thread = threading.Thread(target=watch, name="ft-history-supervisor", daemon=True)
    thread.start()
    try:
        yield sup
    finally:
        stop.set()
        thread.join(10)
        sup.stop()


class Supervisor:
    """The daemon's handle on the service process: started by :meth:`check` (again
    :data:`RESTART_BACKOFF_S` after it exited), stopped by :meth:`stop`. The child exits by
    itself when the daemon is gone."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None
        self._next = 0.0

    def argv(self) -> list[str]:
        argv = [sys.executable, "-I", "-m", "slurm_ft.history.service", "--parent-pid", str(os.getpid())]
        return argv + (["--config", self.cfg.source] if self.cfg.source else [])

    def check(self) -> None:
        if not self.cfg.history.serve:
            return
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is None:
                return
            log.error("history service exited (rc %s); started again in %.0f s", rc, RESTART_BACKOFF_S)
            self.proc, self._next = None, time.monotonic() + RESTART_BACKOFF_S
        if time.monotonic() < self._next:
            return
        # isolated (-I, in /, a minimal environment) like every Python root starts: slurm_ft comes
        # from the interpreter's own site-packages (the venv or the .deb's), never from PYTHONPATH
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C",
               **{k: os.environ[k] for k in ("SLURM_CONF", "SLURM_FT_CONFIG") if os.environ.get(k)}}
        try:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, env=env, cwd="/", close_fds=True)
        except OSError as exc:
            log.error("history service: cannot start %s: %s", sys.executable, exc)
            self._next = time.monotonic() + RESTART_BACKOFF_S

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def main(argv: list[str] | None = None) -> int:
    """``python -m slurm_ft.history.service [--config PATH] [--parent-pid PID]`` (root, the
    controller; normally started by the daemon). Exit 0 when stopped (SIGTERM, or PID gone),
    1 when it cannot start (the port taken, a bad config: said on stderr)."""
    from slurm_ft import config as config_mod
    from slurm_ft import logfmt

    ap = argparse.ArgumentParser(prog="slurm_ft.history.service", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config")
    ap.add_argument("--parent-pid", type=int, default=0)
    args = ap.parse_args(argv)
    logfmt.setup("text", verbose=False)
    try:
        cfg = config_mod.load(args.config)
        try:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        except (ImportError, ValueError, OSError):
            pass
        server = Server(HistoryService(cfg), cfg.history.listen, cfg.history.port, cfg.history.workers,
                        send_s=cfg.history.timeout_s)
    except SlurmFTError as exc:
        log.error("%s", exc)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("history service listening on %s:%s (journal %s)", *server.address, cfg.journal.path)
    from slurm_ft.history.memo import Filler     # ft-history's text of finished jobs, rendered ahead
    Filler(cfg.journal.path, stop, log, cfg.journal.read_group).start()
    server.serve_forever(lambda: not stop.is_set() and (not args.parent_pid or os.getppid() == args.parent_pid))
    server.stop()
    log.info("history service stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
