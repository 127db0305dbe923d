"""Where the lab keeps its files, and the fake GPU inventory each node gets.

Bus ids are distinct per node and GPU (node k, GPU g -> ``0000:{16k+g:02x}:00``), so the shared
kernel log of a one-host lab can be attributed to one node's GPU by bus id, as on a real node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path("/var/tmp/slurm-ft-lab")
#: Ports: slurmctld on ``port_base + 17``, slurmdbd on ``port_base + 19``, node ``nK`` on
#: ``port_base + 200 + K`` (default 16817, 16819 and 17001...; ``lab up --port-base`` moves a
#: second lab out of the way). The lab's MariaDB listens on a unix socket only.
DEFAULT_PORT_BASE = 16800
GPUS_PER_NODE = 2
#: Nodes ``lab up --nodes`` allows (a bigger lab: ``Lab.up(nodes=...)`` up to :data:`MAX_LAB_NODES`,
#: benchmarks/daemon_fleet.py). Node numbers above 15 put their GPUs in PCI domain ``nK // 16``.
MAX_NODES = 15
MAX_LAB_NODES = 64


def repo_root() -> Path:
    """The checkout whose prolog/epilog scripts the lab points Slurm at."""
    return Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Layout:
    dir: Path
    port_base: int = DEFAULT_PORT_BASE

    @property
    def ctld_port(self) -> int: return self.port_base + 17

    @property
    def dbd_port(self) -> int: return self.port_base + 19

    def slurmd_port(self, node: str) -> int:
        return self.port_base + 200 + node_number(node)

    @property
    def slurm_conf(self) -> Path: return self.dir / "slurm.conf"
    @property
    def gres_conf(self) -> Path: return self.dir / "gres.conf"
    @property
    def ft_conf(self) -> Path: return self.dir / "slurm-ft.toml"
    @property
    def state_file(self) -> Path: return self.dir / "lab.json"
    @property
    def log_dir(self) -> Path: return self.dir / "log"
    @property
    def run_dir(self) -> Path: return self.dir / "run"
    @property
    def jobs_dir(self) -> Path: return self.dir / "jobs"
    @property
    def journal_dir(self) -> Path: return self.dir / "journal"
    @property
    def daemon_journal(self) -> Path: return self.journal_dir / "daemon.db"
    @property
    def slurmdbd_conf(self) -> Path: return self.dir / "slurmdbd.conf"
    @property
    def acct_dir(self) -> Path: return self.dir / "accounting"

    def node_journal(self, node: str) -> Path:
        return self.journal_dir / f"node-{node}.db"

    def inventory(self, node: str) -> Path:
        return self.dir / "nvml" / f"{node}.json"

    def dev_dir(self, node: str) -> Path:
        return self.dir / "dev" / node

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def env(self) -> dict[str, str]:
        """Environment for commands run against the lab."""
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf), "SLURM_FT_CONFIG": str(self.ft_conf)}


def node_names(count: int) -> list[str]:
    return [f"n{i}" for i in range(1, count + 1)]


def bus_id(node_no: int, gpu: int) -> str:
    """NVML-style PCI bus id of lab GPU ``gpu`` on node ``n{node_no}`` (n1 GPU0: ``00000000:10:00.0``;
    n17 GPU1: ``00000001:11:00.0``): unique per node and GPU, in the one kernel log all lab nodes share."""
    return f"{node_no // 16:08X}:{(node_no % 16) * 16 + gpu:02X}:00.0"


def node_number(node: str) -> int:
    return int(node.lstrip("n"))


def inventory_gpus(node: str) -> list[dict]:
    k = node_number(node)
    return [
        {
            "index": g,
            "pci_bus_id": bus_id(k, g),
            "uuid": f"GPU-{k:08x}-0000-4000-8000-{g:012x}",
            "name": "NVIDIA H100 80GB HBM3",
        }
        for g in range(GPUS_PER_NODE)
    ]
