"""Count/window rules across jobs: this node's earlier Xids, from its journal.

A rule such as "Xid 31 three times on the same GPU within 1 h → hardware" must also count the
Xids that earlier jobs on this node saw: each job's epilog only reads the kernel log since its
own start.  The epilog records every verdict (with its attributed Xids) in the node journal; when
the current evidence holds an Xid some count rule counts, it reads back the verdicts recorded
within the longest rule window (:meth:`slurm_ft.journal.Journal.recent_xid_verdicts`, bounded)
and passes their Xids as :attr:`Evidence.prior_xids`.  Pure functions here; the epilog does the I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from slurm_ft.errors import EvidenceError
from slurm_ft.classify.model import PriorCrash, PriorXid
from slurm_ft.classify.parse import message_body, normalise_bus_id, parse_xid, record_body
from slurm_ft.classify.policy import Policy

#: Most journal verdict rows read back / looked at by the epilog (the query stays bounded).
MAX_PRIOR_VERDICTS = 1000
SCAN_VERDICTS = 10000
#: Most prior Xid events passed to the classifier.
MAX_PRIOR_XIDS = 5000


def lookback_s(policy: Policy) -> float:
    """How far back prior Xids can matter: the longest count-rule window (0 without rules)."""
    return max((rule.window_s for rule in policy.counts), default=0.0)


def _counted(policy: Policy) -> set[int]:
    counted: set[int] = set()
    for rule in policy.counts:
        counted |= rule.xids
    return counted


def needs_history(kernel_lines: Iterable[str], policy: Policy, *, kernel_records: bool = True) -> bool:
    """Whether the kernel lines hold a GPU Xid (with a bus id) that some count rule counts: only
    then can earlier Xids change the verdict, so only then does the epilog read its journal.
    ``kernel_records``: the lines are ``/dev/kmsg`` record bodies (else saved log lines), parsed
    as the classifier does (:func:`slurm_ft.classify.parse.parse_xid`: the header at the start).
    (Cheap: one lower-cased copy of the text, the Xid parser on the few lines naming an Xid.)"""
    counted = _counted(policy)
    if not counted:
        return False
    lines = list(kernel_lines)
    if "xid" not in "\n".join(lines).lower():
        return False
    for line in lines:
        if "xid" in line.lower():
            hit = parse_xid(record_body(line.encode("utf-8", "replace"), kernel_records))
            if hit is not None and hit.kind == "xid" and hit.bus_id and hit.xid in counted:
                return True
    return False


def prior_xids(rows: Iterable[dict[str, Any]], *, exclude: tuple[int, int] | None = None,
               limit: int = MAX_PRIOR_XIDS) -> tuple[PriorXid, ...]:
    """Journal verdict rows (``{job_id, attempt, created, xids: [{xid, bus_id, kind, line}]}``)
    -> :class:`PriorXid` tuples, GPU Xids with a bus id only, at most ``limit``.  ``exclude``
    ``(job_id, attempt)`` skips the current job's own earlier record (an epilog run twice)."""
    out: list[PriorXid] = []
    pids: dict[str, int | None] = {}     # a line many verdicts recorded (one window) is parsed once
    for row in rows:
        if exclude is not None and (row.get("job_id"), row.get("attempt")) == exclude:
            continue
        try:
            when = float(row["created"])
        except (KeyError, TypeError, ValueError):
            continue
        for x in row.get("xids") or ():
            if not isinstance(x, dict) or x.get("kind", "xid") != "xid" or not x.get("bus_id"):
                continue
            try:
                xid = int(x["xid"])
                bus = normalise_bus_id(str(x["bus_id"]))
            except (KeyError, TypeError, ValueError, EvidenceError):
                continue
            line = str(x.get("line") or "")
            if line not in pids:
                hit = parse_xid(message_body(line.encode("utf-8", "replace")))  # its pid
                pids[line] = hit.pid if hit is not None else None
            out.append(PriorXid(when, xid, bus, pids[line]))
            if len(out) >= limit:
                return tuple(out)
    return tuple(out)


def crash_rules(policy: Policy) -> frozenset[str]:
    """Rule ids some recurrence rule counts (:mod:`.recurrence`)."""
    out: set[str] = set()
    for rule in policy.recurrences:
        out |= rule.rules
    return frozenset(out)


def crash_lookback_s(policy: Policy) -> float:
    """How far back earlier job ends can matter: the longest recurrence window (0 without rules)."""
    return max((rule.window_s for rule in policy.recurrences), default=0.0)


def needs_crash_history(rule: str, policy: Policy) -> bool:
    """Whether a verdict decided by ``rule`` (without earlier jobs) could change with this node's
    earlier job ends: only then does the epilog read them from its journal (one bounded query)."""
    return rule in crash_rules(policy)


def prior_crashes(rows: Iterable[dict[str, Any]], policy: Policy, *, exclude: int | str | None = None,
                  limit: int = MAX_PRIOR_VERDICTS) -> tuple[PriorCrash, ...]:
    """Journal verdict rows (``{job_id, created, rule, user}``; ``user`` may be missing) ->
    :class:`PriorCrash` tuples for the rules some recurrence rule counts, at most ``limit``.
    ``exclude``: the current job's id (its own earlier rows, an epilog run twice or another
    attempt, never count as another job).  A ``verified:``/``unverified:`` prefix (a verdict the
    trusted checks settled) is read as the rule it settled.  Rows that cannot be read are skipped."""
    counted = crash_rules(policy)
    out: list[PriorCrash] = []
    if not counted:
        return ()
    for row in rows:
        try:
            rule = str(row["rule"])
            job = str(row["job_id"])
            when = float(row["created"])
        except (KeyError, TypeError, ValueError):
            continue
        rule = rule.split(":", 1)[1] if rule.startswith(("verified:", "unverified:")) else rule
        if rule not in counted or (exclude is not None and job == str(exclude)):
            continue
        user = row.get("user")
        out.append(PriorCrash(when, rule, job, str(user) if user not in (None, "") else None))
        if len(out) >= limit:
            break
    return tuple(out)
