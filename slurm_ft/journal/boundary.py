"""The journal's one input boundary: every value a row carries is made storable here, once.

Text reaches the journal from places slurm-ft does not control: job names and users from Slurm,
job output excerpts, checkpoint-delivery reports (the job owner's to forge), node fields. Python
strings can hold what SQLite and UTF-8 cannot (a lone surrogate such as ``"\\udcff"``, the way
``surrogateescape`` smuggles an undecodable byte), and a string can be of any length. One such
value used to make every later write fail: sqlite3 raises ``UnicodeEncodeError`` while binding it.

The rule is structural, not a list of bad shapes: :func:`clean_row` is the only way into a row
(:meth:`slurm_ft.journal.store.Journal._write` calls it for every write, the spool's rows on the
way back in too), and whatever it returns is storable:

- ``str`` and ``bytes``: valid UTF-8 (lone surrogates, undecodable bytes and NUL, which C readers
  such as the ``sqlite3`` shell cut text at, become U+FFFD), at most :data:`MAX_TEXT` characters;
- ``bool`` -> 0/1, ``int`` within SQLite's signed 64 bits, ``float``, ``None`` unchanged;
- JSON columns (:data:`JSON_COLUMNS`): a list/dict cleaned recursively (strings at most
  :data:`MAX_ITEM_TEXT` characters, containers at most :data:`MAX_ITEMS` entries) and encoded
  here, so a bound never cuts a JSON document in half;
- anything else: its ``str()``, cleaned as text.

An ``int`` outside 64 bits cannot be stored faithfully: :class:`~slurm_ft.errors.JournalError`,
raised to the caller at the call, never queued.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping

from slurm_ft.errors import JournalError

#: Characters kept of one text value (a truncated one ends with :data:`CUT`).
MAX_TEXT = 16384
#: Characters kept of one string inside a JSON column, and entries kept of one list or dict there.
MAX_ITEM_TEXT, MAX_ITEMS = 2048, 64
#: The end of a value cut to its bound.
CUT = "…"
#: Columns that hold JSON (lists), encoded by :func:`clean_row`: (table, column).
JSON_COLUMNS = frozenset({("verdicts", "xids"), ("verdicts", "evidence")})

_INT64 = (-(1 << 63), (1 << 63) - 1)
_UNSTORABLE = re.compile("[\ud800-\udfff]")


def text(value: str | bytes, limit: int = MAX_TEXT) -> str:
    """``value`` as valid UTF-8 text of at most ``limit`` characters: every lone surrogate,
    undecodable byte and NUL replaced by U+FFFD; a longer one cut, ending with :data:`CUT`.
    Idempotent."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        s = bytes(value).decode("utf-8", "replace")
    else:
        # every surrogate code point (a lone one, or half of a pair a Python str may hold) is one
        # that UTF-8 cannot carry; all other code points can
        s = _UNSTORABLE.sub("\ufffd", str(value))
    s = s.replace("\x00", "\ufffd")
    return s if len(s) <= limit else s[:limit - len(CUT)] + CUT


def value(v: Any, limit: int = MAX_TEXT) -> Any:
    """One scalar column value made storable (see the module doc). Raises :class:`JournalError`
    for an ``int`` outside SQLite's 64 bits."""
    if v is None or isinstance(v, float):
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        if not _INT64[0] <= v <= _INT64[1]:
            raise JournalError(f"journal: integer {v} is outside SQLite's 64-bit range")
        return v
    if isinstance(v, (str, bytes, bytearray, memoryview)):
        return text(v, limit)
    return text(str(v), limit)


def _tree(v: Any) -> Any:
    """A JSON-able copy of ``v`` with every string cleaned and every container bounded."""
    if isinstance(v, Mapping):
        return {text(str(k) if not isinstance(k, (str, bytes)) else k, MAX_ITEM_TEXT): _tree(x)
                for k, x in list(v.items())[:MAX_ITEMS]}
    if isinstance(v, (list, tuple)):
        return [_tree(x) for x in list(v)[:MAX_ITEMS]]
    if isinstance(v, int) and not isinstance(v, bool) and not _INT64[0] <= v <= _INT64[1]:
        return str(v)
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return str(v)
    if v is None or isinstance(v, (bool, int, float)):
        return v
    return text(v if isinstance(v, (str, bytes)) else str(v), MAX_ITEM_TEXT)


def json_text(v: Any) -> str:
    """``v`` (a list, a dict, or JSON text written earlier) as JSON text that decodes, of at most
    :data:`MAX_TEXT` characters: the last entries of a longer list (dict) are dropped."""
    if isinstance(v, (str, bytes)):
        try:
            v = json.loads(v)
        except ValueError:
            v = [v]
    tree = _tree(v if v is not None else [])
    out = json.dumps(tree, ensure_ascii=False)
    while len(out) > MAX_TEXT and isinstance(tree, (list, dict)) and tree:
        tree.pop() if isinstance(tree, list) else tree.popitem()
        out = json.dumps(tree, ensure_ascii=False)
    return out if len(out) <= MAX_TEXT else json.dumps(None)


def clean_row(table: str, row: Mapping[str, Any], columns: Iterable[str]) -> dict:
    """``row`` reduced to ``columns`` with every value made storable (the module doc's rule).
    Raises :class:`JournalError` for a value that cannot be stored faithfully."""
    cols = set(columns)
    out = {}
    for k, v in row.items():
        if k not in cols:
            continue
        out[k] = json_text(v) if (table, k) in JSON_COLUMNS else value(v)
    return out


def params(args: Iterable[Any]) -> list:
    """Query parameters made bindable the same way (a read never fails on what a caller passes)."""
    return [value(a) for a in args]
