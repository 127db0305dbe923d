"""Decision logic: attribution by bus id, root cause, count/window rules, exit status, formats."""

from __future__ import annotations

import json

import pytest

from slurm_ft.classify import Evidence
from slurm_ft.classify import Verdict, XidEvent, classify, from_config, normalise_bus_id
from slurm_ft.classify.model import MAX_EVIDENCE_CHARS, MAX_EVIDENCE_LINES
from slurm_ft.classify.parse import parse_time, parse_xid
from slurm_ft.errors import EvidenceError

# real excerpts (shared corpus c001, c038, c088, c051, c005)
XID48 = "Dec  2 11:38:47 node01 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1."
XID64 = "Dec  2 11:38:47 node01 kernel: [  219.471050] NVRM: Xid (PCI:0000:07:00): 64, pid='<unknown>', name=<unknown>, Dynamic Page Retirement: Blacklisting failed.  Page should have been blacklisted on boot(0x00000000007fffa8)."
XID79_OLD = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
XID94_MIG = "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"
XID31 = "[Sat Jan 30 00:05:20 2021] NVRM: Xid (PCI:0000:db:00): 31, pid={pid}, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_10 faulted @ 0x7efe_ba290000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
XID45_149 = "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"
SXID = "nvidia-nvswitch3: SXid (PCI:0000:88:00.0): 12028, Non-fatal, Link 45 egress non-posted PRIV error (First)"


@pytest.mark.parametrize("text,want", [
    ("00000000:3B:00.0", "0000:3b:00"),
    ("0000:3b:00", "0000:3b:00"),
    ("3b:00.0", "0000:3b:00"),
    ("PCI:0000:01:00 GPU-I:05", "0000:01:00"),
    ("0019:01:00", "0019:01:00"),
    (" 0000:0B:00.0\n", "0000:0b:00"),
])
def test_normalise_bus_id(text, want):
    assert normalise_bus_id(text) == want


def test_normalise_bus_id_rejects_garbage():
    with pytest.raises(EvidenceError):
        normalise_bus_id("GPU-00000000-0000")


def test_root_cause_wins_48_before_64():
    v = classify(Evidence(kernel_lines=[XID48, XID64]))
    assert (v.verdict, v.rule, v.action) == ("hardware", "xid-48", "drain_node")
    assert [x.xid for x in v.xids] == [48, 64]
    assert v.evidence[0].endswith("subpartition 1.")


def test_old_format_and_mig_and_upper_case_bus_ids():
    v = classify(Evidence(kernel_lines=[XID79_OLD]))
    assert v.rule in ("xid-79", "gpu-fallen-off-bus") and v.verdict == "hardware"
    assert v.xids[0].bus_id == "0000:02:00"
    v = classify(Evidence(kernel_lines=[XID94_MIG]))
    assert (v.verdict, v.rule, v.xids[0].bus_id) == ("hardware", "xid-94", "0000:01:00")
    v = classify(Evidence(kernel_lines=["NVRM: Xid (PCI:0000:0B:00): 79, pid=1, GPU has fallen off the bus."],
                          job_bus_ids=frozenset({"0000:0b:00"})))
    assert v.verdict == "hardware" and v.xids[0].bus_id == "0000:0b:00"


def test_xid_without_bus_id_is_unplaced():
    """An Xid naming no bus id is attributed to no job: it decides nothing, it only asks for the
    trusted node checks (Verdict.unplaced; slurm_ft.node.epilog.verify_untrusted)."""
    v = classify(Evidence(kernel_lines=["NVRM: Xid: 79, GPU has fallen off the bus."], job_bus_ids=frozenset({"0000:3b:00"})))
    assert v.verdict != "hardware" and not v.xids
    assert v.unplaced == ("NVRM: Xid: 79, GPU has fallen off the bus.",)


def test_xid_on_another_jobs_gpu_drains_nothing():
    ev = Evidence(kernel_lines=[XID48], stderr_tail="", exit_code=1, job_bus_ids=frozenset({"0000:3b:00"}),
                  node_bus_ids={"0000:07:00": 0, "0000:3b:00": 1})
    v = classify(ev)
    assert v.verdict == "user" and v.rule == "exit-nonzero" and v.xids == ()
    # the same line on the job's own GPU fails over, with the GPU index from the map
    v = classify(Evidence(kernel_lines=[XID48], exit_code=1, job_bus_ids=frozenset({"0000:07:00"}),
                          node_bus_ids={"0000:07:00": 0, "0000:3b:00": 1}))
    assert v.verdict == "hardware" and v.xids[0].gpu_index == 0


def test_gpu_scoped_signature_follows_attribution():
    line = "NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)"
    assert classify(Evidence(kernel_lines=[line], job_bus_ids=frozenset({"0000:0a:00"}))).verdict == "hardware"
    assert classify(Evidence(kernel_lines=[line], job_bus_ids=frozenset({"0000:3b:00"}))).rule == "no-evidence"


def test_node_bus_ids_used_when_job_gpus_unknown():
    v = classify(Evidence(kernel_lines=[XID48], node_bus_ids={"0000:3b:00": 0}))
    assert v.xids == () and v.rule == "no-evidence"
    v = classify(Evidence(kernel_lines=[XID48], node_bus_ids={"0000:07:00": 5}))
    assert v.xids[0].gpu_index == 5 and v.verdict == "hardware"


def test_xid45_follows_the_xid_it_names():
    v = classify(Evidence(kernel_lines=[XID45_149]))
    assert (v.verdict, v.rule) == ("hardware", "xid-149")
    plain45 = "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001"
    v = classify(Evidence(kernel_lines=[plain45, XID31.format(pid=5)]))
    assert (v.verdict, v.rule) == ("user", "xid-31")  # plain 45 is cleanup: the 31 decides


def test_sxid_is_its_own_kind():
    v = classify(Evidence(kernel_lines=[SXID]))
    assert v.xids[0].kind == "sxid" and v.xids[0].xid == 12028 and v.verdict == "unknown"
    # an SXid is not attributed to job GPUs (NVSwitch is node-level) and never looked up as a GPU Xid
    v = classify(Evidence(kernel_lines=[SXID.replace("12028", "48")], job_bus_ids=frozenset({"0000:3b:00"})))
    assert v.xids[0].kind == "sxid" and v.rule == "sxid-nonfatal"


def test_app_xid_recurring_across_processes_is_unknown():
    one = classify(Evidence(kernel_lines=[XID31.format(pid=1), XID31.format(pid=2)]))
    assert one.verdict == "user"
    three = classify(Evidence(kernel_lines=[XID31.format(pid=p) for p in (1, 2, 3)]))
    assert (three.verdict, three.rule) == ("unknown", "xid-app-recurring")
    same_pid = classify(Evidence(kernel_lines=[XID31.format(pid=1)] * 5))
    assert same_pid.verdict == "user"


def test_admin_count_rule_three_31_within_an_hour_is_hardware():
    policy = from_config({"xid": {"31": {"count": 3, "window_s": 3600, "class": "hardware"}}})
    lines = [
        "[Fri Jan 29 23:42:34 2021] NVRM: Xid (PCI:0000:db:00): 31, pid=13641, Ch 00000008",
        "[Sat Jan 30 00:05:20 2021] NVRM: Xid (PCI:0000:db:00): 31, pid=14323, Ch 00000008",
        "[Sat Jan 30 00:32:48 2021] NVRM: Xid (PCI:0000:db:00): 31, pid=33275, Ch 00000008",
    ]
    v = classify(Evidence(kernel_lines=lines), policy)
    assert (v.verdict, v.rule, v.action) == ("hardware", "xid-31-count", "drain_node")
    # spread over more than an hour: each stays an application fault
    spread = [lines[0], lines[1], lines[2].replace("00:32:48", "01:32:48")]
    assert classify(Evidence(kernel_lines=spread), policy).verdict == "user"
    # on three different GPUs: no rule fires
    other = [lines[0], lines[1].replace("db:00", "3d:00"), lines[2].replace("db:00", "3e:00")]
    assert classify(Evidence(kernel_lines=other), policy).verdict == "user"


@pytest.mark.parametrize("line,clock", [
    ("[  219.470994] NVRM: x", "mono"),
    ("[Fri Aug 30 11:43:09 2024] NVRM: x", "wall"),
    ("Dec  2 11:38:47 node01 kernel: NVRM: x", "wall"),
    ("Dez  2 11:38:47 node01 kernel: NVRM: x", "wall"),
    ("déc.  2 11:38:47 node01 kernel: NVRM: x", "wall"),
    ("node01: kern: warning: [2026-04-22T21:30:51.526447914Z]: NVRM: x", "wall"),
])
def test_timestamps(line, clock):
    got = parse_time(line.encode())
    assert got is not None and got[0] == clock


def test_localised_month_names_agree():
    en = parse_time(b"Dec  2 11:38:47 node01 kernel: x")
    de = parse_time(b"Dez  2 11:38:47 node01 kernel: x")
    assert en == de


def test_wrapped_xid_line_rejoined():
    v = classify(Evidence(kernel_lines=["NVRM: Xid (PCI:0000:07:00):", "48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error"]))
    assert v.rule == "xid-48"


def test_parse_xid_needs_the_header_at_the_start():
    line = b'[gpu-health] [CRITICAL] GPU-1234: XID: NVRM: Xid (PCI:0000:c6:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.'
    assert parse_xid(line) is None  # a health agent's line is not a kernel record
    hit = parse_xid(line[line.index(b"NVRM"):])
    assert (hit.kind, hit.xid, hit.bus_id, hit.pid) == ("xid", 79, "0000:c6:00", 1101234)
    # the same text in the job's output (an agent's log it tails) is untrusted: it asks for the checks
    v = classify(Evidence(stderr_tail=line.decode(), exit_code=1))
    assert (v.verdict, v.action, v.xids) == ("hardware", "verify", ())


@pytest.mark.parametrize("kwargs,want", [
    (dict(exit_code=0), ("ok", "clean-exit", "none")),
    (dict(exit_code=0, slurm_state="COMPLETED"), ("ok", "clean-exit", "none")),
    (dict(exit_code=1), ("user", "exit-nonzero", "none")),
    (dict(exit_code=137), ("unknown", "signal-kill", "none")),
    (dict(exit_code=0, signal=9), ("unknown", "signal-kill", "none")),
    (dict(exit_code=0, signal=11), ("user", "signal-other", "none")),
    (dict(exit_code=0, signal=15), ("unknown", "signal-term", "none")),
    (dict(exit_code=-9), ("unknown", "signal-kill", "none")),
    (dict(exit_code=-6), ("user", "signal-other", "none")),
    (dict(), ("unknown", "no-evidence", "none")),
    (dict(exit_code=1, slurm_state="NODE_FAIL"), ("hardware", "slurm-node-fail", "drain_node")),
    (dict(exit_code=0, slurm_state="OUT_OF_MEMORY"), ("user", "slurm-out-of-memory", "none")),
    (dict(exit_code=0, slurm_state="TIMEOUT", signal=15), ("user", "slurm-timeout", "none")),
    (dict(exit_code=0, slurm_state="PREEMPTED"), ("infra", "slurm-preempted", "none")),
    (dict(exit_code=0, slurm_state="cancelled by 1000"), ("user", "slurm-state-cancelled", "none")),
])
def test_exit_status_and_slurm_state(kwargs, want):
    v = classify(Evidence(**kwargs))
    assert (v.verdict, v.rule, v.action) == want


def test_clean_exit_with_hardware_evidence_still_drains():
    v = classify(Evidence(kernel_lines=[XID48], exit_code=0))
    assert (v.verdict, v.rule, v.action) == ("ok", "clean-exit", "drain_node")
    assert v.xids[0].xid == 48


def test_oom_beats_exit_code_and_hardware_beats_oom():
    oom = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB."
    assert classify(Evidence(stderr_tail=oom, exit_code=1)).rule == "cuda-oom"
    v = classify(Evidence(kernel_lines=[XID48], stderr_tail=oom, exit_code=1))
    assert v.rule == "xid-48"


def test_job_output_cannot_forge_kernel_evidence():
    """An Xid printed by the job to its stderr is not a kernel line: no Xid event, no node action;
    a hardware one only asks for the trusted checks (action verify)."""
    v = classify(Evidence(stderr_tail=XID48 + "\n", exit_code=1))
    assert v.action == "verify" and v.xids == ()


def test_nvidia_smi_ecc_header_is_not_an_ecc_error():
    header = "Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |"
    v = classify(Evidence(kernel_lines=[header], stderr_tail=header + "\nRuntimeError: CUDA error: out of memory\n"))
    assert v.verdict == "user"


def test_evidence_is_bounded_and_verdict_json_able():
    lines = [XID31.format(pid=p) + "x" * 2000 for p in range(100)]
    v = classify(Evidence(kernel_lines=lines))
    assert len(v.evidence) <= MAX_EVIDENCE_LINES
    assert all(len(e) <= MAX_EVIDENCE_CHARS for e in v.evidence)
    d = json.loads(json.dumps(v.to_dict()))
    assert set(d) >= {"verdict", "rule", "xids", "evidence", "action"}
    assert set(d["xids"][0]) == {"xid", "bus_id", "gpu_index", "kind", "line"}


def test_types_are_frozen():
    v = classify(Evidence())
    assert isinstance(v, Verdict)
    with pytest.raises(AttributeError):
        v.verdict = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        XidEvent(1, None, None, "").xid = 2  # type: ignore[misc]


def test_bytes_and_odd_input_accepted():
    v = classify(Evidence(kernel_lines=[b"NVRM: Xid (PCI:0000:07:00): 48, x\xff\xfe"], stderr_tail="\udcff CUDA out of memory"))  # type: ignore[list-item]
    assert v.rule == "xid-48"


def test_many_xids_stay_fast_and_bounded():
    import time

    from slurm_ft.classify.engine import MAX_XIDS

    lines = [XID31.format(pid=p) for p in range(40_000)] + [XID48]
    t0 = time.perf_counter()
    v = classify(Evidence(kernel_lines=lines))
    assert time.perf_counter() - t0 < 5
    assert v.rule == "xid-48" and len(v.xids) == MAX_XIDS
    assert {x.xid for x in v.xids} == {31, 48}
