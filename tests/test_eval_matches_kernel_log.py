"""``slurm-ft classify --eval`` scores a ``kernel_log`` case with exactly the parser the epilog and
``classify --kernel-log`` apply (issue 22: one case passed in --eval but gave no Xid through
--kernel-log). Every kernel_log case of every corpus, both ways: same verdict, rule, action, Xids."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_ft.cli.classify import classify_command
from slurm_ft.classify.engine import classify
from slurm_ft.classify.evaluate import evidence_from_text, read_cases

FIXTURES = Path(__file__).parent / "fixtures" / "classify"
CASES = [c for name in ("corpus_cases.jsonl", "public_cases.jsonl", "public_cases_2.jsonl", "public_cases_3.jsonl")
         for c in read_cases((FIXTURES / name).read_text().splitlines(), name) if c.get("kind") == "kernel_log"]


def test_there_are_kernel_log_cases_in_the_corpora():
    assert len(CASES) >= 100


@pytest.mark.parametrize("case", CASES, ids=[str(c["id"]) for c in CASES])
def test_eval_and_kernel_log_give_the_same_verdict(case, tmp_path):
    v = classify(evidence_from_text(case["text"], "kernel_log"))
    log = tmp_path / "kern.log"
    log.write_text(case["text"])
    out = CliRunner().invoke(classify_command, ["--kernel-log", str(log), "--json"])
    assert out.exit_code == 0, out.output
    cli = json.loads(out.output)
    assert (cli["verdict"], cli["rule"], cli["action"]) == (v.verdict, v.rule, v.action)
    assert sorted(x["xid"] for x in cli["xids"]) == sorted(x.xid for x in v.xids)
