"""The drain report's break-fix section (``[remediate]``, slurm_ft.remediate): per node, the repairs
slurm-ft made in the window, their outcome and the RMA candidates (a node that needed repair more
than ``[remediate] max_repairs`` times: drained with ``slurm-ft: rma: ...``). Read from the daemon
journal's ``remediate-*`` action rows only."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_ft.remediate.actions import ACTIONS
from slurm_ft.report.nodeset import natural_key


@dataclass
class RepairRow:
    """One node: ``repairs`` (resets + reboots started), ``passed``/``failed`` outcomes, ``rma``
    (the RMA reason, "" if none), ``steps`` (every step, oldest first: ``reboot, fail, rma``),
    ``last`` (epoch seconds of the newest step)."""

    node: str
    repairs: int
    passed: int
    failed: int
    rma: str
    steps: list[str]
    last: float | None


def rows(journal, since: float) -> list[dict]:
    """The journal's remediation steps in the window (done, or observed in observe mode)."""
    return [r for r in journal.actions_named(ACTIONS, since) if r.get("status") in ("done", "observed")]


def table(steps: list[dict]) -> list[RepairRow]:
    """Per node, RMA candidates first, then by node name."""
    import json

    by: dict[str, RepairRow] = {}
    for r in steps:
        kind = r["action"][len("remediate-"):]
        row = by.setdefault(r["target"], RepairRow(r["target"], 0, 0, 0, "", [], None))
        row.steps.append(kind + (" (observed)" if r.get("status") == "observed" else ""))
        row.last = r.get("created")
        if kind in ("reset", "reboot"):
            row.repairs += 1
        elif kind == "pass":
            row.passed += 1
        elif kind == "fail":
            row.failed += 1
        elif kind == "rma":
            try:
                row.rma = str(json.loads(r.get("detail") or "{}").get("reason", "")) or "rma"
            except ValueError:
                row.rma = "rma"
    return sorted(by.values(), key=lambda x: (not x.rma, natural_key(x.node)))


def to_json(table_: list[RepairRow]) -> list[dict]:
    return [{"node": r.node, "repairs": r.repairs, "passed": r.passed, "failed": r.failed, "rma": r.rma,
             "rma_candidate": bool(r.rma), "steps": r.steps, "last": r.last} for r in table_]
