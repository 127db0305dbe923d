"""`slurm-ft classify` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_ft.cli.classify import classify_command

CASES = Path(__file__).parent / "fixtures" / "classify" / "corpus_cases.jsonl"
XID48 = "Dec  2 11:38:47 node01 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU"


@pytest.fixture(autouse=True)
def _no_site_config(monkeypatch, tmp_path):
    """Keep the machine's /etc/slurm-ft config out of these tests."""
    monkeypatch.setenv("SLURM_FT_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")


def run(args, **kw):
    return CliRunner().invoke(classify_command, args, **kw)


def test_help_text():
    r = run(["--help"])
    assert r.exit_code == 0
    assert "Classify failure evidence" in r.output and "--eval" in r.output and "--json" in r.output
    assert classify_command.name == "classify"


def test_classify_file_text_and_json(tmp_path):
    blob = tmp_path / "blob.txt"
    blob.write_text(XID48 + "\ntorch.cuda.OutOfMemoryError: CUDA out of memory.\n")
    r = run([str(blob)])
    assert r.exit_code == 0, r.output
    assert "verdict: hardware" in r.output and "rule: xid-48" in r.output and "Xid 48 on 0000:07:00" in r.output
    r = run([str(blob), "--json"])
    d = json.loads(r.output)
    assert d["verdict"] == "hardware" and d["rule"] == "xid-48" and d["xids"][0]["bus_id"] == "0000:07:00"
    assert d["evidence"]


def test_classify_stdin():
    r = run(["-", "--json"], input="slurmstepd: error: *** JOB 32391783 ON node01 CANCELLED AT 2021-06-18T13:05:36 DUE TO PREEMPTION ***\n")
    assert json.loads(r.output)["verdict"] == "infra"
    r = run([], input="")
    assert r.exit_code == 0 and "verdict: unknown" in r.output


def test_eval_text_and_json():
    r = run(["--eval", str(CASES)])
    assert r.exit_code == 0, r.output
    assert "expected\\got" in r.output and "false_failover=0" in r.output
    r = run(["--eval", str(CASES), "--json"])
    d = json.loads(r.output)
    assert {"total", "correct", "false_failover", "missed_hardware", "accuracy", "misses"} <= set(d)
    assert d["false_failover"] == 0 and d["accuracy"] >= 0.9


def test_eval_with_policy_override(tmp_path):
    """An admin tries a stricter policy on labelled logs before deploying it."""
    cfg = tmp_path / "slurm-ft.toml"
    cfg.write_text('[classify.signature.pcie-aer-correctable]\nclass = "hardware"\naction = "drain_node"\n')
    d = json.loads(run(["--eval", str(CASES), "--json", "--config", str(cfg)]).output)
    assert d["false_failover"] > 0


def test_errors_are_messages_not_tracebacks(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x", "expected": "hardware"}\nnot json\n')
    r = run(["--eval", str(bad)])
    assert r.exit_code == 1 and "Error:" in r.output and "line 2" in r.output and "Traceback" not in r.output
    r = run([str(tmp_path / "missing.txt")])
    assert r.exit_code == 1 and "Error:" in r.output
    cfg = tmp_path / "c.toml"
    cfg.write_text("[classify]\nbogus = 1\n")
    r = run([str(tmp_path / "bad.jsonl"), "--config", str(cfg)])
    assert r.exit_code == 1 and "classify.bogus" in r.output


def test_usage_error_exit_2(tmp_path):
    r = run(["a", "--eval", str(CASES)])
    assert r.exit_code == 2
