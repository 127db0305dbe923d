"""Drain report for HPC admins: which nodes are out of service and why, what slurm-ft drained
over a period, which Xids and health checks hit which node. Rendered with jinja2 (HTML with
autoescaping: node reasons and evidence are untrusted text; or plain text)."""

from __future__ import annotations

import glob
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..drain import LEADER
from ..errors import SlurmFTError
from ..journal import open_daemon_journal, open_journal
from ..textsafe import terminal_safe


@dataclass
class NodeRow:
    name: str
    state: str
    reason: str
    by_slurm_ft: bool
    since: float | None


@dataclass
class ReportData:
    generated: float
    since: float
    drained: list[NodeRow]
    drains: list[dict]                      # slurm-ft drain actions in the window (daemon journal)
    xids_by_node: dict[str, Counter]        # node -> Counter of Xid codes from hardware verdicts
    verdicts_by_class: Counter
    health_fails: dict[str, Counter] = field(default_factory=dict)   # node -> Counter of failing checks
    notes: list[str] = field(default_factory=list)


def collect(cfg, slurm, *, since_s: float = 7 * 86400, node_journals: str | None = None) -> ReportData:
    """Gather the report from Slurm (live node states), the daemon journal and, if given, node
    journals (a glob; on a real cluster they live on each node — copy them or skip).
    ``since_s``: look-back window in seconds. Raises :class:`SlurmFTError` for unreadable input."""
    now = time.time()
    since = now - since_s
    drained = []
    for n in slurm.nodes():
        if n.drained or n.state.lower().startswith(("down", "drain", "fail")):
            changed = n.raw.get("reason_changed_at")
            changed = changed.get("number") if isinstance(changed, dict) else changed
            drained.append(NodeRow(n.name, "+".join([n.state, *n.flags]), n.reason,
                                   n.reason.startswith(LEADER), changed or None))
    data = ReportData(now, since, drained, [], defaultdict(Counter), Counter())
    with open_daemon_journal(cfg, readonly=True) as j:
        data.drains = list(j.db.query(
            "SELECT job_id, attempt, target AS node, detail AS reason, status, created FROM actions "
            "WHERE action = 'drain' AND created >= ? ORDER BY created DESC", [since]))
        for v in j.db.query("SELECT node, verdict, xids FROM verdicts WHERE created >= ?", [since]):
            data.verdicts_by_class[v["verdict"]] += 1
            if v["verdict"] == "hardware":
                for x in json.loads(v["xids"] or "[]"):
                    data.xids_by_node[v["node"]][x["xid"]] += 1
    if node_journals:
        paths = sorted(glob.glob(node_journals))
        if not paths:
            data.notes.append(f"no node journal matches {node_journals}")
        for path in paths:
            try:
                with open_journal(path, readonly=True) as nj:
                    for r in nj.db.query("SELECT node, check_name FROM health WHERE status = 'fail' AND created >= ?",
                                         [since]):
                        data.health_fails.setdefault(r["node"], Counter())[r["check_name"]] += 1
            except SlurmFTError as exc:
                data.notes.append(str(exc))
    return data


def _finalize_safe(value):
    """Every ``{{ }}`` output: control characters escaped (the text report goes to terminals, and
    an HTML file may be ``cat``-ed too); jinja2 Markup (already escaped HTML) is left as it is."""
    import markupsafe

    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return terminal_safe(value)
    return value


def render(data: ReportData, fmt: str = "html") -> str:
    """``fmt``: "html" (autoescaped) or "text" (terminal-safe: the ``tsafe`` filter on untrusted
    fields, and every output finalized through :func:`slurm_ft.textsafe.terminal_safe`)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("slurm_ft", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True,
                             finalize=_finalize_safe)
    env.filters["ts"] = lambda t: time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"
    env.filters["tsafe"] = terminal_safe
    name = "drain_report.html" if fmt == "html" else "drain_report.txt"
    return env.get_template(name).render(d=data)
