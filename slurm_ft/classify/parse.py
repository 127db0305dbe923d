"""Line grammar: kernel-record headers, PCI bus ids, Xid/SXid numbers, kernel-log timestamps.

This module knows *formats*, not faults: what a line means is decided by the data tables
(``slurm_ft/data/xid_catalog.csv``, ``signatures.toml``).  Format regexes live in :data:`_FORMATS`,
compiled once on first use; the kernel-owned record headers live in ``kernel_headers.toml``.

One rule for every reader of the kernel log (epilog, health check, hang watcher, in-place
restarts, ``slurm-ft classify``): a kernel record is the driver's or the kernel's own evidence
only when it BEGINS with a kernel-owned header (:func:`kernel_header`); an Xid counts only as
that header (:func:`parse_xid`).  Anything else in a record is text a process or file name may
have put there.  A ``/dev/kmsg`` record body is read as it is; a saved log line first loses only
its log tool's own wrappers (:func:`message_body`: syslog/dmesg stamps, host, ``kernel:``).

Xid shapes (``nvErrorLog_va`` over the years):
  ``NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, ...``   (r450+: a header)
  ``NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, ...``                 (MIG: a header)
  ``NVRM: Xid (0000:03:00): 13, 0003 00000000 ...``                           (old: a header)
  ``nvidia-nvswitch1: SXid (PCI:0000:86:00.0): 24007, Fatal, ...``            (NVSwitch: a header)
  ``NVRM: Xid (3): 79, ...``  ``NVRM: Xid: 79, GPU has fallen off the bus.``  (no bus id: *unplaced*,
  too short to be a header, so they never blame; see :func:`parse_xid`)
Timestamps: ``[  219.470994]`` (printk, seconds since boot), ``[Fri Aug 30 11:43:09 2024]``
(``dmesg -T``), ``Dec  2 11:38:47`` (syslog, month names in several languages), ISO 8601.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from slurm_ft.errors import EvidenceError

_FORMATS = {
    # a bus id with a PCI domain: 0000:3b:00 / 00000000:3B:00.0
    "bus_full": rb"\b([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?\b",
    # bus id inside an Xid's parentheses: domain optional
    "bus_paren": rb"(?:PCI:)?(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?",
    # an Xid without a bus id at the start of a record (old drivers): "NVRM: Xid: 79," /
    # "NVRM: Xid (3): 79," (a GPU number).  Not a header (a 15-byte process name can complete it):
    # such an Xid is *unplaced*, attributed to no job (see parse_xid)
    "xid_unplaced": rb"NVRM: Xid(?: \(\d{1,3}\))?: ?(\d{1,6})(?=,|[ \t\r]*$)",
    # wrappers in front of a kernel message in saved logs: syslog / ISO / dmesg -T stamps with a
    # host name, "kernel:", "kern: warning:", a printk "[  219.470994]" stamp, "<3>" levels
    "wrapper": rb"^(?:[ \t]+|<\d{1,3}>|\[ *\d{1,10}\.\d{1,9}\]:? ?|\[\w{2,4}\.? \S{3,6}\.? +\d{1,2} \d\d:\d\d:\d\d \d{4}\]:? ?"
               rb"|\[\d{4}-\d\d-\d\dT[\d:.]+Z?\]:? ?|\S{3,6}\.? +\d{1,2} \d\d:\d\d:\d\d (?:[\w.-]+ )?"
               rb"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[\d.,]*(?:Z|[+-]\d\d:?\d\d)? (?:[\w.-]+ )?"
               rb"|kernel: ?|kern: ?\w{0,8}: |[\w.-]{1,64}: kern: ?\w{0,8}: |kern *:\w{1,8} *: "
               rb"|\[ *\+\d{1,10}\.\d{1,9}\] ?|\[\w{3}\d{1,2} \d\d:\d\d\] ?|\(XEN\) |(?:> ?)+)",
    # the process-name field of an NVRM Xid line ("name=<comm>, "): comm is at most 15 bytes
    "name_field": rb"\bname=[^\n]{0,15}, ",
    # an Xid header cut off at the end of a line (wrapped log)
    "xid_cut": rb"\bS?Xid\b\s*(?:\([^)\n]{0,80}\)?)?\s*:?\s*$",
    "pid": rb"\bpid=(\d+)",
    "caused_by": rb"caused by previous Xid (\d{1,6})",
    "ts_mono": rb"\[\s*(\d{1,10}\.\d{1,9})\]",
    "ts_dmesg_t": rb"\[\w{2,4}\.? (\S{3,6})\.? +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\]",
    "ts_iso": rb"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)",
    "ts_syslog": rb"^(\S{3,6}?)\.? +(\d{1,2}) (\d\d):(\d\d):(\d\d) ",
}

#: Month names/abbreviations (lower-case) -> month number, for localised syslog/dmesg dates:
#: English, German, French, Spanish, Italian, Portuguese, Dutch, Russian.
_MONTHS = {}
for _num, _names in enumerate(
    (
        "jan janv januar gen ene янв",
        "feb fév févr fev февр фев",
        "mar mär mrz mars мар",
        "apr avr abr апр",
        "may mai mag mei мая май",
        "jun juin giu июн",
        "jul juil lug июл",
        "aug aoû août ago авг",
        "sep sept set сен",
        "oct okt ott out окт",
        "nov ноя",
        "dec dez déc dic дек",
    ),
    start=1,
):
    for _n in _names.split():
        _MONTHS[_n] = _num
del _num, _names, _n

_DAYS_BEFORE_MONTH = (0, 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)


@lru_cache(maxsize=None)
def fmt(name: str) -> re.Pattern[bytes]:
    """The compiled format regex ``name`` (bytes pattern)."""
    return re.compile(_FORMATS[name])


def _bus_from_groups(domain: bytes | None, bus: bytes, dev: bytes) -> str:
    dom = (domain or b"0000")[-4:].decode("ascii").lower().rjust(4, "0")
    return f"{dom}:{bus.decode('ascii').lower()}:{dev.decode('ascii').lower()}"


def normalise_bus_id(text: str) -> str:
    """``"00000000:3B:00.0"`` / ``"PCI:0000:3b:00"`` / ``"3b:00.0"`` -> ``"0000:3b:00"``.

    Domain keeps its last four hex digits (nvidia-smi prints eight), bus and device are
    lower-cased, the PCI function and a MIG ``GPU-I:`` suffix are dropped.
    Raises :class:`EvidenceError` when ``text`` holds no bus id.
    """
    raw = text.strip().encode("utf-8", "replace")
    m = fmt("bus_paren").search(raw)
    if m is None:
        raise EvidenceError(f"not a PCI bus id: {text[:80]!r}")
    return _bus_from_groups(m.group(1), m.group(2), m.group(3))


def find_bus_id(line: bytes) -> str | None:
    """The first domain-qualified PCI bus id in ``line``, normalised, or None."""
    m = fmt("bus_full").search(line)
    if m is None:
        return None
    return _bus_from_groups(m.group(1), m.group(2), m.group(3))


class KernelHeader(NamedTuple):
    """The kernel-owned header a record begins with (a row of ``kernel_headers.toml``): ``id``,
    ``kind`` (``xid``/``sxid``/``gpu``/``node``), ``bus_id`` (normalised, or None for a node
    message), ``xid`` (the Xid/SXid number, or None), ``end`` (bytes of the record it covers)."""

    id: str
    kind: str
    bus_id: str | None
    xid: int | None
    end: int


def kernel_header(body: bytes) -> KernelHeader | None:
    """The kernel-owned header ``body`` begins with, or None.

    ``body`` is one record body: a ``/dev/kmsg`` record as read, or a saved log line after
    :func:`message_body`.  Only the start counts: every header is at least 16 bytes of the
    driver's own shape, so no process name (at most 15 bytes) the kernel prints before its own
    text can complete one (``tests/test_kernel_records.py`` checks every row).  Rows:
    ``slurm_ft/data/kernel_headers.toml``."""
    from slurm_ft.classify.table import kernel_headers

    if len(body) < 16:
        return None
    for row in kernel_headers():
        m = row.regex.match(body)
        if m is None:
            continue
        bus = xid = None
        groups = m.groupdict()
        if groups.get("bus"):
            b = fmt("bus_paren").fullmatch(groups["bus"])
            if b is None:
                continue
            bus = _bus_from_groups(b.group(1), b.group(2), b.group(3))
        if groups.get("xid"):
            xid = int(groups["xid"])
        return KernelHeader(row.id, row.kind, bus, xid, m.end())
    return None


class XidHit:
    """One parsed Xid/SXid: ``kind`` (``xid``/``sxid``), ``xid``, ``bus_id`` (None: the record
    names no bus id, the Xid is unplaced), ``pid``, ``caused_by`` (the Xid a 45 names, else None),
    ``header`` (the :class:`KernelHeader` id, or None for an unplaced Xid)."""

    __slots__ = ("kind", "xid", "bus_id", "pid", "caused_by", "header")

    def __init__(self, kind: str, xid: int, bus_id: str | None, pid: int | None, caused_by: int | None,
                 header: str | None = None):
        self.kind, self.xid, self.bus_id, self.pid, self.caused_by = kind, xid, bus_id, pid, caused_by
        self.header = header


def parse_xid(body: bytes) -> XidHit | None:
    """The Xid/SXid ``body`` begins with, or None.

    ``body`` is one record body (a ``/dev/kmsg`` record as read, or a saved log line after
    :func:`message_body`: use :func:`record_body`).  An Xid counts only as the kernel-owned
    header at the START of the record (:func:`kernel_header`, kinds ``xid``/``sxid``): an
    Xid-looking text anywhere else (a process or file name the kernel printed) is not one.
    The two old shapes without a bus id (``NVRM: Xid: 79,``, ``NVRM: Xid (3): 79,``) give a hit
    with ``bus_id`` None: *unplaced*, attributed to no job (they are short enough for a process
    name to forge, so they never decide anything: docs/security.md)."""
    hdr = kernel_header(body)
    if hdr is not None and hdr.kind in ("xid", "sxid"):
        kind, number, bus_id, end = hdr.kind, hdr.xid, hdr.bus_id, hdr.end
    else:
        if hdr is not None:
            return None
        m = fmt("xid_unplaced").match(body)
        if m is None:
            return None
        kind, number, bus_id, end = "xid", int(m.group(1)), None, m.end()
    rest = body[end:]
    p = fmt("pid").search(rest)
    c = fmt("caused_by").search(rest)
    return XidHit(kind, number, bus_id, int(p.group(1)) if p else None, int(c.group(1)) if c else None,
                  hdr.id if hdr is not None else None)


def message_body(line: bytes) -> bytes:
    """``line`` without the wrappers saved logs put in front of a kernel message (syslog, ISO and
    ``dmesg -T`` stamps with a host name, ``kernel:``, printk ``[  219.470994]`` stamps, ``dmesg
    -x`` ``kern  :warn  :`` and ``dmesg -d``/``-H`` ``[  +0.000005]`` stamps, ``<3>`` levels, ``xl
    dmesg``'s ``(XEN)``, the ``> `` of a quoted log).
    For saved logs only: a ``/dev/kmsg`` record body has no wrapper and is never stripped (a
    process name must not be able to pass for one)."""
    wrapper = fmt("wrapper")
    for _ in range(8):
        m = wrapper.match(line)
        if m is None or not m.end():
            break
        line = line[m.end():]
    return line


def record_body(line: bytes, kernel_records: bool) -> bytes:
    """The record body of one kernel-log line: ``line`` itself for a ``/dev/kmsg`` record
    (``kernel_records``), else the saved log line without its log tool's wrappers."""
    return line if kernel_records else message_body(line)


def mask_user_fields(line: bytes) -> bytes:
    """``line`` with the process-name field of an NVRM line (``name=<comm>, ``) blanked, so rules
    that read the driver's text after the Xid number never read the name a user gave a process."""
    if b"name=" not in line:
        return line
    return fmt("name_field").sub(b"name=?, ", line)


def _civil_seconds(year: int, month: int, day: int, hh: int, mm: int, ss: int) -> float:
    """Seconds since 0001-01-01 for a proleptic Gregorian date (no time zone; only differences matter)."""
    y = year - 1
    days = y * 365 + y // 4 - y // 100 + y // 400 + _DAYS_BEFORE_MONTH[month] + day
    if month > 2 and (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)):
        days += 1
    return float(((days * 24 + hh) * 60 + mm) * 60 + ss)


def _month(token: bytes) -> int | None:
    t = token.decode("utf-8", "replace").lower().rstrip(".")
    return _MONTHS.get(t) or _MONTHS.get(t[:3])


def parse_time(line: bytes) -> tuple[str, float] | None:
    """The line's timestamp as ``(clock, seconds)``; ``clock`` is ``"mono"`` (printk seconds since
    boot) or ``"wall"`` (seconds on a civil calendar, no zone; syslog lines without a year use
    year 1).  Only differences between stamps of the same clock are meaningful.  None if absent."""
    m = fmt("ts_mono").search(line)
    if m is not None:
        return ("mono", float(m.group(1)))
    m = fmt("ts_dmesg_t").search(line)
    if m is not None:
        mon = _month(m.group(1))
        if mon:
            return ("wall", _civil_seconds(int(m.group(6)), mon, int(m.group(2)), *(int(m.group(k)) for k in (3, 4, 5))))
    m = fmt("ts_iso").search(line)
    if m is not None:
        y, mo, d, hh, mi, ss = (int(g) for g in m.groups())
        if 1 <= mo <= 12 and 1 <= d <= 31:
            return ("wall", _civil_seconds(y, mo, d, hh, mi, ss))
    m = fmt("ts_syslog").search(line)
    if m is not None:
        mon = _month(m.group(1))
        if mon:
            return ("wall", _civil_seconds(1, mon, int(m.group(2)), *(int(m.group(k)) for k in (3, 4, 5))))
    return None
