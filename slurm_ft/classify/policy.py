"""Classification policy: the shipped tables plus the admin's ``[classify]`` overrides.

``[classify]`` schema (every key optional; unknown keys raise ConfigError naming the key)::

    [classify]
    disable = ["nccl-watchdog-timeout"]     # signature ids to switch off

    [classify.xid.92]                       # per-Xid override of the catalog default
    class = "hardware"                      # hardware | user | infra | hang | unknown
    action = "drain_node"                   # drain_node | reset_gpu | retry | none (default: by class)
    rank = 900                              # optional; higher wins among several Xids

    [classify.xid.31]                       # count/window rule: only when it recurs
    count = 3                               # distinct occurrences (processes) on the same GPU
    window_s = 3600                         # ... within this many seconds
    class = "hardware"

    [classify.signature.cuda-oom]           # re-class a signature row
    class = "user"
    action = "none"
    priority = 700

    [[classify.add]]                        # an extra signature row (fields as in signatures.toml)
    id = "site-lustre-evict"
    ...

``disable`` also switches off a consequence rule by its id (``[[consequence]]`` in
``slurm_ft/data/classify_policy.toml``, see :mod:`.consequence`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from slurm_ft.errors import ConfigError
from slurm_ft.classify.consequence import ConsequenceRule
from slurm_ft.classify.model import ACTIONS, CLASSES, DEFAULT_ACTION
from slurm_ft.classify.recurrence import RecurrenceRule, recurrence_rules
from slurm_ft.classify.table import (
    _data_text, CountRule, Signature, XidRow, count_rules, signature_from_dict, signatures,
    xid_catalog)

#: Rank given to an overridden Xid when the admin names none, and to codes missing from the catalog.
DEFAULT_RANK = {"hardware": 900, "user": 500, "infra": 400, "hang": 350, "unknown": 600}
UNLISTED_XID_RANK = 100

_XID_KEYS = {"class", "action", "rank", "count", "window_s"}
_SIG_KEYS = {"class", "action", "priority"}
_TOP_KEYS = {"disable", "xid", "signature", "add", "unexplained_exit"}
#: What a non-zero exit that no row explains becomes (``[classify] unexplained_exit``).
UNEXPLAINED_EXIT = ("user", "unknown")


@dataclass(frozen=True)
class Policy:
    """Everything :func:`slurm_ft.classify.classify` decides with.

    xids: catalog rows by code.  signatures: active signature rows.  counts: count/window rules.
    consequences: consequence rules (:mod:`.consequence`).
    ``index`` (derived): source -> key -> rows holding that key, for the prefilter scan.
    """

    xids: dict[int, XidRow]
    signatures: tuple[Signature, ...]
    counts: tuple[CountRule, ...]
    consequences: tuple[ConsequenceRule, ...] = ()
    recurrences: tuple[RecurrenceRule, ...] = ()
    #: ``user`` (the shipped default, the product document: a failure without a hardware signal
    #: is not failed over) or ``unknown``: a job that exited non-zero with nothing in its evidence
    #: but the exit status (rule ``exit-nonzero``) gets verdict ``unknown``, rule
    #: ``exit-unexplained``: nothing points at the user's code, so a site that sets ``[failover]
    #: retry_unknown`` retries it elsewhere, unblamed, within ``unblamed_retries``.
    unexplained_exit: str = "user"
    index: dict[str, dict[bytes, tuple[Signature, ...]]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, dict[bytes, list[Signature]]] = {}
        for sig in self.signatures:
            targets = ("kernel", "output") if sig.source == "any" else (sig.source,)
            for target in targets:
                for key in sig.keys:
                    index.setdefault(target, {}).setdefault(key, []).append(sig)
        object.__setattr__(self, "index", {s: {k: tuple(v) for k, v in d.items()} for s, d in index.items()})

    def xid_row(self, xid: int) -> XidRow:
        """The catalog row for ``xid``; codes NVIDIA has not published yet get an ``unknown`` row."""
        row = self.xids.get(xid)
        if row is None:
            return XidRow(xid=xid, cls="unknown", action="none", rank=UNLISTED_XID_RANK,
                          meaning="not in the shipped Xid catalog", policy="unlisted code: undetermined")
        return row

    def qualifiers(self, kind: str) -> tuple[Signature, ...]:
        """Signature rows that qualify Xid (``kind="xid"``) or SXid lines, in table order."""
        return tuple(s for s in self.signatures if s.source == kind)


@lru_cache(maxsize=1)
def consequence_rules() -> tuple[ConsequenceRule, ...]:
    """The shipped ``[[consequence]]`` rules of ``classify_policy.toml``.

    Each needs ``id`` (str), ``xids`` and ``after`` (non-empty lists of Xid codes, disjoint) and
    ``ref`` (non-empty str); nothing else.  Raises :class:`ConfigError` naming the rule and key.
    """
    import tomllib

    out: list[ConsequenceRule] = []
    for n, rec in enumerate(tomllib.loads(_data_text("classify_policy.toml")).get("consequence", [])):
        where = f"classify_policy.toml consequence[{n}]"
        if not isinstance(rec, dict):
            raise ConfigError(f"{where}: must be a table")
        _check_table(where, rec, {"id", "xids", "after", "ref"})
        for key in ("id", "xids", "after", "ref"):
            if key not in rec:
                raise ConfigError(f"{where}: missing key {key!r}")
        if not isinstance(rec["id"], str) or not rec["id"]:
            raise ConfigError(f"{where}.id: a non-empty string")
        if not isinstance(rec["ref"], str) or not rec["ref"].strip():
            raise ConfigError(f"{where}.ref: a non-empty string")
        codes = {}
        for key in ("xids", "after"):
            value = rec[key]
            if not isinstance(value, list) or not value:
                raise ConfigError(f"{where}.{key}: a non-empty list of Xid codes")
            codes[key] = frozenset(_int(f"{where}.{key}", x, 1) for x in value)
        if codes["xids"] & codes["after"]:
            raise ConfigError(f"{where}: an Xid cannot be its own cause ({sorted(codes['xids'] & codes['after'])})")
        out.append(ConsequenceRule(id=rec["id"], xids=codes["xids"], after=codes["after"], ref=rec["ref"]))
    ids = [r.id for r in out]
    if len(set(ids)) != len(ids):
        raise ConfigError("classify_policy.toml: duplicate consequence ids")
    return tuple(out)


@lru_cache(maxsize=1)
def default_policy() -> Policy:
    """The shipped policy: the Xid catalog's default classes, every signature row, default count
    and consequence rules."""
    return Policy(xids=dict(xid_catalog()), signatures=signatures(), counts=count_rules(),
                  consequences=consequence_rules(), recurrences=recurrence_rules())


def _cls_action(where: str, spec: dict[str, Any], default_cls: str, default_action: str) -> tuple[str, str]:
    cls = spec.get("class", default_cls)
    if cls not in CLASSES or cls == "ok":
        raise ConfigError(f"{where}.class: one of {', '.join(c for c in CLASSES if c != 'ok')}, got {cls!r}")
    action = spec.get("action", DEFAULT_ACTION[cls] if "class" in spec else default_action)
    if action not in ACTIONS:
        raise ConfigError(f"{where}.action: one of {', '.join(ACTIONS)}, got {action!r}")
    return cls, action


def _int(where: str, value: Any, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if low is not None and value < low:
        raise ConfigError(f"{where}: must be >= {low}, got {value}")
    return value


def _check_table(where: str, spec, known) -> None:
    """``spec`` must be a TOML table whose keys are all in ``known``; else ConfigError naming the key."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: must be a table")
    for key in spec:
        if key not in known:
            raise ConfigError(f"unknown key {where}.{key} (known: {', '.join(sorted(known))})")


def from_config(table: dict[str, Any]) -> Policy:
    """Validate the ``[classify]`` TOML table and return the resulting policy.

    Raises :class:`ConfigError` naming the offending key (``classify.xid.31.window_s: ...``).
    """
    if not isinstance(table, dict):
        raise ConfigError("[classify]: must be a table")
    for key in table:
        if key not in _TOP_KEYS:
            raise ConfigError(f"unknown key classify.{key} (known: {', '.join(sorted(_TOP_KEYS))})")
    base = default_policy()
    xids = dict(base.xids)
    counts = list(base.counts)
    sigs = list(base.signatures)
    known_ids = {s.id for s in sigs}

    for raw, spec in (table.get("xid") or {}).items():
        where = f"classify.xid.{raw}"
        try:
            code = int(raw)
        except ValueError:
            raise ConfigError(f"{where}: Xid must be a number") from None
        if not 0 < code < 1_000_000:
            raise ConfigError(f"{where}: Xid out of range")
        _check_table(where, spec, _XID_KEYS)
        row = base.xid_row(code)
        cls, action = _cls_action(where, spec, row.cls, row.action)
        rank = _int(f"{where}.rank", spec["rank"], 0) if "rank" in spec else (
            DEFAULT_RANK[cls] if "class" in spec else row.rank)
        if "count" in spec or "window_s" in spec:
            if "count" not in spec or "window_s" not in spec or "class" not in spec:
                raise ConfigError(f"{where}: a count rule needs count, window_s and class")
            count = _int(f"{where}.count", spec["count"], 1)
            window = spec["window_s"]
            if isinstance(window, bool) or not isinstance(window, (int, float)) or window <= 0:
                raise ConfigError(f"{where}.window_s: a number of seconds > 0, got {window!r}")
            counts = [replace(c, xids=c.xids - {code}) for c in counts]
            counts.append(CountRule(id=f"xid-{code}-count", xids=frozenset({code}), count=count,
                                    window_s=float(window), cls=cls, action=action, priority=rank,
                                    ref="admin override (slurm-ft.toml)"))
        else:
            xids[code] = replace(row, cls=cls, action=action, rank=rank, policy="admin override (slurm-ft.toml)")

    for sid, spec in (table.get("signature") or {}).items():
        where = f"classify.signature.{sid}"
        if sid not in known_ids:
            raise ConfigError(f"{where}: no signature row with this id")
        _check_table(where, spec, _SIG_KEYS)
        i = next(i for i, s in enumerate(sigs) if s.id == sid)
        cls, action = _cls_action(where, spec, sigs[i].cls, sigs[i].action)
        prio = _int(f"{where}.priority", spec["priority"], 0) if "priority" in spec else sigs[i].priority
        sigs[i] = replace(sigs[i], cls=cls, action=action, priority=prio)

    added = table.get("add") or []
    if not isinstance(added, list):
        raise ConfigError("classify.add: must be an array of tables ([[classify.add]])")
    for n, rec in enumerate(added):
        where = f"classify.add[{n}]"
        if not isinstance(rec, dict):
            raise ConfigError(f"{where}: must be a table")
        sig = signature_from_dict(rec, where)
        if sig.id in known_ids:
            raise ConfigError(f"{where}.id: {sig.id!r} already exists")
        if not sig.regex.search(sig.example.encode("utf-8")):
            raise ConfigError(f"{where}.example: does not match its own pattern")
        known_ids.add(sig.id)
        sigs.append(sig)

    disable = table.get("disable", [])
    if not isinstance(disable, list) or not all(isinstance(d, str) for d in disable):
        raise ConfigError("classify.disable: a list of signature or consequence rule ids")
    consequence_ids = {c.id for c in base.consequences} | {r.id for r in base.recurrences}
    for sid in disable:
        if sid not in known_ids and sid not in consequence_ids:
            raise ConfigError(f"classify.disable: no signature row or consequence rule (or recurrence rule) {sid!r}")
    sigs = [s for s in sigs if s.id not in set(disable)]
    consequences = tuple(c for c in base.consequences if c.id not in set(disable))
    recurrences = tuple(r for r in base.recurrences if r.id not in set(disable))

    unexplained = table.get("unexplained_exit", base.unexplained_exit)
    if unexplained not in UNEXPLAINED_EXIT:
        raise ConfigError(f"classify.unexplained_exit: one of {', '.join(UNEXPLAINED_EXIT)}, got {unexplained!r}")

    return Policy(xids=xids, signatures=tuple(sigs), counts=tuple(c for c in counts if c.xids),
                  consequences=consequences, recurrences=recurrences, unexplained_exit=unexplained)
