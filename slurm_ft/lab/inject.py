"""Fault injection for the lab: a real-format NVRM Xid line into the real kernel log, and the
GPU's processes killed the way a lost GPU kills them.

The epilog must find the evidence in the kernel log by itself; nothing here talks to it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from slurm_ft.errors import HostlistError, LabError
from slurm_ft.slurm import split_indices
from slurm_ft.lab import layout as L

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


def job_processes(node: str, gpu: int | None, conf: str | None = None) -> list[tuple[int, str]]:
    """(pid, job id) of every job process running on lab node ``node`` that holds GPU ``gpu``
    (any GPU if None), found by their environment (SLURMD_NODENAME, SLURM_JOB_GPUS/SLURM_STEP_GPUS).
    ``conf``: only the jobs of the native lab whose slurm.conf this is (their slurmstepd's
    SLURM_CONF, slurm_ft.hang.procs, in this host's pid namespace: a Docker lab's jobs are in
    their container's): labs side by side on one host have the same node names and job ids."""
    ours = None
    if conf is not None:
        from slurm_ft.hang.procs import scan
        here = os.readlink("/proc/self/ns/pid")
        ours = {p.pid for p in scan(conf=conf, node=node) if _pid_ns(p.pid) == here}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or (ours is not None and int(entry) not in ours):
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


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def inject_xid(node: str, xid: int, gpu: int = 0, kill: bool = True, lab_dir: str | None = None) -> dict:
    """Write the Xid line for ``node``'s GPU ``gpu`` to /dev/kmsg; with ``kill``, SIGKILL the job
    processes on that GPU (a fatal Xid ends the CUDA contexts on it) of the lab in ``lab_dir``
    (None: ``$SLURM_FT_LAB_DIR``, else the default lab, as the lab commands choose): never a job
    of another lab beside it on this host. Returns what was done."""
    if not 0 <= gpu < L.GPUS_PER_NODE:
        raise LabError(f"--gpu must be 0..{L.GPUS_PER_NODE - 1}, got {gpu}")
    try:
        number = L.node_number(node)
    except ValueError:
        raise LabError(f"{node!r} is not a lab node name (n1, n2, ...)") from None
    d = Path(os.path.abspath(lab_dir or os.environ.get("SLURM_FT_LAB_DIR") or L.DEFAULT_DIR))
    conf = str(L.Layout(d.parent.resolve() / d.name).slurm_conf)   # as slurm_ft.lab.cluster.Lab names it
    return xid_fault(L.bus_id(number, gpu), xid, job_processes(node, gpu, conf) if kill else [])


def xid_fault(bus_id: str, xid: int, procs: list[tuple[int, str]]) -> dict:
    """The fault itself, for a native or a Docker lab node: the Xid line for GPU ``bus_id`` into
    /dev/kmsg (naming the first of ``procs``, else pid 4242), then SIGKILL to every
    ``(pid, job)`` of ``procs``. Returns ``{"line", "killed"}``."""
    line = xid_line(bus_id, xid, procs[0][0] if procs else 4242)
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


#: What a task prints when an InfiniBand link fails under NCCL (classifier row ib-completion-error: infra).
INFRA_LINE = ("{node}:{pid}:{pid} [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer "
              "10.0.0.1<49189> with error 12, opcode 0, len 0, vendor err 129 (Recv)")


def inject_infra(node: str, *, conf: str, job_id: int | None = None, message: str | None = None) -> dict:
    """The step tasks (``srun`` steps, never the batch script) of the jobs on lab node ``node``
    (of the lab whose slurm.conf is ``conf``) print ``message`` on their stderr, as a network
    failure makes NCCL do, and are killed (SIGKILL). The line goes down the task's own stderr
    (``/proc/PID/fd/2``) only when that is a pipe or socket (what slurmstepd gives a task): a
    job's stderr that is a file of its choosing is never opened by root. Returns what was done."""
    from slurm_ft.hang.procs import roots, scan, tasks
    found = tasks(scan(job_id, conf=conf, node=node))
    if not found:
        return {"killed": []}
    for p in roots(found):
        say_on_stderr(p.pid, (message or INFRA_LINE).format(node=node, pid=p.pid))
    killed = []
    for p in found:
        try:
            os.kill(p.pid, signal.SIGKILL)
            killed.append({"pid": p.pid, "job": p.job, "step": p.step})
        except ProcessLookupError:
            pass
    return {"killed": killed}


def say_on_stderr(pid: int, line: str) -> bool:
    """Write ``line`` down process ``pid``'s stderr if that is a pipe or a socket (a task's stdio
    from slurmstepd); never when it is a file (root would write into whatever file the job's
    descriptor names). Returns whether it was written."""
    import stat
    try:
        st = os.stat(f"/proc/{pid}/fd/2")          # the open file itself, not a path the job chose
    except OSError:
        return False
    if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return False
    try:
        fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, (line + "\n").encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
