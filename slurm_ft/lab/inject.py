"""Fault injection for the lab: a real-format NVRM Xid line into the real kernel log, and the
GPU's processes killed the way a lost GPU kills them.

The epilog must find the evidence in the kernel log by itself; nothing here talks to it.
"""

from __future__ import annotations

import os
import signal

from ..errors import HostlistError, LabError
from ..slurm import split_indices
from . import layout as L

#: Message texts NVIDIA's driver prints after the Xid number (from the NVIDIA Xid catalog).
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2f_c0000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000008, engmask 00000101, intr 10000000",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860.",
    79: "GPU has fallen off the bus.",
    94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}


def xid_line(bus_id: str, xid: int, pid: int, name: str = "python") -> str:
    """``NVRM: Xid (PCI:0000:10:00): 79, pid=1234, name=python, GPU has fallen off the bus.``"""
    short = bus_id.lower()[4:] if bus_id.count(":") == 2 and len(bus_id.split(":")[0]) == 8 else bus_id.lower()
    short = short.rsplit(".", 1)[0]
    text = XID_TEXT.get(xid, "Unspecified error")
    return f"NVRM: Xid (PCI:{short}): {xid}, pid={pid}, name={name}, {text}"


def job_processes(node: str, gpu: int | None) -> list[tuple[int, str]]:
    """(pid, job id) of every job process running on lab node ``node`` that holds GPU ``gpu``
    (any GPU if None), found by their environment (SLURMD_NODENAME, SLURM_JOB_GPUS/SLURM_STEP_GPUS)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"SLURMD_NODENAME", b"").decode() != node or b"SLURM_JOB_ID" not in env:
            continue
        if b"SLURM_SCRIPT_CONTEXT" in env:  # slurmd's own prolog/epilog, not the job's work
            continue
        gpus = (env.get(b"SLURM_STEP_GPUS") or env.get(b"SLURM_JOB_GPUS") or b"").decode()
        try:
            held = set(split_indices(gpus))
        except HostlistError:  # a job's own environment: garbage there is no GPU of ours
            held = set()
        if gpu is None or gpu in held:
            found.append((int(entry), env[b"SLURM_JOB_ID"].decode()))
    return found


def inject_xid(node: str, xid: int, gpu: int = 0, kill: bool = True) -> dict:
    """Write the Xid line for ``node``'s GPU ``gpu`` to /dev/kmsg; with ``kill``, SIGKILL the job
    processes on that GPU (a fatal Xid ends the CUDA contexts on it). Returns what was done."""
    if not 0 <= gpu < L.GPUS_PER_NODE:
        raise LabError(f"--gpu must be 0..{L.GPUS_PER_NODE - 1}, got {gpu}")
    try:
        number = L.node_number(node)
    except ValueError:
        raise LabError(f"{node!r} is not a lab node name (n1, n2, ...)") from None
    procs = job_processes(node, gpu) if kill else []
    pid = procs[0][0] if procs else 4242
    line = xid_line(L.bus_id(number, gpu), xid, pid)
    try:
        with open("/dev/kmsg", "w") as fh:
            fh.write(f"<3>{line}\n")
    except OSError as exc:
        raise LabError(f"cannot write /dev/kmsg ({exc.strerror}): run as root") from None
    killed = []
    for p, job in procs:
        try:
            os.kill(p, signal.SIGKILL)
            killed.append({"pid": p, "job": job})
        except ProcessLookupError:
            pass
    return {"line": line, "killed": killed}
