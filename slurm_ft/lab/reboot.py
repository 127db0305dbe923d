"""The lab's ``RebootProgram``: "reboot" one lab node the way a real reboot would look to Slurm
and to slurm-ft: its slurmd stops, its fake GPUs come back healthy (unless the lab was told the
fault survives a reboot), and a new slurmd starts with ``-b`` (reports the node rebooted, so
slurmctld completes the ``scontrol reboot``).

Who runs it: the node's slurmd, as root, through ``system()`` (``<lab>/reboot-node``, written by
``lab up``). What it reads: Slurm 22.05 passes no argument and exports no node name to a
RebootProgram (measured: the environment is slurmd's own, ``SLURM_CONF``/``PATH``/``LC_ALL``), so
with several slurmd on one host the node is found from the process that ran it: the parent of its
``sh -c``, a ``slurmd ... -N NODE`` of this lab's ``slurm.conf``. ``$SLURMD_NODENAME`` is taken
first when set (a newer Slurm, or a test). The work is done by a detached child, so that the
RebootProgram returns at once and slurmd is not killed while it waits for it.

A fault that survives the reboot (the RMA path): ``Lab.sticky_fault(node, True)`` leaves the
marker ``<lab>/nvml/<node>.survives-reboot``; the GPUs are then left as they are.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from slurm_ft.errors import LabError


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().decode(errors="replace").rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def node_of_caller(conf: str, pid: int | None = None, env=None) -> str:
    """The lab node whose slurmd ran this program: ``$SLURMD_NODENAME``, else ``-N NODE`` of the
    nearest ancestor that is a ``slurmd`` of ``conf`` (``-f CONF``). Raises :class:`LabError`."""
    env = os.environ if env is None else env
    if env.get("SLURMD_NODENAME"):
        return env["SLURMD_NODENAME"]
    pid = os.getpid() if pid is None else pid
    for _ in range(8):
        pid = _ppid(pid)
        if pid <= 1:
            break
        argv = _cmdline(pid)
        if argv and os.path.basename(argv[0]) == "slurmd" and "-N" in argv[:-1] and conf in argv:
            return argv[argv.index("-N") + 1]
    raise LabError("reboot: no slurmd of this lab among my ancestors and no $SLURMD_NODENAME")


def heal(lab, node: str) -> bool:
    """The node's fake GPUs as after a power cycle (a fresh inventory), unless its fault survives
    reboots. Returns whether they were healed."""
    from slurm_ft.nvml import fake as fake_nvml
    from slurm_ft.lab import layout as L

    if lab.sticky_path(node).exists():
        return False
    fake_nvml.write_inventory(str(lab.lay.inventory(node)), node, L.inventory_gpus(node))
    return True


def reboot(lab_dir: str, node: str, log=print) -> None:
    """Stop ``node``'s slurmd, heal its GPUs, start it again as rebooted (``slurmd -b``)."""
    from slurm_ft.lab.cluster import Lab

    lab = Lab(lab_dir)
    lab.slurmd_kill(node)
    healed = heal(lab, node)
    time.sleep(0.5)          # a reboot takes a while; slurmctld sees the node not responding first
    lab.slurmd_start(node, rebooted=True)
    log(f"lab reboot of {node}: slurmd restarted, GPUs {'healed' if healed else 'left faulty (fault survives reboot)'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slurm_ft.lab.reboot", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="The lab directory.")
    args = ap.parse_args(argv)
    lab_dir = os.path.abspath(args.dir)
    logf = Path(lab_dir) / "log" / "reboot.log"
    try:
        node = node_of_caller(str(Path(lab_dir) / "slurm.conf"))
    except LabError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    if os.fork() > 0:
        return 0                       # slurmd's system() returns now; the child reboots the node
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    fd = os.open(logf, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        time.sleep(0.3)                # let slurmd answer the reboot RPC first
        reboot(lab_dir, node, log=lambda m: print(f"{time.strftime('%FT%T')} {m}", flush=True))
    except Exception as exc:           # noqa: BLE001 - a detached child: its log is its only voice
        print(f"{time.strftime('%FT%T')} lab reboot of {node} failed: {exc!r}", flush=True)
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
