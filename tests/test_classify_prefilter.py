"""The grep -F prefilter of large inputs gives exactly the verdict of the pure-Python path."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.classify import Evidence, classify, from_config
from slurm_ft.classify import prefilter
from slurm_ft.classify.evaluate import evidence_from_text
from slurm_ft.classify.table import signatures

CASES = Path(__file__).parent / "fixtures" / "classify" / "corpus_cases.jsonl"
SHARED = Path("/work/shared/corpus/cases.jsonl")
HAVE_GREP = prefilter._grep() is not None
needs_grep = pytest.mark.skipif(not HAVE_GREP, reason="no grep at /usr/bin/grep or /bin/grep")


def both(evidence: Evidence, policy=None) -> tuple[dict, dict]:
    return (classify(evidence, policy, prefilter="python").to_dict(),
            classify(evidence, policy, prefilter="grep").to_dict())


@pytest.fixture
def grep_must_answer(monkeypatch):
    """Fail the test if the grep path silently fell back to Python."""
    real = prefilter.grep_line_starts
    calls: list[bool] = []

    def checked(*a, **kw):
        res = real(*a, **kw)
        calls.append(res is not None)
        return res

    monkeypatch.setattr(prefilter, "grep_line_starts", checked)
    yield calls
    assert calls and all(calls), "grep did not answer: the comparison ran Python against Python"


@needs_grep
def test_grep_line_starts_offsets():
    text = b"alpha\nBETA gamma\n\x00xid\xff\nnothing\nlast Beta"
    starts = prefilter.grep_line_starts([text[:9], text[9:]], [b"beta", b"xid"])
    assert starts == [6, 17, 31]
    assert prefilter.grep_line_starts([b"nothing here\n"], [b"beta"]) == []
    # a key grep would read as an option, and one holding a newline (split: a superset, still safe)
    assert prefilter.grep_line_starts([b"a -v b\nc\n"], [b"-v"]) == [0]


@needs_grep
@pytest.mark.parametrize("path", [CASES, SHARED])
def test_same_verdict_on_the_corpus(path, grep_must_answer):
    if not path.exists():
        pytest.skip(f"{path} not present")
    for line in path.read_text().splitlines():
        case = json.loads(line)
        py, gr = both(evidence_from_text(case["text"]))
        assert py == gr, case["id"]


def _synthetic(seed: int, lines: int) -> tuple[list[str], str]:
    """Noise plus every signature example, corpus lines, wrapped Xid headers, huge lines,
    upper-case keys, CRLF, NUL and invalid UTF-8, in both sources."""
    rnd = random.Random(seed)
    examples = [s.example for s in signatures()]
    corpus = [t for line in CASES.read_text().splitlines() for t in json.loads(line)["text"].splitlines()]
    odd = [
        "NVRM: Xid (PCI:0000:07:00):", "48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
        "x" * 5000 + " CUDA OUT OF MEMORY " + "y" * 5000 + " NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "Segmentation Fault\r", "\x00binary\x00 oom-kill \udcff", "NVRM: XID (PCI:0000:3B:00): 31, pid=77, Ch 00000008",
        "nvidia-nvswitch1: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 44",
        "[  219.470994] NVRM: Xid (PCI:0000:db:00): 13, pid=9, Graphics Exception",
    ]
    noise = ["[{:.6f}] IPv6: ADDRCONF(NETDEV_CHANGE): veth{}: link becomes ready",
             "step {} loss 2.{} lr 3e-4", "[{:.6f}] audit: type=1400 apparmor=STATUS pid={}"]
    kernel: list[str] = []
    out: list[str] = []
    for i in range(lines):
        r = rnd.random()
        src = kernel if rnd.random() < 0.6 else out
        if r < 0.02:
            src.append(rnd.choice(examples))
        elif r < 0.04:
            src.append(rnd.choice(corpus))
        elif r < 0.05:
            src.append(rnd.choice(odd))
        else:
            src.append(rnd.choice(noise).format(i * 0.01, i))
    return kernel, "\n".join(out)


@needs_grep
@pytest.mark.parametrize("seed", range(6))
def test_same_verdict_on_a_synthetic_mix(seed, grep_must_answer):
    kernel, output = _synthetic(seed, 3000)
    admin = from_config({"xid": {"31": {"count": 2, "window_s": 60, "class": "hardware"}}, "disable": ["cuda-oom"]})
    cases = [
        Evidence(kernel_lines=kernel, stderr_tail=output),
        Evidence(kernel_lines=kernel, stderr_tail=output, exit_code=1, job_bus_ids=frozenset({"0000:07:00"}),
                 node_bus_ids={"0000:07:00": 0, "0000:3b:00": 1}),
        Evidence(kernel_lines=kernel[: len(kernel) // 3], stderr_tail=""),
        Evidence(kernel_lines=(), stderr_tail=output, exit_code=0),
        Evidence(kernel_lines="\n".join(kernel) + "\n", stderr_tail=output + "\n"),
    ]
    for ev in cases:
        for policy in (None, admin):
            py, gr = both(ev, policy)
            assert py == gr


FRAGMENTS = st.sampled_from([
    b"NVRM: Xid (PCI:0000:07:00): ", b"SXid (PCI:0000:86:00.0): ", b"Xid (", b"48, ", b"31, pid=1", b"45, ",
    b"caused by previous Xid ", b"[  219.470994] ", b"\xc3\xa9", b"\xff", b"\x00", b"\n", b"\r\n",
    b"CUDA out of memory", b"Fatal", b"Nonfatal", b"uncorrectable ECC error encountered", b"OOM",
    b"(GPU Reset Required)", b"EDAC MC0: 1 UE", b"fallen off the bus", b"blocked for more than",
])
BLOBS = st.lists(st.one_of(FRAGMENTS, st.binary(max_size=30)), max_size=25).map(b"".join)


@needs_grep
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BLOBS, BLOBS)
def test_same_verdict_on_arbitrary_bytes(kernel, output):
    ev = Evidence(kernel_lines=kernel.decode("utf-8", "surrogateescape").split("\n"),
                  stderr_tail=output.decode("utf-8", "replace"))
    py, gr = both(ev)
    assert py == gr


def test_small_inputs_never_start_grep(monkeypatch):
    def boom(*a, **kw):
        raise AssertionError("grep started for a small input")

    monkeypatch.setattr(prefilter, "grep_line_starts", boom)
    kernel, output = _synthetic(1, 2000)
    assert sum(len(x) + 1 for x in kernel) + len(output) < prefilter.GREP_MIN_BYTES
    classify(Evidence(kernel_lines=kernel, stderr_tail=output))


@needs_grep
def test_large_inputs_use_grep(monkeypatch, grep_must_answer):
    monkeypatch.setattr(prefilter, "GREP_MIN_BYTES", 1000)
    kernel, output = _synthetic(2, 2000)
    v = classify(Evidence(kernel_lines=kernel, stderr_tail=output))
    assert v.to_dict() == classify(Evidence(kernel_lines=kernel, stderr_tail=output), prefilter="python").to_dict()


def _fake_grep(tmp_path, body: str) -> str:
    path = tmp_path / "grep"
    path.write_text("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return str(path)


@pytest.mark.parametrize("body", ["exit 2", "echo garbage; exit 0", "kill -9 $$", "sleep 5"])
def test_grep_trouble_falls_back_to_python(tmp_path, monkeypatch, body):
    monkeypatch.setattr(prefilter, "GREP_PATHS", (_fake_grep(tmp_path, body),))
    monkeypatch.setattr(prefilter, "GREP_TIMEOUT_BASE_S", 0.5)
    assert prefilter.grep_line_starts([b"x oom\n"], [b"oom"]) is None
    kernel, output = _synthetic(3, 500)
    ev = Evidence(kernel_lines=kernel, stderr_tail=output)
    assert classify(ev, prefilter="grep").to_dict() == classify(ev, prefilter="python").to_dict()


def test_no_grep_falls_back_to_python(monkeypatch):
    monkeypatch.setattr(prefilter, "GREP_PATHS", ("/nonexistent/grep",))
    assert prefilter.grep_line_starts([b"x oom\n"], [b"oom"]) is None
    v = classify(Evidence(kernel_lines=["NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen off the bus."]),
                 prefilter="grep")
    assert v.verdict == "hardware"


def test_bad_prefilter_argument():
    with pytest.raises(ValueError):
        classify(Evidence(), prefilter="fast")
