#!/usr/bin/env python3
"""Failover latency on the lab cluster: time from the Xid line entering the kernel log to the job
RUNNING again on another node, over N runs (default 5).

Run as root from the repo: ``.venv/bin/python benchmarks/failover_latency.py [--runs N]``.
Starts the lab if needed (``slurm-ft lab up``). Prints ``name=value`` lines, headline last.
Target (issue 5): median <= 10 s (Slurm's bare requeue delay alone: 121 s).
"""

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_ft.lab.cluster import Lab  # noqa: E402
from slurm_ft.lab.demo import job_gpu_index, reset_nodes, submit_training, wait_started  # noqa: E402
from slurm_ft.lab.inject import inject_xid  # noqa: E402
from slurm_ft.lab.layout import DEFAULT_DIR  # noqa: E402
from slurm_ft.slurm import Slurm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=str(DEFAULT_DIR))
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--jitter", type=float, default=1.0,
                    help="random pause (0..s) before each fault: slurmctld starts jobs on a 1 s tick, and a "
                         "fault at a fixed delay after a start would always meet the same phase of it")
    args = ap.parse_args()
    lab = Lab(args.dir)
    lab.up(nodes=args.nodes, daemon=True, log=lambda *_: None)
    rng = random.Random(5)
    slurm = Slurm(conf=str(lab.lay.slurm_conf))
    running, started = [], []
    for i in range(args.runs):
        reset_nodes(lab, slurm)
        sub = submit_training(lab, steps=400)
        first = wait_started(slurm, sub)
        time.sleep(rng.uniform(0, args.jitter))
        inject_xid(first.nodes, 79, job_gpu_index(slurm, sub.job_id))
        t0 = time.monotonic()
        again = slurm.wait_job(sub.job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1
                               and j.reason != "Prolog", 120, 0.02)
        t_run = time.monotonic() - t0
        wait_started(slurm, sub, 1)
        t_code = time.monotonic() - t0
        if again is None or again.nodes == first.nodes:
            print(f"run{i}=failed", flush=True)
            return 1
        running.append(t_run)
        started.append(t_code)
        print(f"run{i}_running_s={t_run:.3f} run{i}_training_again_s={t_code:.3f} from={first.nodes} to={again.nodes}",
              flush=True)
        slurm.run("scancel", str(sub.job_id))
    reset_nodes(lab, slurm)
    print(f"runs={args.runs}")
    print(f"max_s={max(running):.3f}")
    print(f"training_again_median_s={statistics.median(started):.3f}")
    print(f"median_s={statistics.median(running):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
