"""What the drain report shows, gathered from Slurm's node states, the daemon journal and
(optionally) node journals. No rendering here (``render.py``).

Who took a node out of service, read from its drain/down reason (docs/drain-report.md):

* ``fault``  - slurm-ft, for a fault verdict: ``slurm-ft: Xid 79 GPU 0000:10:00 (job 12)``,
  ``slurm-ft: <rule> (job 12)`` (the epilog and the daemon, ``slurm_ft.drain.drain_reason``);
* ``health`` - slurm-ft, for a failing GPU health check: ``slurm-ft: <check>: ...`` (prolog,
  ``slurm-ft health --act``);
* ``admin``  - any other reason: an admin's own, or ``slurm-ft drain NODE`` run by an admin;
* ``slurm``  - slurmctld's own (``Not responding``, ``Kill task failed``, ...) or no reason.

The four always add up to the nodes out of service; the same four split the drains in the window.
"""

from __future__ import annotations

import glob
import json
import re
import sqlite3
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from slurm_ft.drain import LEADER, SLURM_REASONS
from slurm_ft.errors import JournalError, SlurmFTError
from slurm_ft.failover.policy import HEALTH_RULE
from slurm_ft.health.config import CHECK_NAMES
from slurm_ft.journal import open_daemon_journal, open_journal
from slurm_ft.slurm import parse_gres
from slurm_ft.report import remediation, suspect
from slurm_ft.report.ack import acks as report_acks
from slurm_ft.report.impact import Impact, impact
from slurm_ft.report.suspect import SuspectNode
from slurm_ft.report.nodeset import fold, natural_key

CATEGORIES = ("fault", "health", "admin", "slurm")
LABELS = {"fault": "slurm-ft (fault verdict)", "health": "slurm-ft (health check)", "admin": "admin",
          "slurm": "Slurm"}
BY_SLURM_FT = ("fault", "health")
#: A node or GPU with at least this many hardware faults in the window is flagged (RMA candidate).
FLAP_THRESHOLD = 3

_FAULT_REASON = re.compile(r"\(job \d+\)$")
_GPU_IN_REASON = re.compile(r"\bGPU(\d+)\b")


def reason_category(reason: str) -> str:
    """``fault``, ``health``, ``admin`` or ``slurm`` for a node's drain/down reason (module doc)."""
    if reason.startswith(LEADER):
        check, sep, _ = reason[len(LEADER):].strip().partition(":")
        if sep and check in CHECK_NAMES:
            return "health"
        return "fault" if _FAULT_REASON.search(reason) else "admin"
    if not reason.strip() or reason.startswith(SLURM_REASONS):
        return "slurm"
    return "admin"


@dataclass
class NodeRow:
    """A node out of service now (Slurm's view)."""

    name: str
    state: str
    reason: str
    category: str
    set_by: str
    since: float | None

    @property
    def by_slurm_ft(self) -> bool:
        return self.category in BY_SLURM_FT


@dataclass
class DrainEvent:
    """A node taken out of service in the window, and by whom (``category``, ``source``)."""

    time: float | None
    node: str
    category: str
    source: str
    job_id: int | None
    attempt: int | None
    reason: str


@dataclass
class NotDrained:
    """A drain slurm-ft decided on but did not do (an admin's reason kept, circuit breaker, error)."""

    time: float | None
    node: str
    job_id: int | None
    attempt: int | None
    outcome: str
    detail: str


@dataclass
class NodeFaults:
    node: str
    faults: int
    causes: Counter            #: rule (xid-79, health:row_remap, slurm-node-fail, ...) -> count
    first: float | None
    last: float | None
    flapping: bool
    #: faults before the node's newest acknowledgement (``slurm-ft report --ack``): not counted
    acknowledged: int = 0
    acked: tuple[float, str] | None = None     #: (when, reason) of that acknowledgement


@dataclass
class GpuRow:
    node: str
    bus_id: str | None         #: PCI bus id as the kernel log names it (0000:10:00)
    index: int | None          #: NVML index on the node, when a node journal recorded it
    serial: str | None         #: only if the evidence carries one (slurm-ft records none today)
    faults: int
    xids: Counter
    checks: Counter
    first: float | None
    last: float | None
    flapping: bool
    acknowledged: int = 0                      #: faults before the node's acknowledgement: not counted


@dataclass
class ReportData:
    generated: float
    since: float
    drained: list[NodeRow]
    drains: list[DrainEvent]
    xids_by_node: dict[str, Counter]
    verdicts_by_class: Counter
    health_fails: dict[str, Counter] = field(default_factory=dict)   # node -> failing episodes per check
    not_drained: list[NotDrained] = field(default_factory=list)
    node_faults: list[NodeFaults] = field(default_factory=list)
    gpus: list[GpuRow] = field(default_factory=list)
    flap_threshold: int = FLAP_THRESHOLD
    notes: list[str] = field(default_factory=list)
    impact: Impact = field(default_factory=Impact)   #: what faults cost (report/impact.py)
    #: nodes that crashed jobs of several users (report/suspect.py), and the verdict rows behind them
    suspect_nodes: list[SuspectNode] = field(default_factory=list)
    suspect_rows: list[dict] = field(default_factory=list, repr=False)
    #: break-fix remediation per node, RMA candidates first (report/remediation.py, [remediate])
    repairs: list = field(default_factory=list)

    # -- counts that add up (templates and JSON use these) --------------------------------
    def out_of_service(self) -> dict[str, list[str]]:
        """category -> node names out of service now (every category present)."""
        out: dict[str, list[str]] = {c: [] for c in CATEGORIES}
        for n in self.drained:
            out[n.category].append(n.name)
        return out

    def drain_counts(self) -> dict[str, int]:
        counts = Counter(e.category for e in self.drains)
        return {c: counts.get(c, 0) for c in CATEGORIES}

    @property
    def flapping_nodes(self) -> list[NodeFaults]:
        return [n for n in self.node_faults if n.flapping]

    @property
    def flapping_gpus(self) -> list[GpuRow]:
        return [g for g in self.gpus if g.flapping]

    @staticmethod
    def fold(names) -> str:
        return fold(names)

    @staticmethod
    def label(category: str) -> str:
        return LABELS[category]


# ------------------------------------------------------------------------------ gathering
class _Faults:
    """Hardware faults per node and per GPU, each counted once by its key: a job attempt (its
    verdicts, from the daemon journal and node journals alike), a health-check episode, a drain
    seen only in Slurm."""

    def __init__(self):
        self.node: dict[str, dict] = defaultdict(dict)            # node -> key -> (time, cause)
        self.gpu: dict[tuple, dict] = defaultdict(dict)           # (node, bus, index) -> key -> (time, cause)
        self.index_of: dict[tuple[str, str], int] = {}            # (node, bus) -> NVML index
        self.serial_of: dict[tuple[str, str], str] = {}
        self.xids_by_node: dict[str, Counter] = defaultdict(Counter)

    def jobs_on(self, node: str) -> set:
        return {k[1] for k in self.node.get(node, {}) if k[0] == "attempt"}

    def verdict(self, v: dict) -> None:
        for x in v["xids"]:                # a node journal's copy knows the GPU index
            if x.get("bus_id") and isinstance(x.get("gpu_index"), int):
                self.index_of[(v["node"], x["bus_id"])] = x["gpu_index"]
            if x.get("bus_id") and x.get("serial"):
                self.serial_of[(v["node"], x["bus_id"])] = str(x["serial"])
        key = ("attempt", v["job_id"], v["attempt"])
        if key in self.node[v["node"]]:
            return
        self.node[v["node"]][key] = (v["created"], v["rule"])
        for x in v["xids"]:
            self.xids_by_node[v["node"]][x["xid"]] += 1
        for bus in sorted({x["bus_id"] for x in v["xids"] if x.get("bus_id")}):
            self.gpu[(v["node"], bus, None)][key] = (v["created"], f"xid-{_xids_on(v, bus)}")

    def other(self, node: str, key: tuple, when: float | None, cause: str, *, gpu: int | None = None,
              bus: str | None = None) -> None:
        self.node[node].setdefault(key, (when, cause))
        if gpu is not None or bus is not None:
            self.gpu[(node, bus, gpu)].setdefault(key, (when, cause))


def _xids_on(v: dict, bus: str) -> str:
    return ",".join(str(x) for x in sorted({x["xid"] for x in v["xids"] if x.get("bus_id") == bus}))


def _verdicts(j, since: float, hardware_only: bool = False) -> list[dict]:
    sql = "SELECT job_id, attempt, node, verdict, rule, xids, created FROM verdicts WHERE created >= ?"
    if hardware_only:
        sql += " AND verdict = 'hardware'"
    rows = list(j.db.query(sql + " ORDER BY created", [since]))
    for r in rows:
        try:
            r["xids"] = [x for x in json.loads(r["xids"] or "[]") if isinstance(x, dict) and "xid" in x]
        except ValueError:
            r["xids"] = []
    return rows


def _health_episodes(rows: list[dict]) -> list[dict]:
    """Failing health results that start an episode: a check on a GPU that fails after passing
    (or first) counts once, however many runs keep failing (HealthCheckProgram runs every few
    minutes on a drained node too)."""
    last: dict[tuple, str] = {}
    out = []
    for r in sorted(rows, key=lambda r: (r["created"] or 0, r["id"])):
        k = (r["node"], r["check_name"], r["gpu"])
        if r["status"] == "fail" and last.get(k) != "fail":
            out.append(r)
        last[k] = r["status"]
    return out


def collect(cfg, slurm, *, since_s: float = 7 * 86400, node_journals: str | None = None,
            flap_threshold: int = FLAP_THRESHOLD, now: float | None = None) -> ReportData:
    """Gather the report from Slurm (live node states), the daemon journal and, if given, node
    journals (a glob; on a real cluster they live on each node — copy them or skip).
    ``since_s``: look-back window in seconds; ``flap_threshold``: faults that make a node or GPU
    flapping. Raises :class:`SlurmFTError` for unreadable input (a node journal that cannot be
    read is a note in the report instead)."""
    try:
        return _collect(cfg, slurm, since_s, node_journals, flap_threshold, now)
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"{cfg.journal.path}: {exc}") from None


def _collect(cfg, slurm, since_s: float, node_journals: str | None, flap_threshold: int,
             now: float | None) -> ReportData:
    now = time.time() if now is None else now
    since = now - since_s
    drained = []
    nodes = slurm.nodes()
    gpus_per_node = {}
    for n in nodes:
        try:
            gres = n.raw.get("gres")
            gpus_per_node[n.name] = parse_gres(gres if isinstance(gres, str) else None).get("gpu", 0)
        except SlurmFTError:
            gpus_per_node[n.name] = 0          # unreadable gres: its GPU-hours are not counted
    for n in nodes:
        if n.drained or n.state.lower().startswith(("down", "drain", "fail")):
            drained.append(NodeRow(n.name, "+".join([n.state, *n.flags]), n.reason, reason_category(n.reason),
                                   n.reason_set_by_user, n.reason_time or None))
    drained.sort(key=lambda r: natural_key(r.name))
    data = ReportData(now, since, drained, [], {}, Counter(), flap_threshold=flap_threshold)
    faults = _Faults()
    events: dict[tuple, DrainEvent] = {}
    prolog_health: list[dict] = []
    with open_daemon_journal(cfg, readonly=True) as j:
        for a in j.db.query("SELECT job_id, attempt, target, detail, status, created FROM actions "
                            "WHERE action = 'drain' AND created >= ? ORDER BY created", [since]):
            _drain_action(a, events, data.not_drained)
        for v in _verdicts(j, since):
            data.verdicts_by_class[v["verdict"]] += 1
            if v["verdict"] != "hardware":
                continue
            if v["rule"].startswith(HEALTH_RULE):     # a prolog health check refused the node
                check = v["rule"][len(HEALTH_RULE):]
                events.setdefault((v["node"], v["job_id"], v["attempt"]), DrainEvent(
                    v["created"], v["node"], "health", "prolog", v["job_id"], v["attempt"],
                    f"{LEADER} {check}: failed in the prolog of job {v['job_id']}"))
                prolog_health.append(v)
            else:
                faults.verdict(v)
        acked = report_acks(j)
        data.suspect_rows += suspect.rows(j, since)
        data.repairs = remediation.table(remediation.rows(j, since))
        data.impact = impact(j.db, since, gpus_per_node)
        latched = j.breaker_latched()
        if latched:
            data.notes.append(f"circuit breaker open since {latched}: slurm-ft drains no node until "
                              f"`slurm-ft breaker reset`")
    health_nodes = _read_node_journals(node_journals, since, faults, data) if node_journals else set()
    for v in prolog_health:                  # counted from the node's own health results when read
        if v["node"] not in health_nodes:
            faults.verdict(v)
    _slurm_drains(data.drained, since, events)
    for e in list(events.values()):
        if e.source.startswith("Slurm node state") or e.source == "health check on the node":
            _fault_from_reason(faults, e, health_nodes)
    data.drains = sorted(events.values(), key=lambda e: (e.time or 0, natural_key(e.node)), reverse=True)
    data.xids_by_node = dict(faults.xids_by_node)
    _fault_tables(data, faults, flap_threshold, acked)
    data.suspect_nodes = suspect.table(data.suspect_rows)
    return data


_REASON_JOB = re.compile(r"\(job (\d+)\)$")
#: ``GPU <bus>`` (slurm_ft.drain.drain_reason), `` on <bus>`` (reasons of releases before it)
_REASON_BUS = re.compile(r" (?:GPU|on) ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\b")


def _fault_from_reason(faults: _Faults, e: DrainEvent, health_nodes: set[str]) -> None:
    """A slurm-ft drain known only from Slurm's node state still counts as a fault of the node
    (and of the GPU its reason names), unless the journals already hold it."""
    if e.category == "health" and e.node not in health_nodes:
        m = _GPU_IN_REASON.search(e.reason)
        check = e.reason[len(LEADER):].split(":")[0].strip()
        faults.other(e.node, ("drain", e.time), e.time, f"health:{check}", gpu=int(m.group(1)) if m else None)
    elif e.category == "fault":
        job = _REASON_JOB.search(e.reason)
        if job and int(job.group(1)) in faults.jobs_on(e.node):
            return
        bus = _REASON_BUS.search(e.reason)
        faults.other(e.node, ("drain", e.time), e.time, "drain reason", bus=bus.group(1).lower() if bus else None)


def _drain_action(a: dict, events: dict, not_drained: list) -> None:
    status, detail, node = a["status"], a["detail"] or "", a["target"] or ""
    key = (node, a["job_id"], a["attempt"])
    if status == "done":
        events[key] = DrainEvent(a["created"], node, "fault", "daemon", a["job_id"], a["attempt"], detail)
    elif status == "skipped" and detail.startswith("already-drained"):
        # the epilog drained it first, at the job's end (the daemon found slurm-ft's reason there)
        events.setdefault(key, DrainEvent(a["created"], node, "fault", "epilog", a["job_id"], a["attempt"],
                                          detail.partition(": ")[2] or detail))
    else:
        outcome = {"failed": "drain failed", "observed": "observed only ([failover] mode = observe)"}.get(
            status, "interrupted" if status in ("intent", "abandoned") else "")
        if detail.startswith("kept-admin-reason"):
            outcome = "an admin's reason kept"
        elif "breaker" in detail:
            outcome = "circuit breaker open"
        not_drained.append(NotDrained(a["created"], node, a["job_id"], a["attempt"], outcome or status, detail))


def _slurm_drains(drained: list[NodeRow], since: float, events: dict) -> None:
    """Drains visible only in Slurm's node states (reason set within the window): admins',
    Slurm's, ``slurm-ft health --act``'s, and slurm-ft drains the daemon journal does not hold."""
    for n in drained:
        if n.since is None or n.since < since:
            continue
        if n.category in ("admin", "slurm"):
            source = f"Slurm node state (set by {n.set_by})" if n.set_by else "Slurm node state"
        elif not any(e.node == n.name and e.category == n.category for e in events.values()):
            source = "health check on the node" if n.category == "health" else "Slurm node state"
        else:
            continue
        events[(n.name, "slurm", n.since)] = DrainEvent(n.since, n.name, n.category, source, None, None, n.reason)


def _read_node_journals(pattern: str, since: float, faults: _Faults, data: ReportData) -> set[str]:
    """Node journals: health results (failing episodes) and the verdicts with GPU indices.
    Returns the nodes whose health results were read."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        data.notes.append(f"no node journal matches {pattern}")
    rows: list[dict] = []
    for path in paths:
        try:
            with open_journal(path, readonly=True) as nj:
                rows += list(nj.db.query("SELECT id, node, job_id, check_name, status, gpu, created FROM health "
                                         "WHERE created >= ?", [since]))
                for v in _verdicts(nj, since, hardware_only=True):
                    faults.verdict(v)
                data.suspect_rows += suspect.rows(nj, since)
        except SlurmFTError as exc:
            data.notes.append(str(exc))
        except sqlite3.DatabaseError as exc:
            data.notes.append(f"{path}: {exc}")
    for r in _health_episodes(rows):
        data.health_fails.setdefault(r["node"], Counter())[r["check_name"]] += 1
        if r["job_id"] is not None and r["job_id"] in faults.jobs_on(r["node"]):
            continue                         # the epilog's verified verdict for that job counts it
        faults.other(r["node"], ("health", r["check_name"], r["gpu"], r["created"]), r["created"],
                     f"health:{r['check_name']}", gpu=r["gpu"])
    return {r["node"] for r in rows}


def _after_ack(keys: dict, ack: tuple[float, str] | None) -> dict:
    """The faults (key -> (time, cause)) after an acknowledgement (all of them without one; a
    fault of unknown time counts)."""
    return keys if ack is None else {k: tc for k, tc in keys.items() if not (tc[0] and tc[0] <= ack[0])}


def _fault_tables(data: ReportData, faults: _Faults, threshold: int,
                  acked: dict[str, tuple[float, str]] | None = None) -> None:
    acked = acked or {}
    for node, every in faults.node.items():
        keys = _after_ack(every, acked.get(node))
        times = [t for t, _ in keys.values() if t]
        data.node_faults.append(NodeFaults(node, len(keys), Counter(c for _, c in keys.values()),
                                           min(times, default=None), max(times, default=None), len(keys) >= threshold,
                                           len(every) - len(keys), acked.get(node)))
    data.node_faults.sort(key=lambda n: (-n.faults, natural_key(n.node)))
    merged: dict[tuple, dict] = defaultdict(dict)
    by_index = {(node, i): bus for (node, bus), i in faults.index_of.items()}
    for (node, bus, index), keys in faults.gpu.items():
        if bus is None and (node, index) in by_index:
            bus = by_index[(node, index)]               # a health check's GPU index, mapped to its bus id
        if bus is not None:
            index = faults.index_of.get((node, bus))
        merged[(node, bus, index)].update(keys)
    for (node, bus, index), every in merged.items():
        keys = _after_ack(every, acked.get(node))
        times = [t for t, _ in keys.values() if t]
        causes = [c for _, c in keys.values()]
        xids = Counter(x for c in causes if c.startswith("xid-") for x in c[4:].split(","))
        checks = Counter(c[len("health:"):] for c in causes if c.startswith("health:"))
        serial = faults.serial_of.get((node, bus)) if bus else None
        data.gpus.append(GpuRow(node, bus, index, serial, len(keys), xids, checks, min(times, default=None),
                                max(times, default=None), len(keys) >= threshold, len(every) - len(keys)))
    data.gpus.sort(key=lambda g: (-g.faults, natural_key(g.node), g.bus_id or "", g.index or 0))
    if data.gpus:
        if any(g.index is None for g in data.gpus):
            data.notes.append("GPU index: known only from node journals (--node-journals); the daemon journal "
                              "holds the PCI bus id from the kernel's Xid line")
        if any(g.serial is None for g in data.gpus):
            data.notes.append("GPU serial numbers are not recorded by slurm-ft; on the node: "
                              "nvidia-smi --query-gpu=index,pci.bus_id,serial --format=csv")
