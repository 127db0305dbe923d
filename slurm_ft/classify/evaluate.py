"""Measure a policy against labelled cases (``--eval``): confusion matrix, misses, failover errors.

Case format: JSON Lines, one object per line with at least ``id``, ``text`` and ``expected``
(as in the shared corpus ``cases.jsonl``).  ``text`` is classified as mixed evidence: its lines
are both kernel lines and job output, with no exit status and no bus-id context.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..errors import EvidenceError
from .engine import classify
from .model import CLASSES, Evidence
from .policy import Policy


def evidence_from_text(text: str) -> Evidence:
    """A blob of mixed evidence (kernel log and/or stderr and/or Slurm messages) as :class:`Evidence`."""
    return Evidence(kernel_lines=text.splitlines(), stderr_tail=text)


def read_cases(lines: Iterable[str], name: str = "cases") -> list[dict[str, Any]]:
    """Parse JSON Lines cases; raises :class:`EvidenceError` naming the line of a bad case."""
    cases = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            case = json.loads(line)
        except ValueError as exc:
            raise EvidenceError(f"{name} line {n}: invalid JSON: {exc}") from None
        if not isinstance(case, dict):
            raise EvidenceError(f"{name} line {n}: expected a JSON object")
        for key in ("text", "expected"):
            if not isinstance(case.get(key), str):
                raise EvidenceError(f"{name} line {n}: missing string field {key!r}")
        if case["expected"] not in CLASSES:
            raise EvidenceError(f"{name} line {n}: expected must be one of {', '.join(CLASSES)}, got {case['expected']!r}")
        case.setdefault("id", f"line{n}")
        cases.append(case)
    return cases


def evaluate(cases: list[dict[str, Any]], policy: Policy | None = None) -> dict[str, Any]:
    """Classify every case and score it.

    Returns ``{total, correct, accuracy, false_failover, missed_hardware, hardware_total,
    hardware_recall, confusion: {expected: {got: n}}, misses: [{id, expected, got, rule, action}]}``.
    ``false_failover``: expected anything but hardware, got hardware (a healthy node drained).
    ``missed_hardware``: expected hardware, got something else.
    """
    confusion: dict[str, dict[str, int]] = {}
    misses = []
    correct = false_failover = missed_hw = hw_total = 0
    for case in cases:
        v = classify(evidence_from_text(case["text"]), policy)
        exp, got = case["expected"], v.verdict
        confusion.setdefault(exp, {}).setdefault(got, 0)
        confusion[exp][got] += 1
        if exp == "hardware":
            hw_total += 1
            missed_hw += got != "hardware"
        elif got == "hardware":
            false_failover += 1
        if exp == got:
            correct += 1
        else:
            misses.append({"id": str(case["id"]), "expected": exp, "got": got, "rule": v.rule, "action": v.action})
    total = len(cases)
    return {
        "total": total,
        "correct": correct,
        "accuracy": round(correct / total, 4) if total else 0.0,
        "false_failover": false_failover,
        "missed_hardware": missed_hw,
        "hardware_total": hw_total,
        "hardware_recall": round((hw_total - missed_hw) / hw_total, 4) if hw_total else None,
        "confusion": confusion,
        "misses": misses,
    }


def format_report(result: dict[str, Any]) -> str:
    """Plain-text report: confusion matrix (rows expected, columns got), misses, headline counts."""
    labels = [c for c in CLASSES if c in result["confusion"] or any(c in row for row in result["confusion"].values())]
    width = max([len("expected\\got")] + [len(c) for c in labels]) + 2
    out = ["expected\\got".ljust(width) + "".join(c.rjust(width) for c in labels)]
    for exp in labels:
        row = result["confusion"].get(exp, {})
        out.append(exp.ljust(width) + "".join(str(row.get(got, 0)).rjust(width) for got in labels))
    out.append("")
    if result["misses"]:
        out.append("misses:")
        for m in result["misses"]:
            out.append(f"  {m['id']}: expected {m['expected']}, got {m['got']} (rule {m['rule']}, action {m['action']})")
        out.append("")
    recall = result["hardware_recall"]
    out.append(f"total={result['total']} correct={result['correct']} accuracy={result['accuracy']:.4f}")
    out.append(f"false_failover={result['false_failover']} missed_hardware={result['missed_hardware']}"
               f" hardware_recall={'n/a' if recall is None else f'{recall:.4f}'}")
    return "\n".join(out)
