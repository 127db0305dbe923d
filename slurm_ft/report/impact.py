"""What faults cost, from the daemon journal: faults per day by class, GPU-hours lost per node and
per fault class, and the time to recover (fault -> the job running again).

Definitions (docs/drain-report.md, "What faults cost"):

* a **fault** is a job attempt with a verdict other than ``user`` (hardware, infra, hang,
  unknown); an attempt with several node verdicts counts once, under its worst class
  (:data:`CLASS_RANK`) and on the node that verdict names;
* **time to recover**: from the attempt's end (its verdict's time when the end is not on record)
  to the start of the job's next attempt; an attempt with no next start yet is not counted;
* **time lost** per fault: that recovery time plus the work done since the attempt's last saved
  checkpoint (a ``ckpt-ack`` action within the attempt; the attempt's start when there is none),
  times the attempt's node count, in node-hours; **GPU-hours** multiply a node-hour by the GPUs
  Slurm's ``gres/gpu`` gives that node (``gpus_per_node``; a node Slurm shows without GPUs
  counts 0 GPU-hours, so the two figures are shown side by side).

Reads only (one SELECT per table, window-bounded); never raises for odd rows (a missing time
leaves the fault out of the figures that need it).
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from slurm_ft.slurm import split_nodes

#: Which class an attempt with several verdicts counts under (the first present wins).
CLASS_RANK = ("hardware", "hang", "infra", "unknown")
#: Percentiles of the time to recover shown in the report.
PERCENTILES = (50, 90, 99)


@dataclass
class Impact:
    """``per_day``: ``YYYY-MM-DD`` (local time) -> class -> faults; ``node_hours`` /
    ``gpu_hours``: node -> hours lost and class -> hours lost; ``recover_s``: every time to
    recover, seconds, ascending."""

    per_day: dict[str, Counter] = field(default_factory=dict)
    node_hours_by_node: Counter = field(default_factory=Counter)
    gpu_hours_by_node: Counter = field(default_factory=Counter)
    node_hours_by_class: Counter = field(default_factory=Counter)
    gpu_hours_by_class: Counter = field(default_factory=Counter)
    recover_s: list[float] = field(default_factory=list)

    def percentiles(self) -> dict[int, float | None]:
        """{50: s, 90: s, 99: s} by the nearest-rank method; None without data."""
        xs = self.recover_s
        return {p: (xs[max(0, math.ceil(p / 100 * len(xs)) - 1)] if xs else None) for p in PERCENTILES}

    def to_json(self) -> dict:
        return {
            "faults_per_day": {day: dict(c) for day, c in sorted(self.per_day.items())},
            "node_hours_lost": {"by_node": _rounded(self.node_hours_by_node),
                                "by_class": _rounded(self.node_hours_by_class)},
            "gpu_hours_lost": {"by_node": _rounded(self.gpu_hours_by_node),
                               "by_class": _rounded(self.gpu_hours_by_class)},
            "time_to_recover_s": {"count": len(self.recover_s),
                                  **{f"p{p}": v for p, v in self.percentiles().items()}},
        }


def _rounded(c: Counter) -> dict[str, float]:
    return {k: round(v, 3) for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))}


def day_of(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(t))


def impact(db, since: float, gpus_per_node: dict[str, int] | None = None) -> Impact:
    """The figures of the module doc over the verdicts created at or after ``since`` (epoch s).
    ``db``: a sqlite_utils Database of a daemon journal."""
    gpus_per_node = gpus_per_node or {}
    worst: dict[tuple[int, int], tuple[int, str, str, float]] = {}
    for v in db.query("SELECT job_id, attempt, node, verdict, created FROM verdicts "
                      "WHERE created >= ? AND verdict != 'user'", [since]):
        if v["verdict"] not in CLASS_RANK or v["created"] is None:
            continue
        rank = CLASS_RANK.index(v["verdict"])
        key = (v["job_id"], v["attempt"])
        if key not in worst or rank < worst[key][0]:
            worst[key] = (rank, v["verdict"], v["node"], v["created"])
    out = Impact()
    if not worst:
        return out
    jobs = sorted({k[0] for k in worst})
    attempts: dict[tuple[int, int], dict] = {}
    acks: dict[tuple[int, int], float] = {}
    for chunk in _chunks(jobs, 500):
        marks = ",".join("?" * len(chunk))
        for a in db.query(f"SELECT job_id, attempt, nodes, start, end FROM attempts WHERE job_id IN ({marks})",
                          chunk):
            attempts[(a["job_id"], a["attempt"])] = a
        for a in db.query(f"SELECT job_id, attempt, created FROM actions WHERE action = 'ckpt-ack' "
                          f"AND status = 'done' AND job_id IN ({marks})", chunk):
            k = (a["job_id"], a["attempt"])
            acks[k] = max(acks.get(k, 0.0), a["created"] or 0.0)
    per_day: dict[str, Counter] = defaultdict(Counter)
    for (job, n), (_, cls, node, created) in worst.items():
        per_day[day_of(created)][cls] += 1
        this, nxt = attempts.get((job, n)), attempts.get((job, n + 1))
        end = (this or {}).get("end") or created
        if not nxt or not nxt.get("start") or nxt["start"] < end:
            continue
        recover = nxt["start"] - end
        out.recover_s.append(recover)
        start = (this or {}).get("start")
        saved = acks.get((job, n)) or start
        redone = max(0.0, end - saved) if saved else 0.0
        nodes = split_nodes((this or {}).get("nodes") or node) or [node]
        node_h = (recover + redone) * len(nodes) / 3600.0
        gpu_h = sum((recover + redone) * gpus_per_node.get(x, 0) for x in nodes) / 3600.0
        out.node_hours_by_node[node] += node_h
        out.gpu_hours_by_node[node] += gpu_h
        out.node_hours_by_class[cls] += node_h
        out.gpu_hours_by_class[cls] += gpu_h
    out.per_day = dict(per_day)
    out.recover_s.sort()
    return out


def _chunks(xs: list, n: int):
    for i in range(0, len(xs), n):
        yield xs[i:i + n]
