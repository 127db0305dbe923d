"""Deliver the checkpoint signal to the job's processes that catch it, and to no other process.

Why not ``scancel --signal``: Slurm signals either the step tasks (a batch script that runs
``python train.py`` itself gets nothing), the batch shell only (bash's default action for
USR1/USR2 is to exit: the job dies), or the whole tree (``--full``: the shell dies, and so does
every program that does not handle the signal). Facts measured on the 22.05 lab
(shared/SLURM_LAB_NOTES.md, "Signals").

How: the controller runs one overlapping step on every node of the job, **as the job's owner**
(root may not create steps in another user's job: "Access/permission denied", measured)::

    srun --jobid=J --overlap -N n --ntasks-per-node=1 -w NODES --gres=none \\
         python -m slurm_ft.checkpoint.deliver --job J --signal USR1

and on each node :func:`deliver` picks the job's processes (descendants of the job's
``slurmstepd: [J.<step>]`` processes, and members of a ``job_J`` cgroup where proctrack/cgroup
is used), minus its own step, and signals each one whose ``SigCgt`` mask in
``/proc/PID/status`` (proc(5)) says it has a handler for the signal. A shell without a ``trap``,
a Python program without a handler, ``srun`` (it forwards signals from a ``sigwait`` thread:
the signal is blocked, not caught, so it is never in ``SigCgt``; skipped by name as well) are
left alone and keep running. One JSON line per node reports what was signalled and skipped.

Trust: the step runs with the job owner's uid, so it can signal nothing the owner could not.
What it reports is the owner's to forge (same uid): it is journaled as the job's report and only
decides whether slurm-ft waits for an ack, never a verdict about a node.
"""

from __future__ import annotations

import json
import os
import re
import signal as _signal
import socket
import sys
from dataclasses import dataclass, field

#: Programs that forward a signal they receive to processes slurm-ft signals itself.
FORWARDERS = frozenset({"srun", "slurmstepd", "mpirun", "mpiexec", "orterun", "prterun"})
#: Step name of the delivering step (``squeue -s``).
STEP_NAME = "slurm-ft-ckpt-notify"


@dataclass
class Proc:
    pid: int
    ppid: int
    uid: int
    comm: str
    cmdline: str
    sigcgt: int       # bit n-1 set: a handler is installed for signal n (proc(5) SigCgt)
    sigign: int
    cgroup: str
    node: str | None = None   # SLURMD_NODENAME in its environment (readable by its owner only)


def read_proc(pid: int, proc: str = "/proc") -> Proc | None:
    """One process from ``/proc/PID`` (None when it vanished or is unreadable)."""
    base = f"{proc}/{pid}"
    try:
        with open(f"{base}/status", encoding="utf-8", errors="replace") as fh:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
        with open(f"{base}/cmdline", "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        try:
            with open(f"{base}/cgroup", encoding="utf-8", errors="replace") as fh:
                cgroup = fh.read()
        except OSError:
            cgroup = ""
        return Proc(pid=pid, ppid=int(status.get("PPid", "0")), uid=int(status.get("Uid", "0").split()[0]),
                    comm=status.get("Name", ""), cmdline=cmdline, sigcgt=int(status.get("SigCgt", "0"), 16),
                    sigign=int(status.get("SigIgn", "0"), 16), cgroup=cgroup, node=_env_node(base))
    except (OSError, ValueError):
        return None


def _env_node(base: str) -> str | None:
    """``SLURMD_NODENAME`` of a process (None when unreadable: another user's, or gone)."""
    try:
        with open(f"{base}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(b"SLURMD_NODENAME="):
                    return item.split(b"=", 1)[1].decode("utf-8", "replace")
    except OSError:
        pass
    return None


def all_procs(proc: str = "/proc") -> dict[int, Proc]:
    out = {}
    for name in os.listdir(proc):
        if name.isdigit():
            p = read_proc(int(name), proc)
            if p is not None:
                out[p.pid] = p
    return out


def step_of(p: Proc, job_id: int) -> str | None:
    """The step (``0``, ``batch``, ``extern``...) whose slurmstepd ``p`` is, or whose cgroup it is
    in; None otherwise. A slurmstepd is a root process titled ``slurmstepd: [J.step]`` (a user
    cannot retitle a root process)."""
    if p.uid == 0:
        m = re.match(rf"slurmstepd: \[{job_id}\.([\w-]+)\]", p.cmdline)
        if m:
            return m.group(1)
    m = re.search(rf"/job_{job_id}/step_([\w-]+)", p.cgroup)
    return m.group(1) if m else None


def job_processes(job_id: int, procs: dict[int, Proc], uid: int, node: str | None = None) -> list[tuple[Proc, str]]:
    """The job's processes on this node with their step: every descendant of one of its
    slurmstepd processes, and every process in one of its step cgroups, owned by ``uid`` (the
    job's owner). slurmstepd itself is not returned, nor (where several slurmd share one host,
    as in the lab) a process whose ``SLURMD_NODENAME`` names another ``node``."""
    steps: dict[int, str] = {}
    for p in procs.values():
        s = step_of(p, job_id)
        if s is not None:
            steps[p.pid] = s
    out = []
    for p in procs.values():
        if p.uid != uid or (p.uid == 0 and p.pid in steps and p.comm == "slurmstepd"):
            continue
        if node and p.node and p.node != node:
            continue
        cur, seen = p, set()
        step = steps.get(p.pid)
        while step is None and cur is not None and cur.ppid and cur.pid not in seen:
            seen.add(cur.pid)
            step = steps.get(cur.ppid)
            cur = procs.get(cur.ppid)
        if step is not None:
            out.append((p, step))
    return sorted(out, key=lambda ps: ps[0].pid)


@dataclass
class NodeReport:
    node: str
    signalled: list[dict] = field(default_factory=list)   # {"pid", "comm", "step"}
    skipped: list[dict] = field(default_factory=list)     # {"pid", "comm", "step", "why"}
    error: str = ""

    def to_json(self) -> str:
        return json.dumps({"node": self.node, "signalled": self.signalled, "skipped": self.skipped,
                           "error": self.error}, sort_keys=True)


def deliver(job_id: int, signum: int, *, own_step: str | None, procs: dict[int, Proc] | None = None,
            kill=os.kill, node: str | None = None, uid: int | None = None) -> NodeReport:
    """Signal ``signum`` to each process of job ``job_id`` on this node that catches it.
    Skipped (and reported): the delivering step ``own_step``, forwarders (:data:`FORWARDERS`),
    processes that ignore the signal or have no handler for it (its default action would kill
    them, e.g. a batch shell without ``trap``)."""
    here = node or os.environ.get("SLURMD_NODENAME")
    report = NodeReport(here or socket.gethostname())
    procs = all_procs() if procs is None else procs
    bit = 1 << (signum - 1)
    for p, step in job_processes(job_id, procs, os.geteuid() if uid is None else uid, here):
        if step == own_step:
            continue
        item = {"pid": p.pid, "comm": p.comm, "step": step}
        if p.comm in FORWARDERS:
            why = "forwards signals itself"
        elif p.sigign & bit:
            why = "ignores the signal"
        elif not p.sigcgt & bit:
            why = "no handler (the default action would end it)"
        else:
            try:
                kill(p.pid, signum)
                report.signalled.append(item)
                continue
            except ProcessLookupError:
                why = "exited"
            except PermissionError:
                why = "not permitted"
        report.skipped.append({**item, "why": why})
    return report


@dataclass
class Delivery:
    """What one notify did across the job's nodes (controller side)."""

    signal: str
    nodes: list[NodeReport] = field(default_factory=list)
    error: str = ""                  # the step could not run (then nothing was signalled)

    @property
    def signalled(self) -> int:
        return sum(len(n.signalled) for n in self.nodes)

    def summary(self) -> str:
        """One line for the journal and the admin: ``SIGUSR1 to 2 process(es): n1 python3[123]...``."""
        if self.error:
            return f"SIG{self.signal} not delivered: {self.error}"
        parts = []
        for n in self.nodes:
            got = " ".join(f"{d['comm']}[{d['pid']}]" for d in n.signalled) or "none"
            skip = " ".join(f"{d['comm']}[{d['pid']}]" for d in n.skipped)
            parts.append(f"{n.node}: {got}" + (f" (left alone: {skip})" if skip else "")
                         + (f" error: {n.error}" if n.error else ""))
        return f"SIG{self.signal} to {self.signalled} process(es) that catch it; " + "; ".join(parts)


def job_owner(job) -> tuple[int, int] | None:
    """(uid, gid) to run a step in ``job`` as: its owner's, from its ``squeue --json`` record;
    None when the owner is the caller itself (e.g. root's own job). Raises SlurmFTError when
    the record has no owner."""
    from slurm_ft.errors import SlurmFTError

    uid, gid = job.raw.get("user_id"), job.raw.get("group_id")
    if not isinstance(uid, int) or not isinstance(gid, int):
        raise SlurmFTError(f"job {job.job_id}: no owner uid/gid in Slurm's record ({uid!r}/{gid!r})")
    return None if uid == os.geteuid() else (uid, gid)


#: Interpreter on the nodes that runs this file's node half (standard library only).
NODE_PYTHON = "/usr/bin/python3"


def signal_job(slurm, job, signal_name: str, *, python: str = NODE_PYTHON, timeout_s: float = 30.0) -> Delivery:
    """Run the delivering step on every node of running ``job`` (a :class:`slurm_ft.slurm.Job`),
    as its owner; returns what each node signalled. Never raises for a refused or failed step:
    the error is in :attr:`Delivery.error` and nothing was signalled.

    The step runs this file's source with the nodes' system ``python`` (``-I -c``; stdlib only),
    so the job's owner needs no access to slurm-ft's own virtualenv (often root-only)."""
    from slurm_ft.errors import SlurmFTError
    from slurm_ft.slurm import split_nodes

    out = Delivery(signal_name)
    nodes = split_nodes(job.nodes)
    try:
        owner = job_owner(job)
        proc = slurm.run("srun", f"--jobid={job.job_id}", "--overlap", f"--nodes={len(nodes)}",
                         "--ntasks-per-node=1", f"--nodelist={job.nodes}", "--gres=none", f"--job-name={STEP_NAME}",
                         "--quiet", "--kill-on-bad-exit=0", "--input=none",
                         python, "-I", "-c", _node_source(),
                         "--job", str(job.job_id), "--signal", signal_name,
                         check=False, timeout_s=timeout_s, as_user=owner)
    except SlurmFTError as exc:
        out.error = str(exc)
        return out
    for line in proc.stdout.splitlines():
        try:
            d = json.loads(line)
            out.nodes.append(NodeReport(str(d["node"]), [_item(x) for x in d["signalled"]],
                                        [_item(x) for x in d["skipped"]], str(d.get("error", ""))))
        except (ValueError, KeyError, TypeError):
            continue  # the job's own output cannot be in this step's stdout, but be strict anyway
    if not out.nodes:
        err = (proc.stderr or "").strip().splitlines()
        out.error = f"srun rc={proc.returncode}: {err[-1] if err else 'no report from any node'}"
    return out


def _node_source() -> str:
    """This module's source (its node half runs stand-alone: stdlib imports only at top level)."""
    with open(__file__, encoding="utf-8") as fh:
        return fh.read()


def _item(d: dict) -> dict:
    """One reported process, reduced to known fields and types (the report is the owner's)."""
    item = {"pid": int(d["pid"]), "comm": str(d["comm"])[:32], "step": str(d["step"])[:32]}
    if "why" in d:
        item["why"] = str(d["why"])[:80]
    return item


def main(argv: list[str] | None = None) -> int:
    """``python -m slurm_ft.checkpoint.deliver --job J --signal USR1``: run on each node by the
    overlapping step; prints one :class:`NodeReport` JSON line."""
    import argparse

    ap = argparse.ArgumentParser(prog="slurm_ft.checkpoint.deliver")
    ap.add_argument("--job", type=int, required=True)
    ap.add_argument("--signal", required=True)
    args = ap.parse_args(argv)
    try:
        signum = int(getattr(_signal, "SIG" + args.signal.upper().removeprefix("SIG")))
    except AttributeError:
        print(NodeReport(os.environ.get("SLURMD_NODENAME", ""), error=f"unknown signal {args.signal!r}").to_json())
        return 2
    try:
        report = deliver(args.job, signum, own_step=os.environ.get("SLURM_STEP_ID"))
    except OSError as exc:
        report = NodeReport(os.environ.get("SLURMD_NODENAME", ""), error=f"cannot read /proc: {exc}")
    print(report.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
