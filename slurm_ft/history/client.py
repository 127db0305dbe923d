"""``ft-history``'s side of the history service (slurm_ft.history.service): an ordinary user on a
login node, who cannot read the daemon's journal, gets their jobs' history from the controller.

Runs as the user who runs ``ft-history``, on any host with MUNGE (every Slurm host). The query
is the payload of a MUNGE credential made for this process's uid (:func:`slurm_ft.slurm.munge.encode`);
the answer is the list of histories :func:`slurm_ft.history.query.select` would give that user,
rendered by ``ft-history`` exactly as from the file.

Where: ``[history] endpoint`` (``host:port``, comma-separated to try several), else every
``SlurmctldHost`` of ``scontrol show config`` in order (its address in parentheses when Slurm
lists one), at ``[history] port``; the first that answers is used.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

from slurm_ft.config import HOST_RE, parse_endpoints
from slurm_ft.errors import SlurmFTError

#: Seconds to connect to one controller before trying the next.
CONNECT_S = 5.0


class ServiceError(SlurmFTError):
    """The history service could not be reached or refused the query (the message says which)."""


def controllers(conf: dict[str, str], port: int) -> list[tuple[str, int]]:
    """``(address, port)`` of each ``SlurmctldHost`` of a parsed ``scontrol show config``, in order
    (slurm_ft.slurm.slurmctld_hosts): ``ctl(10.0.0.1)`` -> 10.0.0.1 (the address Slurm itself
    uses), ``ctl`` -> ctl; an address that is no host name or IP address is left out."""
    from slurm_ft.slurm.records import slurmctld_hosts
    return [(addr, port) for _, addr in slurmctld_hosts(conf) if HOST_RE.fullmatch(addr)]


def endpoints(cfg, slurm=None, timeout_s: float | None = None) -> list[tuple[str, int]]:
    """Where the history service listens (see the module doc): ``[history] endpoint``, else each
    ``SlurmctldHost`` at ``[history] port`` (``scontrol show config``, given at most
    ``timeout_s`` when set: the hang watcher's report has a deadline). ``ft-history`` and the
    hang watcher both ask here. Raises :class:`ServiceError` when there is nowhere."""
    if cfg.history.endpoint:
        try:
            return parse_endpoints(cfg.history.endpoint, cfg.history.port)
        except ValueError as exc:
            raise ServiceError(f"[history] endpoint: {exc}") from None
    from slurm_ft.config import trusted_bin_dir
    from slurm_ft.slurm import Slurm

    try:
        slurm = slurm or Slurm(bin_dir=trusted_bin_dir(cfg), timeout_s=cfg.slurm.command_timeout_s)
        conf = slurm.show_config(timeout_s=None if timeout_s is None else max(0.1, timeout_s))
    except SlurmFTError as exc:
        raise ServiceError(f"cannot find the controller to ask for your history: {exc}") from None
    found = controllers(conf, cfg.history.port)
    if not found:
        raise ServiceError("cannot find the controller to ask for your history: scontrol show config lists no "
                           "SlurmctldHost (set [history] endpoint)")
    return found


def wanted(journal_path: str, explicit: bool, uid: int | None = None) -> bool:
    """Whether ``ft-history`` asks the service: not root, no ``--journal`` given, and the journal
    cannot be read here (a login node has none; on the controller only root or ``[journal]
    read_group`` may read it)."""
    uid = os.getuid() if uid is None else uid
    return uid != 0 and not explicit and not os.access(journal_path, os.R_OK)


@dataclass(frozen=True)
class Answer:
    jobs: list
    #: the "job N is not in the journal ..." sentence for -j ids not found or not the user's
    error: str | None
    warnings: list
    #: "host:port" that answered
    where: str
    #: ``ft-history -N``: each node's drains and repairs (slurm_ft.history.query.node_steps), None when
    #: the query asked for no nodes
    nodes: dict | None = None


def ask(cfg, sel, *, slurm=None, socket_path: str | None = None) -> Answer:
    """Send selection ``sel`` (:class:`slurm_ft.history.query.Selection`) to the service and return its
    answer. Raises :class:`ServiceError` (with what to do) when MUNGE cannot make a credential,
    no controller answers, or the service refuses the query."""
    from slurm_ft.slurm import munge
    from slurm_ft.history.protocol import MAX_REQUEST, MAX_RESPONSE, encode_query

    payload = encode_query(sel)
    targets = endpoints(cfg, slurm)   # first: "no controller" is the clearer error when both fail
    try:   # only root (the service) can decode it: a program squatting the port learns nothing
        cred = munge.encode(payload, socket=socket_path, decoder_uid=0)
    except munge.MungeError as exc:
        raise ServiceError(f"cannot make a MUNGE credential to ask the controller for your history: {exc}") from None
    line = cred.encode("ascii") + b"\n"
    if len(line) > MAX_REQUEST:
        raise ServiceError("the query is too large for the history service: ask for fewer job ids or users at once")
    tried = []
    for host, port in targets:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            raw = _exchange(host, port, line, cfg.history.timeout_s, MAX_RESPONSE)
        except OSError as exc:
            tried.append(f"{where}: {exc.strerror or exc.__class__.__name__}")
            continue
        return _decode(raw, where, line, lambda text: munge.decode(text, socket=socket_path))
    raise ServiceError(f"no slurm-ft history service answered ({'; '.join(tried)}): it runs with the slurm-ft daemon "
                       f"on the controller ([history] serve, port {cfg.history.port}; docs/install.md); ask an admin")


def _exchange(host: str, port: int, line: bytes, timeout_s: float, limit: int) -> bytes:
    """Send ``line``, read the answer until the service closes (at most ``limit`` + 1 bytes, in
    ``timeout_s`` in all). Raises OSError (connection refused, timed out, ...)."""
    deadline = time.monotonic() + timeout_s
    with socket.create_connection((host, port), timeout=min(CONNECT_S, timeout_s)) as s:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        s.sendall(line)
        s.shutdown(socket.SHUT_WR)
        data = bytearray()
        while len(data) <= limit:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            s.settimeout(left)
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        return bytes(data)


def _decode(raw: bytes, where: str, request: bytes, verify) -> Answer:
    """The answer in ``raw`` (proof line, JSON) to ``request``; ``verify``: credential text ->
    :class:`slurm_ft.slurm.munge.Credential`. Raises :class:`ServiceError` for a refusal and for any
    answer whose proof is not a credential of root binding this request to this JSON."""
    from slurm_ft.slurm import munge
    from slurm_ft.history.protocol import MAX_RESPONSE, proof_payload

    if len(raw) > MAX_RESPONSE + 4096:
        raise ServiceError(f"the history service at {where} sent more than {MAX_RESPONSE} bytes")
    proof, _, body = raw.partition(b"\n")
    try:
        reply = json.loads(body.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ServiceError(f"the history service at {where} sent no answer it understands (another program on "
                           f"that port?)") from None
    if not isinstance(reply, dict) or reply.get("v") != 1:
        raise ServiceError(f"the history service at {where} speaks another version: update slurm-ft here or there")
    if not reply.get("ok"):
        why = reply.get("error") if isinstance(reply.get("error"), str) else "refused the query"
        raise ServiceError(f"the history service at {where}: {why}")
    try:
        cred = verify(proof.decode("ascii"))
    except (UnicodeDecodeError, munge.MungeError) as exc:
        raise ServiceError(f"the answer from {where} carries no valid proof that the slurm-ft history service "
                           f"(root) sent it ({exc.__class__.__name__}): not shown") from None
    if cred.uid != 0 or cred.payload != proof_payload(request, body):
        raise ServiceError(f"the answer from {where} was not sent by root's slurm-ft history service for this "
                           f"query: not shown")
    jobs = reply.get("jobs")
    if not isinstance(jobs, list) or not all(isinstance(h, dict) for h in jobs):
        raise ServiceError(f"the history service at {where} sent a malformed answer")
    error = reply.get("error")
    warnings = reply.get("warnings")
    warnings = [w for w in warnings if isinstance(w, str)] if isinstance(warnings, list) else []
    nodes = reply.get("nodes")
    if nodes is not None and not (isinstance(nodes, dict) and all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(x, dict) for x in v) for k, v in nodes.items())):
        raise ServiceError(f"the history service at {where} sent a malformed answer")
    return Answer(jobs, error if isinstance(error, str) else None, warnings, where, nodes)


def select(cfg, sel, *, slurm=None) -> tuple[list, SlurmFTError | None, list[str], dict | None]:
    """``ft-history``'s hook (slurm_ft.cli.history.command): ``(histories, the error for -j ids not
    found or None, the service's warnings (a stuck daemon, journal trouble: untrusted text, for the
    caller to print terminal-safe), each node's steps for -N or None)`` from the service, as
    :func:`slurm_ft.history.query.select` and :func:`slurm_ft.history.query.node_steps` give them
    from the file. Raises :class:`ServiceError`."""
    answer = ask(cfg, sel, slurm=slurm)
    return answer.jobs, SlurmFTError(answer.error) if answer.error else None, list(answer.warnings), answer.nodes
