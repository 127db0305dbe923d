"""The labs benchmarks/vs_slurm.py runs on: the few operations its scenarios need, for the native
lab (slurm_ft/lab/cluster.py: one host, the host's Slurm) and for the Docker lab
(slurm_ft/lab/docker_engine.py: a controller container and node containers of one Slurm version).

Each lab gives: its Slurm runner (``slurm``), its nodes, where job scripts and outputs live (a host
path, and the path as the job sees it), ``sbatch``, the faults (an Xid on a GPU, an NCCL-style
failure of the step tasks, a lost node and its return), the fake NVML inventory of a node, the
slurm-ft daemon's stop/start, the switch of slurm.conf (written where slurmctld and slurmd read it,
``scontrol reconfigure``, then a probe job on every node that shows which epilog slurmd runs:
slurm-ft's journals a verdict for it, another epilog none), the files a configuration adds beside
slurm.conf (site epilogs), and ``slurm-ft drain --checkpoint`` as an admin runs it.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from slurm_ft.lab import layout as L
from slurm_ft.lab.demo import reset_nodes, wait_for
from slurm_ft.lab.inject import say_on_stderr, xid_line
from slurm_ft.slurm import Slurm

#: Seconds to wait for a reconfigured lab to show the configuration (probe job, journal rows).
SETTLE_S = 60.0


def pci_of(bus: str) -> str:
    """The PCI id as an ``NVRM: Xid (PCI:...)`` line names bus id ``bus`` (what a site epilog greps)."""
    return re.search(r"PCI:([^)]*)\)", xid_line(bus, 0, 0)).group(1)


class NativeBenchLab:
    """The native lab (``slurm-ft lab up``): Slurm commands, scripts and faults on this host."""

    engine = "native"

    def __init__(self, dir: str, nodes: int):
        from job_overhead import Bench
        from slurm_ft.lab.cluster import Lab
        from slurm_ft.lab.layout import repo_root
        self.lab = Lab(dir)
        self.lab.up(nodes=nodes, daemon=True, log=lambda *_: None)
        self.slurm = Slurm(conf=str(self.lab.lay.slurm_conf))
        self.env = self.lab.env()
        self.jobs_host = self.lab.lay.jobs_dir
        self.jobs_job = str(self.jobs_host)
        self.train = f"python3 {repo_root() / 'examples' / 'train.py'}"
        self.conf_path = self.lab.lay.slurm_conf
        self.extra_dir = self.lab.lay.dir          # where a configuration's own scripts go
        self.extra_dir_job = str(self.extra_dir)
        self._bench = Bench(self.lab, self.slurm)

    def version(self) -> str:
        return subprocess.run(["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True).stdout.strip()

    def nodes(self) -> list[str]:
        return self.lab.nodes()

    def bus_ids(self, node: str) -> list[str]:
        return [L.bus_id(L.node_number(node), g) for g in range(L.GPUS_PER_NODE)]

    def sbatch(self, args: list[str]) -> int:
        proc = subprocess.run(["/usr/bin/sbatch", "--parsable", *args], capture_output=True, text=True, timeout=30,
                              env=self.env, cwd=str(self.jobs_host))
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def inject_xid(self, node: str, xid: int, gpu: int) -> None:
        from slurm_ft.lab.inject import inject_xid
        inject_xid(node, xid, gpu, lab_dir=str(self.lab.lay.dir))

    def inject_infra(self, node: str, job_id: int, message: str) -> None:
        from slurm_ft.lab.inject import inject_infra
        inject_infra(node, conf=str(self.lab.lay.slurm_conf), job_id=job_id, message=message)

    def lose_node(self, node: str) -> None:
        """slurmd of ``node`` killed (its job's processes keep running: a stale copy)."""
        self.lab.slurmd_kill(node)

    def node_back(self, node: str) -> None:
        self.lab.slurmd_start(node)

    def inventory(self, node: str) -> Path:
        return self.lab.lay.inventory(node)

    def daemon_stop(self) -> None:
        self.lab.daemon_stop()

    def daemon_start(self) -> None:
        self.lab.daemon_start()

    def read_conf(self) -> str:
        return self.conf_path.read_text()

    def apply(self, conf: str, ft: bool) -> None:
        self._bench.apply(conf, ft=ft)

    def restore(self, conf: str) -> None:
        from slurm_ft.lab.cluster import write_file
        write_file(self.conf_path, conf)
        subprocess.run(["/usr/bin/scontrol", "reconfigure"], env=self.env, timeout=60, capture_output=True)

    def write_extra(self, name: str, text: str) -> str:
        """Write script ``name`` beside the lab's files; its path as slurmd sees it."""
        from slurm_ft.lab.cluster import write_file
        write_file(self.extra_dir / name, text, 0o755)
        return str(self.extra_dir / name)

    def remove_extra(self, name: str) -> None:
        (self.extra_dir / name).unlink(missing_ok=True)

    def reset(self) -> None:
        reset_nodes(self.lab, self.slurm)

    def drain_checkpoint(self, node: str, job_id: int, reason: str) -> tuple[int, str]:
        r = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "drain", node, "--checkpoint", "--job",
                            str(job_id), "--reason", reason], env=self.env, capture_output=True, text=True,
                           timeout=120)
        return r.returncode, r.stdout + r.stderr


class DockerBenchLab:
    """The Docker lab of one Slurm version (``slurm-ft lab up --engine docker --slurm V``), started
    if it is not running. Slurm commands run in the controller container; slurm.conf is the
    configuration directory every container mounts read-only (``/etc/slurm-lab``), written on
    the host, and ``scontrol reconfigure`` makes slurmctld and every slurmd read it again (26.05's
    slurmd re-executes itself in place under ``-D``: the container stays up)."""

    engine = "docker"

    def __init__(self, version: str, nodes: int):
        from slurm_ft.lab import docker_engine as D
        self.D = D
        self.lab = D.DockerLab(version)
        st = self.lab.status() if self.lab.dir.exists() else {"running": False}
        if not st.get("running") or len(st.get("nodes") or []) != nodes:
            self.lab.up(nodes=nodes, daemon=True, log=lambda *_: None)
        self.slurm = self.lab.slurm(30)
        self.jobs_host = self.lab.jobs_dir
        self.jobs_job = f"{D.SHARED}/jobs"
        self.train = f"python3 {D.EXAMPLES}/train.py"
        self.conf_path = self.lab.dir / "conf" / "slurm.conf"
        self.extra_dir = self.lab.dir / "conf"
        self.extra_dir_job = D.CONF
        self._daemon_up = True          # as `lab up` leaves it
        from slurm_ft.config import FailoverConfig
        self.node_poll_s = FailoverConfig().node_poll_s      # the lab's slurm-ft.toml keeps the default

    def version(self) -> str:
        _, out = self.lab.exec("ctl", ["/usr/sbin/slurmctld", "-V"])
        return out.strip()

    def nodes(self) -> list[str]:
        return self.lab.nodes()

    def bus_ids(self, node: str) -> list[str]:
        return [self.D.bus_id(self.lab.version, L.node_number(node), g) for g in range(L.GPUS_PER_NODE)]

    def sbatch(self, args: list[str]) -> int:
        proc = self.lab.sbatch(*args, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def inject_xid(self, node: str, xid: int, gpu: int) -> None:
        self.lab.inject_xid(node, xid, gpu)

    def inject_infra(self, node: str, job_id: int, message: str) -> None:
        """As :func:`slurm_ft.lab.inject.inject_infra`, only the step tasks in ``node``'s container
        (its pid namespace: the host may run a native lab with the same node names and job ids)."""
        import signal
        from slurm_ft.hang.procs import roots, scan, tasks
        ns = os.readlink(f"/proc/{self.lab.container(node).attrs['State']['Pid']}/ns/pid")

        def ours(pid: int) -> bool:
            try:
                return os.readlink(f"/proc/{pid}/ns/pid") == ns
            except OSError:
                return False
        found = [p for p in tasks(scan(job_id, conf=f"{self.D.CONF}/slurm.conf", node=node)) if ours(p.pid)]
        for p in roots(found):
            say_on_stderr(p.pid, message)
        for p in found:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def lose_node(self, node: str) -> None:
        """``docker kill`` of ``node``: the node and its job die at once (a power loss)."""
        self.lab.kill_node(node)

    def node_back(self, node: str) -> None:
        self.lab.node_back(node)
        wait_for(lambda: self.lab._healthy([node]) or self._drained_up(node), 60, f"{node}'s slurmd", 0.5)

    def _drained_up(self, node: str) -> bool:
        n = next((x for x in self.slurm.nodes() if x.name == node), None)
        return n is not None and "not_responding" not in n.state.lower() and not n.state.lower().startswith("down")

    def inventory(self, node: str) -> Path:
        return self.lab.inventory(node)

    def daemon_stop(self) -> None:
        self.lab.daemon_stop()
        self._daemon_up = False

    def daemon_start(self) -> None:
        self.lab.daemon_start()
        self._daemon_up = True

    def read_conf(self) -> str:
        return self.conf_path.read_text()

    def _write_conf(self, conf: str) -> None:
        tmp = self.conf_path.with_name(".slurm.conf.tmp")
        tmp.write_text(conf)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.conf_path)

    def _busy(self) -> bool:
        return (any(not j.ended for j in self.slurm.jobs())
                or any(n.state.lower() != "idle" or n.drained for n in self.slurm.nodes()))

    def _wait_idle(self, timeout_s: float = 60.0) -> None:
        wait_for(lambda: not self._busy(), timeout_s, "every job ended and every node idle", 0.05)

    def _verdict_nodes(self, job_id: int) -> int:
        found = 0
        for node in self.nodes():
            path = self.lab.node_journal(node)
            try:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2) as db:
                    n = db.execute("SELECT count(*) FROM verdicts WHERE job_id = ?", [job_id]).fetchone()[0]
            except sqlite3.Error:
                n = 0
            found += bool(n)
        return found

    def apply(self, conf: str, ft: bool) -> None:
        """Write ``conf``, ``scontrol reconfigure``, and wait until a probe job on every node shows
        that slurmd runs slurm-ft's epilog (``ft``: a verdict journaled on every node) or not (none)."""
        self._write_conf(conf)
        self.slurm.run("scontrol", "reconfigure", timeout_s=60)
        want = len(self.nodes()) if ft else 0
        deadline = time.monotonic() + SETTLE_S
        while True:
            self._wait_idle()
            proc = self.slurm.run("srun", f"-N{len(self.nodes())}", "printenv", "SLURM_JOB_ID", check=False,
                                  timeout_s=60)
            ids = {int(x) for x in proc.stdout.split() if x.isdigit()}
            if proc.returncode == 0 and len(ids) == 1:
                job = ids.pop()
                self._wait_idle()
                seen = self._verdict_nodes(job)
                end = time.monotonic() + (5 if ft else 0)
                while seen != want and time.monotonic() < end:   # a verdict may wait in a journal's spool
                    time.sleep(0.1)
                    seen = self._verdict_nodes(job)
                if seen == want:
                    return
            else:
                seen = f"none (probe rc {proc.returncode}: {proc.stderr.strip()[-200:]})"
            if time.monotonic() > deadline:
                sys.exit(f"after reconfigure, the probe job: {seen} of {len(self.nodes())} nodes journaled a "
                         f"verdict (wanted {want})")
            time.sleep(1.0)

    def restore(self, conf: str) -> None:
        self._write_conf(conf)
        self.slurm.run("scontrol", "reconfigure", timeout_s=60, check=False)

    def write_extra(self, name: str, text: str) -> str:
        path = self.extra_dir / name
        path.write_text(text)
        os.chmod(path, 0o755)
        return f"{self.extra_dir_job}/{name}"

    def remove_extra(self, name: str) -> None:
        (self.extra_dir / name).unlink(missing_ok=True)

    def reset(self) -> None:
        """:meth:`DockerLab.reset`; with slurm-ft's daemon running, then wait one node poll of the
        daemon (``[failover] node_poll_s`` + 2 s) when a node was resumed: from Slurm 24.11 on,
        ``scontrol reconfigure`` restarts slurmctld (a new start time), and a daemon that has not
        seen the resume yet reads a drain of its own that is gone after a slurmctld restart as a
        drain slurmctld forgot, and drains the node again (slurm_ft.failover.reconcile)."""
        resumed = any(n.drained or n.state.lower().startswith("down") for n in self.slurm.nodes())
        self.lab.reset(self.slurm)
        if resumed and self._daemon_up:
            time.sleep(self.node_poll_s + 2.0)

    def drain_checkpoint(self, node: str, job_id: int, reason: str) -> tuple[int, str]:
        D = self.D
        rc, out = self.lab.exec("ctl", [f"{D.VENV}/bin/python", "-m", "slurm_ft.cli.main", "drain", node,
                                        "--checkpoint", "--job", str(job_id), "--reason", reason],
                                env={"SLURM_CONF": f"{D.CONF}/slurm.conf", "SLURM_FT_CONFIG": f"{D.CONF}/slurm-ft.toml",
                                     "PATH": f"{D.VENV}/bin:{D.SAFE_PATH}"}, check=False)
        return rc, out
