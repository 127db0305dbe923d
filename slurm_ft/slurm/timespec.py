"""Slurm's time specifications, as ``sacct -S/-E`` reads them (``man sacct``, Slurm's
``parse_time`` with ``past`` set), for ``ft-history``.

Accepted (case-insensitive, surrounding blanks ignored)::

    HH:MM[:SS][AM|PM]                    today at that time (even if later than now)
    MMDD[YY][-HH:MM[:SS]]                a date without a year is this year, or last year
    MM.DD[.YY][-HH:MM[:SS]]              when its month is after the current one
    MM/DD[/YY][-HH:MM[:SS]]
    YYYY-MM-DD[THH:MM[:SS]]              a date without a time is its 00:00:00
    today, tomorrow                      (00:00, or with a time: ``today 15:00``, ``today-noon``)
    midnight, noon, elevenses, fika, teatime     00:00, 12:00, 11:00, 15:00, 16:00 today
    now[{+|-}count[seconds|minutes|hours|days|weeks]]     seconds when no unit is given
    uts<epoch seconds>                   (Slurm's own spelling of a Unix time stamp)

Times are local. Anything else, or an impossible date (``02/30``), is a :class:`ValueError`
whose message names the accepted forms; the CLI turns it into a usage error.
"""

from __future__ import annotations

import re
import time
from datetime import date, datetime, timedelta

FORMATS = ("HH:MM[:SS][AM|PM], MMDD[YY][-HH:MM[:SS]], MM.DD[.YY][-HH:MM[:SS]], MM/DD[/YY][-HH:MM[:SS]], "
           "YYYY-MM-DD[THH:MM[:SS]], today, midnight, noon, elevenses, fika, teatime, "
           "now[{+|-}count[seconds|minutes|hours|days|weeks]]")

_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}
_NOW = re.compile(r"now(?:\s*([+-])\s*(\d{1,9})\s*(?:(second|minute|hour|day|week)s?)?)?")
_UTS = re.compile(r"uts(\d{7,12})")
_NAMED_TIMES = {"midnight": (0, 0, 0), "noon": (12, 0, 0), "elevenses": (11, 0, 0), "fika": (15, 0, 0),
                "teatime": (16, 0, 0)}
_TIME = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(am|pm)?")
_DATES = (
    re.compile(r"(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})"),
    re.compile(r"(?P<m>\d{2})(?P<d>\d{2})(?P<yy>\d{2})?"),
    re.compile(r"(?P<m>\d{1,2})\.(?P<d>\d{1,2})(?:\.(?P<yy>\d{2}))?"),
    re.compile(r"(?P<m>\d{1,2})/(?P<d>\d{1,2})(?:/(?P<yy>\d{2}))?"),
)


def parse_time(text: str, now: float | None = None) -> float:
    """Epoch seconds for a Slurm time specification (see the module doc); ``now`` for tests."""
    now = time.time() if now is None else now
    s = text.strip().lower()
    if not s:
        raise ValueError(f"empty time; use one of: {FORMATS}")
    m = _UTS.fullmatch(s)
    if m:
        return float(m.group(1))
    m = _NOW.fullmatch(s)
    if m:
        if not m.group(1):
            return float(now)
        delta = int(m.group(2)) * _UNITS[m.group(3) or "second"]
        return float(now + delta if m.group(1) == "+" else now - delta)
    today = datetime.fromtimestamp(now).date()
    day, rest = _date_part(s, today)
    if rest and day is not None:
        if rest[0] not in "t- " and not rest[0].isspace():
            raise _bad(text)
        rest = rest[1:].strip()
    hms = _time_part(rest, text) if rest else None
    if day is None and hms is None:
        raise _bad(text)
    day = day or today                      # a time alone is today's (sacct looks into the past)
    h, mi, sec = hms or (0, 0, 0)
    return datetime(day.year, day.month, day.day, h, mi, sec).timestamp()


def _bad(text: str) -> ValueError:
    return ValueError(f"{text!r} is not a time Slurm understands; use one of: {FORMATS}")


def _date_part(s: str, today: date) -> tuple[date | None, str]:
    """(the date at the start of ``s`` or None, what follows it)."""
    for word, offset in (("today", 0), ("tomorrow", 1)):
        if s.startswith(word):
            return today + timedelta(days=offset), s[len(word):]
    if _TIME.match(s) and _TIME.match(s).group(0).count(":"):
        return None, s                      # starts with HH:MM: no date
    for pattern in _DATES:
        m = pattern.match(s)
        if not m:
            continue
        g = m.groupdict()
        month, mday = int(g["m"]), int(g["d"])
        if g.get("y"):
            year = int(g["y"])
        elif g.get("yy"):
            year = 2000 + int(g["yy"])
        else:                               # no year: this year, or last year for a later month
            year = today.year - 1 if month > today.month else today.year
        try:
            return date(year, month, mday), s[m.end():]
        except ValueError:
            raise ValueError(f"{s!r}: no such date ({year:04d}-{month:02d}-{mday:02d})") from None
    return None, s


def _time_part(s: str, text: str) -> tuple[int, int, int]:
    if s in _NAMED_TIMES:
        return _NAMED_TIMES[s]
    m = _TIME.fullmatch(s)
    if not m:
        raise _bad(text)
    hour, minute, second = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    ampm = m.group(4)
    if ampm:
        if not 1 <= hour <= 12:
            raise ValueError(f"{text!r}: hour {hour} with {ampm.upper()}")
        hour = hour % 12 + (12 if ampm == "pm" else 0)
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"{text!r}: no such time of day")
    return hour, minute, second
