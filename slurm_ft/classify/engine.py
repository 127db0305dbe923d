"""evidence -> verdict.

1. Scan: kernel text and job output are scanned as bytes.  For each literal key of the policy's
   signature rows, ``bytes.find`` on the lower-cased text locates candidate lines; only those
   lines run the rows' regexes.  Large inputs (>= 8 MiB) let ``grep -F`` pick the lines holding
   one of their source's keys first, several greps at once (:mod:`.candidates`,
   :mod:`.prefilter`); the same scan then runs on those lines only: same verdict.
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
"""

from __future__ import annotations

import time

from slurm_ft.classify.model import MAX_EVIDENCE_CHARS, MAX_EVIDENCE_LINES, Evidence, Verdict, XidEvent
from slurm_ft.classify.parse import (
    find_bus_id, fmt, kernel_header, mask_user_fields, parse_time, parse_xid, record_body)
from slurm_ft.classify import prefilter as prefilter_mod
from slurm_ft.classify.consequence import judged_as
from slurm_ft.classify.policy import Policy, default_policy
from slurm_ft.classify.recurrence import recurring

#: Bytes of context kept either side of a key hit when a line is longer (huge lines stay cheap).
HALF_WINDOW = 2048
#: Longest raw line kept in an XidEvent.
MAX_XID_LINE = 1000
#: Most Xid events reported in a verdict (all of them still count for the decision).
MAX_XIDS = 100

_OK_STATES = (None, "", "COMPLETED")


class _Cand:
    """One matched row/Xid. ``trusted``: it comes from evidence the job cannot write (kernel
    records, Slurm's own state); only trusted hardware candidates may drain or reset."""

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


def _count_fired(occ: list[tuple[bytes, tuple[str, float] | None]], count: int, window_s: float) -> bool:
    """Whether ``count`` distinct occurrence keys fall within ``window_s`` seconds."""
    return _cluster(occ, window_s) >= count


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


def classify(evidence: Evidence, policy: Policy | None = None, *, prefilter: str = "auto") -> Verdict:
    """Classify one job's end on one node.  Never raises on odd text: any bytes give a verdict.

    ``prefilter``: ``"auto"`` lets ``grep -F`` select the candidate lines of inputs of at least
    :data:`~slurm_ft.classify.prefilter.GREP_MIN_BYTES` (:mod:`.prefilter`), ``"grep"`` tries it
    whatever the size, ``"python"`` never does.  The verdict is the same either way; grep
    failing or missing silently means the pure-Python path."""
    if prefilter not in ("auto", "grep", "python"):
        raise ValueError(f"prefilter: 'auto', 'grep' or 'python', not {prefilter!r}")
    policy = policy or default_policy()
    kernel = _to_bytes(evidence.kernel_lines or ())
    output = _text(evidence.stderr_tail or "")
    out_base = len(kernel) + 1
    cands: list[_Cand] = []
    strict = bool(evidence.kernel_records)  # /dev/kmsg record bodies: never stripped of "wrappers"
    unplaced: list[tuple[int, bytes]] = []  # hardware records that name no GPU of this job or node

    starts = None
    if prefilter == "grep" or (prefilter == "auto" and len(kernel) + len(output) >= prefilter_mod.GREP_MIN_BYTES):
        starts = _candidates(kernel, output, policy)
    if starts is None:
        kernel_low, output_low = kernel.lower(), output.lower()
        xid_lines = _xid_lines(kernel, kernel_low, join=not strict) if kernel else []
        sig_hits = [scan(kernel, kernel_low, policy.index.get("kernel", {})),
                    scan(output, output_low, policy.index.get("output", {}), out_base)]
        output_xid_lines = _xid_lines(output, output_low, join=True) if b"xid" in output_low else []
    else:
        k_starts, o_starts = starts
        xid_lines = _xid_lines_at(kernel, k_starts, join=not strict)
        sig_hits = [scan_lines(kernel, k_starts, policy.index.get("kernel", {})),
                    scan_lines(output, o_starts, policy.index.get("output", {}), out_base)]
        output_xid_lines = _xid_lines_at(output, o_starts, join=True)

    job_ids = evidence.job_bus_ids
    node_ids = evidence.node_bus_ids

    def placed(bus: str | None) -> str:
        """Where a kernel record's bus id puts it: ``job`` (one of the job's GPUs; any bus id when
        neither map is known: an offline ``slurm-ft classify``), ``other`` (another job's GPU) or
        ``unplaced`` (no bus id, or one the node's GPU map does not hold): attributed to no job."""
        if bus is None or (node_ids is not None and bus not in node_ids):
            return "unplaced"
        if job_ids is not None and bus not in job_ids:
            return "other"
        return "job"

    def output_attributed(bus: str | None) -> bool:
        """A bus id in the job's own output (untrusted, it can only ask for the trusted checks):
        another job's GPU is not this job's; a line naming none may be."""
        return bus is None or placed(bus) != "other"

    # -- Xids ----------------------------------------------------------------------------------
    xid_quals = policy.qualifiers("xid")
    sxid_quals = policy.qualifiers("sxid")
    events: list[XidEvent] = []
    judged: list[tuple[XidEvent, int, bytes, object]] = []  # (event, pos, line, hit)
    for pos, line in xid_lines:
        hit = parse_xid(record_body(line, strict))  # the driver's header at the record's start only
        if hit is None:
            continue
        if hit.kind == "xid":
            where = placed(hit.bus_id)
            if where == "other":
                continue
            if where == "unplaced":  # decides nothing; a hardware one asks for the trusted checks
                row = policy.xid_row(hit.caused_by if (hit.xid == 45 and hit.caused_by) else hit.xid)
                if _acts_on_node(row):
                    unplaced.append((pos, line))
                continue
        gpu_index = node_ids.get(hit.bus_id) if (node_ids and hit.bus_id and hit.kind == "xid") else None
        ev = XidEvent(xid=hit.xid, bus_id=hit.bus_id, gpu_index=gpu_index,
                      line=line.decode("utf-8", "replace").strip()[:MAX_XID_LINE], kind=hit.kind)
        events.append(ev)
        judged.append((ev, pos, line, hit))

    fired: dict[int, object] = {}  # index in judged -> count rule
    prior = _prior_by_bus(evidence.prior_xids) if (evidence.prior_xids and policy.counts) else {}
    now = evidence.now if evidence.now is not None else (time.time() if prior else 0.0)
    for rule in policy.counts:
        groups: dict[str | None, list[int]] = {}
        for i, (ev, _pos, _line, _hit) in enumerate(judged):
            if ev.kind == "xid" and ev.xid in rule.xids:
                groups.setdefault(ev.bus_id, []).append(i)
        for bus, members in groups.items():
            occ = []
            for i in members:
                ev, pos, line, hit = judged[i]
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

    as_cause = judged_as([(ev.kind, ev.xid, ev.bus_id) for ev, _p, _l, _h in judged], policy.consequences)
    for i, (ev, pos, line, hit) in enumerate(judged):
        line = mask_user_fields(line)  # qualifiers read the driver's words, never a process name
        if ev.kind == "sxid":
            for q in sxid_quals:
                if q.regex.search(line):
                    cands.append(_Cand(q.priority, pos, q.cls, q.action, q.id, line))
                    break
            continue
        rule = fired.get(i)
        if rule is not None:
            cands.append(_Cand(rule.priority, pos, rule.cls, rule.action, rule.id, line))
            continue
        xid = hit.caused_by if (hit.xid == 45 and hit.caused_by) else hit.xid
        xid = as_cause[i][0] if i in as_cause else xid  # a consequence is judged as its cause
        for q in xid_quals:
            if (q.xids is None or xid in q.xids) and q.regex.search(line):
                cands.append(_Cand(q.priority, pos, q.cls, q.action, q.id, line))
                break
        else:
            row = policy.xid_row(xid)
            cands.append(_Cand(row.rank, pos, row.cls, row.action, row.id, line))

    # -- Xids the job's output names (a health agent's log it tails, a pasted dmesg) ----------------
    # Untrusted text: a hardware Xid there can only ask for the trusted checks (action "verify").
    for pos, line in output_xid_lines:
        for at in _header_starts(line):
            hit = parse_xid(line[at:])
            if hit is None or hit.kind != "xid" or hit.bus_id is None or not output_attributed(hit.bus_id):
                continue
            xid = hit.caused_by if (hit.xid == 45 and hit.caused_by) else hit.xid
            text = mask_user_fields(line)
            q = next((q for q in xid_quals if (q.xids is None or xid in q.xids) and q.regex.search(text)), None)
            cls, action, rank, rid = ((q.cls, q.action, q.priority, q.id) if q is not None else
                                      (lambda r: (r.cls, r.action, r.rank, r.id))(policy.xid_row(xid)))
            if cls == "hardware":
                cands.append(_Cand(rank, out_base + pos, cls, action, rid, line, False))
            break

    # -- signature rows over kernel text and job output -----------------------------------------
    # A kernel row that acts on the node counts only when its record BEGINS with a kernel-owned
    # header (parse.kernel_header); a GPU row is placed by that header's bus id, never by text
    # elsewhere in the record.  Everything else in a record is text (a process or file name).
    for trusted, hits in zip((True, False), sig_hits):  # kernel records, then the job's output
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
                    where = placed(hdr.bus_id if hdr.kind in ("xid", "gpu") else None)
                    if where == "other":
                        continue
                    if where == "unplaced":
                        if row.cls == "hardware":
                            unplaced.append((pos, line))
                        continue
            elif row.scope == "gpu" and not output_attributed(find_bus_id(line)):
                continue
            cands.append(_Cand(row.priority, pos, row.cls, row.action, row.id, line, trusted))

    # -- Slurm state and exit status --------------------------------------------------------------
    tail = out_base + len(output) + 1
    if evidence.slurm_state:
        state = _text(str(evidence.slurm_state).strip().upper())
        for row in policy.signatures:
            if row.source == "slurm_state" and row.regex.search(state):
                cands.append(_Cand(row.priority, tail, row.cls, row.action, row.id, b"slurm state: " + state))
    sig = evidence.signal
    code = evidence.exit_code
    if sig is None and code is not None and 128 < code < 160:
        sig = code - 128  # shells report death by signal N as exit status 128+N
    elif sig is None and code is not None and code < 0:
        sig, code = -code, None  # Python/torchrun style: -N means killed by signal N
    if code is not None or sig:
        pseudo = b"exit=%s signal=%s" % (b"%d" % code if code is not None else b"none",
                                          b"%d" % sig if sig else b"none")
        for row in policy.signatures:
            if row.source == "exit" and row.regex.search(pseudo):
                cands.append(_Cand(row.priority, tail + 1, row.cls, row.action, row.id, pseudo, False))
                break

    # -- decide ------------------------------------------------------------------------------------
    # Highest priority wins, ties to the earliest line; but trusted hardware evidence beats
    # untrusted (job output) hardware evidence whatever their priorities.  Untrusted hardware
    # evidence alone never drains or resets: its action becomes "verify" (the epilog then runs
    # the trusted GPU checks, see slurm_ft/node/epilog.py and docs/security.md).  Likewise trusted
    # evidence that proves the fault (a node action) beats trusted evidence that is no proof by
    # itself (an Xid the catalog says "depends": action "verify").
    win = max(cands, key=lambda c: (c.priority, -c.pos)) if cands else None
    if win is not None and win.cls == "hardware" and not (win.trusted and win.action in NODE_ACTIONS):
        trusted_hw = [c for c in cands if c.cls == "hardware" and c.trusted]
        trusted_hw = [c for c in trusted_hw if c.action in NODE_ACTIONS] or trusted_hw
        if trusted_hw:
            win = max(trusted_hw, key=lambda c: (c.priority, -c.pos))
    clean = code == 0 and not sig and str(evidence.slurm_state or "").strip().upper() in _OK_STATES
    if clean:
        action = win.action if (win is not None and win.cls == "hardware" and win.trusted
                                and win.action in NODE_ACTIONS) else "none"  # "verify": no proof, the job lived
        verdict, rule = "ok", "clean-exit"
    elif win is not None:
        verdict, rule = win.cls, win.rule
        action = win.action if (win.trusted or win.action not in NODE_ACTIONS) else "verify"
    else:
        verdict, rule, action = "unknown", "no-evidence", "none"
    if not clean and win is not None:
        verdict, rule, action, note = _across_jobs(policy, evidence, verdict, rule, action)
        if note:
            cands.append(_Cand(win.priority, tail + 2, verdict, action, rule, note, False))
            win = cands[-1]

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
    shown: list[str] = []
    for _pos, line in sorted(unplaced):
        s = _decode(line)
        if s and s not in shown:
            shown.append(s)
            if len(shown) >= MAX_EVIDENCE_LINES:
                break
    return Verdict(verdict=verdict, rule=rule, xids=_bounded_xids(events), evidence=tuple(lines), action=action,
                   unplaced=tuple(shown),
                   cause=win.rule if clean and action != "none" else "")
