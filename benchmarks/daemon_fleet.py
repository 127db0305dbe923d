#!/usr/bin/env python3
"""A fleet run (issue 14): a lab of many slurmd (default 64, all on this host), many short ft jobs
(default 2,000), a hardware fault (Xid 79) injected into a running job's GPU for a share of them
(default 5%), the requeue daemon as shipped. Checks that every faulted job failed over exactly
once, and prints failovers per minute, the daemon's CPU time, the journals' size and the time to
recover (fault injected -> the job RUNNING again on another node), p50/p99.

Jobs run, and faults go, only on nodes above n15 (their GPU bus ids are in PCI domains no smaller
lab uses, and no smaller lab has those node names: the one kernel log and /proc are shared, and
other labs' tests inject faults on n1-n15); n1-n15 still run their slurmd. Drained nodes are
resumed ``--repair-s`` after their drain (an admin's repair), and the lab's circuit breaker is
opened wide for the run. Run as root: ``.venv/bin/python benchmarks/daemon_fleet.py``. Prints
``name=value`` lines, headline (``recover_p50_s``) last.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_ft.lab.cluster import Lab  # noqa: E402
from slurm_ft.lab.inject import inject_xid  # noqa: E402
from slurm_ft.slurm import Slurm, split_nodes  # noqa: E402


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def daemon_pid(lab: Lab) -> int | None:
    return next((p["pid"] for p in lab.processes() if p["name"] == "slurm-ft-daemon" and p["alive"]), None)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--faults", type=float, default=0.05, help="share of jobs given a hardware fault")
    ap.add_argument("--job-s", type=float, default=20.0, help="run time of each job (sleep)")
    ap.add_argument("--repair-s", type=float, default=30.0)
    ap.add_argument("--dir", default="/var/tmp/slurm-ft-lab-fleet")
    ap.add_argument("--port-base", type=int, default=23000)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    log = lambda s: print(s, flush=True)  # noqa: E731
    lab = Lab(args.dir, args.port_base)
    if lab.status().get("running"):
        lab.down(log=lambda *_: None)
    Path(args.dir).mkdir(mode=0o755, exist_ok=True)
    (Path(args.dir) / "slurm.conf.local").write_text(f"MaxJobCount={args.jobs + 10000}\n")
    t_up = time.monotonic()
    lab.up(nodes=args.nodes, daemon=True, log=lambda *_: None)
    log(f"nodes={args.nodes} lab_up_s={time.monotonic() - t_up:.1f}")
    conf = lab.lay.ft_conf.read_text()
    conf = re.sub(r"max_nodes = \d+", "max_nodes = 100000", conf)
    lab.lay.ft_conf.write_text(conf)
    lab.daemon_start()
    env = lab.env()
    slurm = Slurm(conf=str(lab.lay.slurm_conf))
    faultable = [f"n{i}" for i in range(16, args.nodes + 1)]
    n_faults = int(round(args.jobs * args.faults))
    pid = daemon_pid(lab)
    cpu0 = cpu_s(pid) if pid else float("nan")
    t0 = time.monotonic()
    log(f"jobs={args.jobs} faults_planned={n_faults} faultable_nodes={len(faultable)}")
    # jobs only on n16 and up: other labs on this host inject faults on n1-n15 (their kernel-log
    # lines and their kills by node name would land on this lab's jobs there too)
    argv = ["/usr/bin/sbatch", "--parsable", "--comment=ft:retries=3", "--gres=gpu:1", "-o", "/dev/null",
            "-x", "n[1-15]", "--wrap", f"sleep {args.job_s:g}"]
    ids: list[int] = []
    for _ in range(args.jobs):   # submitted at once: the queue drains at the nodes' pace
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, cwd="/tmp")
        if out.stdout.strip().isdigit():
            ids.append(int(out.stdout.strip()))
    log(f"submitted={len(ids)} submit_s={time.monotonic() - t0:.0f}")
    faulted: dict[int, tuple[float, str]] = {}       # job -> (inject time, node)
    recovered: dict[int, float] = {}
    requeued: dict[int, float] = {}                  # fault -> requeued by the daemon (eligible, restart 1)
    rng = random.Random(14)
    drained_at: dict[str, float] = {}
    done_ids: set[int] = set()

    def jobs_now():
        return {j.job_id: j for j in slurm.jobs()}

    last_fault = 0.0
    spacing = max(1.0, args.jobs * (args.job_s + 5) / max(args.nodes * 2, 1) / max(n_faults, 1) / 2)
    while True:
        now = time.monotonic()
        jobs = jobs_now()
        # recoveries
        for jid, (t_inj, node) in faulted.items():
            j = jobs.get(jid)
            if jid not in requeued and j is not None and j.restart_count >= 1:
                requeued[jid] = now - t_inj
            if jid not in recovered and j is not None and j.restart_count >= 1 and (
                    (j.state == "RUNNING" and j.reason != "Prolog") or j.state == "COMPLETED"):
                recovered[jid] = now - t_inj
        # faults: a running, not yet faulted job on a node above n15
        if len(faulted) < n_faults and now - last_fault >= spacing:
            cands = [j for j in jobs.values() if j.job_id in ids and j.job_id not in faulted and j.state == "RUNNING"
                     and j.reason != "Prolog" and j.restart_count == 0 and time.time() - (j.start_time or 0) > 1
                     and split_nodes(j.nodes) and split_nodes(j.nodes)[0] in faultable]
            if cands:
                victim = rng.choice(cands)
                gpus = slurm.job_gpus(victim.job_id)
                node = split_nodes(victim.nodes)[0]
                gpu = min(gpus.get(node, {0}))
                t_inj = time.monotonic()
                done = inject_xid(node, 79, gpu)
                if any(k["job"] == str(victim.job_id) for k in done["killed"]):   # else it had just ended
                    faulted[victim.job_id] = (t_inj, node)
                    last_fault = now
        # repairs
        for n in slurm.nodes():
            if n.drained and n.reason.startswith("slurm-ft:"):
                drained_at.setdefault(n.name, now)
                if now - drained_at[n.name] >= args.repair_s:
                    slurm.run("scontrol", "update", f"NodeName={n.name}", "State=RESUME", check=False)
                    drained_at.pop(n.name, None)
        done_ids = {jid for jid in ids if jid not in jobs or jobs[jid].ended}
        if len(done_ids) == len(ids) and len(recovered) == len(faulted):
            break
        if now - t0 > 6 * 3600:
            log("# giving up after 6 h")
            break
        if int(now - t0) % 60 == 0:
            log(f"# t={now - t0:.0f}s done={len(done_ids)}/{len(ids)} faulted={len(faulted)} "
                f"recovered={len(recovered)}")
        time.sleep(1.0)
    elapsed = time.monotonic() - t0
    cpu = cpu_s(pid) - cpu0 if pid else float("nan")
    from slurm_ft import config as config_mod
    from slurm_ft.journal import open_journal

    cfg = config_mod.load(lab.lay.ft_conf)
    with open_journal(cfg.journal.path, readonly=True) as j:
        twice = j.db.execute("SELECT count(*) FROM (SELECT job_id, attempt FROM actions WHERE action = 'failover' "
                             "GROUP BY job_id, attempt HAVING count(*) > 1)").fetchone()[0]
        failovers = j.db.execute("SELECT count(*) FROM actions WHERE action = 'failover' AND status = 'done'"
                                 ).fetchone()[0]
        rows = j.db.execute("SELECT count(*) FROM actions").fetchone()[0]
    jdir = Path(cfg.journal.path).parent
    size = sum(p.stat().st_size for p in jdir.glob("*.db*"))
    daemon_size = sum(p.stat().st_size for p in jdir.glob("daemon.db*"))
    rec = list(recovered.values())
    log(f"elapsed_s={elapsed:.0f} jobs_done={len(done_ids)} faults={len(faulted)} failovers_done={failovers} "
        f"failovers_twice={twice} recovered={len(rec)}")
    log(f"failovers_per_min={failovers / (elapsed / 60):.2f} daemon_cpu_s={cpu:.1f} "
        f"daemon_cpu_pct={100 * cpu / elapsed:.2f} journal_rows_actions={rows}")
    log(f"journal_bytes_daemon={daemon_size} journal_bytes_all={size}")
    req = list(requeued.values())
    log(f"requeued_p50_s={pct(req, 0.5):.2f} requeued_p99_s={pct(req, 0.99):.2f} (fault -> requeued, 1 s polls)")
    log(f"recover_p99_s={pct(rec, 0.99):.2f} recover_max_s={max(rec) if rec else float('nan'):.2f} "
        f"(fault -> RUNNING again: includes waiting for a free GPU in a full cluster)")
    if not args.keep:
        subprocess.run(["/usr/bin/scancel", "-u", "root"], env=env, timeout=600)
        lab.down(log=lambda *_: None)
    log(f"recover_p50_s={statistics.median(rec) if rec else float('nan'):.2f}")
    return 0 if twice == 0 and len(rec) == len(faulted) else 1


if __name__ == "__main__":
    sys.exit(main())
