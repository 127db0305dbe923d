"""Can a job still run once slurm-ft excludes the nodes it blamed? (issue 15)

A failover requeues the job with ``ExcNodeList`` = every node blamed so far. If the job *requires*
one of those nodes (``-w n10``), needs more nodes than its partition has left, asks for a feature
or a reservation only the excluded nodes provide, Slurm 22.05 does not refuse the update: the job
pends with ``Reason=BadConstraints`` and ``Priority=0`` forever (measured on the lab). This module
answers, before that happens, whether the job can still run and, if not, why, in one line an
admin can act on; for ``[failover] unsatisfiable = "relax"`` it also says whether dropping the
excluded nodes from the job's required node list is enough.

Pure: no I/O. Inputs, with their sources and shapes (22.05 measured on the lab, Slurm 22.05.8,
``openapi/v0.0.38``; 24.11 read from Slurm's ``data_parser/v0.0.42/parsers.c``, not run here):

======================  ==================================================  =========================
job record field         22.05 ``squeue --json``                             24.11
======================  ==================================================  =========================
``required_nodes``       ``"n[1-2]"`` (``-w``; ``""`` none)                  same (string)
``excluded_nodes``       ``"n1"``                                            same (string)
``features``             ``"a100&nvlink"`` (``-C``; slurmctld turns ``,``    same (string)
                         into ``&``; ``""`` none)
``node_count``           ``2``                                               ``{"set", "infinite", "number"}``
``partition``            ``"gpu"``; ``"gpu,small"`` while pending in several  same
``resv_name``            ``"r1"`` (``--reservation``; ``""`` none)           same
``shared``               ``null``; ``"none"`` (``--exclusive``), ``"user"``,  ``["none"]``, ``["user"]``,
                         ``"shared"`` (``--oversubscribe``)                  ``["oversubscribe"]``, ``[]``
======================  ==================================================  =========================

Node records (:class:`slurm_ft.slurm.Node`; ``sinfo --json`` on 22.05, ``scontrol show nodes
--json`` from 23.02): ``features`` / ``active_features`` (22.05 ``"a100,nvlink"``, 24.11
``["a100", "nvlink"]``), ``partitions`` (``["gpu", "small"]``). Node records carry no reservation
on 22.05 (24.11 names only the reservation active on the node now), so a job's reservation is
checked against ``scontrol show reservation -o NAME`` (22.05: ``ReservationName=r1 ...
Nodes=n[1-2] NodeCnt=2 ... Flags=SPEC_NODES ...``; no ``--json`` there), parsed by
:func:`reservation_nodes`; without that record the reservation is not checked (a note says so).

Fail safe, the other way round from health checks: a job is only called unrunnable when the model
is sure. Anything it cannot parse (a feature expression with ``!``, counts under ``|``, a hostlist
it cannot expand) counts as satisfiable and is reported in :attr:`Feasibility.notes` (logged at
debug level by the caller); and a job the model finds unrunnable even with *no* node excluded is
let through (the model is missing something Slurm knows). Not modelled: per-node CPUs, memory and
GRES counts, node weights, licenses, ``--prefer`` (soft).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from slurm_ft.errors import HostlistError
from slurm_ft.slurm import compress_nodes, split_nodes

HOLD, RELAX = "hold", "relax"
MODES = (HOLD, RELAX)

#: Longest feature expression / name list looked at (a job's ``--constraint`` is user input).
MAX_EXPR = 1024
#: Deepest nesting of ``(`` / ``[`` parsed (Slurm itself allows one of each).
MAX_DEPTH = 8
#: User-controlled text shown in a reason is cut to this many characters.
MAX_SHOWN = 80


@dataclass(frozen=True)
class Feasibility:
    """The answer of :func:`check`.

    ``runnable``: the job can still run with the excluded nodes excluded (or the model is not sure).
    ``reason``: when not runnable, one admin-readable line naming the node(s) and the constraint,
    e.g. ``n10 excluded after Xid 79; the job requires it (--nodelist=n10)``.
    ``constraint``: ``nodelist`` | ``nodes`` | ``reservation`` | ``features`` (``""`` if runnable).
    ``relaxed_nodelist``: for mode ``relax``, the required node list to set instead
    (``scontrol update JobId=J ReqNodeList=<it>``; ``""`` clears the pin) when dropping the
    excluded nodes from it makes the job runnable; None when that does not help.
    ``dropped``: the required nodes that relaxing drops. ``notes``: what was not checked, and why.
    """

    runnable: bool
    reason: str = ""
    constraint: str = ""
    relaxed_nodelist: str | None = None
    dropped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def relax_detail(self) -> str:
        """Journal text for a relax: ``ReqNodeList -> n2 (dropped n1: <reason>)``."""
        return (f"ReqNodeList -> {self.relaxed_nodelist or '(none)'} "
                f"(dropped {_nodes_shown(self.dropped)}: {self.reason})")


@dataclass(frozen=True)
class _Spec:
    """What the job asks for, read from its record."""

    required: tuple[str, ...]
    needed: int
    partitions: frozenset[str]
    reservation: str
    features: str
    exclusive: str


@dataclass(frozen=True)
class _Failure:
    constraint: str
    nodes: frozenset[str]      # the excluded nodes that made it fail
    left: int = 0              # nodes left for the job


# ----------------------------------------------------------------------------- reading records
def _num(value) -> int | None:
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "" if value in (None, "(null)") else str(value)


def _words(value) -> set[str]:
    """A comma list (22.05 string) or a list of strings (24.11) as a set; ``(null)`` dropped."""
    items = value if isinstance(value, list) else str(value or "").split(",")
    return {str(v).strip() for v in items if str(v).strip() and str(v).strip() != "(null)"}


def _exclusive(raw: dict) -> str:
    """The job's ``--exclusive`` flag as the user typed it, or ``""`` (from ``shared``: 22.05
    ``"none"``/``"user"``/``"mcs"``, 24.11 the same words in a list)."""
    shared = raw.get("shared")
    flags = {str(f) for f in shared} if isinstance(shared, list) else {str(shared)}
    if "none" in flags:
        return "--exclusive"
    if "user" in flags:
        return "--exclusive=user"
    if "mcs" in flags:
        return "--exclusive=mcs"
    return ""


def _spec(raw: dict, notes: list[str]) -> _Spec:
    try:
        required = tuple(split_nodes(_text(raw.get("required_nodes"))))
    except HostlistError as exc:
        notes.append(f"required node list not checked: {exc}")
        required = ()
    needed = next((n for n in (_num(raw.get("node_count")), _num(raw.get("num_nodes"))) if n and n > 0), 0)
    return _Spec(
        required=required,
        needed=max(needed, len(required), 1),
        partitions=frozenset(p for p in _text(raw.get("partition")).split(",") if p),
        reservation=_text(raw.get("resv_name")),
        features=_text(raw.get("features")),
        exclusive=_exclusive(raw),
    )


def reservation_nodes(record: dict | None) -> frozenset[str] | None:
    """The nodes a job in the reservation may use, from ``scontrol show reservation -o NAME``
    parsed into a dict (:func:`slurm_ft.slurm.parse_kv_line`): ``Nodes=n[1-2]``. None (not
    checked) when there is no record, when the reservation has no node list (``Nodes=(null)``,
    licenses or burst buffers only) or when its ``Flags`` let jobs use nodes outside it
    (``FLEX``, ``ANY_NODES``)."""
    if not record:
        return None
    flags = {f.strip().upper() for f in str(record.get("Flags", "")).split(",")}
    if flags & {"FLEX", "ANY_NODES"}:
        return None
    try:
        nodes = split_nodes(record.get("Nodes"))
    except HostlistError:
        return None
    return frozenset(nodes) or None


def fault_cause(verdicts: list[dict], blamed) -> str:
    """Why the blamed nodes were excluded, for a reason line: ``Xid 79`` / ``Xids 48, 79`` from
    the attempt's verdict rows (:meth:`Journal.verdicts`: ``node``, ``rule``, ``xids`` as
    ``[{"xid": 79, ...}]``) on the blamed nodes; ``a failed health check (gpu-count)`` for a
    prolog health verdict; ``a hardware fault`` for another verdict (a lost node); ``a drain``
    when no verdict names them (an evacuation: an admin's requeue, ``slurm-ft drain
    --checkpoint``)."""
    blamed = set(blamed)
    rows = [v for v in verdicts if v.get("node") in blamed]
    xids = sorted({int(x["xid"]) for v in rows for x in (v.get("xids") or [])
                   if isinstance(x, dict) and str(x.get("xid", "")).isdigit()})
    if xids:
        return ("Xid " if len(xids) == 1 else "Xids ") + ", ".join(str(x) for x in xids)
    health = sorted({v["rule"][len("health:"):] for v in rows if str(v.get("rule", "")).startswith("health:")})
    if health:
        return f"a failed health check ({_show(','.join(health))})"
    return "a hardware fault" if rows else "a drain"


# ----------------------------------------------------------------------------- feature expressions
class FeatureParseError(ValueError):
    """A ``--constraint`` expression this module does not understand (then it is not checked)."""


_TOKEN = re.compile(r"(?P<name>[^&|,()\[\]*!\s]+)|(?P<count>\*\d{1,9})|(?P<op>[&|,])|(?P<open>[(\[])|(?P<close>[)\]])")


def _tokens(expr: str) -> list[tuple[str, str]]:
    expr = expr.strip()
    if len(expr) > MAX_EXPR:
        raise FeatureParseError(f"longer than {MAX_EXPR} characters")
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise FeatureParseError(f"unexpected {expr[pos]!r} at {pos}")
        out.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    return out


@dataclass(frozen=True)
class _Group:
    """One level of an expression: ``items`` joined by ``ops`` (``&`` or ``|``; ``,`` is ``&``).
    An item is ``(atom, count)``: atom a feature name or a nested :class:`_Group`, count ``*N``
    or None; ``bracket`` marks ``[...]`` (matching OR, read here as plain grouping: looser)."""

    items: tuple[tuple[object, int | None], ...]
    ops: tuple[str, ...]
    bracket: bool = False


def parse_features(expr: str) -> _Group:
    """Parse a Slurm ``--constraint`` expression (names, ``&``, ``,``, ``|``, ``(...)``,
    ``[...]``, ``name*N``). Raises :class:`FeatureParseError` on anything else (``!``, spaces
    inside, unbalanced brackets, more than :data:`MAX_DEPTH` levels, over :data:`MAX_EXPR` chars)."""
    toks = _tokens(expr)
    group, pos = _parse_group(toks, 0, 0, None)
    if pos != len(toks):
        raise FeatureParseError(f"unexpected {toks[pos][1]!r}")
    return group


def _parse_group(toks, pos: int, depth: int, closer: str | None) -> tuple[_Group, int]:
    if depth > MAX_DEPTH:
        raise FeatureParseError(f"nested deeper than {MAX_DEPTH}")
    items, ops = [], []
    while True:
        if pos >= len(toks):
            raise FeatureParseError("ends where a feature name is expected")
        kind, text = toks[pos]
        if kind == "name":
            atom, pos = text, pos + 1
        elif kind == "open":
            atom, pos = _parse_group(toks, pos + 1, depth + 1, ")" if text == "(" else "]")
            atom = replace(atom, bracket=text == "[")
        else:
            raise FeatureParseError(f"unexpected {text!r}")
        count = None
        if pos < len(toks) and toks[pos][0] == "count":
            count = int(toks[pos][1][1:])
            if count <= 0:
                raise FeatureParseError(f"count {toks[pos][1]!r}")
            pos += 1
        items.append((atom, count))
        if pos >= len(toks):
            if closer:
                raise FeatureParseError(f"missing {closer!r}")
            return _Group(tuple(items), tuple(ops)), pos
        kind, text = toks[pos]
        if kind == "close":
            if text != closer:
                raise FeatureParseError(f"unexpected {text!r}")
            return _Group(tuple(items), tuple(ops)), pos + 1
        if kind != "op":
            raise FeatureParseError(f"unexpected {text!r}")
        ops.append("&" if text == "," else text)
        pos += 1


def _has_count(group: _Group) -> bool:
    return any(c is not None or (isinstance(a, _Group) and _has_count(a)) for a, c in group.items)


def _matches(group: _Group, feats: set[str], order: str) -> bool:
    """Whether a node with features ``feats`` satisfies ``group`` (counts ignored). ``order``:
    ``ltr`` (left to right, as 22.05's slurmctld evaluates a flat list) or ``prec`` (``&`` binds
    tighter); the callers require both to agree before trusting a mixed expression."""
    vals = [(_matches(a, feats, order) if isinstance(a, _Group) else a in feats) for a, _ in group.items]
    if order == "ltr":
        acc = vals[0]
        for op, v in zip(group.ops, vals[1:]):
            acc = (acc and v) if op == "&" else (acc or v)
        return acc
    chains, cur = [], [vals[0]]
    for op, v in zip(group.ops, vals[1:]):
        if op == "|":
            chains.append(cur)
            cur = [v]
        else:
            cur.append(v)
    chains.append(cur)
    return any(all(c) for c in chains)


def _any_match(group: _Group, feats: set[str]) -> bool:
    """Whether the node matches in either reading (counted items read per node)."""
    return _matches(group, feats, "ltr") or _matches(group, feats, "prec")


def _feature_fit(group: _Group, pool: dict[str, set[str]], needed: int) -> tuple[bool | None, int, str]:
    """Whether ``pool`` (node -> features) can satisfy the expression for a job of ``needed``
    nodes: ``(True|False|None, matching nodes, note)``; None = not sure (then not blocking)."""
    if not _has_count(group):
        counts = {o: sum(1 for f in pool.values() if _matches(group, f, o)) for o in ("ltr", "prec")}
        ok = {o: n >= needed for o, n in counts.items()}
        if ok["ltr"] != ok["prec"]:
            return None, max(counts.values()), "mixes & and | without parentheses; Slurm's order not modelled"
        return ok["ltr"], counts["ltr"], ""
    # counted terms (``[rack1*2&rack2*4]``): only an &-chain of counted items is modelled; each
    # counted item needs that many nodes matching it in either reading (a "no" is then certain).
    top = group
    if len(top.items) == 1 and isinstance(top.items[0][0], _Group) and top.items[0][1] is None:
        top = top.items[0][0]
    if any(op != "&" for op in top.ops):
        return None, 0, "counts under |; not modelled"
    least = None
    for atom, count in top.items:
        if count is None:
            continue
        if isinstance(atom, _Group) and _has_count(atom):
            return None, 0, "nested counts; not modelled"
        sub = atom if isinstance(atom, _Group) else _Group(((atom, None),), ())
        n = sum(1 for f in pool.values() if _any_match(sub, f))
        if n < count:
            return False, n, ""
        least = n if least is None else min(least, n)
    return True, least or 0, ""


# ----------------------------------------------------------------------------- the check
def check(job, nodes: list, excluded, *, blamed=(), cause: str = "a hardware fault",
          reservation: dict | None = None) -> Feasibility:
    """Whether ``job`` (a :class:`slurm_ft.slurm.Job` or its raw ``squeue --json`` record) can
    still run with every node in ``excluded`` (names) excluded.

    ``nodes``: the cluster's :class:`slurm_ft.slurm.Node` list (drained and down nodes count as
    usable: an admin may bring them back; an excluded node never comes back for this job).
    ``blamed``: the nodes blamed by this failover (named with ``cause``, e.g. ``Xid 79``, see
    :func:`fault_cause`; other excluded nodes are "excluded earlier"). ``reservation``: the job's
    reservation as parsed ``scontrol show reservation -o`` (None: not checked).

    Checks, in order: required node list, node count vs usable nodes of the job's partition(s),
    reservation nodes, features. Returns a :class:`Feasibility`."""
    raw = getattr(job, "raw", job) or {}
    notes: list[str] = []
    spec = _spec(raw, notes)
    excluded = frozenset(excluded)
    resv = _reservation(spec, reservation, notes)
    pool = _pool(spec, nodes, notes)
    failure = _evaluate(spec, pool, excluded, resv, notes)
    if failure is None:
        return Feasibility(True, notes=tuple(notes))
    if _evaluate(spec, pool, frozenset(), resv, []) is not None:
        notes.append(f"the job looks unrunnable even with no node excluded ({failure.constraint}): "
                     "the model misses something Slurm knows; not blocking")
        return Feasibility(True, notes=tuple(notes))
    relaxed, dropped = None, ()
    if failure.constraint == "nodelist":
        dropped = tuple(n for n in spec.required if n in excluded)
        rest = tuple(n for n in spec.required if n not in excluded)
        if _evaluate(replace(spec, required=rest), pool, excluded, resv, []) is None:
            relaxed = compress_nodes(rest)
    return Feasibility(False, _reason(spec, failure, frozenset(blamed), cause), failure.constraint,
                       relaxed, dropped, tuple(notes))


def _reservation(spec: _Spec, record: dict | None, notes: list[str]) -> frozenset[str] | None:
    if not spec.reservation:
        return None
    nodes = reservation_nodes(record)
    if nodes is None:
        notes.append(f"reservation {_show(spec.reservation)}: no node list (no record, none, or FLEX/ANY_NODES); "
                     "not checked")
    return nodes


def _pool(spec: _Spec, nodes: list, notes: list[str]) -> dict[str, set[str]]:
    """Nodes of the job's partition(s) -> their features (available or active). A node whose
    record names no partition counts (looser); no partition on the job: every node."""
    pool: dict[str, set[str]] = {}
    for n in nodes:
        parts = set(getattr(n, "partitions", []) or [])
        if spec.partitions and parts and not parts & spec.partitions:
            continue
        r = getattr(n, "raw", {}) or {}
        pool[n.name] = _words(r.get("features")) | _words(r.get("active_features"))
    if not nodes:
        notes.append("no node records; node count, reservation and features not checked")
    return pool


def _evaluate(spec: _Spec, pool: dict[str, set[str]], excluded: frozenset[str],
              resv: frozenset[str] | None, notes: list[str]) -> _Failure | None:
    """The first constraint that fails, or None."""
    conflict = frozenset(spec.required) & excluded
    if conflict:
        return _Failure("nodelist", conflict)
    if not pool:
        return None
    usable = {n: f for n, f in pool.items() if n not in excluded}
    if len(usable) < spec.needed:
        return _Failure("nodes", frozenset(pool) & excluded, len(usable))
    if resv is not None:
        usable = {n: f for n, f in usable.items() if n in resv}
        if len(usable) < spec.needed:
            return _Failure("reservation", resv & excluded, len(usable))
    if spec.features:
        try:
            group = parse_features(spec.features)
        except FeatureParseError as exc:
            notes.append(f"features {_show(spec.features)} not checked: {exc}")
            group = None
        if group is not None:
            ok, left, note = _feature_fit(group, usable, spec.needed)
            if ok is None:
                notes.append(f"features {_show(spec.features)} not checked: {note}")
            elif not ok:
                # name the excluded nodes that had what the job asks for
                everyone = {n: f for n, f in pool.items() if resv is None or n in resv}
                had = frozenset(n for n in excluded if n in everyone and _any_match(group, everyone[n]))
                return _Failure("features", had or (frozenset(everyone) & excluded), left)
            usable = {n: f for n, f in usable.items() if _has_count(group) or _any_match(group, f)}
    missing = [n for n in spec.required if n not in usable and n in pool]
    if missing:
        return _Failure("nodelist-fit", frozenset(missing), len(usable))
    return None


# ----------------------------------------------------------------------------- reason lines
#: Kept in shown text; anything else (spaces, controls, ``:``) becomes ``?``.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+@/&|()\[\]*!-]")


def _show(text: str) -> str:
    """User-controlled text (feature expression, partition, reservation) for a reason line: one
    word (no spaces or controls, so it can never split off a word such as ``ft:...`` in an
    AdminComment; ``:`` is replaced too), at most :data:`MAX_SHOWN` characters."""
    text = _UNSAFE.sub("?", str(text))
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 3] + "..."


def _nodes_shown(names) -> str:
    return _show(compress_nodes(sorted(names)))


def _excluded_phrase(nodes: frozenset[str], blamed: frozenset[str], cause: str) -> str:
    now, before = nodes & blamed, nodes - blamed
    parts = []
    if now:
        parts.append(f"{_nodes_shown(now)} excluded after {cause}")
    if before:
        parts.append(f"{_nodes_shown(before)} excluded earlier")
    return ", ".join(parts) or "the excluded nodes"


def _reason(spec: _Spec, f: _Failure, blamed: frozenset[str], cause: str) -> str:
    head = _excluded_phrase(f.nodes, blamed, cause)
    part = _show(",".join(sorted(spec.partitions))) or "(any)"
    excl = f", {spec.exclusive}" if spec.exclusive else ""
    if f.constraint == "nodelist":
        it = "it" if len(f.nodes) == 1 else "them"
        return f"{head}; the job requires {it} (--nodelist={_nodes_shown(spec.required)})"
    if f.constraint == "nodes":
        return (f"{head}; {f.left} usable node(s) left in partition {part}, the job needs {spec.needed} "
                f"(--nodes={spec.needed}{excl})")
    if f.constraint == "reservation":
        return (f"{head}; {f.left} node(s) left in reservation {_show(spec.reservation)}, the job needs "
                f"{spec.needed} (--reservation={_show(spec.reservation)})")
    if f.constraint == "features":
        other = "no other node" if f.left == 0 else f"only {f.left} other node(s)"
        return (f"{head}; {other} in partition {part} has the features the job requires, it needs "
                f"{spec.needed} (--constraint={_show(spec.features)})")
    return f"{head}; the job cannot run on its remaining required nodes (--nodelist={_nodes_shown(spec.required)})"
