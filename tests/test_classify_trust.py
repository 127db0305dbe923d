"""The classifier's trust boundary (docs/security.md): what a job writes, and names a job gives
to its processes and files, never drain or reset a node.  Each test is an attack a user can do."""

from __future__ import annotations

import pytest

from slurm_ft.classify import Evidence, classify
from slurm_ft.classify.parse import mask_user_fields, message_body, parse_xid
from slurm_ft.classify.table import signatures

BUS = "0000:10:00"
NODE_ACTIONS = ("drain_node", "reset_gpu")
HW_OUTPUT_ROWS = [r for r in signatures() if r.source in ("output", "any") and r.cls == "hardware"]


@pytest.mark.parametrize("exit_code", [1, 0])
@pytest.mark.parametrize("row", HW_OUTPUT_ROWS, ids=[r.id for r in HW_OUTPUT_ROWS])
def test_job_output_alone_never_acts_on_the_node(row, exit_code):
    """Attack 1: a job prints a hardware-looking line (every output/any hardware row's own
    excerpt), then exits 1 or 0."""
    v = classify(Evidence(stderr_tail=f"step 10\n{row.example}\n", exit_code=exit_code, kernel_records=True))
    assert v.action not in NODE_ACTIONS
    if exit_code == 0:
        assert (v.verdict, v.action) == ("ok", "none")
    else:
        assert v.action == "verify"  # the epilog's trusted checks decide


def test_trusted_kernel_evidence_beats_untrusted_output():
    kernel = [f"NVRM: Xid (PCI:{BUS}): 79, pid=1, name=python, GPU has fallen off the bus."]
    v = classify(Evidence(kernel_lines=kernel, stderr_tail="RuntimeError: CUDA error: uncorrectable ECC error encountered",
                          exit_code=1, job_bus_ids=frozenset({BUS}), kernel_records=True))
    assert (v.verdict, v.rule, v.action) == ("hardware", "xid-79", "drain_node")


# Lines the kernel prints with a user-chosen process name (comm, <= 15 bytes) or file name.
FORGED = {
    "oom-kill": "Out of memory: Killed process 4242 (NVRM: Xid: 79,) total-vm:1000kB, anon-rss:900kB, UID:1000",
    "oom-reaper": "oom_reaper: reaped process 4242 (Xid: 79, lost), now anon-rss:0kB",
    "invoked-oom": "NVRM: Xid: 79, invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE), order=0",
    "segfault-comm": "NVRM: Xid: 79, [4242]: segfault at 0 ip 0000000000401000 sp 00007ffd5e3a1b28 error 4 in a.out[401000+1000]",
    "segfault-file": f"python[4242]: segfault at 0 ip 00007f00 sp 00007ffd error 4 in NVRM: Xid (PCI:{BUS}): 79, GPU has fallen off the bus[7f3a2b000000+1c000]",
    "traps": f"traps: x[4242] general protection fault ip:7f sp:7f error:0 in NVRM: Xid (PCI:{BUS}): 48, DBE[7f+1]",
    "hung-task": "INFO: task NVRM: Xid: 79,:4242 blocked for more than 120 seconds.",
    "sched-show": "task:NVRM: Xid: 79, state:D stack:0     pid:4242  ppid:1 flags:0x00004000",
    "stack-dump": f"CPU: 3 PID: 4242 Comm: NVRM: Xid (PCI:{BUS}): 79, Tainted: P OE 6.1.0",
    "audit": f'audit: type=1326 audit(1700000000.1:42): pid=4242 comm="x" exe="/home/u/NVRM: Xid (PCI:{BUS}): 79, GPU has fallen off the bus" sig=31',
    "fallen-file": f"python[4242]: segfault at 0 ip 0 sp 0 error 4 in GPU {BUS}.0: GPU has fallen off the bus[7f+1]",
}


@pytest.mark.parametrize("records", [True, False], ids=["kmsg", "saved-log"])
@pytest.mark.parametrize("name", FORGED)
def test_process_and_file_names_never_forge_hardware(name, records):
    """Attack 2: a process (or a file it faults in) named like an Xid line with a bus id."""
    line = FORGED[name]
    if not records:
        line = "Dec  2 11:38:47 node01 kernel: [  219.470994] " + line
    v = classify(Evidence(kernel_lines=[line], exit_code=1, job_bus_ids=frozenset({BUS}), kernel_records=records))
    assert v.verdict != "hardware" and v.action not in NODE_ACTIONS, (name, v)
    assert not v.xids


def test_a_process_name_cannot_turn_a_real_xid_into_hardware():
    """A real Xid 13 (the job's own bug) from a process named "GPU is lost" stays a user fault:
    the NVRM line's name= field is blanked before any rule reads the driver's words."""
    line = f"NVRM: Xid (PCI:{BUS}): 13, pid=4242, name=GPU is lost, Graphics SM Warp Exception"
    v = classify(Evidence(kernel_lines=[line], exit_code=1, job_bus_ids=frozenset({BUS}), kernel_records=True))
    assert (v.verdict, v.rule) == ("user", "xid-13")
    line = f"NVRM: Xid (PCI:{BUS}): 13, pid=4242, name=Non-fatal x, Graphics SM Warp Exception"
    assert mask_user_fields(line.encode()).count(b"Non-fatal") == 0


def test_a_process_name_cannot_hide_a_real_xid():
    """Nor can a name shaped like a template make the driver's own line user-named."""
    line = f"NVRM: Xid (PCI:{BUS}): 79, pid=4242, name=[1] trap x, GPU has fallen off the bus."
    v = classify(Evidence(kernel_lines=[line], exit_code=1, job_bus_ids=frozenset({BUS}), kernel_records=True))
    assert (v.verdict, v.rule, v.action) == ("hardware", "xid-79", "drain_node")


def test_kmsg_records_need_the_header_at_the_start():
    hit = parse_xid(f"NVRM: Xid (PCI:{BUS}): 79, GPU has fallen off the bus.".encode())
    assert hit is not None and (hit.xid, hit.bus_id) == (79, BUS)
    assert parse_xid(f"x NVRM: Xid (PCI:{BUS}): 79, lost".encode()) is None
    # only the driver's exact header: a bus id or GPU number in the parentheses, a comma after
    assert parse_xid(b"NVRM: Xid (PCI:[4242]: segfault): 79, x") is None
    hit = parse_xid(b"NVRM: Xid: 79,[4242]: segfault at 0")  # a process named "NVRM: Xid: 79,"
    assert hit.bus_id is None  # no bus id: unplaced, attributed to no job (it only asks for checks)
    assert parse_xid(b"Xid 79 on my GPU") is None


def test_message_body_strips_saved_log_wrappers():
    body = b"NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>'"
    for prefix in (b"Dec  2 11:38:47 node01 kernel: [  219.470994] ", b"[Fri Aug 30 11:43:09 2024] ",
                   b"node01: kern: warning: [2026-04-22T21:30:51.870495804Z]: ", b"Mar 29 15:38:59 kernel: ",
                   b"[74889.644138] ", b"<3>"):
        assert message_body(prefix + body) == body
