"""Per-node recurrence across jobs: a node that crashes job after job is the suspect.

One job's ``Segmentation fault`` looks like that job's bug; the same kind of crash on the same node
from several jobs of several users points at the node (issue 22, a flaky node).  A
``[[recurrence]]`` rule of ``classify_policy.toml`` says: when the current job's deciding rule is
one of ``rules`` and this node's journal holds at least ``jobs`` distinct jobs (the current one
included) of at least ``users`` distinct users that ended on one of ``rules`` within ``window_s``
seconds, the verdict becomes the rule's (``hardware`` with action ``verify``).

Trust (docs/security.md): the counted evidence is the jobs' own output, which their users
control, so a recurrence only makes the node *suspect*: action ``verify`` sends the epilog to the
trusted GPU checks (:func:`slurm_ft.node.epilog.verify_untrusted`); only a failing check drains the
node (``verified:node-crash-recurring``), otherwise the verdict is ``unknown``
(``unverified:node-crash-recurring``) and the job is retried elsewhere without blame within
``[failover] unblamed_retries``.  Requiring distinct *users* means one user alone can never make
a node suspect, however many jobs it runs.  Prior events come from the node journal
(:func:`slurm_ft.classify.history.prior_crashes`); events without a user never count toward
``users``.  Pure functions, no I/O.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass
from functools import lru_cache

from slurm_ft.errors import ConfigError
from slurm_ft.classify.model import ACTIONS, CLASSES, Evidence, PriorCrash


@dataclass(frozen=True)
class RecurrenceRule:
    """``rules``: signature row ids that count (the crash kinds); ``jobs``/``users``: distinct jobs
    and users needed, the current job included; ``window_s``: seconds back from the evidence's
    ``now``; ``cls``/``action``/``priority``: the verdict it gives; ``ref``: the source."""

    id: str
    rules: frozenset[str]
    jobs: int
    users: int
    window_s: float
    cls: str
    action: str
    priority: int
    ref: str


_KEYS = {"id", "rules", "jobs", "users", "window_s", "class", "action", "priority", "ref"}


def rule_from_dict(rec: dict, where: str) -> RecurrenceRule:
    """Validate one ``[[recurrence]]`` table; raises :class:`ConfigError` naming the key."""
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: must be a table")
    for key in rec:
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}")
    for key in sorted(_KEYS):
        if key not in rec:
            raise ConfigError(f"{where}: missing key {key!r}")
    if not isinstance(rec["id"], str) or not rec["id"]:
        raise ConfigError(f"{where}.id: a non-empty string")
    rules = rec["rules"]
    if not isinstance(rules, list) or not rules or not all(isinstance(r, str) and r for r in rules):
        raise ConfigError(f"{where}.rules: a non-empty list of rule ids")
    for key in ("jobs", "users", "priority"):
        if isinstance(rec[key], bool) or not isinstance(rec[key], int) or rec[key] < (0 if key == "priority" else 1):
            raise ConfigError(f"{where}.{key}: an integer >= {0 if key == 'priority' else 1}, got {rec[key]!r}")
    if rec["users"] < 2:
        raise ConfigError(f"{where}.users: at least 2 (one user's jobs alone never make a node suspect)")
    window = rec["window_s"]
    if isinstance(window, bool) or not isinstance(window, (int, float)) or window <= 0:
        raise ConfigError(f"{where}.window_s: a number of seconds > 0, got {window!r}")
    if rec["class"] not in CLASSES or rec["class"] == "ok" or rec["action"] not in ACTIONS:
        raise ConfigError(f"{where}: bad class/action {rec['class']!r}/{rec['action']!r}")
    if rec["action"] in ("drain_node", "reset_gpu"):
        raise ConfigError(f"{where}.action: job output alone never drains: use 'verify' (the trusted checks decide)")
    if not isinstance(rec["ref"], str) or not rec["ref"].strip():
        raise ConfigError(f"{where}.ref: a non-empty string")
    return RecurrenceRule(id=rec["id"], rules=frozenset(rules), jobs=rec["jobs"], users=rec["users"],
                          window_s=float(window), cls=rec["class"], action=rec["action"],
                          priority=rec["priority"], ref=rec["ref"])


@lru_cache(maxsize=1)
def recurrence_rules() -> tuple[RecurrenceRule, ...]:
    """The shipped ``[[recurrence]]`` rules of ``classify_policy.toml``."""
    import tomllib

    from slurm_ft.classify.table import _data_text

    data = tomllib.loads(_data_text("classify_policy.toml"))
    out = tuple(rule_from_dict(rec, f"classify_policy.toml recurrence[{n}]")
                for n, rec in enumerate(data.get("recurrence", [])))
    if len({r.id for r in out}) != len(out):
        raise ConfigError("classify_policy.toml: duplicate recurrence ids")
    return out



def rule_ids() -> frozenset[str]:
    """The ids of :func:`recurrence_rules` (``node-crash-recurring``): what a suspect node's
    verdict rule names (``unverified:<id>`` / ``verified:<id>``)."""
    return frozenset(r.id for r in recurrence_rules())

def _as_crash(item) -> PriorCrash | None:
    try:
        crash = item if isinstance(item, PriorCrash) else PriorCrash(*item)
        return crash._replace(time=float(crash.time))
    except (TypeError, ValueError):
        return None


def recurring(rule: RecurrenceRule, current_rule: str, evidence: Evidence) -> tuple[int, int] | None:
    """``(jobs, users)`` counted for ``rule`` when the current verdict's ``current_rule`` is one it
    counts and the thresholds are met, else None.  The current job counts as one job (and one
    user when :attr:`Evidence.user` is known); a prior event of the same job (an epilog run twice,
    another node of it) never counts twice; prior events need a ``time`` inside the window."""
    if current_rule not in rule.rules or not evidence.prior_crashes:
        return None
    now = evidence.now if evidence.now is not None else _time.time()
    jobs: set[str] = {"(current job)" if evidence.job_id is None else str(evidence.job_id)}
    users: set[str] = {str(evidence.user)} if evidence.user else set()
    for item in evidence.prior_crashes:
        crash = _as_crash(item)
        if crash is None or crash.rule not in rule.rules or not now - rule.window_s <= crash.time <= now:
            continue
        if evidence.job_id is not None and str(crash.job_id) == str(evidence.job_id):
            continue  # the current job's own earlier record (another node of it, an epilog run twice)
        jobs.add(str(crash.job_id))
        if crash.user:
            users.add(str(crash.user))
    if len(jobs) >= rule.jobs and len(users) >= rule.users:
        return len(jobs), len(users)
    return None
