"""Measure a policy against labelled cases (``--eval``): confusion matrix, misses, failover errors.

Case format: JSON Lines, one object per line with at least ``id``, ``text`` and ``expected``
(as in the shared corpus ``cases.jsonl``). ``kind`` says what the text is: ``kernel_log`` (kernel
lines only), ``job_output`` (the job's output only), anything else or absent: mixed evidence (its
lines are both kernel lines and job output). No exit status and no bus-id context. A case may
list ``accept`` (classes that count as right, for disputed cases); a hardware verdict on a case
whose ``accept`` lacks ``hardware`` is a false failover. A verdict with action ``verify`` (only the
job's output suggested hardware) is scored as the epilog's trusted GPU checks would settle it when
right: hardware where hardware is accepted, else unknown (counted as ``verify``).  Likewise a
verdict with *unplaced* hardware records (kernel records that name no GPU: the epilog runs the
trusted node checks for them) is scored hardware where hardware is accepted, else as it stands
(counted as ``unplaced``).

The cases are saved logs: each kernel line loses only its log tool's wrappers
(:func:`slurm_ft.classify.parse.message_body`), then goes through exactly the epilog's parser: a
record is evidence for hardware only when it begins with a kernel-owned header.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from slurm_ft.errors import EvidenceError
from slurm_ft.classify.engine import classify
from slurm_ft.classify.model import CLASSES, Evidence
from slurm_ft.classify.policy import Policy


def evidence_from_text(text: str, kind: str | None = None) -> Evidence:
    """``text`` as :class:`Evidence`: kernel lines (``kind`` ``kernel_log``), the job's output
    (``job_output``) or, for any other kind, a blob of mixed evidence read as both."""
    if kind == "kernel_log":
        return Evidence(kernel_lines=text.splitlines())
    if kind == "job_output":
        return Evidence(stderr_tail=text)
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
    hardware_recall, verify, unplaced, per_class: {class: {precision, recall, support}}, confusion: {expected: {got:
    n}}, misses: [{id, expected, got, rule, action}]}``.
    ``false_failover``: a hardware verdict where hardware is not an accepted class (a healthy node
    drained). ``missed_hardware``: expected hardware, got something else. ``precision``/``recall``
    of a class: over the cases with that label/verdict (accepted alternatives count as right).
    """
    confusion: dict[str, dict[str, int]] = {}
    misses = []
    correct = false_failover = missed_hw = hw_total = verified = unplaced = 0
    right_by_label: dict[str, int] = {}
    right_by_verdict: dict[str, int] = {}
    for case in cases:
        v = classify(evidence_from_text(case["text"], case.get("kind")), policy)
        exp, got = case["expected"], v.verdict
        accept = set(case.get("accept") or ()) | {exp}
        if v.action == "verify":
            # only the job's output suggested hardware: the epilog's trusted checks decide (a
            # faulty GPU fails them, a healthy one does not): scored as if they are right
            verified += 1
            got = "hardware" if "hardware" in accept else "unknown"
        elif v.unplaced and not (got == "hardware" and v.action in ("drain_node", "reset_gpu")):
            # hardware records naming no GPU: the epilog's trusted node checks decide; a failing
            # one drains (verified:unplaced), none leaves the verdict as it is
            unplaced += 1
            if "hardware" in accept:
                got = "hardware"
        confusion.setdefault(exp, {}).setdefault(got, 0)
        confusion[exp][got] += 1
        if exp == "hardware":
            hw_total += 1
            missed_hw += got not in accept
        elif got == "hardware" and "hardware" not in accept:
            false_failover += 1
        if got in accept:
            correct += 1
            right_by_label[exp] = right_by_label.get(exp, 0) + 1
            right_by_verdict[got] = right_by_verdict.get(got, 0) + 1
        else:
            misses.append({"id": str(case["id"]), "expected": exp, "got": got, "rule": v.rule, "action": v.action})
    total = len(cases)
    per_class = {}
    for c in CLASSES:
        support = sum(confusion.get(c, {}).values())
        predicted = sum(row.get(c, 0) for row in confusion.values())
        if support or predicted:
            per_class[c] = {"precision": round(right_by_verdict.get(c, 0) / predicted, 4) if predicted else None,
                            "recall": round(right_by_label.get(c, 0) / support, 4) if support else None,
                            "support": support}
    return {
        "total": total,
        "correct": correct,
        "accuracy": round(correct / total, 4) if total else 0.0,
        "false_failover": false_failover,
        "missed_hardware": missed_hw,
        "hardware_total": hw_total,
        "hardware_recall": round((hw_total - missed_hw) / hw_total, 4) if hw_total else None,
        "verify": verified,
        "unplaced": unplaced,
        "per_class": per_class,
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
    out.append("class".ljust(width) + "precision".rjust(11) + "recall".rjust(9) + "support".rjust(9))
    for c, m in result.get("per_class", {}).items():
        out.append(c.ljust(width) + _ratio(m["precision"]).rjust(11) + _ratio(m["recall"]).rjust(9)
                   + str(m["support"]).rjust(9))
    out.append("")
    if result["misses"]:
        out.append("misses:")
        for m in result["misses"]:
            out.append(f"  {m['id']}: expected {m['expected']}, got {m['got']} (rule {m['rule']}, action {m['action']})")
        out.append("")
    recall = result["hardware_recall"]
    out.append(f"total={result['total']} correct={result['correct']} accuracy={result['accuracy']:.4f}"
               f" verify={result.get('verify', 0)} unplaced={result.get('unplaced', 0)}")
    out.append(f"false_failover={result['false_failover']} missed_hardware={result['missed_hardware']}"
               f" hardware_recall={'n/a' if recall is None else f'{recall:.4f}'}")
    return "\n".join(out)


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
