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

and on each node :func:`deliver` picks the job's processes with the one process scanner,
:func:`slurm_ft.hang.procs.scan` (descendants of the job's ``slurmstepd: [J.<step>]`` processes,
the ``extern`` step's included, and members of a ``job_J`` step cgroup where proctrack/cgroup is
used, owned by the step's user), minus its own step, and signals each one whose ``SigCgt`` mask in
``/proc/PID/status`` (proc(5)) says it has a handler for the signal. A shell without a ``trap``,
a Python program without a handler, ``srun`` (it forwards signals from a ``sigwait`` thread:
the signal is blocked, not caught, so it is never in ``SigCgt``; skipped by name as well) are
left alone and keep running. One JSON line per node reports what was signalled and skipped.

The step runs this file with the nodes' system Python, which need not have slurm-ft installed:
:func:`_node_source` is a stand-alone program holding the scanner's source and this file's.

Trust: the step runs with the job owner's uid, so it can signal nothing the owner could not.
What it reports is the owner's to forge (same uid): it is journaled as the job's report and only
decides whether slurm-ft waits for an ack, never a verdict about a node.
"""

from __future__ import annotations

import json
import os
import signal as _signal
import socket
import sys
from dataclasses import dataclass, field

from slurm_ft.hang.procs import Proc, scan

#: Programs that forward a signal they receive to processes slurm-ft signals itself.
FORWARDERS = frozenset({"srun", "slurmstepd", "mpirun", "mpiexec", "orterun", "prterun"})
#: Step name of the delivering step (``squeue -s``).
STEP_NAME = "slurm-ft-ckpt-notify"


def job_processes(job_id: int, uid: int, node: str | None = None, proc_root: str = "/proc") -> list[Proc]:
    """The job's processes on this node that the delivery considers, sorted by pid: every
    process of user ``uid`` (the job's owner) below one of the job's slurmstepd processes or in
    one of its step cgroups, the ``extern`` step's included (``pam_slurm_adopt`` puts ssh
    sessions there), slurmstepd itself never; where several slurmd share one host (the lab), not
    a process whose ``SLURMD_NODENAME`` names another ``node``. :func:`slurm_ft.hang.procs.scan`
    with the delivery's filters; raises OSError when ``proc_root`` cannot be listed."""
    return scan(job_id, uid=uid, node=node or None, extern=True, cgroups=True, proc_root=proc_root)


@dataclass
class NodeReport:
    node: str
    signalled: list[dict] = field(default_factory=list)   # {"pid", "comm", "step"}
    skipped: list[dict] = field(default_factory=list)     # {"pid", "comm", "step", "why"}
    error: str = ""

    def to_json(self) -> str:
        return json.dumps({"node": self.node, "signalled": self.signalled, "skipped": self.skipped,
                           "error": self.error}, sort_keys=True)


def deliver(job_id: int, signum: int, *, own_step: str | None, proc_root: str = "/proc",
            kill=os.kill, node: str | None = None, uid: int | None = None) -> NodeReport:
    """Signal ``signum`` to each process of job ``job_id`` on this node that catches it
    (:func:`job_processes` of user ``uid``, default the caller's effective uid, on ``node``,
    default ``$SLURMD_NODENAME``). Skipped (and reported): the delivering step ``own_step``,
    forwarders (:data:`FORWARDERS`), processes that ignore the signal or have no handler for it
    (its default action would kill them, e.g. a batch shell without ``trap``). Raises OSError
    when ``proc_root`` cannot be listed."""
    here = node or os.environ.get("SLURMD_NODENAME")
    report = NodeReport(here or socket.gethostname())
    bit = 1 << (signum - 1)
    for p in job_processes(job_id, os.geteuid() if uid is None else uid, here, proc_root):
        step = p.step
        if step == own_step:
            continue
        item = {"pid": p.pid, "comm": p.comm, "step": step}
        if p.comm in FORWARDERS:
            why = "forwards signals itself"
        elif p.ignored & bit:
            why = "ignores the signal"
        elif not p.caught & bit:
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


#: The stand-alone program the delivering step runs: it registers the scanner's source as the
#: module ``slurm_ft.hang.procs`` (empty parent packages: nothing of slurm-ft is imported from
#: disk), then runs this file's source as ``__main__``.
_BOOT = """import sys, types
for _name in ("slurm_ft", "slurm_ft.hang"):
    sys.modules[_name] = types.ModuleType(_name)
    sys.modules[_name].__path__ = []
_procs = types.ModuleType("slurm_ft.hang.procs")
sys.modules[_procs.__name__] = _procs
exec(compile({procs!r}, "slurm_ft/hang/procs.py", "exec"), _procs.__dict__)
exec(compile({main!r}, "slurm_ft/checkpoint/deliver.py", "exec"), globals())
"""


def _node_source() -> str:
    """The program the delivering step runs with ``python -I -c`` (a str of Python source): the
    scanner (:mod:`slurm_ft.hang.procs`) and this module, standard library only, needing no
    slurm-ft on the node. Raises OSError when either source file cannot be read."""
    from slurm_ft.hang import procs

    with open(procs.__file__, encoding="utf-8") as fh:
        scanner = fh.read()
    with open(__file__, encoding="utf-8") as fh:
        main = fh.read()
    return _BOOT.format(procs=scanner, main=main)


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
