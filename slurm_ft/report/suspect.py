"""Suspect nodes for the drain report: nodes that crashed jobs of several users (issue 22).

The epilog's ``node-crash-recurring`` rule (slurm_ft.classify.recurrence) makes a node *suspect*
when at least 3 jobs of at least 2 users ended on it by a crash (``segfault``...) within 24 h; the
trusted GPU checks then decide: ``verified:node-crash-recurring`` (a check failed: the node was
drained) or ``unverified:node-crash-recurring`` (the checks passed: the job was retried elsewhere,
unblamed, the node stayed in service).  An admin reads the second kind here: nodes the checks
cannot explain yet that keep crashing jobs (memory, CPU, a bad library on that node).

Facts come from the verdict rows of the daemon journal (the node's verdict through its mailbox)
and of node journals when given (``--node-journals``; their rows also carry the job's owner,
``verdicts.uid``, from slurmd).  One job attempt on one node counts once, whichever journal holds
it.  Node names are untrusted text: the templates escape them (slurm_ft.report.render).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from slurm_ft.classify import recurrence

#: The verdict rule prefixes of a suspect verdict the trusted checks settled (slurm_ft.node.epilog).
CONFIRMED, NOT_CONFIRMED = "verified:", "unverified:"


@dataclass
class SuspectNode:
    """One node the recurrence rule made suspect in the window.  ``jobs``: distinct job attempts
    judged so; ``confirmed``: of those, the ones a failing trusted check confirmed (node drained);
    ``not_confirmed``: the checks passed (job retried elsewhere, node kept); ``users``: distinct
    owners (uids) of those jobs where a node journal recorded them (0: not known); ``first``/
    ``last``: epoch seconds; ``job_ids``: the newest few, newest first."""

    node: str
    jobs: int = 0
    confirmed: int = 0
    not_confirmed: int = 0
    users: int = 0
    first: float | None = None
    last: float | None = None
    job_ids: list[int] = field(default_factory=list)


#: Job ids listed per suspect node (the newest).
MAX_JOB_IDS = 5


def rows(journal, since: float, ids: frozenset[str] | None = None) -> list[dict]:
    """The suspect verdict rows of one journal (daemon or node) recorded at or after ``since``:
    ``[{job_id, attempt, node, rule, created, uid}]`` (``uid`` None where the journal has none)."""
    ids = recurrence.rule_ids() if ids is None else ids
    rules = sorted({f"{p}{r}" for r in ids for p in ("", CONFIRMED, NOT_CONFIRMED)})
    conn = journal.db.conn
    cols = {r[1] for r in conn.execute("PRAGMA table_info(verdicts)")}
    uid = "uid" if "uid" in cols else "NULL AS uid"        # a journal from before migration 008
    cur = conn.execute(f"SELECT job_id, attempt, node, rule, created, {uid} FROM verdicts WHERE created >= ? "
                       "AND rule IN (SELECT value FROM json_each(?)) ORDER BY created", [since, json.dumps(rules)])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur]


def table(verdicts: list[dict]) -> list[SuspectNode]:
    """Suspect nodes from :func:`rows` of any number of journals: one attempt counts once; most
    jobs first, then by name."""
    from slurm_ft.report.nodeset import natural_key

    seen: dict[tuple, dict] = {}
    for v in verdicts:
        key = (v["node"], v["job_id"], v["attempt"])
        kept = seen.setdefault(key, dict(v))
        if kept.get("uid") is None and v.get("uid") is not None:      # a node journal knows the owner
            kept["uid"] = v["uid"]
        if str(v["rule"]).startswith(CONFIRMED):
            kept["rule"] = v["rule"]
    nodes: dict[str, SuspectNode] = {}
    owners: dict[str, set] = {}
    for (node, job_id, _), v in sorted(seen.items(), key=lambda kv: kv[1]["created"] or 0):
        n = nodes.setdefault(node, SuspectNode(str(node)))
        n.jobs += 1
        if str(v["rule"]).startswith(CONFIRMED):
            n.confirmed += 1
        else:
            n.not_confirmed += 1
        if v.get("uid") is not None:
            owners.setdefault(node, set()).add(v["uid"])
        when = v["created"]
        if when is not None:
            n.first = when if n.first is None else min(n.first, when)
            n.last = when if n.last is None else max(n.last, when)
        if job_id not in n.job_ids:
            n.job_ids.insert(0, job_id)
            del n.job_ids[MAX_JOB_IDS:]
    for node, uids in owners.items():
        nodes[node].users = len(uids)
    return sorted(nodes.values(), key=lambda n: (-n.jobs, natural_key(n.node)))


def to_json(nodes: list[SuspectNode]) -> list[dict]:
    return [{"node": n.node, "jobs": n.jobs, "confirmed": n.confirmed, "not_confirmed": n.not_confirmed,
             "users": n.users, "first": n.first, "last": n.last, "job_ids": list(n.job_ids)} for n in nodes]
