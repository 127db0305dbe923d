"""Line grammar: PCI bus ids, NVRM Xid/SXid lines, kernel-log timestamps.

This module knows *formats*, not faults: what a line means is decided by the data tables
(``slurm_ft/data/xid_catalog.csv``, ``signatures.toml``).  All format regexes live in
:data:`_FORMATS`, compiled once on first use.

Formats handled (NVIDIA driver ``nv_report_error``/``nvErrorLog`` output over the years):
  ``NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, ...``   (r450+)
  ``NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, ...``                 (MIG)
  ``NVRM: Xid (0000:03:00): 13, 0003 00000000 ...``  ``NVRM: Xid (3): 79, ...``  (old, no PCI:)
  ``NVRM: Xid: 79, GPU has fallen off the bus.``                              (no bus id)
  ``nvidia-nvswitch1: SXid (PCI:0000:86:00.0): 24007, Fatal, ...``            (NVSwitch)
Timestamps: ``[  219.470994]`` (printk, seconds since boot), ``[Fri Aug 30 11:43:09 2024]``
(``dmesg -T``), ``Dec  2 11:38:47`` (syslog, month names in several languages), ISO 8601.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..errors import EvidenceError

_FORMATS = {
    # a bus id with a PCI domain: 0000:3b:00 / 00000000:3B:00.0
    "bus_full": rb"\b([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?\b",
    # bus id inside an Xid's parentheses: domain optional
    "bus_paren": rb"(?:PCI:)?(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?",
    # Xid / SXid header: kind, optional parenthesised location, number
    "xid": rb"\b(S?)Xid\b\s*(?:\(([^)\n]{0,80})\))?\s*:?\s*(\d{1,6})\b",
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


class XidHit:
    """One parsed Xid/SXid header: ``kind`` (``xid``/``sxid``), ``xid``, ``bus_id``, ``pid``,
    ``caused_by`` (the Xid a 45 names, else None)."""

    __slots__ = ("kind", "xid", "bus_id", "pid", "caused_by")

    def __init__(self, kind: str, xid: int, bus_id: str | None, pid: int | None, caused_by: int | None):
        self.kind, self.xid, self.bus_id, self.pid, self.caused_by = kind, xid, bus_id, pid, caused_by


def parse_xid(line: bytes) -> XidHit | None:
    """Parse the first Xid/SXid header in ``line`` (anywhere: wrappers such as syslog, journald
    JSON or a health agent's prefix are skipped), or None."""
    for m in fmt("xid").finditer(line):
        kind = "sxid" if m.group(1) else "xid"
        number = int(m.group(3))
        bus_id = None
        where = m.group(2)
        if where:
            b = fmt("bus_paren").search(where)
            if b is not None:
                bus_id = _bus_from_groups(b.group(1), b.group(2), b.group(3))
        rest = line[m.end():]
        p = fmt("pid").search(rest)
        c = fmt("caused_by").search(rest)
        return XidHit(kind, number, bus_id, int(p.group(1)) if p else None, int(c.group(1)) if c else None)
    return None


def join_wrapped(lines: list[bytes]) -> list[bytes]:
    """Re-join an Xid header that a log wrapper cut after ``Xid (PCI:...):`` with its next line."""
    out: list[bytes] = []
    cut = fmt("xid_cut")
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if i + 1 < n and b"id" in line and cut.search(line):
            out.append(line.rstrip() + b" " + lines[i + 1].lstrip())
            i += 2
            continue
        out.append(line)
        i += 1
    return out


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
