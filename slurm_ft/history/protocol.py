"""The history service's wire format, one module for both ends: the client's query
(:func:`encode_query`; the service decodes it: slurm_ft.history.service.parse_query), its bounds,
and what the service's proof credential carries (:func:`proof_payload`). A request is one line:
a MUNGE credential whose payload is the query; the answer is a proof line, then the JSON body."""

from __future__ import annotations

import hashlib
import json

from slurm_ft.errors import SlurmFTError

SERVICE = "slurm-ft-history"
VERSION = 1
#: Longest request line (bytes): the credential with its query.
MAX_REQUEST = 65536
#: Longest query (the credential's payload, bytes).
MAX_QUERY = 16384
#: Most items in one list of a query (job ids, users, states).
MAX_ITEMS = 1000
#: Largest answer sent (bytes of JSON).
MAX_RESPONSE = 64 * 1024 * 1024


class BadRequest(SlurmFTError):
    """A query the service will not answer; the message is sent to the client."""


def _node_pieces(names) -> list[str]:
    """``-N`` node names as short hostlists (ClusterShell's contiguous pieces, ``g[001-004]``, ``n1``),
    each at most 256 characters (what the service takes in a list). Raises :class:`BadRequest` when they do not fit a query."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet

    pieces = [str(p) for p in NodeSet.fromlist(sorted(names), resolver=RESOLVER_NOGROUP).contiguous()]
    if len(pieces) > MAX_ITEMS or any(len(p) > 256 for p in pieces):
        raise BadRequest(f"-N: too many separate nodes for the history service (at most {MAX_ITEMS} ranges)")
    return pieces


def encode_query(sel, *, now: float | None = None) -> bytes:
    """The payload for :class:`slurm_ft.history.query.Selection` ``sel`` (client side). ``nodes`` (``-N``)
    is sent only when set: a service that predates it refuses such a query as having an unknown
    field, and answers every other query as before."""
    nodes = getattr(sel, "nodes", None)
    extra = {"nodes": _node_pieces(nodes)} if nodes is not None else {}
    return json.dumps({
        "service": SERVICE, "v": VERSION,
        "jobs": [str(j) for j in sel.job_ids],
        "users": sorted(sel.users) if sel.users is not None else None,
        "all_users": bool(sel.all_users), "start": float(sel.start),
        "end": None if sel.end is None else float(sel.end),
        "states": sorted(sel.states), "duplicates": bool(sel.duplicates),
        "accounts": sorted(sel.accounts) if getattr(sel, "accounts", None) is not None else None, **extra,
    }, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def proof_payload(request: bytes, body: bytes) -> bytes:
    """What the service's proof credential carries for ``request`` (the line, stripped) and the
    answer's JSON ``body``."""
    return json.dumps({"service": SERVICE, "request": hashlib.sha256(request.strip()).hexdigest(),
                       "answer": hashlib.sha256(body).hexdigest()}, sort_keys=True).encode("ascii")
