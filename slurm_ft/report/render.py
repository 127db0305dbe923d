"""The drain report as HTML, plain text (jinja2 templates in ``slurm_ft/templates``) or JSON.

Node reasons, drain details and node names are untrusted text (an admin's or a job's words end
up in them): HTML is autoescaped, every ``{{ }}`` output of both templates is made
terminal-safe (``finalize``), the text template also applies ``tsafe`` before padding, and JSON
is ASCII with every control character as a ``\\uXXXX`` escape.
"""

from __future__ import annotations

import json
import time

from slurm_ft.textsafe import terminal_safe
from slurm_ft.report.collect import BY_SLURM_FT, CATEGORIES, LABELS, ReportData
from slurm_ft.report.remediation import to_json as remediation_json
from slurm_ft.report.suspect import to_json as suspect_json

FORMATS = ("text", "html", "json")


def _finalize_safe(value):
    """Every ``{{ }}`` output: control characters escaped (the text report goes to terminals, and
    an HTML file may be ``cat``-ed too); jinja2 Markup (already escaped HTML) is left as it is."""
    import markupsafe

    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return terminal_safe(value)
    return value


def _ts(t) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def _counted(counter) -> str:
    return ", ".join(f"{k} x{n}" for k, n in counter.most_common())


def render(data: ReportData, fmt: str = "html") -> str:
    """``fmt``: "html" (autoescaped), "text" (terminal-safe) or "json"."""
    if fmt == "json":
        return json.dumps(to_json(data), indent=2, ensure_ascii=True)
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("slurm_ft", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True,
                             finalize=_finalize_safe)
    env.filters["ts"] = _ts
    env.filters["tsafe"] = terminal_safe
    env.filters["counted"] = _counted
    name = "drain_report.html" if fmt == "html" else "drain_report.txt"
    return env.get_template(name).render(d=data, cats=CATEGORIES, labels=LABELS, counts=_counts(data),
                                         charts=_charts(data) if fmt == "html" else {},
                                         recover=data.impact.percentiles())


def _charts(d: ReportData) -> dict:
    """The inline SVG charts of the HTML report (slurm_ft.report.charts), keyed by name."""
    from collections import Counter

    from slurm_ft.report import charts

    return {
        "per_day": charts.faults_per_day(d.impact.per_day),
        "top_nodes": charts.hbars(Counter({n.node: n.faults for n in d.node_faults}),
                                  "Nodes with the most hardware faults"),
        "xids": charts.xid_histogram(d.xids_by_node),
        "gpu_hours": charts.hbars(d.impact.gpu_hours_by_node, "GPU-hours lost per node"),
    }


def _counts(d: ReportData) -> dict:
    """The totals both templates and JSON print; each one is the sum of its parts."""
    oos = d.out_of_service()
    drains = d.drain_counts()
    return {
        "out_of_service": {c: len(oos[c]) for c in CATEGORIES},
        "out_of_service_total": len(d.drained),
        "out_of_service_nodes": {c: d.fold(oos[c]) for c in CATEGORIES},
        "drains": drains,
        "drains_total": sum(drains.values()),
        "drains_by_slurm_ft": sum(drains[c] for c in BY_SLURM_FT),
        "drains_by_others": sum(drains[c] for c in CATEGORIES if c not in BY_SLURM_FT),
    }


def to_json(d: ReportData) -> dict:
    c = _counts(d)
    return {
        "generated": d.generated,
        "since": d.since,
        "flap_threshold": d.flap_threshold,
        "out_of_service": {
            "total": c["out_of_service_total"],
            "by": {cat: {"label": LABELS[cat], "count": c["out_of_service"][cat],
                         "nodes": c["out_of_service_nodes"][cat]} for cat in CATEGORIES},
            "nodes": [{"name": n.name, "state": n.state, "reason": n.reason, "category": n.category,
                       "set_by": n.set_by, "since": n.since} for n in d.drained],
        },
        "drains": {
            "total": c["drains_total"],
            "by_slurm_ft": c["drains_by_slurm_ft"],
            "by_admins_or_slurm": c["drains_by_others"],
            "by": c["drains"],
            "events": [{"time": e.time, "node": e.node, "category": e.category, "source": e.source,
                        "job_id": e.job_id, "attempt": e.attempt, "reason": e.reason} for e in d.drains],
        },
        "not_drained": [{"time": x.time, "node": x.node, "job_id": x.job_id, "attempt": x.attempt,
                         "outcome": x.outcome, "detail": x.detail} for x in d.not_drained],
        "flapping": {"nodes": d.fold(n.node for n in d.flapping_nodes),
                     "gpus": [{"node": g.node, "bus_id": g.bus_id, "index": g.index} for g in d.flapping_gpus]},
        "node_faults": [{"node": n.node, "faults": n.faults, "causes": dict(n.causes), "first": n.first,
                         "last": n.last, "flapping": n.flapping, "acknowledged": n.acknowledged,
                         "acked": None if n.acked is None else {"time": n.acked[0], "reason": n.acked[1]}}
                        for n in d.node_faults],
        "gpu_faults": [{"node": g.node, "bus_id": g.bus_id, "index": g.index, "serial": g.serial,
                        "faults": g.faults, "xids": dict(g.xids), "checks": dict(g.checks), "first": g.first,
                        "last": g.last, "flapping": g.flapping, "acknowledged": g.acknowledged} for g in d.gpus],
        "xids_by_node": {node: {str(x): k for x, k in cnt.items()} for node, cnt in sorted(d.xids_by_node.items())},
        "health_fails": {node: dict(cnt) for node, cnt in sorted(d.health_fails.items())},
        "suspect_nodes": suspect_json(d.suspect_nodes),
        "repairs": remediation_json(d.repairs),
        "verdicts": dict(d.verdicts_by_class),
        "impact": d.impact.to_json(),
        "notes": list(d.notes),
    }
