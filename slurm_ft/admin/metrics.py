"""Prometheus metrics of slurm-ft, computed from the daemon journal (and ``sinfo`` for the nodes
out of service) at each scrape or textfile write: ``slurm-ft metrics`` (docs/install.md).

The journal is the record, so the numbers are the same whichever host or process computes them,
and survive daemon restarts. Counters count journal rows (monotonic while the journal is kept).
The expensive values (the journal scan, ``sinfo``) are computed at most once per
:data:`SCRAPE_TTL_S` seconds by one served registry, whatever the scrape rate: concurrent scrapes
share one computation (an unauthenticated scraper cannot make root run ``sinfo`` and a full
journal scan in a loop).

======================================== ======= ==============================================
metric                                   type    labels / meaning
======================================== ======= ==============================================
slurm_ft_verdicts_total                  counter class, rule: verdicts recorded
slurm_ft_failovers_total                 counter class, rule, blamed (yes/no): failovers done
slurm_ft_failovers_failed_total          counter failovers Slurm refused (internal-error)
slurm_ft_decisions_total                 counter decision: non-failover decisions (user-error,
                                                 failed, max-retries-exceeded, evacuate, ...)
slurm_ft_drains_total                    counter outcome of the daemon's drains: drained,
                                                 already-drained (the epilog drained it first),
                                                 kept-admin-reason, breaker-open, failed
slurm_ft_evacuations_total               counter requeues for evacuations (not faults)
slurm_ft_continuations_total             counter requeues at the time limit after a save
slurm_ft_max_retries_exceeded_total      counter jobs whose retry budget ran out
slurm_ft_jobs                            gauge   ft_state: ft-enabled jobs per ft state
slurm_ft_breaker_open                    gauge   1 while the circuit breaker is open
slurm_ft_daemon_heartbeat_age_seconds    gauge   seconds since the daemon's last cycle
slurm_ft_daemon_up                       gauge   1 when that heartbeat is fresh
slurm_ft_nodes_out_of_service            gauge   category: fault, health, admin, slurm (sinfo)
slurm_ft_time_to_recover_seconds         histo.  fault (attempt end) to the next attempt's start
slurm_ft_journal_readable                gauge   0 when the journal could not be read
slurm_ft_journal_ok                      gauge   kind: 1 (kind "ok") while the journal's filesystem
                                                 takes writes, else 0 with the trouble's kind
                                                 (disk_full, read_only, io_error)
slurm_ft_journal_spooled_rows            gauge   rows waiting in the journal's spool
slurm_ft_slurm_up                        gauge   0 when sinfo failed (node gauges then absent)
slurm_ft_internal_errors_total           counter hook: unexpected errors (slurm-ft bugs) caught by
                                                 the root hooks' boundary on this host
                                                 (slurm_ft.node.boundary; [node_state] dir)
slurm_ft_kernel_log_unavailable_total    counter epilogs on this host that could not read the
                                                 kernel log: GPU faults there are found only by
                                                 the trusted checks (slurm_ft.node.epilog)
======================================== ======= ==============================================
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from slurm_ft.failover import daemonlock
from slurm_ft.errors import SlurmFTError

log = logging.getLogger("slurm_ft.admin.metrics")
#: Upper bounds (seconds) of the time-to-recover histogram: the lab recovers in 0.3-1.2 s (a
#: recovery within the second of the fault is 0 s: Slurm's start/end times are whole seconds, so
#: ``le="0.5"`` counts them), an unblamed retry keeps Slurm's 121 s requeue delay, a held job may
#: wait for an admin.
RECOVER_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 130.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0)
_DRAIN_SKIPS = ("already-drained", "kept-admin-reason", "breaker-open")
#: Seconds a scrape's journal scan and ``sinfo`` answer are reused by later scrapes.
SCRAPE_TTL_S = 15.0
#: Hooks always shown in ``slurm_ft_internal_errors_total`` (0 until one fails).
HOOKS = ("prolog", "epilog", "hang-watcher")


def _drain_outcome(status: str, detail: str) -> str:
    if status == "done":
        return "drained"
    if status == "failed":
        return "failed"
    head = (detail or "").split(":", 1)[0]
    if head in _DRAIN_SKIPS:
        return head
    return "breaker-open" if "breaker" in (detail or "") else status or "unknown"


def journal_counts(journal) -> dict:
    """Every journal-derived number, as plain data (tests read this directly)."""
    db = journal.db
    out: dict = {}
    out["verdicts"] = Counter({(r["verdict"], r["rule"]): r["n"] for r in db.query(
        "SELECT verdict, rule, count(*) AS n FROM verdicts GROUP BY verdict, rule")})
    first_fault: dict[tuple[int, int], tuple[str, str]] = {}
    for r in db.query("SELECT job_id, attempt, verdict, rule FROM verdicts WHERE verdict != 'ok' ORDER BY id"):
        key = (r["job_id"], r["attempt"])
        if key not in first_fault or (r["verdict"] == "hardware" and first_fault[key][0] != "hardware"):
            first_fault[key] = (r["verdict"], r["rule"])     # the attempt's hardware verdict, else its first
    failovers: Counter = Counter()
    failed = 0
    recovered_from: list[tuple[int, int]] = []
    for a in journal.actions_named(["failover"]):
        # the failover's kind, typed when its intent was written (migration 011; the journal reads an
        # older row's from its text): a refused one keeps it although its detail became Slurm's refusal
        # (read from that text it passed for an evacuation's requeue and was never counted)
        kind = a["kind"]
        if kind == "evacuation":              # an evacuation's requeue: not a fault
            continue
        if a["status"] == "failed":
            failed += 1
            continue
        if a["status"] != "done":
            continue
        cls, rule = first_fault.get((a["job_id"], a["attempt"]), ("unknown", "unknown"))
        failovers[(cls, rule, "yes" if kind == "blamed" else "no")] += 1
        recovered_from.append((a["job_id"], a["attempt"]))
    out["failovers"], out["failovers_failed"] = failovers, failed
    decisions: Counter = Counter()
    for r in db.query("SELECT detail FROM actions WHERE action = 'decide'"):
        decisions[(r["detail"] or "").split(":", 1)[0].strip() or "unknown"] += 1
    out["decisions"] = decisions
    out["drains"] = Counter(_drain_outcome(r["status"], r["detail"]) for r in db.query(
        "SELECT status, detail FROM actions WHERE action = 'drain' AND status NOT IN ('intent', 'abandoned')"))
    count = lambda action: db.execute(  # noqa: E731
        "SELECT count(*) FROM actions WHERE action = ? AND status = 'done'", [action]).fetchone()[0]
    out["evacuations"], out["continuations"] = count("evacuation"), count("continue")
    out["remediations"] = Counter({r["action"][len("remediate-"):]: r["n"] for r in db.query(   # slurm_ft.remediate
        "SELECT action, count(*) AS n FROM actions WHERE action LIKE 'remediate-%' AND status = 'done' "
        "GROUP BY action")})
    out["jobs"] = Counter({r["ft_state"] or "unknown": r["n"] for r in db.query(
        "SELECT ft_state, count(*) AS n FROM jobs WHERE ft_enabled = 1 OR ft_enabled IS NULL GROUP BY ft_state")})
    out["max_retries"] = db.execute("SELECT count(*) FROM jobs WHERE ft_state = 'max-retries-exceeded'").fetchone()[0]
    attempts = {(r["job_id"], r["attempt"]): r for r in db.query("SELECT job_id, attempt, start, end FROM attempts")}
    recover = []
    for job_id, attempt in recovered_from:
        ended, nxt = attempts.get((job_id, attempt)), attempts.get((job_id, attempt + 1))
        if ended and nxt and ended["end"] and nxt["start"] and nxt["start"] >= ended["end"]:
            recover.append(nxt["start"] - ended["end"])
    out["time_to_recover"] = recover
    out["breaker_open"] = journal.breaker_latched() is not None
    return out


def _labelled(family, name: str, doc: str, labels: list[str], counts: dict):
    """A metric family with one sample per ``counts`` key (a label value, or a tuple of them)."""
    m = family(name, doc, labels=labels)
    for key, n in sorted(counts.items()):
        m.add_metric(list(key) if isinstance(key, tuple) else [key], n)
    return m


def _histogram(name: str, doc: str, values: list[float], buckets=RECOVER_BUCKETS) -> HistogramMetricFamily:
    counts = [(str(b), sum(1 for v in values if v <= b)) for b in buckets]
    counts.append(("+Inf", len(values)))
    return HistogramMetricFamily(name, doc, buckets=counts, sum_value=float(sum(values)))


class ScrapeCache:
    """One value, recomputed at most once per ``ttl_s`` seconds of ``clock`` (monotonic s).
    Callers that arrive while it is being computed wait for that computation and share it."""

    def __init__(self, ttl_s: float = SCRAPE_TTL_S, clock=time.monotonic):
        self.ttl_s, self.clock = ttl_s, clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._value = None
        self.computations = 0

    def get(self, compute):
        with self._lock:
            now = self.clock()
            if self._at is None or not 0 <= now - self._at < self.ttl_s:
                self._value = compute()
                self._at = now
                self.computations += 1
            return self._value


class JournalCollector(Collector):
    """Computes every metric at ``collect()`` from the config's daemon journal and, if ``slurm``
    is given, ``sinfo`` (nodes out of service by who took them out); those two at most once per
    ``ttl_s`` (``clock``: monotonic seconds, for tests)."""

    def __init__(self, cfg, slurm=None, now=time.time, *, clock=time.monotonic, ttl_s: float = SCRAPE_TTL_S):
        self.cfg, self.slurm, self.now = cfg, slurm, now
        self.cache = ScrapeCache(ttl_s, clock)

    def expensive(self) -> dict:
        """The journal counts (None: unreadable) and ``sinfo``'s nodes (a SlurmFTError when it
        failed; None when not asked): what the cache keeps."""
        from slurm_ft.journal import open_daemon_journal
        cfg = self.cfg
        try:
            with open_daemon_journal(cfg, readonly=True) as j:
                counts = journal_counts(j)
        except Exception as exc:  # noqa: BLE001 - a scrape reports (journal_readable 0), never crashes
            log.error("metrics: %s: %s", cfg.journal.path, exc)
            counts = None
        nodes = None
        if self.slurm is not None:
            try:
                nodes = self.slurm.nodes()
            except SlurmFTError as exc:
                log.error("metrics: sinfo: %s", exc)
                nodes = exc
        return {"counts": counts, "nodes": nodes}

    def collect(self):
        snap = self.cache.get(self.expensive)
        c = snap["counts"]
        readable = GaugeMetricFamily("slurm_ft_journal_readable", "1 when the daemon journal could be read")
        readable.add_metric([], 0 if c is None else 1)
        yield readable
        yield from self._journal_writable()
        if c is not None:
            yield from self._journal_metrics(c)
        yield from self._daemon_metrics()
        yield self._internal_errors()
        yield self._kernel_log_unavailable()
        if self.slurm is not None:
            yield from self._node_metrics(snap["nodes"])

    def _journal_writable(self):
        """``slurm_ft_journal_ok{kind}``: 1 while the daemon journal's filesystem takes writes
        (``kind="ok"``), else 0 with the trouble's kind (``disk_full``, ``read_only``...;
        slurm_ft.journal.trouble); ``slurm_ft_journal_spooled_rows``: rows waiting in its spool.
        One ``statvfs`` per scrape."""
        from slurm_ft.journal import trouble
        t = trouble.check_writable(self.cfg.journal.path)
        ok = GaugeMetricFamily("slurm_ft_journal_ok", "1 while the daemon journal's filesystem takes writes; "
                               "0 with the trouble's kind (disk_full, read_only, io_error)", labels=["kind"])
        ok.add_metric(["ok" if t is None else t.kind], 1 if t is None else 0)
        yield ok
        yield GaugeMetricFamily("slurm_ft_journal_spooled_rows", "Rows waiting in the daemon journal's spool",
                                value=trouble.waiting_rows(self.cfg.journal.path))

    def _internal_errors(self):
        from slurm_ft.node.boundary import read_counts
        counts = {hook: 0 for hook in HOOKS}
        counts.update(read_counts(self.cfg.node_state.dir))
        return _labelled(CounterMetricFamily, "slurm_ft_internal_errors",
                         "Unexpected errors (slurm-ft bugs) caught at a root hook's boundary on this host",
                         ["hook"], counts)

    def _kernel_log_unavailable(self):
        from slurm_ft.node.boundary import KERNEL_LOG_FILE, read_counts
        family = CounterMetricFamily("slurm_ft_kernel_log_unavailable",
                                     "Epilogs on this host that could not read the kernel log (GPU faults found "
                                     "only by the trusted checks)")
        family.add_metric([], read_counts(self.cfg.node_state.dir, KERNEL_LOG_FILE).get("epilog", 0))
        return family

    def _journal_metrics(self, c: dict):
        yield _labelled(CounterMetricFamily, "slurm_ft_verdicts", "Verdicts recorded, by class and rule",
                        ["class", "rule"], c["verdicts"])
        yield _labelled(CounterMetricFamily, "slurm_ft_failovers", "Failovers done, by the verdict's class and rule "
                        "and whether a node was blamed", ["class", "rule", "blamed"], c["failovers"])
        yield CounterMetricFamily("slurm_ft_failovers_failed", "Failovers Slurm refused (ft state internal-error)",
                                  value=c["failovers_failed"])
        yield _labelled(CounterMetricFamily, "slurm_ft_decisions", "Decisions other than a failover", ["decision"],
                        c["decisions"])
        yield _labelled(CounterMetricFamily, "slurm_ft_drains", "Drains slurm-ft decided on, by outcome", ["outcome"],
                        c["drains"])
        yield _labelled(CounterMetricFamily, "slurm_ft_remediations", "Break-fix steps ([remediate]): reset, "
                        "reboot, pass, fail, rma, cancel", ["step"], c["remediations"])
        yield CounterMetricFamily("slurm_ft_evacuations", "Requeues for evacuations (not faults)",
                                  value=c["evacuations"])
        yield CounterMetricFamily("slurm_ft_continuations", "Requeues at the time limit after an exit checkpoint",
                                  value=c["continuations"])
        yield CounterMetricFamily("slurm_ft_max_retries_exceeded", "Jobs whose retry budget ran out",
                                  value=c["max_retries"])
        yield _labelled(GaugeMetricFamily, "slurm_ft_jobs", "ft-enabled jobs in the journal, by ft state",
                        ["ft_state"], c["jobs"])
        yield GaugeMetricFamily("slurm_ft_breaker_open", "1 while the circuit breaker on drains is open",
                                value=1 if c["breaker_open"] else 0)
        yield _histogram("slurm_ft_time_to_recover_seconds",
                         "Seconds from a faulted attempt's end to the next attempt's start (failovers)",
                         c["time_to_recover"])

    def _daemon_metrics(self):
        hb = daemonlock.read_heartbeat(self.cfg.journal.path)
        age = GaugeMetricFamily("slurm_ft_daemon_heartbeat_age_seconds",
                                "Seconds since the daemon's last cycle (NaN: no heartbeat)")
        up = GaugeMetricFamily("slurm_ft_daemon_up", "1 when the daemon's heartbeat is fresh")
        if hb is None:
            age.add_metric([], math.nan)
            up.add_metric([], 0)
        else:
            a = max(0.0, self.now() - hb["time"])
            age.add_metric([], a)
            up.add_metric([], 1 if a <= daemonlock.stale_after(self.cfg.failover.poll_interval_s) else 0)
        yield age
        yield up

    def _node_metrics(self, nodes):
        from slurm_ft.report.collect import CATEGORIES, reason_category
        up = GaugeMetricFamily("slurm_ft_slurm_up", "1 when sinfo answered")
        if nodes is None or isinstance(nodes, Exception):
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        counts = Counter()
        for n in nodes:
            if n.drained or n.state.lower().startswith(("down", "drain", "fail")):
                counts[reason_category(n.reason)] += 1
        m = GaugeMetricFamily("slurm_ft_nodes_out_of_service", "Nodes drained or down now, by who took them out",
                              labels=["category"])
        for cat in CATEGORIES:
            m.add_metric([cat], counts.get(cat, 0))
        yield m


def registry(cfg, slurm=None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(JournalCollector(cfg, slurm))
    return reg


def exposition(cfg, slurm=None) -> str:
    """The metrics in Prometheus' text format."""
    from prometheus_client import generate_latest
    return generate_latest(registry(cfg, slurm)).decode()


def write_textfile(path: str, cfg, slurm=None) -> None:
    """Write the metrics for node_exporter's textfile collector (temp file + rename)."""
    from prometheus_client import write_to_textfile
    write_to_textfile(path, registry(cfg, slurm))
