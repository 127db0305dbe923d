"""The steps of ``classify()`` alone (slurm_ft.classify.engine): candidate lines, attribution by
bus id, count rules, Xid / output / signature / status candidates, ranking, decision, evidence."""

from __future__ import annotations

import pytest

from slurm_ft.classify import Evidence, classify, default_policy
from slurm_ft.classify.engine import (
    Candidate, Lines, attribute_xids, candidate_lines, clean_exit, decide, evidence_lines, exit_status,
    fired_count_rules, output_names_job, output_xid_candidates, place, rank, signature_candidates,
    status_candidates, unplaced_lines, xid_candidates)
from slurm_ft.classify.model import MAX_EVIDENCE_LINES

# /dev/kmsg record bodies of real excerpts (shared corpus c001, c051)
XID48 = ("NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error "
         "(DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.")
XID64 = ("NVRM: Xid (PCI:0000:07:00): 64, pid='<unknown>', name=<unknown>, Dynamic Page Retirement: "
         "Blacklisting failed.  Page should have been blacklisted on boot(0x00000000007fffa8).")
XID79_OTHER = "NVRM: Xid (PCI:0000:0a:00): 79, GPU has fallen off the bus."
XID79_NO_BUS = "NVRM: Xid: 79, GPU has fallen off the bus."
XID31 = ("NVRM: Xid (PCI:0000:07:00): 31, pid={pid}, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS "
         "GPCCLIENT_T1_10 faulted @ 0x7efe_ba290000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ")
OUTPUT = (b"step 1 | loss 2.1\nCUDA error: an illegal memory access was encountered\n"
          b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
JOB = frozenset({"0000:07:00"})
NODE = {"0000:07:00": 0, "0000:0a:00": 1}
GPUS = {"job_bus_ids": JOB, "node_bus_ids": NODE}


@pytest.fixture(scope="module")
def policy():
    return default_policy()


def kernel(*records: str) -> bytes:
    return "\n".join(records).encode()


def cand(priority=500, pos=0, cls="user", action="none", rule="r", line=b"x", trusted=True) -> Candidate:
    return Candidate(priority, pos, cls, action, rule, line, trusted)


# -- step 1: candidate lines -----------------------------------------------------------------------
def test_candidate_lines_positions_and_rows(policy):
    k = kernel(XID48, "usb 1-2: new high-speed USB device number 3 using xhci_hcd", XID79_OTHER)
    lines = candidate_lines(k, OUTPUT, policy, strict=True, prefilter="python")
    assert lines.out_base == len(k) + 1
    assert [pos for pos, _ in lines.kernel_xids] == [0, k.index(b"NVRM: Xid (PCI:0000:0a")]
    assert all(k[pos:].startswith(line[:20]) for pos, line in lines.kernel_xids)
    assert [(row.id, pos) for row, pos, _ in lines.kernel_hits] == [("gpu-fallen-off-bus", k.index(b"NVRM: Xid (PCI:0000:0a"))]
    hits = {row.id: pos for row, pos, _ in lines.output_hits}
    assert hits["illegal-memory-access"] == lines.out_base + OUTPUT.index(b"CUDA error")
    assert hits["cuda-oom"] == lines.out_base + OUTPUT.index(b"RuntimeError")
    assert lines.output_xids == []


def test_candidate_lines_same_on_both_paths(policy):
    k = kernel(XID48, "noise", XID64, XID79_NO_BUS)
    out = OUTPUT + b"agent: NVRM: Xid (PCI:0000:07:00): 48, pid=1, name=x, An uncorrectable double bit error\n"
    python = candidate_lines(k, out, policy, strict=False, prefilter="python")
    assert candidate_lines(k, out, policy, strict=False, prefilter="grep") == python
    assert isinstance(python, Lines) and len(python.output_xids) == 1


def test_candidate_lines_rejoins_a_wrapped_header_only_in_saved_logs(policy):
    k = kernel("[  219.470994] NVRM: Xid (PCI:0000:07:00):", "48, pid=1, name=x, An uncorrectable double bit error")
    saved = candidate_lines(k, b"", policy, strict=False, prefilter="python").kernel_xids
    records = candidate_lines(k, b"", policy, strict=True, prefilter="python").kernel_xids
    assert len(saved) == 1 and saved[0][1].endswith(b"double bit error")
    assert [line for _, line in records] == [k.split(b"\n")[0]]


# -- attribution by bus id ------------------------------------------------------------------------
@pytest.mark.parametrize("bus,job,node,want", [
    ("0000:07:00", JOB, NODE, "job"),
    ("0000:0a:00", JOB, NODE, "other"),
    ("0000:99:00", JOB, NODE, "unplaced"),  # not a GPU of this node
    (None, JOB, NODE, "unplaced"),
    ("0000:0a:00", None, NODE, "job"),  # the job's GPUs unknown: the node's
    ("0000:0a:00", None, None, "job"),  # neither map known: an offline classification
    ("0000:07:00", frozenset(), NODE, "other"),  # a job without GPUs owns none
])
def test_place(bus, job, node, want):
    assert place(bus, job, node) == want


def test_output_names_job():
    assert output_names_job(None, JOB, NODE)
    assert output_names_job("0000:07:00", JOB, NODE)
    assert output_names_job("0000:99:00", JOB, NODE)  # unplaced is not another job's
    assert not output_names_job("0000:0a:00", JOB, NODE)


# -- step 2: Xids attributed to this job ------------------------------------------------------------
def test_attribute_xids(policy):
    k = kernel(XID48, XID79_OTHER, XID64, XID79_NO_BUS, "NVRM: Xid text a process wrote: 48")
    lines = candidate_lines(k, b"", policy, strict=True, prefilter="python")
    judged, unplaced = attribute_xids(lines.kernel_xids, policy, strict=True, **GPUS)
    assert [(j.event.xid, j.event.bus_id, j.event.gpu_index, j.pos) for j in judged] == [
        (48, "0000:07:00", 0, 0), (64, "0000:07:00", 0, k.index(XID64.encode()))]  # 79 on 0a: another job's
    assert all(j.hit.xid == j.event.xid and j.line.startswith(b"NVRM: Xid (") for j in judged)
    assert unplaced == [(k.index(XID79_NO_BUS.encode()), XID79_NO_BUS.encode())]


def test_attribute_xids_cuts_the_event_line(policy):
    long = XID48 + " x" * 2000
    judged, _ = attribute_xids([(0, long.encode())], policy, strict=True, job_bus_ids=None, node_bus_ids=None)
    assert len(judged[0].event.line) == 1000 and judged[0].event.gpu_index is None


# -- step 3: count rules ----------------------------------------------------------------------------
def test_fired_count_rules_three_processes(policy):
    k = kernel(*(XID31.format(pid=p) for p in (101, 102, 101, 103)))
    lines = candidate_lines(k, b"", policy, strict=True, prefilter="python")
    judged, _ = attribute_xids(lines.kernel_xids, policy, strict=True, **GPUS)
    fired = fired_count_rules(judged, policy)
    assert sorted(fired) == [0, 1, 2, 3] and {r.id for r in fired.values()} == {"xid-app-recurring"}
    two = fired_count_rules(judged[:3], policy)  # pids 101, 102, 101: two processes
    assert two == {}
    now = 1_000_000.0
    prior = [(now - 60, 31, "0000:07:00", 555), (now - 7200, 31, "0000:07:00", 556),  # out of the window
             (now - 60, 31, "0000:0a:00", 557)]  # another GPU
    assert sorted(fired_count_rules(judged[:3], policy, prior, now)) == [0, 1, 2]
    assert fired_count_rules(judged[:3], policy, prior[1:], now) == {}


# -- step 4: Xid candidates -------------------------------------------------------------------------
def test_xid_candidates_catalog_rows_and_count_rule(policy):
    k = kernel(XID48, XID64)
    judged, _ = attribute_xids(candidate_lines(k, b"", policy, strict=True).kernel_xids, policy, strict=True, **GPUS)
    cands = xid_candidates(judged, {}, policy)
    assert [(c.rule, c.cls, c.action, c.pos, c.trusted) for c in cands] == [
        ("xid-48", "hardware", "drain_node", 0, True), ("xid-64", "hardware", "drain_node", k.index(b"NVRM: Xid (PCI:0000:07:00): 64"), True)]
    assert cands[0].priority > cands[1].priority
    rule = policy.counts[0]
    assert xid_candidates(judged, {1: rule}, policy)[1].rule == rule.id


def test_xid_candidates_45_judged_as_the_xid_it_names(policy):
    line = b"NVRM: Xid (PCI:0000:07:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 48"
    judged, _ = attribute_xids([(0, line)], policy, strict=True, **GPUS)
    assert xid_candidates(judged, {}, policy)[0].rule == "xid-48"


# -- step 5: Xids named in the job's output ----------------------------------------------------------
def test_output_xid_candidates_untrusted_and_attributed(policy):
    out = [(0, b"dmesg: NVRM: Xid (PCI:0000:07:00): 48, pid=1, name=x, An uncorrectable double bit error"),
           (90, b"NVRM: Xid (PCI:0000:0a:00): 48, pid=1, name=x, An uncorrectable double bit error"),  # another job's
           (200, b"NVRM: Xid (PCI:0000:07:00): 13, pid=1, name=x, Graphics Exception")]  # not hardware
    cands = output_xid_candidates(out, policy, 50, **GPUS)
    assert [(c.rule, c.pos, c.trusted, c.cls) for c in cands] == [("xid-48", 50, False, "hardware")]


# -- step 6: signature rows ---------------------------------------------------------------------------
def test_signature_candidates_trust_and_placement(policy):
    k = kernel(XID79_OTHER, XID79_NO_BUS, "NVRM: GPU at PCI:0000:07:00: GPU has fallen off the bus.")
    lines = candidate_lines(k, OUTPUT, policy, strict=True, prefilter="python")
    cands, unplaced = signature_candidates(lines, k, strict=True, **GPUS)
    kernel_cands = [c for c in cands if c.trusted]
    assert [(c.rule, c.pos) for c in kernel_cands] == [("gpu-fallen-off-bus", k.index(b"NVRM: GPU at"))]
    assert {c.rule for c in cands if not c.trusted} == {"cuda-oom", "illegal-memory-access", "python-exception"}
    assert all(c.pos >= lines.out_base for c in cands if not c.trusted)
    assert unplaced == [(k.index(XID79_NO_BUS.encode()), XID79_NO_BUS.encode())]


def test_signature_candidates_need_the_kernel_header_at_the_record_start(policy):
    k = kernel("trainer[4242]: NVRM: GPU 0000:07:00.0: GPU has fallen off the bus.")  # a process's words
    lines = candidate_lines(k, b"", policy, strict=True, prefilter="python")
    assert [row.id for row, _, _ in lines.kernel_hits] == ["gpu-fallen-off-bus"]
    assert signature_candidates(lines, k, strict=True, **GPUS) == ([], [])


# -- step 7: Slurm state and exit status --------------------------------------------------------------
@pytest.mark.parametrize("code,sig,want", [
    (137, None, (137, 9)), (-9, None, (None, 9)), (1, None, (1, None)), (0, 15, (0, 15)),
    (None, None, (None, None)), (160, None, (160, None)), (128, None, (128, None))])
def test_exit_status(code, sig, want):
    assert exit_status(code, sig) == want


def test_status_candidates(policy):
    cands = status_candidates(Evidence(exit_code=137, slurm_state=" node_fail"), policy, 100)
    assert [(c.rule, c.pos, c.trusted, c.line) for c in cands] == [
        ("slurm-node-fail", 100, True, b"slurm state: NODE_FAIL"), ("signal-kill", 101, False, b"exit=137 signal=9")]
    assert status_candidates(Evidence(), policy, 7) == []


@pytest.mark.parametrize("kwargs,want", [
    ({"exit_code": 0}, True), ({"exit_code": 0, "slurm_state": "completed"}, True),
    ({"exit_code": 0, "slurm_state": "NODE_FAIL"}, False), ({"exit_code": 0, "signal": 9}, False),
    ({"exit_code": 1}, False), ({}, False), ({"exit_code": -9}, False)])
def test_clean_exit(kwargs, want):
    assert clean_exit(Evidence(**kwargs)) is want


# -- step 8: ranking ---------------------------------------------------------------------------------
def test_rank_priority_then_earliest():
    assert rank([]) is None
    a, b, c = cand(500, 10), cand(500, 5), cand(400, 1)
    assert rank([a, b, c]) is b
    first, same = cand(500, 5, rule="first"), cand(500, 5, rule="same")
    assert rank([first, same]) is first


def test_rank_trusted_hardware_beats_untrusted_and_proof_beats_verify():
    untrusted = cand(990, 1, "hardware", "drain_node", trusted=False)
    verify = cand(900, 2, "hardware", "verify")
    proof = cand(100, 3, "hardware", "drain_node")
    assert rank([untrusted, verify, proof]) is proof
    assert rank([untrusted, verify]) is verify
    assert rank([untrusted, cand(50, 0)]) is untrusted  # no trusted hardware evidence: the winner stays


# -- step 9: decision ---------------------------------------------------------------------------------
def test_decide():
    drain = cand(950, 0, "hardware", "drain_node", "xid-48")
    assert decide(drain, clean=True) == ("ok", "clean-exit", "drain_node")
    assert decide(cand(950, 0, "hardware", "verify"), clean=True) == ("ok", "clean-exit", "none")
    assert decide(cand(950, 0, "hardware", "drain_node", trusted=False), clean=True) == ("ok", "clean-exit", "none")
    assert decide(None, clean=True) == ("ok", "clean-exit", "none")
    assert decide(drain, clean=False) == ("hardware", "xid-48", "drain_node")
    assert decide(cand(950, 0, "hardware", "reset_gpu", "r", trusted=False), clean=False) == ("hardware", "r", "verify")
    assert decide(cand(700, 0, "user", "none", "cuda-oom", trusted=False), clean=False) == ("user", "cuda-oom", "none")
    assert decide(None, clean=False) == ("unknown", "no-evidence", "none")


# -- step 10: evidence lines -----------------------------------------------------------------------------
def test_evidence_lines_winner_and_its_rule_first_then_priority():
    win = cand(500, 9, rule="w", line=b"winner")
    same_rule = cand(100, 20, rule="w", line=b"same rule")
    high = cand(900, 1, rule="h", line=b"high")
    low = cand(200, 0, rule="l", line=b"low ")
    dup = cand(800, 2, rule="d", line=b"  high  ")
    assert evidence_lines([low, high, same_rule, dup, win], win) == ("winner", "same rule", "high", "low")
    assert evidence_lines([], None) == ()
    many = [cand(1, i, line=b"line %d" % i) for i in range(MAX_EVIDENCE_LINES + 5)]
    assert len(evidence_lines(many, None)) == MAX_EVIDENCE_LINES


def test_unplaced_lines_in_log_order_distinct():
    assert unplaced_lines([(30, b"b"), (10, b"a "), (20, b"b"), (40, b"")]) == ("a", "b")


# -- the composition ---------------------------------------------------------------------------------------
def test_classify_is_the_composition_of_its_steps(policy):
    k = kernel(XID79_OTHER, XID48, XID64, XID79_NO_BUS)
    ev = Evidence(kernel_lines=k.decode().split("\n"), stderr_tail=OUTPUT.decode(), exit_code=1, kernel_records=True,
                  **GPUS)
    lines = candidate_lines(k, OUTPUT, policy, strict=True)
    judged, unplaced = attribute_xids(lines.kernel_xids, policy, strict=True, **GPUS)
    cands = xid_candidates(judged, fired_count_rules(judged, policy), policy)
    cands += output_xid_candidates(lines.output_xids, policy, lines.out_base, **GPUS)
    sig, sig_unplaced = signature_candidates(lines, k, strict=True, **GPUS)
    cands += sig + status_candidates(ev, policy, lines.out_base + len(OUTPUT) + 1)
    win = rank(cands)
    v = classify(ev, policy)
    assert (v.verdict, v.rule, v.action) == decide(win, clean_exit(ev)) == ("hardware", "xid-48", "drain_node")
    assert v.evidence == evidence_lines(cands, win)
    assert v.unplaced == unplaced_lines(unplaced + sig_unplaced) == (XID79_NO_BUS,)
    assert [x.xid for x in v.xids] == [j.event.xid for j in judged] == [48, 64]
