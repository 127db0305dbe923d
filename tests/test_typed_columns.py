"""Typed values instead of text parsed back (issue 21): a health drain's check and GPU on the node
record (slurm_ft.drain.reason, slurm_ft.slurm.records.Node.failed_check), and the journal's
typed action columns of migration 011 (failover ``kind``, in-place ``restart``/``restart_of``),
back-filled once from old rows' text."""

from __future__ import annotations

import re

from hypothesis import example, given, strategies as st

from slurm_ft.drain.reason import LEADER, FailedCheck, health_reason, read_health_reason
from slurm_ft.failover import machine as m
from slurm_ft.health.result import CHECK_NAMES, CheckResult
from slurm_ft.slurm import Node

#: A GPU as a health reason names it (``GPU<n>``, a word of its own).
GPU_WORD = r"\bGPU\d+\b"


def node(reason: str, flags=("DRAIN",)) -> Node:
    return Node.from_json({"name": "n1", "state": "mixed", "state_flags": list(flags), "reason": reason})


# --------------------------------------------------------------------------- (1) health drains
measurements = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=250)


@given(st.sampled_from(CHECK_NAMES), st.one_of(st.none(), st.integers(0, 4096)), measurements)
@example("temperature", 5, "GPU51 at 91 C")           # names GPU5 only as part of another word
@example("xid_events", 2, "Xid 79 on nvGPU2")
@example("nvlink", 5, "GPU3 link to GPU5 down")        # names another GPU first
@example("row_remap", 1, "GPU1 row remap pending")     # names it first: written once
def test_a_health_reason_reads_back_as_its_check_and_gpu(check, gpu, measurement):
    """What :func:`health_reason` writes, :func:`read_health_reason` reads back: the check, and the
    GPU (None for a node-level result whose measurement names no GPU)."""
    if gpu is None and re.search(GPU_WORD, measurement):
        return          # a node-level measurement that names a GPU itself: that GPU is read
    reason = health_reason([CheckResult("gpu_count", "pass", None, "ok"), CheckResult(check, "fail", gpu, measurement)])
    assert reason is not None and reason.startswith(f"{LEADER} {check}: ") and len(reason) <= 200
    assert read_health_reason(reason, CHECK_NAMES) == FailedCheck(check, gpu)
    assert node(reason).failed_check == (check, gpu)
    if gpu is not None and re.match(rf"GPU{gpu}\b", measurement):
        assert reason == f"{LEADER} {check}: {measurement}"[:200]


def test_other_reasons_name_no_failed_check():
    for reason in ("", "bad DIMM, ticket 42", "slurm-ft: Xid 79 GPU 0000:10:00 (job 12)",
                   "slurm-ft: cuda-ecc-uncorrectable, verified (job 12)",
                   "slurm-ft: bisect: nccl fails with n5 (round 3 of 3)", "slurm-ft: nvml_responsive: GPU0 hung",
                   "temperature: GPU1 91 C", "slurm-ft temperature: GPU1 91 C"):
        assert read_health_reason(reason, CHECK_NAMES) is None and node(reason).failed_check is None
    assert read_health_reason("slurm-ft: temperature: GPU1 91 C", ("throttle",)) is None
    assert read_health_reason("slurm-ft:  temperature : GPU12 at 91 C", CHECK_NAMES) is None   # not its shape
    assert read_health_reason("slurm-ft: temperature: GPU12 at 91 C (GPU3 too)", CHECK_NAMES) == ("temperature", 12)
    assert read_health_reason("slurm-ft: xid_events: Xid 79 on nvGPU2", CHECK_NAMES) == ("xid_events", None)


def test_the_machine_reads_the_node_records_typed_check():
    """health_drain reads ``Node.failed_check`` (set from the reason when the record is made), and
    only while the node is drained."""
    drained = node("slurm-ft: temperature: GPU1 91 C")
    assert drained.failed_check == FailedCheck("temperature", 1)
    assert m.health_drain(drained) == ("temperature", 1)
    assert m.health_drain(node("slurm-ft: temperature: GPU1 91 C", flags=())) is None      # resumed
    assert m.health_drain(None) is None
    drained.failed_check = FailedCheck("row_remap", 3)      # the typed field is what is read
    assert m.health_drain(drained) == ("row_remap", 3)
    drained.failed_check = None
    assert m.health_drain(drained) is None
    built = Node("n2", "IDLE", ["DRAIN"], "slurm-ft: pcie_link: link gen 3 < 4", "root", "", "", {})
    assert m.health_drain(built) == ("pcie_link", None)          # any construction reads it once
