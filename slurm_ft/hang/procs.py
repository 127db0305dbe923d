"""A job's processes on this node, found the way root can trust: through slurmstepd.

The one process scanner: the hang watcher (root: which pids to dump and end), the lab's fault
injection, and the checkpoint delivery step (the job's owner: which processes get the checkpoint
signal, ``slurm_ft.checkpoint.deliver``) all call :func:`scan`, with their filters as arguments.

Every process of a job step descends from that step's ``slurmstepd``, a process the kernel says is
root's (its real uid in ``/proc/PID/status`` and the owner of ``/proc/PID`` are 0) and named
``slurmstepd`` whose command line slurmstepd itself sets to ``slurmstepd: [JOB.STEP]``; the
kernel's parent links (``/proc/PID/stat``) cannot be forged by the job. So the job's processes are
those whose nearest stepd ancestor is one of its stepds (a process below another job's stepd, or
below a stepd filtered out, is not this job's). With ``cgroups``, a process in a step cgroup
(``/job_J/step_S`` in ``/proc/PID/cgroup``, proctrack/cgroup) counts as that step's as well, and so
do its descendants: a process that double-forked away from its stepd is found that way only.
A process of user U is one whose real uid is U **and** whose ``/proc/PID`` the kernel gives to U
(a process that changed its ids or made itself non-dumpable shows as root's: it is nobody's job).

In the lab several slurmd share one host (and job ids repeat across labs): a stepd belongs to
this cluster when its ``SLURM_CONF`` is ours (``conf``), and a task to this node when its
``SLURMD_NODENAME`` is (``node``; the job's own environment, which only decides between the
job's own processes). On a real node both filters are moot (one slurmd per host; a stepd
started by systemd's slurmd has no ``SLURM_CONF`` and is always taken as ours).

Reads only ``/proc``; costs one pass over it (a few ms on a busy node): used when acting, not at
every look of a watcher. Standard library only: the checkpoint delivery step runs this file with
the nodes' system Python.

**Pinning.** A pid is only a number the kernel hands out again once its process is gone. Before
root signals a scanned process, :func:`pin` opens a pidfd on it (``pidfd_open(2)``, Linux >= 5.3)
and only then checks that the process behind the pid is still the scanned one (its start time,
field 22 of ``/proc/PID/stat``, in clock ticks since boot, and its owner): the pidfd names that
process and no other for as long as it is open, so :meth:`Pinned.signal`
(``pidfd_send_signal(2)``) can never reach a process that reused the pid. Without pidfds (an
older kernel) the same check is made right before ``kill(2)`` instead.
"""

from __future__ import annotations

import errno
import os
import re
import select
import signal as signal_mod
import time
from dataclasses import dataclass

_STEPD = re.compile(rb"^slurmstepd: \[(\d+)\.([A-Za-z0-9_-]+)\]")
_CGROUP = re.compile(r"/job_(\d+)/step_([A-Za-z0-9_-]+)")
#: Bytes of a process's environment read (a job's environment is its own: bounded).
ENV_LIMIT = 1 << 20


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    uid: int             # owner of /proc/PID (what :func:`identity` and :func:`pin` compare)
    comm: str
    job: int
    step: str            # "batch", "0", "1", ...; "extern" only when the scan asked for it
    start_time: int | None = None   # /proc/PID/stat field 22: clock ticks after boot (None: unknown)
    caught: int = 0      # SigCgt of /proc/PID/status: bit n-1 set = a handler for signal n (proc(5))
    ignored: int = 0     # SigIgn, the same way


def _stat(pid: str, proc_root: str = "/proc") -> tuple[int, str, int | None] | None:
    """(ppid, comm, start time) from ``/proc/PID/stat`` (comm may hold spaces and parentheses;
    the start time, field 22, is None when the line is shorter)."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as fh:
            data = fh.read(4096)
    except OSError:
        return None
    head, _, tail = data.rpartition(b")")
    fields = tail.split()          # fields[0] is field 3 (state)
    if len(fields) < 2:
        return None
    comm = head.partition(b"(")[2].decode(errors="replace")
    try:
        start = int(fields[19]) if len(fields) > 19 else None
        return int(fields[1]), comm, start
    except ValueError:
        return None


def _status(pid: int, proc_root: str = "/proc") -> tuple[int, int, int] | None:
    """(real uid, SigCgt mask, SigIgn mask) from ``/proc/PID/status``; None when it is unreadable
    or has no valid ``Uid:`` line (masks missing or malformed read as 0)."""
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as fh:
            data = fh.read(16384)
    except OSError:
        return None
    fields = {}
    for line in data.split(b"\n"):
        k, sep, v = line.partition(b":")
        if sep:
            fields[k] = v.strip()
    try:
        ruid = int(fields[b"Uid"].split()[0])
    except (KeyError, IndexError, ValueError):
        return None
    masks = []
    for k in (b"SigCgt", b"SigIgn"):
        try:
            masks.append(int(fields.get(k, b"0"), 16))
        except ValueError:
            masks.append(0)
    return ruid, masks[0], masks[1]


def identity(pid: int, proc_root: str = "/proc") -> tuple[int, int] | None:
    """(start time, owner uid) of the process now behind ``pid``; None when there is none."""
    st = _stat(str(pid), proc_root)
    if st is None or st[2] is None:
        return None
    try:
        return st[2], os.stat(f"{proc_root}/{pid}").st_uid
    except OSError:
        return None


def environ(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    """A process's initial environment (bounded; {} when unreadable)."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as fh:
            data = fh.read(ENV_LIMIT)
    except OSError:
        return {}
    out = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def _stepd_title(pid: int, proc_root: str) -> tuple[int, str] | None:
    """(job, step) of a stepd's ``slurmstepd: [JOB.STEP]`` title, when the process's real uid is
    root's (the caller has checked its name and the owner of ``/proc/PID``); else None."""
    st = _status(pid, proc_root)
    if st is None or st[0] != 0:
        return None           # a user's process renamed and made non-dumpable shows root's /proc/PID
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as fh:
            m = _STEPD.match(fh.read(256))
    except OSError:
        return None
    return (int(m.group(1)), m.group(2).decode()) if m else None


def _cgroup_step(pid: int, proc_root: str) -> tuple[int, str] | None:
    """(job, step) of the Slurm step cgroup ``pid`` is in (``/job_J/step_S``); None otherwise."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", "rb") as fh:
            m = _CGROUP.search(fh.read(4096).decode(errors="replace"))
    except OSError:
        return None
    return (int(m.group(1)), m.group(2)) if m else None


def scan(job_id: int | None = None, *, conf: str | None = None, node: str | None = None,
         uid: int | None = None, extern: bool = False, cgroups: bool = False,
         proc_root: str = "/proc") -> list[Proc]:
    """The processes of job ``job_id`` (every job when None) on this node, sorted by pid; stepds
    themselves are never returned.

    ``conf``: keep stepds whose ``SLURM_CONF`` is this (None: any; a stepd without one is kept);
    ``node``: keep processes whose ``SLURMD_NODENAME`` is this (None: any; one without it, or
    whose environment is unreadable, is kept); ``uid``: keep processes of this user (real uid and
    ``/proc/PID`` owner; None: any); ``extern``: the ``extern`` step's processes too (its sleeper,
    and processes ``pam_slurm_adopt`` put in it); ``cgroups``: step cgroups count as well as stepd
    ancestry (see the module text). Raises OSError when ``proc_root`` cannot be listed."""
    parent: dict[int, int] = {}
    comm: dict[int, str] = {}
    start: dict[int, int | None] = {}
    owner: dict[int, int] = {}
    stepds: set[int] = set()
    #: pid -> (job, step) of a stepd or step cgroup member this scan wants; None: one it does not
    #: want (a process below it is not the job's, whatever is further up)
    anchor: dict[int, tuple[int, str] | None] = {}

    def wanted(js: tuple[int, str]) -> bool:
        return (job_id is None or js[0] == job_id) and (extern or js[1] != "extern")

    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        st = _stat(entry, proc_root)
        if st is None:
            continue
        pid = int(entry)
        try:
            owner[pid] = os.stat(f"{proc_root}/{entry}").st_uid
        except OSError:
            continue
        parent[pid], comm[pid], start[pid] = st
        if st[1] == "slurmstepd" and owner[pid] == 0:
            js = _stepd_title(pid, proc_root)
            if js is not None:
                stepds.add(pid)
                theirs = environ(pid, proc_root).get("SLURM_CONF") if conf is not None else None
                ours = theirs is None or theirs == conf   # another cluster's stepd on this host (the lab)
                anchor[pid] = js if ours and wanted(js) else None
                continue
        if cgroups:
            js = _cgroup_step(pid, proc_root)
            if js is not None:
                anchor[pid] = js if wanted(js) else None
    out: list[Proc] = []
    for pid in parent:
        if pid in stepds or (uid is not None and owner[pid] != uid):
            continue
        cur, seen, hit = pid, set(), None
        while cur in parent and cur not in seen:
            if cur in anchor:
                hit = anchor[cur]
                break
            seen.add(cur)
            cur = parent[cur]
        if hit is None:
            continue
        status = _status(pid, proc_root)
        if status is None or (uid is not None and status[0] != uid):
            continue
        if node is not None and environ(pid, proc_root).get("SLURMD_NODENAME", node) != node:
            continue
        out.append(Proc(pid, parent[pid], owner[pid], comm[pid], hit[0], hit[1], start[pid],
                        status[1], status[2]))
    return sorted(out, key=lambda p: p.pid)


def tasks(procs: list[Proc]) -> list[Proc]:
    """The step tasks (processes of ``srun`` steps), not the batch script's."""
    return [p for p in procs if p.step != "batch"]


def roots(procs: list[Proc]) -> list[Proc]:
    """The processes whose parent is their stepd: one per task (the rank), or the batch script."""
    pids = {p.pid for p in procs}
    return [p for p in procs if p.ppid not in pids]


# ------------------------------------------------------------------------------ pinning
class Pinned:
    """One scanned process held by a pidfd (``fd``; None where the kernel has no pidfds).
    :meth:`signal` reaches that process or nothing; :meth:`close` lets the pid go."""

    def __init__(self, proc: Proc, fd: int | None, proc_root: str = "/proc"):
        self.proc, self.fd, self.proc_root = proc, fd, proc_root

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the pinned process has not exited (a pidfd polls readable once it has)."""
        if self.fd is not None:
            p = select.poll()
            p.register(self.fd, select.POLLIN)
            return not p.poll(0)
        return identity(self.proc.pid, self.proc_root) == (self.proc.start_time, self.proc.uid)

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the pinned process; False when it is gone (never another process)."""
        try:
            if self.fd is not None:
                signal_mod.pidfd_send_signal(self.fd, sig)
                return True
            if identity(self.proc.pid, self.proc_root) != (self.proc.start_time, self.proc.uid):
                return False          # no pidfds: the same check, right before kill(2)
            os.kill(self.proc.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def pin(procs: list[Proc], proc_root: str = "/proc") -> list[Pinned]:
    """Pin every process of ``procs`` still the one scanned (same pid, start time and owner):
    pidfd first, then the check, so the pidfd names the scanned process. Processes gone, reused
    or of unknown start time are left out (never signalled)."""
    out = []
    for q in procs:
        if q.start_time is None:
            continue
        fd = None
        try:
            fd = os.pidfd_open(q.pid)
        except ProcessLookupError:
            continue
        except (AttributeError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                continue
            fd = None           # a kernel (or seccomp profile) without pidfds: check before kill(2)
        if identity(q.pid, proc_root) != (q.start_time, q.uid):
            if fd is not None:
                os.close(fd)
            continue
        out.append(Pinned(q, fd, proc_root))
    return out


def end_pinned(pinned: list[Pinned], wait_s: float, sleep=time.sleep) -> list[int]:
    """SIGTERM every pinned process, then SIGKILL those still alive after ``wait_s`` s. Only the
    pinned processes are ever signalled. Returns the pids that got SIGKILL."""
    for p in pinned:
        p.signal(signal_mod.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(p.alive() for p in pinned):
        sleep(0.2)
    return [p.pid for p in pinned if p.alive() and p.signal(signal_mod.SIGKILL)]
