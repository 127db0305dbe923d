"""The per-source, per-piece grep prefilter (slurm_ft.classify.candidates) gives exactly the
verdict of the pure-Python path, however the kernel text is cut."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.classify import Evidence, classify, engine, prefilter
from slurm_ft.classify.candidates import GrepRun, grep_keys
from slurm_ft.classify.policy import default_policy
from slurm_ft.classify.table import signatures

needs_grep = pytest.mark.skipif(prefilter._grep() is None, reason="no grep at /usr/bin/grep or /bin/grep")

LINES = st.one_of(
    st.sampled_from([s.example for s in signatures()] + [
        "NVRM: Xid (PCI:0000:07:00):", "48, pid=1, name=python, An uncorrectable double bit error",
        "[  219.470994] NVRM: Xid (PCI:0000:3b:00): 79, pid=9, name=x, GPU has fallen off the bus.",
        "nvidia-nvswitch1: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 44", "", "xid", "XID\r",
        "step 10 loss 2.1", "\x00 oom-kill \udcff"]),
    st.text(max_size=40))


@needs_grep
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kernel=st.lists(LINES, max_size=30), output=st.lists(LINES, max_size=12),
       pieces=st.integers(1, 5), trailing=st.booleans())
def test_any_cut_gives_the_python_verdict(monkeypatch_module, kernel, output, pieces, trailing):
    monkeypatch_module.setattr(engine, "KERNEL_PIECES", pieces)
    kernel_lines = "\n".join(kernel) + "\n" if trailing else kernel
    ev = Evidence(kernel_lines=kernel_lines, stderr_tail="\n".join(output), exit_code=1)
    assert classify(ev, prefilter="grep").to_dict() == classify(ev, prefilter="python").to_dict()
    # grep answered (the comparison was not Python against Python)
    assert engine._candidates(engine._to_bytes(kernel_lines), engine._text(ev.stderr_tail), default_policy()) is not None


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@needs_grep
def test_pieces_map_back_to_whole_text_offsets():
    run = GrepRun(default_policy())
    text = b"a xid\nnothing\nb XID\nc\nxid d"
    cut = text.index(b"\n", 8)
    view = memoryview(text)
    run.add("kernel", view[:cut], 0)
    run.add("kernel", view[cut + 1:], cut + 1)
    run.add("output", b"")  # an empty text starts nothing
    found = run.result()
    assert found == {"kernel": [0, 14, 22], "output": []}


def test_each_source_is_searched_for_its_own_keys():
    policy = default_policy()
    for source in ("kernel", "output"):
        keys = grep_keys(policy, source)
        assert b"xid" in keys and set(policy.index[source]) <= set(keys)
    assert set(grep_keys(policy, "kernel")) != set(grep_keys(policy, "output"))


@needs_grep
@pytest.mark.parametrize("failing", ["kernel", "output"])
def test_one_grep_failing_means_the_python_path(monkeypatch, failing):
    real = prefilter.grep_line_starts
    failing_keys = grep_keys(default_policy(), failing)

    def flaky(chunks, keys):
        return None if list(keys) == failing_keys else real(chunks, keys)

    monkeypatch.setattr(prefilter, "grep_line_starts", flaky)
    ev = Evidence(kernel_lines=["NVRM: Xid (PCI:0000:07:00): 79, pid=1, name=x, GPU has fallen off the bus."] * 3,
                  stderr_tail="CUDA error: out of memory\n", exit_code=1)
    assert classify(ev, prefilter="grep").to_dict() == classify(ev, prefilter="python").to_dict()


def test_an_error_in_a_grep_thread_is_raised(monkeypatch):
    def broken(chunks, keys):
        raise RuntimeError("grep wrapper bug")

    monkeypatch.setattr(prefilter, "grep_line_starts", broken)
    with pytest.raises(RuntimeError, match="grep wrapper bug"):
        classify(Evidence(kernel_lines=["x"], stderr_tail="y"), prefilter="grep")
