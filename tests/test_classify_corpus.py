"""The shared labelled corpus of real failure evidence: the issue's targets."""

from __future__ import annotations

from pathlib import Path

from slurm_ft.classify.evaluate import evaluate, read_cases

CASES = Path(__file__).parent / "fixtures" / "classify" / "corpus_cases.jsonl"


def test_corpus_targets():
    result = evaluate(read_cases(CASES.read_text().splitlines(), str(CASES)))
    assert result["total"] >= 60
    assert result["false_failover"] == 0, result["misses"]
    assert result["hardware_recall"] >= 0.95, result["misses"]
    assert result["accuracy"] >= 0.90, result["misses"]


def test_corpus_deciding_xids():
    """Where the label names the deciding Xid and the verdict is right, the rule names that Xid
    (or a qualifier/count row of it) and the Xid is reported."""
    import json

    from slurm_ft.classify import classify
    from slurm_ft.classify.evaluate import evidence_from_text

    for line in CASES.read_text().splitlines():
        case = json.loads(line)
        if not case.get("xid"):
            continue
        v = classify(evidence_from_text(case["text"]))
        if v.verdict != case["expected"] or v.action == "verify":
            continue  # (verify: the Xid sits in a tool's output, not in a kernel record)
        assert case["xid"] in [x.xid for x in v.xids] or case["xid"] == 45, case["id"]


PUBLIC = Path(__file__).parent / "fixtures" / "classify" / "public_cases.jsonl"


def test_public_cases_drain_no_healthy_node():
    """The 301 public labelled cases (issue 27): no false failover, and no more missed hardware
    than before the no-proof fault kinds (p205: an nvidia-smi fabric report, not yet a row)."""
    result = evaluate(read_cases(PUBLIC.read_text().splitlines(), str(PUBLIC)))
    assert result["total"] == 301
    assert result["false_failover"] == 0, result["misses"]
    assert result["missed_hardware"] <= 1, result["misses"]


PUBLIC_2 = Path(__file__).parent / "fixtures" / "classify" / "public_cases_2.jsonl"


def test_second_held_out_corpus_drains_no_healthy_node():
    """The second held-out corpus (issue 22: public cases from sources in neither corpus above,
    labelled before any rule of round 3 was written).  Held out at 154/202, 0 false failovers,
    0 missed hardware before the round-3 rows; no false failover and no missed hardware after."""
    import json

    cases = read_cases(PUBLIC_2.read_text().splitlines(), str(PUBLIC_2))
    result = evaluate(cases)
    assert result["total"] == len(cases) >= 200
    assert result["false_failover"] == 0, result["misses"]
    assert result["missed_hardware"] == 0, result["misses"]
    assert result["correct"] >= 178, result["misses"]
    old = {json.loads(line)["source"] for f in (CASES, PUBLIC) for line in f.read_text().splitlines() if line.strip()}
    assert not old & {c["source"] for c in cases}, "a source already in another corpus"
    assert all(c["source"].startswith("https://") and c["why"] for c in cases)


PUBLIC_3 = Path(__file__).parent / "fixtures" / "classify" / "public_cases_3.jsonl"


def test_second_held_out_corpus_part_two_drains_no_healthy_node():
    """The second held-out corpus, part two (issue 22): 113 more public cases (ids h203-h315),
    collected and labelled after the round-3 rows were written and scored with those rules
    unchanged: held out at 96/113, 0 false failovers, 1 missed hardware (h235: a BMC event log's
    'Uncorrectable Machine Check Exception', not a kernel record).  With part one the second
    held-out set holds >= 300 cases."""
    import json

    cases = read_cases(PUBLIC_3.read_text().splitlines(), str(PUBLIC_3))
    result = evaluate(cases)
    assert result["total"] == len(cases) >= 110
    assert result["false_failover"] == 0, result["misses"]
    assert result["missed_hardware"] <= 1, result["misses"]
    assert result["correct"] >= 96, result["misses"]
    part_one = [json.loads(line) for line in PUBLIC_2.read_text().splitlines() if line.strip()]
    assert len(part_one) + len(cases) >= 300
    assert not {c["id"] for c in part_one} & {c["id"] for c in cases}, "an id already in part one"
    old = {json.loads(line)["source"] for f in (CASES, PUBLIC, PUBLIC_2) for line in f.read_text().splitlines() if line.strip()}
    assert not old & {c["source"] for c in cases}, "a source already in another corpus"
    assert len({c["source"] for c in cases}) == len(cases), "one source twice"
    assert all(c["source"].startswith("https://") and c["why"] for c in cases)
