"""The classifier's data: frozen rows loaded once from ``slurm_ft/data/``.

* ``xid_catalog.csv``: one row per NVIDIA Xid code (156 codes): the catalog meaning (paraphrased),
  NVIDIA's immediate-action bucket, whether the catalog calls it hardware, and slurm-ft's default
  ``class``/``action``/``rank`` with the reason (``policy``) and the ``source`` of the facts;
  ``repair`` (reset/reboot/none, from the bucket) and ``cancels`` (the Xid a later one undoes).
* ``signatures.toml``: one row per kind of non-Xid evidence (see the file header for fields).
* ``classify_policy.toml``: default count/window rules.
* ``kernel_headers.toml``: the kernel-owned record headers a kernel record must begin with to be
  evidence for hardware (docs/security.md).

Rows are validated on load; a broken data file is a packaging bug and raises ConfigError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from slurm_ft.data import data_text as _data_text
from slurm_ft.errors import ConfigError
from slurm_ft.classify.model import ACTIONS, CLASSES

#: Repairs a catalog row may call for (``repair`` column, from NVIDIA's immediate-action bucket:
#: RESET_GPU and the Xid 48 / NVLink workflows -> reset; RESTART_BM/RESTART_VM/XID_154 -> reboot).
REPAIRS = ("reset", "reboot", "none")
SOURCES = ("kernel", "output", "any", "slurm_state", "exit", "xid", "sxid")


@dataclass(frozen=True)
class XidRow:
    """Catalog row: ``xid`` code, default ``cls``/``action``, ``rank`` (higher wins when several
    Xids are seen: the root cause outranks its consequences), ``meaning`` (paraphrased from
    NVIDIA's Xid catalog), ``bucket`` (NVIDIA's immediate action), ``policy`` (why this class)."""

    xid: int
    cls: str
    action: str
    rank: int
    meaning: str = ""
    bucket: str = ""
    policy: str = ""
    source: str = ""
    #: The repair NVIDIA's immediate-action bucket calls for (``reset``, ``reboot`` or ``none``),
    #: used by ``[remediate]`` (slurm_ft.remediate; docs/drain-report.md, "Break-fix remediation").
    repair: str = "none"
    #: Xid codes this one cancels when it follows them on the same GPU (catalog pairs: 162/163).
    cancels: frozenset[int] = frozenset()

    @property
    def id(self) -> str:
        return f"xid-{self.xid}"


@dataclass(frozen=True)
class Signature:
    """Signature row (fields documented in ``signatures.toml``); ``regex`` is compiled from
    ``pattern`` as a case-insensitive bytes regex."""

    id: str
    source: str
    keys: tuple[bytes, ...]
    pattern: str
    cls: str
    action: str
    priority: int
    example: str
    ref: str
    scope: str | None = None
    xids: frozenset[int] | None = None

    @property
    def regex(self) -> re.Pattern[bytes]:
        return _compile(self.pattern)


@dataclass(frozen=True)
class CountRule:
    """Count/window rule: at least ``count`` distinct occurrences of ``xids`` on one GPU within
    ``window_s`` seconds re-classify those events as ``cls``/``action`` with ``priority``."""

    id: str
    xids: frozenset[int]
    count: int
    window_s: float
    cls: str
    action: str
    priority: int
    ref: str = ""


@lru_cache(maxsize=None)
def _compile(pattern: str) -> re.Pattern[bytes]:
    return re.compile(pattern.encode("utf-8"), re.IGNORECASE)


def _check_class_action(where: str, cls: object, action: object) -> None:
    if cls not in CLASSES or cls == "ok":
        raise ConfigError(f"{where}: class must be one of {', '.join(c for c in CLASSES if c != 'ok')}, got {cls!r}")
    if action not in ACTIONS:
        raise ConfigError(f"{where}: action must be one of {', '.join(ACTIONS)}, got {action!r}")


@lru_cache(maxsize=1)
def xid_catalog() -> dict[int, XidRow]:
    """The shipped Xid catalog, keyed by code."""
    import csv  # local: loaded on first classification, not at import

    rows: dict[int, XidRow] = {}
    for rec in csv.DictReader(_data_text("xid_catalog.csv").splitlines()):
        where = f"xid_catalog.csv xid {rec.get('xid')}"
        _check_class_action(where, rec["class"], rec["action"])
        row = XidRow(
            xid=int(rec["xid"]), cls=rec["class"], action=rec["action"], rank=int(rec["rank"]),
            meaning=rec["meaning"], bucket=rec["bucket"], policy=rec["policy"], source=rec["source"],
            repair=rec.get("repair") or "none",
            cancels=frozenset(int(x) for x in (rec.get("cancels") or "").split() if x.isdigit()),
        )
        if row.repair not in REPAIRS:
            raise ConfigError(f"{where}: repair must be one of {', '.join(REPAIRS)}, got {row.repair!r}")
        rows[row.xid] = row
    return rows


def signature_from_dict(rec: dict, where: str, *, compile_pattern: bool = True) -> Signature:
    """Build and validate one signature row (also used for admin-added rows).

    ``compile_pattern=False`` (the shipped table only) leaves the regex to be compiled on first
    use: a classification compiles only the rows whose keys it meets, which keeps the epilog's
    start-up short.  ``tests/test_classify_table.py`` compiles and checks every shipped row."""
    required = ("id", "source", "keys", "pattern", "class", "action", "priority", "example", "ref")
    allowed = set(required) | {"scope", "xids"}
    for key in rec:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r}")
    for key in required:
        if key not in rec:
            raise ConfigError(f"{where}: missing key {key!r}")
    if rec["source"] not in SOURCES:
        raise ConfigError(f"{where}.source: one of {', '.join(SOURCES)}, got {rec['source']!r}")
    _check_class_action(where, rec["class"], rec["action"])
    keys = rec["keys"]
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k and k == k.lower() for k in keys):
        raise ConfigError(f"{where}.keys: a non-empty list of lower-case strings")
    if not isinstance(rec["pattern"], str):
        raise ConfigError(f"{where}.pattern: a string")
    try:
        if compile_pattern:
            _compile(rec["pattern"])
    except re.error as exc:
        raise ConfigError(f"{where}.pattern: invalid regex: {exc}") from None
    if rec.get("scope") not in (None, "gpu"):
        raise ConfigError(f"{where}.scope: only 'gpu', got {rec['scope']!r}")
    xids = rec.get("xids")
    return Signature(
        id=rec["id"], source=rec["source"], keys=tuple(k.encode("utf-8") for k in keys), pattern=rec["pattern"],
        cls=rec["class"], action=rec["action"], priority=int(rec["priority"]), example=rec["example"],
        ref=rec["ref"], scope=rec.get("scope"), xids=frozenset(int(x) for x in xids) if xids else None,
    )


@lru_cache(maxsize=1)
def signatures() -> tuple[Signature, ...]:
    """The shipped signature rows, in file order."""
    import tomllib

    data = tomllib.loads(_data_text("signatures.toml"))
    rows = tuple(signature_from_dict(rec, f"signatures.toml [{i}] {rec.get('id')}", compile_pattern=False)
                 for i, rec in enumerate(data["signature"]))
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise ConfigError("signatures.toml: duplicate ids")
    return rows


@lru_cache(maxsize=1)
def count_rules() -> tuple[CountRule, ...]:
    """The shipped default count/window rules."""
    import tomllib

    data = tomllib.loads(_data_text("classify_policy.toml"))
    out = []
    for rec in data.get("count", []):
        _check_class_action(f"classify_policy.toml {rec.get('id')}", rec["class"], rec["action"])
        out.append(CountRule(
            id=rec["id"], xids=frozenset(rec["xids"]), count=int(rec["count"]), window_s=float(rec["window_s"]),
            cls=rec["class"], action=rec["action"], priority=int(rec["priority"]), ref=rec.get("ref", ""),
        ))
    return tuple(out)


@dataclass(frozen=True)
class HeaderRow:
    """One kernel-owned record header (``data/kernel_headers.toml``): ``kind`` is ``xid``,
    ``sxid`` (groups ``bus`` and ``xid``), ``gpu`` (group ``bus``) or ``node``; ``regex`` is a
    case-sensitive bytes regex matched at the start of a record body."""

    id: str
    kind: str
    regex: re.Pattern[bytes]
    example: str
    ref: str


#: Header kinds: an NVIDIA Xid, an NVSwitch SXid, a record about one PCI device, a node message.
HEADER_KINDS = ("xid", "sxid", "gpu", "node")
#: A header is longer than any process or interface name the kernel may print first (15 bytes).
MIN_HEADER_BYTES = 16


@lru_cache(maxsize=1)
def kernel_headers() -> tuple[HeaderRow, ...]:
    """The kernel-owned record headers of ``data/kernel_headers.toml``, in file order.  Raises
    :class:`ConfigError` when the shipped file is malformed (a missing field, an unknown kind, a
    regex that does not compile, lacks the groups its kind needs or does not match its example)."""
    import tomllib

    out = []
    for n, rec in enumerate(tomllib.loads(_data_text("kernel_headers.toml")).get("header", []), 1):
        where = f"kernel_headers.toml header {n} ({rec.get('id')})"
        try:
            row = HeaderRow(id=str(rec["id"]), kind=str(rec["kind"]), regex=re.compile(rec["regex"].encode("utf-8")),
                            example=str(rec["example"]), ref=str(rec["ref"]))
        except (KeyError, TypeError, AttributeError, re.error) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        need = {"xid": {"bus", "xid"}, "sxid": {"bus", "xid"}, "gpu": {"bus"}, "node": set()}.get(row.kind)
        if need is None:
            raise ConfigError(f"{where}: kind must be one of {', '.join(HEADER_KINDS)}, got {row.kind!r}")
        if not need <= set(row.regex.groupindex):
            raise ConfigError(f"{where}: kind {row.kind} needs the groups {sorted(need)}")
        m = row.regex.match(row.example.encode("utf-8"))
        if m is None or m.end() < MIN_HEADER_BYTES:
            raise ConfigError(f"{where}: does not match its example with at least {MIN_HEADER_BYTES} bytes")
        out.append(row)
    if len({r.id for r in out}) != len(out):
        raise ConfigError("kernel_headers.toml: duplicate ids")
    return tuple(out)
