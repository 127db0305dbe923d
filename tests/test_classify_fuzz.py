"""Fuzz the parsers: arbitrary bytes, huge lines, invalid UTF-8 give a verdict or a named error."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.classify import CLASSES, Evidence, classify, normalise_bus_id
from slurm_ft.classify.parse import parse_time, parse_xid
from slurm_ft.classify.sources import read_tail_safely
from slurm_ft.errors import EvidenceError

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# fragments of real formats, so the fuzzer reaches deep into the grammar
FRAGMENTS = st.sampled_from([
    b"NVRM: Xid (PCI:0000:07:00): ", b"SXid (PCI:0000:86:00.0): ", b"Xid (", b"GPU-I:05)", b"48, ", b"45, ",
    b"caused by previous Xid ", b"pid=", b"'<unknown>'", b"[  219.470994] ", b"[Fri Aug 30 11:43:09 2024] ",
    b"Dec  2 11:38:47 ", b"\xc3\xa9", b"\xff", b"\n", b"CUDA out of memory", b"Fatal", b"Nonfatal",
    b"uncorrectable ECC error encountered", b"(GPU Reset Required)", b"0x0 (None)", b"EDAC MC0: 1 UE",
])
BLOBS = st.lists(st.one_of(FRAGMENTS, st.binary(max_size=40)), max_size=30).map(b"".join)


def _check(v):
    assert v.verdict in CLASSES and v.rule and v.action


@FAST
@given(BLOBS, BLOBS, st.none() | st.integers(-5, 300), st.none() | st.integers(-5, 70),
       st.none() | st.text(max_size=20))
def test_classify_never_crashes(kernel, output, code, sig, state):
    text_k = kernel.decode("utf-8", "surrogateescape")
    text_o = output.decode("utf-8", "replace")
    _check(classify(Evidence(kernel_lines=text_k.split("\n"), stderr_tail=text_o, exit_code=code, signal=sig,
                             slurm_state=state, job_bus_ids=frozenset({"0000:07:00"}), node_bus_ids={"0000:07:00": 0})))
    _check(classify(Evidence(kernel_lines=[kernel], stderr_tail=output)))  # bytes in, too


@FAST
@given(st.lists(st.text(max_size=80), max_size=8), st.text(max_size=200), st.none() | st.text(max_size=10))
def test_classify_any_unicode(lines, output, state):
    _check(classify(Evidence(kernel_lines=lines, stderr_tail=output, slurm_state=state)))
    _check(classify(Evidence(kernel_lines=["\ud800 NVRM: Xid (PCI:0000:07:00): 48,"], stderr_tail="\udfff")))


@FAST
@given(BLOBS)
def test_line_parsers_never_crash(blob):
    hit = parse_xid(blob)
    assert hit is None or hit.kind in ("xid", "sxid")
    t = parse_time(blob)
    assert t is None or t[0] in ("mono", "wall")


@FAST
@given(st.text(max_size=60))
def test_normalise_bus_id_returns_or_raises_named_error(text):
    try:
        out = normalise_bus_id(text)
    except EvidenceError:
        return
    assert len(out) == 10 and out == out.lower()


def test_huge_lines_stay_fast():
    huge = "A" * (8 << 20) + " NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen off the bus. " + "B" * (8 << 20)
    v = classify(Evidence(kernel_lines=[huge], stderr_tail="x" * (8 << 20) + " CUDA out of memory"))
    assert v.verdict != "hardware"  # not at the start of the record: text, not the driver's header
    huge = "NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen off the bus. " + "B" * (16 << 20)
    v = classify(Evidence(kernel_lines=["A" * (8 << 20), huge], stderr_tail="x" * (8 << 20) + " CUDA out of memory"))
    assert v.verdict == "hardware"
    v = classify(Evidence(kernel_lines=["(" * 200_000 + "Xid (" * 50_000], stderr_tail="Error: " * 200_000))
    _check(v)


@FAST
@given(st.binary(max_size=2000))
def test_tail_reader_any_bytes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("t") / "out"
    p.write_bytes(data)
    text = read_tail_safely(str(p), expected_uid=os.getuid(), max_bytes=512)
    assert isinstance(text, str)


def test_import_is_cheap():
    """The epilog imports slurm_ft.classify: no click, no data files loaded at import time."""
    code = ("import sys, slurm_ft.classify as c, slurm_ft.classify.table as t;"
            "assert 'click' not in sys.modules, 'click imported';"
            "assert t.signatures.cache_info().currsize == 0 and t.xid_catalog.cache_info().currsize == 0")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
