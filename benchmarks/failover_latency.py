#!/usr/bin/env python3
"""Failover latency on the lab cluster: time from the Xid line entering the kernel log to the job
RUNNING again on another node, over N runs (default 5), with the timeline of each run.

Run as root from the repo: ``.venv/bin/python benchmarks/failover_latency.py [--runs N]``.
Starts the lab if needed (``slurm-ft lab up``). Prints ``name=value`` lines, headline last
(``median_s``: fault -> RUNNING). Target (issue 23): median <= 0.5 s.

The timeline of each run (``run<N>_<stage>_s``: seconds after the Xid was written), from
timestamps that exist, never from the daemon's own say-so:

====================  ===========================================================================
stage                 source
====================  ===========================================================================
``job_end``           slurmctld log ``_job_complete: JobId=J done`` (ms)
``verdict``           the epilog's mailbox record time (node field, ``sinfo --json``; made just
                      before it is posted)
``daemon_seen``       daemon log ``verdict job J attempt 0 on N`` (ms)
``requeue``           slurmctld log ``Requeuing JobId=J`` (ms)
``start_time``        slurmctld log ``setting begin to ... for JobId=J`` after the requeue (ms;
                      absent when the job was eligible at once)
``allocated``         slurmctld log ``sched: Allocate JobId=J`` after the requeue (ms)
``running``           this script's poll (``squeue``/``scontrol`` every 20 ms): RUNNING, restart
                      count 1, past the prolog (the headline)
``first_line``        mtime of the job's output file when its ``attempt 1 on`` line is first seen
====================  ===========================================================================

Per-stage medians follow as ``<stage>_median_s``, then ``tick_wait_median_s``: from
``StartTime=now`` (the job eligible) to ``sched: Allocate``, the wait for slurmctld's
once-a-second background scheduling pass, Slurm's part that no slurm-ft step shortens (22.05
runs ``schedule()`` at once only in the epilog-complete RPC; docs/architecture.md, "Fault to
RUNNING: slurm-ft's part and Slurm's").
"""

import argparse
import math
import os
import random
import re
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_ft.failover import mailbox  # noqa: E402
from slurm_ft.lab.cluster import Lab  # noqa: E402
from slurm_ft.lab.demo import job_gpu_index, reset_nodes, submit_training, wait_started  # noqa: E402
from slurm_ft.lab.inject import inject_xid  # noqa: E402
from slurm_ft.lab.layout import DEFAULT_DIR  # noqa: E402
from slurm_ft.slurm import Slurm  # noqa: E402

STAGES = ("job_end", "verdict", "daemon_seen", "requeue", "start_time", "allocated", "running", "first_line")
_CTLD = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)$")
_DAEMON = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ (.*)$")


def _lines_since(path: Path, offset: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def ctld_times(lines: list[str], job_id: int) -> dict[str, float]:
    """Stage -> epoch seconds from slurmctld log lines written since the fault."""
    out: dict[str, float] = {}
    for line in lines:
        m = _CTLD.match(line)
        if m is None:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
        text = m.group(2)
        if f"JobId={job_id} done" in text and "_job_complete" in text:
            out.setdefault("job_end", t)
        elif re.search(rf"Requeuing JobId={job_id}$", text):
            out.setdefault("requeue", t)
        elif "requeue" in out and re.search(rf"setting begin to \S+ for JobId={job_id}$", text):
            out.setdefault("start_time", t)
        elif "requeue" in out and re.search(rf"sched: Allocate JobId={job_id} ", text):
            out.setdefault("allocated", t)
    return out


def ctld_alloc(lines: list[str], job_id: int) -> float | None:
    """Epoch seconds of the first ``sched: Allocate JobId=J`` line (an instant of slurmctld's tick)."""
    for line in lines:
        m = _CTLD.match(line)
        if m and re.search(rf"sched: Allocate JobId={job_id} ", m.group(2)):
            return datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
    return None


def daemon_seen(lines: list[str], job_id: int) -> float | None:
    for line in lines:
        m = _DAEMON.match(line)
        if m and re.match(rf"verdict job {job_id} attempt 0 on ", m.group(2)):
            return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def verdict_time(slurm: Slurm, node: str, job_id: int) -> float | None:
    for n in slurm.nodes():
        if n.name == node:
            return next((r.time for r in mailbox.parse(n.extra, n.name) if r.job_id == job_id and r.attempt == 0),
                        None)
    return None


def first_line_time(sub, attempt: int, timeout_s: float = 60) -> float | None:
    """mtime of the output file when the ``attempt N on`` line first appears (polled every 10 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            st = os.stat(sub.out)
            if re.search(rf"^attempt {attempt} on", sub.output(), re.M):
                return st.st_mtime
        except OSError:
            pass
        time.sleep(0.01)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=str(DEFAULT_DIR))
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--jitter", type=float, default=1.0,
                    help="random pause (0..s) before each fault (seeded; the issue 5 method)")
    ap.add_argument("--spread", action="store_true",
                    help="instead of --jitter: run N's fault at phase (N+0.5)/runs of slurmctld's 1 s "
                         "scheduling tick (read from the first attempt's 'sched: Allocate' line), so that "
                         "the median is over phases spread evenly, not over a few random ones")
    ap.add_argument("--restart-daemon", action="store_true",
                    help="restart the lab's requeue daemon first, so that it runs this checkout's code")
    args = ap.parse_args()
    lab = Lab(args.dir)
    lab.up(nodes=args.nodes, daemon=True, log=lambda *_: None)
    if args.restart_daemon:
        lab.daemon_start()
    rng = random.Random(5)
    slurm = Slurm(conf=str(lab.lay.slurm_conf))
    ctld_log, daemon_log = lab.lay.log_dir / "slurmctld.log", lab.lay.log_dir / "daemon.log"
    running, started = [], []
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    for i in range(args.runs):
        reset_nodes(lab, slurm)
        sub = submit_training(lab, steps=400)
        ctld_sub = _size(ctld_log)
        first = wait_started(slurm, sub)
        tick = ctld_alloc(_lines_since(ctld_log, ctld_sub), sub.job_id) if args.spread else None
        if tick is not None:      # slurmctld allocates on its ~1 s background tick: aim at a phase of it
            at = tick + (i + 0.5) / args.runs
            at += max(0, math.ceil(time.time() + 0.3 - at))   # whole ticks later, still ahead of now
            time.sleep(max(0.0, at - time.time()))
        else:
            time.sleep(rng.uniform(0, args.jitter))
        gpu = job_gpu_index(slurm, sub.job_id)
        ctld_at, daemon_at = _size(ctld_log), _size(daemon_log)
        inject_xid(first.nodes, 79, gpu)   # the /proc scan first, then the kmsg write and the kill
        t0_wall, t0 = time.time(), time.monotonic()
        again = slurm.wait_job(sub.job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1
                               and j.reason != "Prolog", 120, 0.02)
        t_run = time.monotonic() - t0
        t_first = first_line_time(sub, 1)
        wait_started(slurm, sub, 1)
        t_code = time.monotonic() - t0
        if again is None or again.nodes == first.nodes:
            print(f"run{i}=failed", flush=True)
            return 1
        running.append(t_run)
        started.append(t_code)
        at = ctld_times(_lines_since(ctld_log, ctld_at), sub.job_id)
        seen = daemon_seen(_lines_since(daemon_log, daemon_at), sub.job_id)
        if seen is not None:
            at["daemon_seen"] = seen
        v = verdict_time(slurm, first.nodes, sub.job_id)
        if v is not None:
            at["verdict"] = v
        if t_first is not None:
            at["first_line"] = t_first
        rel = {s: at[s] - t0_wall for s in STAGES if s in at}
        rel["running"] = t_run
        for s, x in rel.items():
            stages[s].append(x)
        print(" ".join(f"run{i}_{s}_s={rel[s]:.3f}" for s in STAGES if s in rel)
              + f" from={first.nodes} to={again.nodes}", flush=True)
        slurm.run("scancel", str(sub.job_id))
    reset_nodes(lab, slurm)
    print(f"runs={args.runs}")
    for s in STAGES:
        if stages[s]:
            print(f"{s}_median_s={statistics.median(stages[s]):.3f}")
    waits = [a - e for a, e in zip(stages["allocated"], stages["start_time"])] \
        if len(stages["allocated"]) == len(stages["start_time"]) else []
    if waits:
        print(f"tick_wait_median_s={statistics.median(waits):.3f}")
    print(f"max_s={max(running):.3f}")
    print(f"training_again_median_s={statistics.median(started):.3f}")
    print(f"median_s={statistics.median(running):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
