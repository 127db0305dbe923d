"""The hang report: a hung attempt's stack frames, from the hang watcher (root, compute node) to
the daemon's journal on the controller, by a private channel (docs/hang.md, "The stack in
ft-history").

The watcher's verdict reaches the controller through the node's mailbox record (Slurm's node
``Extra``, readable by every user): it carries only numbers (:func:`slurm_ft.failover.marker.hang_summary`).
The frames (the job's function and file names) go instead to the history service
(:mod:`slurm_ft.history.service`) as its second request kind: one line, a MUNGE credential made
by root on the node that only root can decode (``decoder_uid=0``), whose payload is::

    {"service": "slurm-ft-hang", "v": 1, "job_id": 5, "attempt": 0, "node": "n1",
     "frames": [[4242, "python3", ["<module> (train.py:29)", ...]], ...],
     "beat": {"at": 1796191926.0, "step": 1} | null}

(:func:`encode_report`; at most :data:`~slurm_ft.hang.evidence.MAX_DUMPS` processes, at most
:data:`~slurm_ft.failover.marker.HANG_FRAMES` frames of at most
:data:`~slurm_ft.failover.marker.FRAME_CHARS` characters each, :data:`MAX_REPORT` bytes in all).
The service accepts it only from uid 0 (:func:`parse_report` checks the shape), for a job and an
attempt its journal knows, and records it as an action row ``hang-stack`` (target the node,
detail :func:`stored_detail`'s JSON) through the journal's own write path. Nothing in the
daemon's decisions reads that row: ``ft-history`` shows it (``slurm_ft.history.format.stack_lines``),
escaped, to whoever may see the job (its owner, admins, root).

The watcher sends it best effort (:func:`send`): after the job's processes were ended, in at most
:data:`SEND_S` seconds in all (controller discovery, MUNGE, connect, answer). While no service
answers, or the service says ``"retry": true`` (its journal has not booked the attempt yet, or
was busy), it tries again every :data:`RETRY_S` seconds with a new credential (MUNGE refuses a
replayed one) until that bound; the outcome is logged to the node log only, once.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from dataclasses import dataclass

SERVICE = "slurm-ft-hang"
VERSION = 1
#: The journal action that holds an accepted report (target: the node; detail: :func:`stored_detail`).
ACTION = "hang-stack"
#: Largest report payload (bytes of JSON).
MAX_REPORT = 32768
#: Seconds the watcher spends sending a report, everything included (retries too; a loaded
#: 2-core lab node took over 3 s).
SEND_S = 10.0
#: Seconds between two tries of a report the service could not take yet.
RETRY_S = 0.5
#: Reports kept per attempt of a job (a multi-node job's nodes, in-place restarts); more are refused.
MAX_PER_ATTEMPT = 32
#: Longest process name in a report.
COMM_CHARS = 64
#: Longest stored detail (characters, below the journal boundary's text bound: never cut).
MAX_DETAIL = 12000
#: A node name as slurmd gives it (slurm_ft.node.job).
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FIELDS = {"service", "v", "job_id", "attempt", "node", "frames", "beat"}


@dataclass(frozen=True)
class Report:
    job_id: int
    attempt: int
    node: str
    #: ((pid, process name, (frame, ...)), ...), innermost frame first
    frames: tuple
    beat_at: float | None
    beat_step: int | None


def _limits() -> tuple[int, int, int]:
    from slurm_ft.failover.marker import FRAME_CHARS, HANG_FRAMES
    from slurm_ft.hang.evidence import MAX_DUMPS
    return MAX_DUMPS, HANG_FRAMES, FRAME_CHARS


# ------------------------------------------------------------------------------ the payload
def encode_report(job_id: int, attempt: int, node: str, dumps, beat_at: float | None,
                  beat_step: int | None) -> bytes | None:
    """The payload for the watcher's ``dumps`` ((pid, process name, py-spy dump) per process):
    each process's top frames (:func:`slurm_ft.failover.marker.top_frames`, already one
    printable-ASCII line each). None when no process has a frame (nothing private to send)."""
    from slurm_ft.failover.marker import _safe_line, top_frames
    max_dumps, _, _ = _limits()
    frames = [[int(pid), _safe_line(comm, 32) or "?", top_frames(dump)] for pid, comm, dump in list(dumps)[:max_dumps]]
    if not any(f for _, _, f in frames):
        return None
    beat = None
    if beat_at is not None and isinstance(beat_at, (int, float)) and math.isfinite(beat_at) and 0 <= beat_at < 1e11:
        beat = {"at": round(float(beat_at), 3), "step": int(beat_step) if isinstance(beat_step, int) else None}
    while True:
        payload = json.dumps({"service": SERVICE, "v": VERSION, "job_id": int(job_id), "attempt": int(attempt),
                              "node": node, "frames": frames, "beat": beat},
                             separators=(",", ":"), ensure_ascii=True).encode("ascii")
        if len(payload) <= MAX_REPORT or len(frames) <= 1:     # whole processes left out to fit
            break
        frames.pop()
    return payload if len(payload) <= MAX_REPORT else None


def is_report(payload: bytes) -> bool:
    """Whether a credential's payload claims to be a hang report (then :func:`parse_report` decides)."""
    if len(payload) > 4 * MAX_REPORT or b"slurm-ft-hang" not in payload:
        return False
    try:
        q = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(q, dict) and q.get("service") == SERVICE


def _int(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def parse_report(payload: bytes) -> Report:
    """The :class:`Report` in a credential's payload. Raises ValueError (a one-line message) for
    anything but a well-formed report of this version within the bounds (module doc)."""
    max_dumps, max_frames, frame_chars = _limits()
    if len(payload) > MAX_REPORT:
        raise ValueError(f"the hang report is larger than {MAX_REPORT} bytes")
    try:
        q = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("not a hang report") from None
    if not isinstance(q, dict) or q.get("service") != SERVICE:
        raise ValueError("not a hang report")
    if q.get("v") != VERSION or isinstance(q.get("v"), bool):
        raise ValueError(f"hang report version {str(q.get('v'))[:20]!r} not understood (this service speaks "
                         f"{VERSION})")
    if set(q) != _FIELDS:
        raise ValueError(f"hang report: fields {', '.join(sorted(set(q) ^ _FIELDS))[:200]} unknown or missing")
    if not _int(q["job_id"], 1, (1 << 63) - 1):
        raise ValueError("hang report: job_id is not a job id")
    if not _int(q["attempt"], 0, 1 << 31):
        raise ValueError("hang report: attempt is not an attempt number")
    if not isinstance(q["node"], str) or not _NODE.fullmatch(q["node"]):
        raise ValueError("hang report: node is not a node name")
    frames = q["frames"]
    if not isinstance(frames, list) or not 0 < len(frames) <= max_dumps:
        raise ValueError(f"hang report: frames must list 1 to {max_dumps} processes")
    out = []
    for item in frames:
        if not (isinstance(item, list) and len(item) == 3 and _int(item[0], 1, 1 << 22)
                and isinstance(item[1], str) and 0 < len(item[1]) <= COMM_CHARS
                and isinstance(item[2], list) and len(item[2]) <= max_frames
                and all(isinstance(f, str) and 0 < len(f) <= frame_chars for f in item[2])):
            raise ValueError(f"hang report: each process is [pid, name, [at most {max_frames} frames of at most "
                             f"{frame_chars} characters]]")
        out.append((item[0], item[1], tuple(item[2])))
    beat = q["beat"]
    at = step = None
    if beat is not None:
        if not (isinstance(beat, dict) and set(beat) == {"at", "step"}):
            raise ValueError("hang report: beat is {\"at\": epoch s, \"step\": int or null} or null")
        at, step = beat["at"], beat["step"]
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or not 0 <= at < 1e11:
            raise ValueError("hang report: beat.at is not a time")
        if step is not None and not _int(step, 0, (1 << 63) - 1):
            raise ValueError("hang report: beat.step is not a step")
        at = float(at)
    return Report(q["job_id"], q["attempt"], q["node"], tuple(out), at, step)


def stored_detail(r: Report) -> str:
    """The ``hang-stack`` row's detail: ``{"v": 1, "frames": [[pid, name, [frame, ...]], ...],
    "beat": ...}`` with every name and frame made one printable-ASCII line again
    (:func:`slurm_ft.failover.marker._safe_line`), at most :data:`MAX_DETAIL` characters (whole
    processes are left out from the end to fit: the JSON is never cut)."""
    from slurm_ft.failover.marker import _safe_line
    _, _, frame_chars = _limits()
    frames = [[pid, _safe_line(comm, 32), [_safe_line(f, frame_chars) for f in fs]] for pid, comm, fs in r.frames]
    beat = None if r.beat_at is None else {"at": r.beat_at, "step": r.beat_step}
    while True:
        text = json.dumps({"v": VERSION, "frames": frames, "beat": beat}, separators=(",", ":"), ensure_ascii=True)
        if len(text) <= MAX_DETAIL or len(frames) <= 1:
            return text if len(text) <= MAX_DETAIL else json.dumps({"v": VERSION, "frames": [], "beat": beat})
        frames.pop()


def read_detail(detail) -> list[tuple[int, str, list[str]]]:
    """The processes of a stored ``hang-stack`` detail, [] for anything that is not one (the
    journal is read defensively: never raises)."""
    try:
        d = json.loads(detail or "")
    except (TypeError, ValueError, RecursionError):
        return []
    frames = d.get("frames") if isinstance(d, dict) else None
    if not isinstance(frames, list):
        return []
    out = []
    for item in frames:
        if isinstance(item, list) and len(item) == 3 and isinstance(item[2], list):
            out.append((item[0], str(item[1]), [str(f) for f in item[2]]))
    return out


# ------------------------------------------------------------------------------ the watcher's side
def _exchange(host: str, port: int, line: bytes, deadline: float) -> bytes:
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("timed out")
    with socket.create_connection((host, port), timeout=left) as s:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        s.sendall(line)
        s.shutdown(socket.SHUT_WR)
        data = bytearray()
        while len(data) < 4096:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            s.settimeout(left)
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return bytes(data)


def _answer(raw: bytes) -> tuple[bool, str, bool]:
    """(stored, why, worth another try) for the service's answer ``raw``."""
    _, _, body = raw.partition(b"\n")
    try:
        reply = json.loads(body.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False, "no answer it understands (another program on that port?)", False
    if not isinstance(reply, dict):
        return False, "no answer it understands", False
    if reply.get("ok") is True:
        return True, "stored", False
    return False, str(reply.get("error") or "refused")[:300], reply.get("retry") is True


def _send(cfg, slurm, payload: bytes, deadline: float, encode, log) -> bool:
    from slurm_ft.slurm import munge
    from slurm_ft.errors import SlurmFTError
    from slurm_ft.history.client import endpoints
    try:
        targets = endpoints(cfg, slurm, deadline - time.monotonic())
    except SlurmFTError as exc:
        log(f"hang report not sent: {exc}")
        return False
    tries = 0
    while True:
        tries += 1
        try:        # a new credential per try: MUNGE refuses one decoded before
            cred = encode(payload) if encode is not None else munge.encode(payload, decoder_uid=0)
        except munge.MungeError as exc:
            log(f"hang report not sent: {exc}")
            return False
        ok, again, message = _try_once(targets, cred.encode("ascii") + b"\n", deadline)
        if ok or not again or time.monotonic() + RETRY_S >= deadline:
            after = f" (after {tries} tries)" if tries > 1 else ""
            log(message + after)
            return ok
        time.sleep(RETRY_S)


def _try_once(targets, line: bytes, deadline: float) -> tuple[bool, bool, str]:
    """One try over the service's endpoints: (stored, worth another try, the log line)."""
    tried = []
    for host, port in targets:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            raw = _exchange(host, port, line, deadline)
        except OSError as exc:
            tried.append(f"{where}: {exc.strerror or str(exc) or type(exc).__name__}")
            continue
        ok, why, again = _answer(raw)
        if ok:
            return True, False, f"hang report sent to the history service at {where}: the stack is in ft-history"
        return False, again, f"hang report refused by {where}: {why}"
    return False, True, f"hang report not sent: no history service answered ({'; '.join(tried)[:400]})"


def send(cfg, slurm, payload: bytes, log, *, encode=None, timeout_s: float = SEND_S) -> bool:
    """Send a report (:func:`encode_report`) to the history service; True when it was stored.
    At most ``timeout_s`` in all: the work runs in a thread this call waits for that long (a
    step that overruns its own bound is left behind, never waited for). ``encode``: payload ->
    credential text (default :func:`slurm_ft.slurm.munge.encode` for root alone). Never raises; every
    outcome is one line through ``log`` (the node log)."""
    deadline = time.monotonic() + timeout_s
    result: list[bool] = []

    def work():
        try:
            result.append(_send(cfg, slurm, payload, deadline, encode, log))
        except Exception as exc:           # best effort: a bug here never reaches the watcher's loop
            log(f"hang report not sent: {type(exc).__name__}: {exc}")
            result.append(False)

    t = threading.Thread(target=work, name="hang-report", daemon=True)
    t.start()
    t.join(max(0.0, timeout_s) + 0.2)
    if not result:
        log(f"hang report not sent within {timeout_s:.0f} s")
        return False
    return result[0]
