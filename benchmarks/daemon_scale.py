#!/usr/bin/env python3
"""What the requeue daemon costs slurmctld as the queue grows (issue 14), on a lab cluster of its own.

For each queue size (default 1,000 / 10,000 / 50,000 jobs, nearly all held jobs of another user,
one record each, ``sbatch --hold`` in parallel; ``MaxJobCount`` raised in the lab's
``slurm.conf.local``):

* ``baseline``: no daemon: slurmctld RPCs per minute (``sdiag`` deltas, ``REQUEST_STATS_INFO``
  left out: that is this script asking), and what another user sees: ``squeue`` and
  ``sbatch --hold`` latency (medians, run as the lab's ordinary user);
* ``event``: the daemon as shipped (events from the Prolog/EpilogSlurmctld hook, a full scan every
  ``scan_interval_s``, nodes every ``node_poll_s``), run in this process: its RPCs per minute
  (window delta minus the baseline rate), its cycle times (steady and full-scan), the same user
  latencies, and the failover latency (Xid 79 injected into a running ft job -> RUNNING on
  another node; median of ``--failovers`` runs);
* ``poll``: the same daemon with ``scan_interval_s = 0`` (a full ``squeue --json`` every cycle:
  the cost model before issue 14), for comparison.

Faults are injected on nodes n11-n15 only (bus ids no smaller lab shares in the one kernel log).
Run as root: ``.venv/bin/python benchmarks/daemon_scale.py [--sizes 1000,10000,50000]``. Prints
``name=value`` lines; the last is ``daemon_rpc_per_s=N`` for the largest size.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_ft import config as config_mod  # noqa: E402
from slurm_ft.failover.daemon import Daemon  # noqa: E402
from slurm_ft.lab.cluster import Lab  # noqa: E402
from slurm_ft.lab.demo import job_gpu_index, submit_training, wait_started  # noqa: E402
from slurm_ft.lab.inject import inject_xid  # noqa: E402
from slurm_ft.lab.users import LAB_USER, ensure_user  # noqa: E402
from slurm_ft.slurm import Slurm  # noqa: E402

FT_NODES = "n[11-15]"
NOT_FT = "n[1-10]"


def sdiag(env) -> dict[str, int]:
    out = subprocess.run(["/usr/bin/sdiag"], capture_output=True, text=True, env=env, timeout=30).stdout
    part = out.split("Remote Procedure Call statistics by message type", 1)[-1].split("by user", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+(\w+)\s+\(\s*\d+\)\s+count:(\d+)", part, re.M)}


def rpcs(before: dict, after: dict) -> int:
    return sum(after.get(k, 0) - before.get(k, 0) for k in after if k != "REQUEST_STATS_INFO")


def timed(argv, env) -> float:
    t = time.monotonic()
    subprocess.run(argv, capture_output=True, env=env, timeout=120)
    return time.monotonic() - t


def user_latency(env, n: int = 5) -> tuple[float, float]:
    """Median seconds of ``squeue`` and ``sbatch --hold`` as the lab's ordinary user."""
    run = ["/usr/sbin/runuser", "-u", LAB_USER, "--"]
    sq = [timed([*run, "/usr/bin/squeue", "-h", "-t", "PD,R", "-o", "%i"], env) for _ in range(n)]
    sb = []
    for _ in range(max(2, n // 2)):
        t = time.monotonic()
        p = subprocess.run([*run, "/usr/bin/sbatch", "--hold", "--parsable", "-o", "/dev/null", "--wrap", "true"],
                           capture_output=True, text=True, env=env, timeout=120, cwd="/tmp")
        sb.append(time.monotonic() - t)
        if p.stdout.strip().isdigit():
            subprocess.run(["/usr/bin/scancel", p.stdout.strip()], env=env, timeout=60)
    return statistics.median(sq), statistics.median(sb)


def fill(env, count: int, log) -> float:
    """``count`` more held one-record jobs of the ordinary user; returns the seconds it took."""
    t = time.monotonic()
    argv = ["/usr/sbin/runuser", "-u", LAB_USER, "--", "/usr/bin/sbatch", "--hold", "--parsable", "-o", "/dev/null",
            "-x", "n[11-15]", "--wrap", "true"]
    batch = 500
    done = 0
    with ThreadPoolExecutor(8) as pool:
        while done < count:
            n = min(batch, count - done)
            list(pool.map(lambda _: subprocess.run(argv, capture_output=True, env=env, timeout=120, cwd="/tmp"),
                          range(n)))
            done += n
            log(f"# queued {done}/{count}")
    return time.monotonic() - t


class CountingSlurm(Slurm):
    """The daemon's own Slurm commands, counted (``squeue``, ``sinfo``, ``scontrol show``, ...)."""

    def __init__(self, conf: str):
        super().__init__(conf=conf)
        self.counts: dict[str, int] = {}

    def run(self, cmd, *args, **kw):
        key = " ".join([cmd, *args[:1]]) if cmd == "scontrol" else cmd
        self.counts[key] = self.counts.get(key, 0) + 1
        return super().run(cmd, *args, **kw)


class Loop(threading.Thread):
    """The daemon's loop in a thread (Daemon.run wants the main thread for its SIGTERM handler)."""

    def __init__(self, cfg, slurm):
        super().__init__(daemon=True)
        self.cfg, self.slurm, self.poll_s = cfg, slurm, cfg.failover.poll_interval_s
        self.stop = threading.Event()
        self.cycles: list[tuple[float, bool]] = []   # (seconds, full scan?)
        self.cpu = 0.0

    def run(self):
        self.d = Daemon(self.cfg, self.slurm)       # its journal connection belongs to this thread
        cpu0 = time.thread_time()
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                self.d.cycle()
            except Exception as exc:  # noqa: BLE001 - a benchmark reports, never dies
                print(f"# cycle failed: {exc}", flush=True)
            self.cycles.append((time.monotonic() - t, self.d._rows is not None))
            self.cpu = time.thread_time() - cpu0
            self.stop.wait(max(0.0, self.poll_s - (time.monotonic() - t)))
        self.d.journal.close()


def run_daemon(cfg, slurm, env, window_s: float, failovers: int, lab, log, probes: int = 11) -> dict:
    """One daemon (``cfg``) for ``window_s`` seconds (RPCs, cycles, user latency), then failovers."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dataclasses.replace(cfg, journal=dataclasses.replace(cfg.journal, path=f"{tmp}/daemon.db"))
        counting = CountingSlurm(slurm.conf)
        loop = Loop(cfg, counting)
        loop.start()
        while not loop.cycles:                      # the start-up scan
            time.sleep(0.2)
        first = loop.cycles[0][0]
        counts0 = dict(counting.counts)
        before = sdiag(env)
        t0 = time.monotonic()
        time.sleep(window_s / 2)
        sq, sb = user_latency(env, probes)
        time.sleep(max(0.0, window_s / 2 - (time.monotonic() - t0 - window_s / 2)))
        after = sdiag(env)
        elapsed = time.monotonic() - t0
        calls = {k: v - counts0.get(k, 0) for k, v in counting.counts.items() if v - counts0.get(k, 0)}
        # the user-latency probes are RPCs too: measured with the baseline's probes, subtracted there
        out = {"rpc": rpcs(before, after), "elapsed": elapsed, "first_cycle_s": first, "squeue_s": sq, "sbatch_s": sb,
               "calls": " ".join(f"{k.replace(' ', '_')}:{v}" for k, v in sorted(calls.items()))}
        steady = [c for c, full in loop.cycles[1:] if not full]
        fulls = [c for c, full in loop.cycles[1:] if full]
        out["cycle_median_s"] = statistics.median(steady) if steady else float("nan")
        out["cycle_max_s"] = max(steady) if steady else float("nan")
        out["full_scan_s"] = statistics.median(fulls) if fulls else first
        lat = []
        for i in range(failovers):
            sub = submit_training(lab, steps=400, extra=["-x", NOT_FT])
            first_run = wait_started(slurm, sub, timeout_s=120)
            time.sleep(random.uniform(0, 1.0))     # off the phase of slurmctld's 1 s scheduling tick
            inject_xid(first_run.nodes, 79, job_gpu_index(slurm, sub.job_id))
            t = time.monotonic()
            again = slurm.wait_job(sub.job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1
                                   and j.reason != "Prolog", 120, 0.05)
            lat.append(time.monotonic() - t if again is not None and again.nodes != first_run.nodes else float("inf"))
            log(f"# failover {i}: {lat[-1]:.2f} s ({first_run.nodes} -> {again.nodes if again else '?'})")
            slurm.run("scancel", str(sub.job_id), check=False)
            for n in slurm.nodes():                   # resume the drained node for the next run
                if n.drained and n.reason.startswith("slurm-ft:"):
                    slurm.run("scontrol", "update", f"NodeName={n.name}", "State=RESUME", check=False)
            time.sleep(2)
        out["failover_median_s"] = statistics.median(lat) if lat else float("nan")
        out["cpu_s"] = loop.cpu
        loop.stop.set()
        loop.join(30)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,50000")
    ap.add_argument("--dir", default="/var/tmp/slurm-ft-lab-bench")
    ap.add_argument("--port-base", type=int, default=22000)
    ap.add_argument("--window", type=float, default=120.0, help="seconds each daemon is measured")
    ap.add_argument("--poll-window", type=float, default=30.0, help="seconds the full-scan-every-cycle daemon runs")
    ap.add_argument("--failovers", type=int, default=3)
    ap.add_argument("--probes", type=int, default=11, help="squeue probes per window (sbatch: half as many)")
    ap.add_argument("--keep", action="store_true", help="leave the lab (and its queue) running")
    ap.add_argument("--reuse", action="store_true", help="use the running lab and the jobs it has queued")
    args = ap.parse_args()
    log = lambda s: print(s, flush=True)  # noqa: E731
    sizes = [int(s) for s in args.sizes.split(",")]
    lab = Lab(args.dir, args.port_base)
    lab_dir = Path(args.dir)
    reuse = args.reuse and lab.status().get("running")
    if lab.status().get("running") and not reuse:
        lab.down(log=lambda *_: None)
    if not reuse:
        lab_dir.mkdir(mode=0o755, exist_ok=True)
        (lab_dir / "slurm.conf.local").write_text(f"MaxJobCount={max(sizes) + 10000}\nMaxArraySize={max(sizes) + 1}\n")
        lab.up(nodes=15, daemon=False, log=lambda *_: None)
    ensure_user()
    env = lab.env()
    slurm = Slurm(conf=str(lab.lay.slurm_conf))
    cfg = config_mod.load(lab.lay.ft_conf)
    queued, last = 0, None
    if reuse:
        out = subprocess.run(["/usr/bin/squeue", "-h", "-u", LAB_USER, "-o", "%A"], capture_output=True, text=True,
                             env=env, timeout=120).stdout
        queued = len(out.split())
        log(f"# reusing the running lab: {queued} jobs of {LAB_USER} queued")
    try:
        for size in sizes:
            log(f"# --- {size} queued jobs")
            added = max(0, size - queued)
            took = fill(env, added, log)
            queued = size
            log(f"size={size} fill_s={took:.0f} submit_per_s={added / max(took, 1e-9):.0f}")
            b0 = sdiag(env)
            t0 = time.monotonic()
            time.sleep(args.window / 2)
            sq0, sb0 = user_latency(env, args.probes)
            time.sleep(args.window / 2)
            base_elapsed = time.monotonic() - t0
            base_rpc = rpcs(b0, sdiag(env))
            base_rate = base_rpc / base_elapsed
            log(f"size={size} baseline_rpc_per_min={base_rate * 60:.1f} squeue_s={sq0:.3f} sbatch_s={sb0:.3f}")
            ev = run_daemon(cfg, slurm, env, args.window, args.failovers, lab, log, args.probes)
            d_rate = max(0.0, ev["rpc"] / ev["elapsed"] - base_rate)
            log(f"size={size} event_daemon_rpc_per_min={d_rate * 60:.1f} cycle_median_s={ev['cycle_median_s']:.4f} "
                f"cycle_max_s={ev['cycle_max_s']:.3f} full_scan_s={ev['full_scan_s']:.3f} "
                f"first_cycle_s={ev['first_cycle_s']:.3f} squeue_s={ev['squeue_s']:.3f} sbatch_s={ev['sbatch_s']:.3f} "
                f"failover_median_s={ev['failover_median_s']:.2f} daemon_cpu_s={ev['cpu_s']:.1f}")
            log(f"size={size} event_daemon_commands_in_window({ev['elapsed']:.0f}s)={ev['calls']}")
            poll_cfg = dataclasses.replace(cfg, failover=dataclasses.replace(cfg.failover, scan_interval_s=0.0))
            po = run_daemon(poll_cfg, slurm, env, args.poll_window, 1, lab, log, args.probes)
            p_rate = max(0.0, po["rpc"] / po["elapsed"] - base_rate)
            log(f"size={size} poll_daemon_rpc_per_min={p_rate * 60:.1f} cycle_median_s={po['full_scan_s']:.3f} "
                f"squeue_s={po['squeue_s']:.3f} sbatch_s={po['sbatch_s']:.3f} "
                f"failover_median_s={po['failover_median_s']:.2f}")
            log(f"size={size} poll_daemon_commands_in_window({po['elapsed']:.0f}s)={po['calls']}")
            last = d_rate
    finally:
        if not args.keep:
            subprocess.run(["/usr/bin/scancel", "-u", LAB_USER], env=env, timeout=600)
            lab.down(log=lambda *_: None)
    log(f"daemon_rpc_per_s={last:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
