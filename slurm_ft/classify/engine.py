"""evidence -> verdict.

1. Scan: kernel text and job output are scanned as bytes.  For each literal key of the policy's
   signature rows, ``bytes.find`` on the lower-cased text locates candidate lines; only those
   lines run the rows' regexes.  Large inputs (>= 8 MiB, or from 128 KiB on when the epilog asks
   with ``prefilter="grep"``) let ``grep -F`` pick the lines holding one of their source's keys
   first, several greps at once (:mod:`.candidates`, :mod:`.prefilter`); the same scan then runs
   on those lines only: same verdict.
2. Kernel records: a record is evidence for hardware only when it BEGINS with a kernel-owned
   header (:func:`.parse.kernel_header`, ``data/kernel_headers.toml``); the rest of a record is
   text.  Xids are parsed the same way (:func:`.parse.parse_xid`).  An Xid or GPU record counts
   only when its header's bus id is one of the job's GPUs (``job_bus_ids``; empty for a job
   without GPUs; the node's when unknown; any when neither map is known); another job's GPU is
   skipped; no bus id, or one the node's map does not hold, is *unplaced* (``Verdict.unplaced``:
   no job's evidence, the epilog runs the trusted checks).  Each attributed Xid takes its catalog row, unless an ``xid`` qualifier row matches the
   line (NVLink5 "Nonfatal", "NVLink: fatal error"...) or a count/window rule fires (counting
   also ``Evidence.prior_xids``: this node's earlier Xids on the same GPU within the window).  Xid 45 that
   names its cause ("caused by previous Xid 149") is judged as that Xid.
3. Decide: every matched row/Xid is a candidate ``(priority, position)``; the highest priority wins,
   ties go to the earliest line, so the root cause (48 before its 64) decides.
   A clean exit (code 0, no signal, Slurm state unknown/COMPLETED) is ``ok`` whatever was seen;
   hardware evidence then still sets the action, so the node is drained even though the job lived.

:func:`classify` is these steps in order, each a function of its own: :func:`candidate_lines`
(1), :func:`attribute_xids`, :func:`fired_count_rules`, :func:`xid_candidates`,
:func:`output_xid_candidates`, :func:`signature_candidates`, :func:`status_candidates` (2),
:func:`rank`, :func:`decide`, the rules across jobs, :func:`evidence_lines` (3).
"""

from __future__ import annotations

import time
from typing import NamedTuple

from slurm_ft.classify.model import MAX_EVIDENCE_CHARS, MAX_EVIDENCE_LINES, Evidence, Verdict, XidEvent
from slurm_ft.classify.parse import (
    XidHit, find_bus_id, fmt, kernel_header, mask_user_fields, parse_time, parse_xid, record_body)
from slurm_ft.classify import prefilter as prefilter_mod
from slurm_ft.classify.consequence import judged_as
from slurm_ft.classify.policy import Policy, default_policy
from slurm_ft.classify.recurrence import recurring
from slurm_ft.classify.table import CountRule

#: Bytes of context kept either side of a key hit when a line is longer (huge lines stay cheap).
HALF_WINDOW = 2048
#: Longest raw line kept in an XidEvent.
MAX_XID_LINE = 1000
#: Most Xid events reported in a verdict (all of them still count for the decision).
MAX_XIDS = 100

_OK_STATES = (None, "", "COMPLETED")


class Candidate:
    """One matched row/Xid: ``priority`` (higher wins), ``pos`` (byte position in the kernel text,
    a newline and the job's output; ties go to the earliest), ``cls``/``action``/``rule`` (the
    row's class, action and id), ``line`` (the evidence line, bytes).  ``trusted``: it comes from
    evidence the job cannot write (kernel records, Slurm's own state); only trusted hardware
    candidates may drain or reset."""

    __slots__ = ("priority", "pos", "cls", "action", "rule", "line", "trusted")

    def __init__(self, priority: int, pos: int, cls: str, action: str, rule: str, line: bytes,
                 trusted: bool = True):
        self.priority, self.pos, self.cls, self.action, self.rule, self.line = priority, pos, cls, action, rule, line
        self.trusted = trusted


#: Actions that take a node or GPU out of service: only trusted evidence may carry them.
NODE_ACTIONS = ("drain_node", "reset_gpu")


def _acts_on_node(row) -> bool:
    """Whether a row's hit is evidence for hardware (class hardware, or an action on the node)."""
    return row.cls == "hardware" or row.action in NODE_ACTIONS


#: Bytes of a record read from its start to find its header (records are at most ~1 KiB).
RECORD_HEAD = 1024


def _record_head(text: bytes, ls: int) -> bytes:
    """The first :data:`RECORD_HEAD` bytes of the line starting at ``ls`` (never past its end)."""
    le = text.find(b"\n", ls, ls + RECORD_HEAD)
    return text[ls:le if le != -1 else ls + RECORD_HEAD]


def _header_starts(line: bytes) -> list[int]:
    """Offsets in ``line`` where an NVRM Xid header could begin (job output only: there the
    driver's words may sit anywhere in a line, and they are untrusted anyway)."""
    out, at = [], line.find(b"NVRM: Xid")
    while at != -1 and len(out) < 8:
        out.append(at)
        at = line.find(b"NVRM: Xid", at + 1)
    return out


def _text(value: object) -> bytes:
    """Any str/bytes/object as UTF-8 bytes; undecodable input never raises."""
    if isinstance(value, bytes):
        return value
    text = value if isinstance(value, str) else str(value)
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # lone surrogates outside the escape range
        return text.encode("utf-8", "replace")


def _to_bytes(lines: object) -> bytes:
    if isinstance(lines, (str, bytes)):
        return _text(lines)
    try:
        return "\n".join(lines).encode("utf-8", "surrogateescape")  # type: ignore[arg-type]
    except (TypeError, UnicodeEncodeError):
        return b"\n".join(_text(x) for x in lines)  # type: ignore[union-attr]


#: Pieces a large kernel text is cut into (at line ends) for grep: one process per piece, all
#: at once with the output's (:class:`.candidates.GrepRun`).
KERNEL_PIECES = 2


def _candidates(kernel: bytes, output: bytes, policy: Policy) -> tuple[list[int], list[int]] | None:
    """``(kernel line starts, output line starts)`` grep found (:mod:`.candidates`), or None when
    grep could not answer: the caller then uses the Python scan.  The kernel text is searched in
    :data:`KERNEL_PIECES` pieces cut at line ends (memoryviews: nothing is copied here)."""
    from slurm_ft.classify.candidates import (  # local: small inputs (the epilog's) never need threads
        GrepRun)

    run = GrepRun(policy)
    run.add("output", output)
    view = memoryview(kernel)
    base = 0
    for n in range(KERNEL_PIECES - 1, 0, -1):
        cut = kernel.find(b"\n", base + (len(kernel) - base) // (n + 1))
        if cut == -1:
            break
        run.add("kernel", view[base:cut], base)
        base = cut + 1
    run.add("kernel", view[base:], base)
    found = run.result()
    return None if found is None else (found["kernel"], found["output"])


def _line_at(text: bytes, pos: int) -> tuple[int, int, bytes]:
    """(line start, line end, the line clipped to HALF_WINDOW bytes either side of pos)."""
    ls = text.rfind(b"\n", 0, pos) + 1
    le = text.find(b"\n", pos)
    if le == -1:
        le = len(text)
    return ls, le, text[max(ls, pos - HALF_WINDOW):min(le, pos + HALF_WINDOW)]


def scan(text: bytes, low: bytes, index: dict[bytes, tuple], base: int = 0) -> list[tuple[object, int, bytes]]:
    """Rows of ``index`` (key -> rows) matching lines of ``text``: ``[(row, position, line)]``.
    ``low`` is ``text.lower()`` (bytes.lower: ASCII only, so positions agree)."""
    out: list[tuple[object, int, bytes]] = []
    if not text or not index:
        return out
    seen: set[tuple[str, int]] = set()
    for key, rows in index.items():
        find = low.find
        pos = find(key)
        while pos != -1:
            ls, le, line = _line_at(text, pos)
            for row in rows:
                if (row.id, ls) not in seen and row.regex.search(line):
                    seen.add((row.id, ls))
                    out.append((row, base + ls, line))
            pos = find(key, le)
    return out


def _xid_lines(text: bytes, low: bytes, join: bool = True) -> list[tuple[int, bytes]]:
    """Kernel lines holding ``xid``, ``[(line start, line from its start)]``; with ``join`` (saved
    logs: a wrapped header) a line ending in a cut Xid header is re-joined with the next one.
    ``low`` is ``text.lower()``."""
    out: list[tuple[int, bytes]] = []
    pos = low.find(b"xid")
    cut = fmt("xid_cut")
    while pos != -1:
        ls, le, _ = _line_at(text, pos)
        line = text[ls:min(le, ls + 2 * HALF_WINDOW)]
        if join and cut.search(line) and le < len(text):
            _, le2, nxt = _line_at(text, le + 1)
            line = line.rstrip() + b" " + nxt.lstrip()
            le = le2
        out.append((ls, line))
        pos = low.find(b"xid", le)
    return out


def _xid_lines_at(text: bytes, starts: list[int], join: bool = True) -> list[tuple[int, bytes]]:
    """:func:`_xid_lines` restricted to the lines starting at ``starts`` (ascending; a superset of
    the lines holding ``xid``): same lines, same positions, same re-joined headers."""
    out: list[tuple[int, bytes]] = []
    cut = fmt("xid_cut")
    resume = -1
    n = len(text)
    for ls in starts:
        if ls <= resume:  # consumed as the continuation of a wrapped header
            continue
        le = text.find(b"\n", ls)
        if le == -1:
            le = n
        i = text[ls:le].lower().find(b"xid")
        if i == -1:
            continue
        ls, le, _ = _line_at(text, ls + i)
        line = text[ls:min(le, ls + 2 * HALF_WINDOW)]
        if join and cut.search(line) and le < n:
            _, le2, nxt = _line_at(text, le + 1)
            line = line.rstrip() + b" " + nxt.lstrip()
            le = le2
        out.append((ls, line))
        resume = le
    return out


def scan_lines(text: bytes, starts: list[int], index: dict[bytes, tuple], base: int = 0) -> list[tuple[object, int, bytes]]:
    """:func:`scan` restricted to the lines of ``text`` starting at ``starts`` (ascending; a
    superset of the lines holding a key): the candidate lines are copied out whole, scanned, and
    the positions mapped back, so rows, lines and positions are those :func:`scan` gives."""
    if not starts or not index or not text:
        return []
    pieces: list[bytes] = []
    where: dict[int, int] = {}
    at = 0
    n = len(text)
    for ls in starts:
        le = text.find(b"\n", ls)
        if le == -1:
            le = n
        where[at] = ls
        pieces.append(text[ls:le])
        at += le - ls + 1
    sub = b"\n".join(pieces)
    return [(row, base + where[pos], line) for row, pos, line in scan(sub, sub.lower(), index)]


def _decode(line: bytes, limit: int = MAX_EVIDENCE_CHARS) -> str:
    return line.decode("utf-8", "replace").strip()[:limit]


def _cluster(occ: list[tuple[bytes, tuple[str, float] | None]], window_s: float) -> int:
    """The most distinct occurrence keys that fall within ``window_s`` seconds of each other.

    Undated occurrences count inside every window; dated ones are compared only with stamps of
    the same clock.  One sliding window per clock: O(n log n)."""
    undated = {k for k, t in occ if t is None}
    by_clock: dict[str, list[tuple[float, bytes]]] = {}
    for k, t in occ:
        if t is not None and k not in undated:
            by_clock.setdefault(t[0], []).append((t[1], k))
    best = 0
    for stamps in by_clock.values():
        stamps.sort()
        inside: dict[bytes, int] = {}
        lo = 0
        for when, key in stamps:
            inside[key] = inside.get(key, 0) + 1
            while when - stamps[lo][0] > window_s:
                old = stamps[lo][1]
                inside[old] -= 1
                if not inside[old]:
                    del inside[old]
                lo += 1
            best = max(best, len(inside))
    return len(undated) + best


def _prior_by_bus(prior: object) -> dict[str, list[tuple[float, int, bytes]]]:
    """``Evidence.prior_xids`` -> bus id -> ``[(epoch seconds, xid, occurrence key)]``.  Events
    without a bus id are dropped (which GPU they hit is unknown); malformed entries are skipped."""
    out: dict[str, list[tuple[float, int, bytes]]] = {}
    for n, p in enumerate(prior or ()):
        try:
            when, xid, bus = float(p[0]), int(p[1]), p[2]
            pid = p[3] if len(p) > 3 else None
        except (TypeError, ValueError, IndexError):
            continue
        if not bus or not isinstance(bus, str):
            continue
        key = b"pid=%d" % pid if isinstance(pid, int) and not isinstance(pid, bool) else b"prior=%d" % n
        out.setdefault(bus, []).append((when, xid, key))
    return out


def _bounded_xids(events: list[XidEvent]) -> tuple[XidEvent, ...]:
    """At most :data:`MAX_XIDS` events in log order: the first of each (kind, xid, bus id) always,
    then further events in log order; exact repeats of a line are dropped."""
    if len(events) <= MAX_XIDS:
        return tuple(events)
    keep: set[int] = set()
    firsts: set[tuple[str, int, str | None]] = set()
    for i, ev in enumerate(events):
        if (ev.kind, ev.xid, ev.bus_id) not in firsts and len(keep) < MAX_XIDS:
            firsts.add((ev.kind, ev.xid, ev.bus_id))
            keep.add(i)
    lines = {events[i].line for i in keep}
    for i, ev in enumerate(events):
        if len(keep) >= MAX_XIDS:
            break
        if i not in keep and ev.line not in lines:
            keep.add(i)
            lines.add(ev.line)
    return tuple(events[i] for i in sorted(keep))


def _across_jobs(policy: Policy, evidence: Evidence, verdict: str, rule: str,
                 action: str) -> tuple[str, str, str, bytes]:
    """The decided ``(verdict, rule, action)`` after the rules that look beyond the current
    evidence, with a note line for the verdict's evidence (b"" when nothing changed):

    * a recurrence rule (:mod:`.recurrence`): the same kind of crash from several jobs of several
      users on this node makes the node suspect (``hardware``/``verify``: the trusted checks decide);
    * ``[classify] unexplained_exit = "unknown"``: a non-zero exit that only the exit status
      explains (rule ``exit-nonzero``) is ``unknown``/``exit-unexplained`` (nothing points at the
      user's code; the site's ``retry_unknown`` decides whether it is retried)."""
    for rec in policy.recurrences:
        counted = recurring(rec, rule, evidence)
        if counted is not None:
            note = b"%s: %d jobs of %d users on this node ended by %s within %ds" % (
                rec.id.encode(), counted[0], counted[1], rule.encode(), int(rec.window_s))
            return rec.cls, rec.id, rec.action, note
    if rule == "exit-nonzero" and policy.unexplained_exit == "unknown":
        return "unknown", "exit-unexplained", "none", b"exit-unexplained: a non-zero exit and no other evidence"
    return verdict, rule, action, b""


# -- the steps of classify(), in order ---------------------------------------------------------

class Lines(NamedTuple):
    """The candidate lines of one classification (:func:`candidate_lines`).  Positions are byte
    offsets: kernel ones into the kernel text, ``output_hits`` ones into the kernel text, a
    newline and the output (``out_base`` added), ``output_xids`` ones into the output alone."""

    kernel_xids: list[tuple[int, bytes]]  #: ``[(line start, line)]`` holding ``xid``, wrapped headers re-joined
    kernel_hits: list[tuple[object, int, bytes]]  #: ``[(signature row, position, line)]`` of ``kernel`` rows
    output_hits: list[tuple[object, int, bytes]]  #: ``[(signature row, out_base + position, line)]`` of ``output`` rows
    output_xids: list[tuple[int, bytes]]  #: ``[(line start in the output, line)]`` holding ``xid``
    out_base: int  #: where the output starts after the kernel text: ``len(kernel) + 1`` bytes


def candidate_lines(kernel: bytes, output: bytes, policy: Policy, *, strict: bool, prefilter: str = "auto") -> Lines:
    """Step 1: the lines of ``kernel`` (the kernel text, records joined by ``\\n``) and ``output``
    (the job's output) that hold a key of their source's signature rows or ``xid``, with the rows
    they match.  ``strict``: kernel lines are ``/dev/kmsg`` records (a wrapped Xid header is then
    never re-joined with the next record).  ``prefilter`` as :func:`classify`'s: through grep's
    candidate lines or the pure-Python scan, the same :class:`Lines` either way."""
    out_base = len(kernel) + 1
    starts = None
    if prefilter == "grep" or (prefilter == "auto" and len(kernel) + len(output) >= prefilter_mod.GREP_MIN_BYTES):
        starts = _candidates(kernel, output, policy)
    if starts is None:
        kernel_low, output_low = kernel.lower(), output.lower()
        return Lines(kernel_xids=_xid_lines(kernel, kernel_low, join=not strict) if kernel else [],
                     kernel_hits=scan(kernel, kernel_low, policy.index.get("kernel", {})),
                     output_hits=scan(output, output_low, policy.index.get("output", {}), out_base),
                     output_xids=_xid_lines(output, output_low, join=True) if b"xid" in output_low else [],
                     out_base=out_base)
    k_starts, o_starts = starts
    return Lines(kernel_xids=_xid_lines_at(kernel, k_starts, join=not strict),
                 kernel_hits=scan_lines(kernel, k_starts, policy.index.get("kernel", {})),
                 output_hits=scan_lines(output, o_starts, policy.index.get("output", {}), out_base),
                 output_xids=_xid_lines_at(output, o_starts, join=True),
                 out_base=out_base)


def place(bus: str | None, job_bus_ids: frozenset[str] | None, node_bus_ids: dict[str, int] | None) -> str:
    """Where a kernel record's bus id (normalised, ``0000:07:00.0``) puts it: ``"job"`` (one of the
    job's GPUs ``job_bus_ids``; any bus id when neither map is known: an offline ``slurm-ft
    classify``), ``"other"`` (another job's GPU) or ``"unplaced"`` (no bus id, or one the node's
    GPU map ``node_bus_ids``, bus id -> GPU index, does not hold): attributed to no job."""
    if bus is None or (node_bus_ids is not None and bus not in node_bus_ids):
        return "unplaced"
    if job_bus_ids is not None and bus not in job_bus_ids:
        return "other"
    return "job"


def output_names_job(bus: str | None, job_bus_ids: frozenset[str] | None,
                     node_bus_ids: dict[str, int] | None) -> bool:
    """Whether a bus id in the job's own output (untrusted: it can only ask for the trusted checks)
    may be this job's: another job's GPU is not; a line naming none (``bus`` None) may be."""
    return bus is None or place(bus, job_bus_ids, node_bus_ids) != "other"


class JudgedXid(NamedTuple):
    """One kernel Xid/SXid attributed to this job (:func:`attribute_xids`)."""

    event: XidEvent
    pos: int  #: line start in the kernel text (bytes)
    line: bytes  #: the line (a wrapped header re-joined)
    hit: XidHit  #: the parsed header


def _deciding_xid(hit: XidHit) -> int:
    """The Xid a hit is judged as: Xid 45 that names its cause ("caused by previous Xid 149") is
    judged as that Xid."""
    return hit.caused_by if (hit.xid == 45 and hit.caused_by) else hit.xid


def attribute_xids(xid_lines: list[tuple[int, bytes]], policy: Policy, *, strict: bool,
                   job_bus_ids: frozenset[str] | None,
                   node_bus_ids: dict[str, int] | None) -> tuple[list[JudgedXid], list[tuple[int, bytes]]]:
    """Step 2: the Xids/SXids of ``xid_lines`` (``Lines.kernel_xids``) whose record begins with the
    driver's header, attributed to this node's GPUs by bus id (:func:`place`): ``(judged,
    unplaced)``.  ``judged``: the job's Xids and every SXid, in log order, each with its
    :class:`XidEvent` (``gpu_index`` from ``node_bus_ids``, the line cut to :data:`MAX_XID_LINE`
    characters).  Another job's Xid is skipped; an unplaced one decides nothing, but one whose
    catalog row is hardware goes to ``unplaced`` (``[(position, line)]``: the trusted checks)."""
    judged: list[JudgedXid] = []
    unplaced: list[tuple[int, bytes]] = []
    for pos, line in xid_lines:
        hit = parse_xid(record_body(line, strict))  # the driver's header at the record's start only
        if hit is None:
            continue
        if hit.kind == "xid":
            where = place(hit.bus_id, job_bus_ids, node_bus_ids)
            if where == "other":
                continue
            if where == "unplaced":  # decides nothing; a hardware one asks for the trusted checks
                if _acts_on_node(policy.xid_row(_deciding_xid(hit))):
                    unplaced.append((pos, line))
                continue
        gpu_index = node_bus_ids.get(hit.bus_id) if (node_bus_ids and hit.bus_id and hit.kind == "xid") else None
        ev = XidEvent(xid=hit.xid, bus_id=hit.bus_id, gpu_index=gpu_index,
                      line=line.decode("utf-8", "replace").strip()[:MAX_XID_LINE], kind=hit.kind)
        judged.append(JudgedXid(ev, pos, line, hit))
    return judged, unplaced


def fired_count_rules(judged: list[JudgedXid], policy: Policy, prior_xids: object = (),
                      now: float | None = None) -> dict[int, CountRule]:
    """Step 3: the count/window rules that fire, ``{index in judged: rule}`` (the first rule of
    ``policy.counts`` that fires for an event wins).  A rule fires for the Xids it counts on one
    GPU when at least ``count`` distinct occurrences (one per ``pid=``, else per timestamp, else
    per line) fall within ``window_s`` seconds, counting also ``prior_xids``
    (``Evidence.prior_xids``: this node's earlier Xids on the same GPU, epoch seconds, within
    ``window_s`` before ``now``; ``now`` None: the clock, when any are given)."""
    fired: dict[int, CountRule] = {}
    prior = _prior_by_bus(prior_xids) if (prior_xids and policy.counts) else {}
    now = now if now is not None else (time.time() if prior else 0.0)
    for rule in policy.counts:
        groups: dict[str | None, list[int]] = {}
        for i, j in enumerate(judged):
            if j.event.kind == "xid" and j.event.xid in rule.xids:
                groups.setdefault(j.event.bus_id, []).append(i)
        for bus, members in groups.items():
            occ = []
            for i in members:
                _ev, pos, line, hit = judged[i]
                stamp = parse_time(line)
                key = b"pid=%d" % hit.pid if hit.pid is not None else (
                    b"t=%r" % (stamp,) if stamp is not None else b"pos=%d" % pos)
                occ.append((key, stamp))
            # this node's earlier Xids on the same GPU (node journal): each distinct process
            # within window_s before now adds one; one already among the current lines counts once
            earlier: set[bytes] = set()
            if bus is not None and bus in prior:
                current = {k for k, _ in occ}
                since = now - rule.window_s
                earlier = {k for when, xid, k in prior[bus] if xid in rule.xids and when >= since and k not in current}
            if _cluster(occ, rule.window_s) + len(earlier) >= rule.count:
                for i in members:
                    fired.setdefault(i, rule)
    return fired


def xid_candidates(judged: list[JudgedXid], fired: dict[int, CountRule], policy: Policy) -> list[Candidate]:
    """Step 4: one trusted :class:`Candidate` per judged Xid/SXid, in log order (an SXid without a
    matching ``sxid`` qualifier row gives none).  An Xid takes, in this order: its fired count
    rule (:func:`fired_count_rules`); the first ``xid`` qualifier row matching its line (the
    process name masked); its catalog row; judged as its cause when a consequence rule says so
    (:func:`.consequence.judged_as`) or as the Xid a 45 names."""
    cands: list[Candidate] = []
    xid_quals = policy.qualifiers("xid")
    sxid_quals = policy.qualifiers("sxid")
    as_cause = judged_as([(j.event.kind, j.event.xid, j.event.bus_id) for j in judged], policy.consequences)
    for i, (ev, pos, line, hit) in enumerate(judged):
        line = mask_user_fields(line)  # qualifiers read the driver's words, never a process name
        if ev.kind == "sxid":
            for q in sxid_quals:
                if q.regex.search(line):
                    cands.append(Candidate(q.priority, pos, q.cls, q.action, q.id, line))
                    break
            continue
        rule = fired.get(i)
        if rule is not None:
            cands.append(Candidate(rule.priority, pos, rule.cls, rule.action, rule.id, line))
            continue
        xid = as_cause[i][0] if i in as_cause else _deciding_xid(hit)  # a consequence is judged as its cause
        for q in xid_quals:
            if (q.xids is None or xid in q.xids) and q.regex.search(line):
                cands.append(Candidate(q.priority, pos, q.cls, q.action, q.id, line))
                break
        else:
            row = policy.xid_row(xid)
            cands.append(Candidate(row.rank, pos, row.cls, row.action, row.id, line))
    return cands


def output_xid_candidates(output_xids: list[tuple[int, bytes]], policy: Policy, out_base: int, *,
                          job_bus_ids: frozenset[str] | None,
                          node_bus_ids: dict[str, int] | None) -> list[Candidate]:
    """Step 5: untrusted candidates for the hardware Xids the job's output names (a health agent's
    log it tails, a pasted dmesg): ``output_xids`` is ``Lines.output_xids``, positions become
    ``out_base + line start``.  Only the first Xid header of a line that names a bus id possibly
    the job's (:func:`output_names_job`) counts, and only when its qualifier or catalog row is
    class ``hardware``: alone it can only ask for the trusted checks."""
    cands: list[Candidate] = []
    xid_quals = policy.qualifiers("xid")
    for pos, line in output_xids:
        for at in _header_starts(line):
            hit = parse_xid(line[at:])
            if (hit is None or hit.kind != "xid" or hit.bus_id is None
                    or not output_names_job(hit.bus_id, job_bus_ids, node_bus_ids)):
                continue
            xid = _deciding_xid(hit)
            text = mask_user_fields(line)
            q = next((q for q in xid_quals if (q.xids is None or xid in q.xids) and q.regex.search(text)), None)
            cls, action, rank, rid = ((q.cls, q.action, q.priority, q.id) if q is not None else
                                      (lambda r: (r.cls, r.action, r.rank, r.id))(policy.xid_row(xid)))
            if cls == "hardware":
                cands.append(Candidate(rank, out_base + pos, cls, action, rid, line, False))
            break
    return cands


def signature_candidates(lines: Lines, kernel: bytes, *, strict: bool, job_bus_ids: frozenset[str] | None,
                         node_bus_ids: dict[str, int] | None) -> tuple[list[Candidate], list[tuple[int, bytes]]]:
    """Step 6: candidates for the signature rows the kernel text (trusted) and the job's output
    (untrusted) matched (``lines.kernel_hits`` then ``lines.output_hits``): ``(candidates,
    unplaced)``.  A kernel row that acts on the node counts only when its record BEGINS with a
    kernel-owned header (:func:`.parse.kernel_header`, read from ``kernel`` at the hit); a GPU
    row is placed by that header's bus id, never by text elsewhere in the record (a process or
    file name).  A hardware row whose record names no GPU of the node goes to ``unplaced``
    (``[(position, line)]``).  An output GPU row naming another job's GPU is skipped."""
    cands: list[Candidate] = []
    unplaced: list[tuple[int, bytes]] = []
    for trusted, hits in ((True, lines.kernel_hits), (False, lines.output_hits)):
        for row, pos, line in hits:
            if trusted and _acts_on_node(row):
                if row.regex.search(mask_user_fields(line)) is None:
                    continue  # it matched only inside the NVRM name= field (a process name)
                body = record_body(_record_head(kernel, pos), strict)
                hdr = kernel_header(body)
                if hdr is None:
                    if row.cls == "hardware" and body.startswith(b"NVRM: "):
                        unplaced.append((pos, line))  # the driver's words, but no GPU named
                    continue
                if row.scope == "gpu":
                    where = place(hdr.bus_id if hdr.kind in ("xid", "gpu") else None, job_bus_ids, node_bus_ids)
                    if where == "other":
                        continue
                    if where == "unplaced":
                        if row.cls == "hardware":
                            unplaced.append((pos, line))
                        continue
            elif row.scope == "gpu" and not output_names_job(find_bus_id(line), job_bus_ids, node_bus_ids):
                continue
            cands.append(Candidate(row.priority, pos, row.cls, row.action, row.id, line, trusted))
    return cands, unplaced


def exit_status(exit_code: int | None, signal: int | None) -> tuple[int | None, int | None]:
    """``(exit code, signal)`` as the job ended: a shell's exit status 128+N (129..159) also means
    signal N; a negative code -N (Python, torchrun) means signal N and no exit code."""
    if signal is None and exit_code is not None and 128 < exit_code < 160:
        return exit_code, exit_code - 128
    if signal is None and exit_code is not None and exit_code < 0:
        return None, -exit_code
    return exit_code, signal


def status_candidates(evidence: Evidence, policy: Policy, at: int) -> list[Candidate]:
    """Step 7: candidates for Slurm's job state (trusted: every ``slurm_state`` row matching it,
    at position ``at``) and the exit status (untrusted: the first ``exit`` row matching the
    pseudo line ``exit=<code|none> signal=<N|none>``, at ``at + 1``).  ``at`` is a byte position
    after all the text, so at equal priority any line of text wins over these."""
    cands: list[Candidate] = []
    if evidence.slurm_state:
        state = _text(str(evidence.slurm_state).strip().upper())
        for row in policy.signatures:
            if row.source == "slurm_state" and row.regex.search(state):
                cands.append(Candidate(row.priority, at, row.cls, row.action, row.id, b"slurm state: " + state))
    code, sig = exit_status(evidence.exit_code, evidence.signal)
    if code is not None or sig:
        pseudo = b"exit=%s signal=%s" % (b"%d" % code if code is not None else b"none",
                                          b"%d" % sig if sig else b"none")
        for row in policy.signatures:
            if row.source == "exit" and row.regex.search(pseudo):
                cands.append(Candidate(row.priority, at + 1, row.cls, row.action, row.id, pseudo, False))
                break
    return cands


def clean_exit(evidence: Evidence) -> bool:
    """Whether the job ended cleanly: exit code 0, no signal, Slurm state unknown or COMPLETED."""
    code, sig = exit_status(evidence.exit_code, evidence.signal)
    return code == 0 and not sig and str(evidence.slurm_state or "").strip().upper() in _OK_STATES


def rank(cands: list[Candidate]) -> Candidate | None:
    """Step 8: the deciding candidate, or None when there is none.  Highest priority wins, ties
    to the earliest position (the first listed when equal); but trusted hardware evidence beats
    untrusted (job output) hardware evidence whatever their priorities, and among trusted
    hardware evidence, proof of the fault (a node action) beats evidence that is no proof by
    itself (an Xid the catalog says "depends": action ``verify``)."""
    win = max(cands, key=lambda c: (c.priority, -c.pos)) if cands else None
    if win is not None and win.cls == "hardware" and not (win.trusted and win.action in NODE_ACTIONS):
        trusted_hw = [c for c in cands if c.cls == "hardware" and c.trusted]
        trusted_hw = [c for c in trusted_hw if c.action in NODE_ACTIONS] or trusted_hw
        if trusted_hw:
            win = max(trusted_hw, key=lambda c: (c.priority, -c.pos))
    return win


def decide(win: Candidate | None, clean: bool) -> tuple[str, str, str]:
    """Step 9: ``(verdict, rule, action)`` from the deciding candidate.  A clean exit is ``ok``
    (rule ``clean-exit``) whatever was seen, but trusted hardware evidence with a node action
    still sets the action (the node is drained though the job lived).  Untrusted hardware
    evidence alone never drains or resets: its action becomes ``verify`` (the epilog then runs
    the trusted GPU checks, see slurm_ft/node/epilog.py and docs/security.md).  No candidate:
    ``unknown``/``no-evidence``."""
    if clean:
        action = win.action if (win is not None and win.cls == "hardware" and win.trusted
                                and win.action in NODE_ACTIONS) else "none"  # "verify": no proof, the job lived
        return "ok", "clean-exit", action
    if win is not None:
        return win.cls, win.rule, (win.action if (win.trusted or win.action not in NODE_ACTIONS) else "verify")
    return "unknown", "no-evidence", "none"


def evidence_lines(cands: list[Candidate], win: Candidate | None) -> tuple[str, ...]:
    """Step 10: the verdict's evidence, at most :data:`MAX_EVIDENCE_LINES` distinct lines (each at
    most :data:`MAX_EVIDENCE_CHARS` characters): the winner and the candidates of its rule first,
    then by priority (highest first) and position."""
    lines: list[str] = []
    seen: set[str] = set()
    ordered = sorted(cands, key=lambda c: (c is not win and c.rule != (win.rule if win else None), -c.priority, c.pos))
    for c in ordered:
        s = _decode(c.line)
        if s and s not in seen:
            seen.add(s)
            lines.append(s)
            if len(lines) >= MAX_EVIDENCE_LINES:
                break
    return tuple(lines)


def unplaced_lines(unplaced: list[tuple[int, bytes]]) -> tuple[str, ...]:
    """The verdict's ``unplaced`` lines: at most :data:`MAX_EVIDENCE_LINES` distinct lines in log
    order, from ``[(position, line)]``."""
    shown: list[str] = []
    for _pos, line in sorted(unplaced):
        s = _decode(line)
        if s and s not in shown:
            shown.append(s)
            if len(shown) >= MAX_EVIDENCE_LINES:
                break
    return tuple(shown)


def classify(evidence: Evidence, policy: Policy | None = None, *, prefilter: str = "auto") -> Verdict:
    """Classify one job's end on one node.  Never raises on odd text: any bytes give a verdict.

    ``prefilter``: ``"auto"`` lets ``grep -F`` select the candidate lines of inputs of at least
    :data:`~slurm_ft.classify.prefilter.GREP_MIN_BYTES` (:mod:`.prefilter`), ``"grep"`` tries it
    whatever the size, ``"python"`` never does.  The verdict is the same either way; grep
    failing or missing silently means the pure-Python path.  Raises ValueError for any other
    ``prefilter``."""
    if prefilter not in ("auto", "grep", "python"):
        raise ValueError(f"prefilter: 'auto', 'grep' or 'python', not {prefilter!r}")
    policy = policy or default_policy()
    kernel = _to_bytes(evidence.kernel_lines or ())
    output = _text(evidence.stderr_tail or "")
    strict = bool(evidence.kernel_records)  # /dev/kmsg record bodies: never stripped of "wrappers"
    gpus = {"job_bus_ids": evidence.job_bus_ids, "node_bus_ids": evidence.node_bus_ids}

    lines = candidate_lines(kernel, output, policy, strict=strict, prefilter=prefilter)
    judged, unplaced = attribute_xids(lines.kernel_xids, policy, strict=strict, **gpus)
    fired = fired_count_rules(judged, policy, evidence.prior_xids, evidence.now)
    cands = xid_candidates(judged, fired, policy)
    cands += output_xid_candidates(lines.output_xids, policy, lines.out_base, **gpus)
    sig_cands, sig_unplaced = signature_candidates(lines, kernel, strict=strict, **gpus)
    cands += sig_cands
    tail = lines.out_base + len(output) + 1  # a position after all the text
    cands += status_candidates(evidence, policy, tail)

    clean = clean_exit(evidence)
    win = rank(cands)
    verdict, rule, action = decide(win, clean)
    if not clean and win is not None:
        verdict, rule, action, note = _across_jobs(policy, evidence, verdict, rule, action)
        if note:
            win = Candidate(win.priority, tail + 2, verdict, action, rule, note, False)
            cands.append(win)
    return Verdict(verdict=verdict, rule=rule, xids=_bounded_xids([j.event for j in judged]),
                   evidence=evidence_lines(cands, win), action=action,
                   unplaced=unplaced_lines(unplaced + sig_unplaced),
                   cause=win.rule if clean and action != "none" else "")
