#!/usr/bin/env python3
"""Daemon full-scan cycle time with many jobs in the queue (issue 5 target: <= 1 s with 1,000 jobs).

Submits N held jobs (half ft-enabled) to the lab, then times ``Daemon.cycle()`` with a full scan
every cycle (``scan_interval_s = 0``: one ``squeue --json`` + one ``sinfo --json`` + per-job
handling; the shipped daemon does this once a minute, see benchmarks/daemon_scale.py) against a
scratch journal: the first cycle (every job new to the journal) and the median of later ones.
Cancels the jobs after.
Run as root: ``.venv/bin/python benchmarks/daemon_cycle.py [--jobs N]``. Prints ``name=value``
lines, headline (``median_s``, steady state) last.
"""

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_ft import config as config_mod  # noqa: E402
from slurm_ft.failover.daemon import Daemon  # noqa: E402
from slurm_ft.lab.cluster import Lab  # noqa: E402
from slurm_ft.lab.demo import reset_nodes  # noqa: E402
from slurm_ft.lab.layout import DEFAULT_DIR  # noqa: E402
from slurm_ft.slurm import Slurm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--dir", default=str(DEFAULT_DIR))
    args = ap.parse_args()
    lab = Lab(args.dir)
    lab.up(nodes=3, daemon=True, log=lambda *_: None)
    slurm = Slurm(conf=str(lab.lay.slurm_conf))
    reset_nodes(lab, slurm)
    env = lab.env()
    t0 = time.monotonic()
    for i in range(args.jobs):
        comment = "ft" if i % 2 == 0 else "plain"
        subprocess.run(["/usr/bin/sbatch", "--hold", "--parsable", f"--comment={comment}", "-o", "/dev/null",
                        "--wrap", "true"], env=env, check=True, capture_output=True, timeout=30)
    print(f"submit_s={time.monotonic() - t0:.1f}")
    print(f"jobs_in_queue={len(slurm.jobs())}")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config_mod.load(lab.lay.ft_conf)
        cfg = dataclasses.replace(cfg, journal=dataclasses.replace(cfg.journal, path=f"{tmp}/bench.db"),
                                  failover=dataclasses.replace(cfg.failover, scan_interval_s=0.0))
        daemon = Daemon(cfg, slurm)
        t = time.monotonic()
        daemon.cycle()
        first = time.monotonic() - t
        times = []
        for _ in range(args.cycles):
            t = time.monotonic()
            daemon.cycle()
            times.append(time.monotonic() - t)
        t = time.monotonic()
        slurm.jobs()
        squeue = time.monotonic() - t
    reset_nodes(lab, slurm)
    print(f"squeue_json_s={squeue:.3f}")
    print(f"first_cycle_s={first:.3f}")
    print(f"max_s={max(times):.3f}")
    print(f"median_s={statistics.median(times):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
