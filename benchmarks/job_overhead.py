#!/usr/bin/env python3
"""Per-job cost of slurm-ft's hooks: wall time of ``srun -N1 true`` on the lab cluster with
slurm-ft's Prolog/Epilog and controller hook, against ``/bin/true`` as Prolog/Epilog and no
controller hook, side by side in one run.

Run as root from the repo: ``.venv/bin/python benchmarks/job_overhead.py [--runs N]``.
Starts the lab if needed (``slurm-ft lab up``, as benchmarks/failover_latency.py does).

How the two configurations are compared: Slurm's ``Prolog=`` is global (no per-node or
per-partition prolog), and the presence of ``PrologSlurmctld=`` itself changes how a job starts
(the job is CONFIGURING until it ran), so a switch inside a wrapper script could not take the
controller hook away. The benchmark therefore rewrites the lab's ``slurm.conf`` between series and
applies it with ``scontrol reconfigure``, alternating ``ft bare ft bare ...`` (``--runs`` rounds of
``--per-round`` jobs each), so that a load change on the machine hits both series alike:

* ``ft``: the lab's own slurm.conf (``Prolog=``/``Epilog=`` slurm-ft's wrappers,
  ``PrologSlurmctld=``/``EpilogSlurmctld=`` the controller event hook, the lab's ``PrologFlags``;
  ``--ft-prolog-flags`` tries other flags, ``--ft-without-ctld-hook`` drops the controller hook);
* ``bare``: ``Prolog=/bin/true``, ``Epilog=/bin/true``, no controller hook, the same ``PrologFlags``
  as ``ft`` (``--bare-prolog-flags`` to change).

After each reconfigure a probe job (``srun -N<all nodes> true``) proves which epilog the slurmd
processes run: slurm-ft's epilog journals a verdict for the probe on every node, ``/bin/true``
journals nothing. Each measured job starts with every node idle (the previous job's epilog done),
so the srun times do not include the epilog; the epilog's own cost is reported as
``<cfg>_completing_median_s``: srun's exit to the node idle again (COMPLETING over).
The lab's original slurm.conf is put back (and reconfigured) at the end, also on an error.

Why a hook costs more than its run time on a Slurm with ``PrologFlags=Alloc`` (hold): srun polls
``slurm_job_node_ready`` until the prolog is reported done, asking at 0 and 0.1 s, then at 1.1 s
(24.11) or 0.3, 0.6, 1.0 s (22.05): a prolog not done within about 0.1 s of the allocation costs
the whole next sleep (docs/architecture.md, "Per-job cost"). The lab, as docs/install.md, sets
``Alloc,NoHold`` (no poll: slurmd holds the step instead); ``--ft-prolog-flags Alloc
--bare-prolog-flags Alloc`` measures a site that must keep ``Alloc`` alone (``Contain``).

Prints ``name=value`` lines, ``added_s=`` (median ft - median bare srun seconds) last.
``--before-prolog WRAPPER`` adds a ``before`` series (the ft configuration with that Prolog=, e.g.
a wrapper running an older checkout) in every round, for a before/after figure under one load.
Target (issue 24): <= 0.15 s added (bar: 0.2 s).
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_ft import config as ft_config  # noqa: E402
from slurm_ft.journal import open_node_journal  # noqa: E402
from slurm_ft.lab.cluster import Lab, write_file  # noqa: E402
from slurm_ft.lab.demo import reset_nodes  # noqa: E402
from slurm_ft.lab.layout import DEFAULT_DIR  # noqa: E402
from slurm_ft.slurm import Slurm  # noqa: E402

#: Seconds to wait for a reconfigured lab to show the configuration (probe job, journal rows).
SETTLE_S = 60.0


def variant(conf: str, settings: dict[str, str | None]) -> str:
    """``conf`` (slurm.conf text) with each ``KEY=...`` line of ``settings`` replaced by
    ``KEY=value``, or removed for None; keys not in ``conf`` are appended."""
    out, done = [], set()
    for line in conf.splitlines():
        key = line.split("=", 1)[0].strip() if "=" in line and not line.lstrip().startswith("#") else ""
        if key in settings:
            done.add(key)
            if settings[key] is not None:
                out.append(f"{key}={settings[key]}")
            continue
        out.append(line)
    out += [f"{k}={v}" for k, v in settings.items() if k not in done and v is not None]
    return "\n".join(out) + "\n"


def conf_value(conf: str, key: str) -> str | None:
    m = re.search(rf"^{key}=(.*)$", conf, re.M)
    return m.group(1).strip() if m else None


class Bench:
    def __init__(self, lab: Lab, slurm: Slurm):
        self.lab, self.slurm = lab, slurm
        self.env = lab.env()
        self.cfg = ft_config.load(lab.lay.ft_conf)
        self.nodes = lab.nodes()
        self.health_seen = -1

    def srun(self, *args: str, timeout_s: float = 60.0) -> float:
        """Wall seconds of ``srun args``; raises SystemExit when it fails."""
        t0 = time.perf_counter()
        proc = subprocess.run(["/usr/bin/srun", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, cwd="/")
        took = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"srun {' '.join(args)} failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}")
        return took

    def busy(self) -> bool:
        """Any job not ended yet (COMPLETING included) or any node not idle."""
        out = subprocess.run(["/usr/bin/squeue", "-h", "-o", "%i"], env=self.env, capture_output=True,
                             text=True, timeout=30)
        if out.stdout.strip():
            return True
        nodes = subprocess.run(["/usr/bin/sinfo", "-h", "-N", "-o", "%t"], env=self.env, capture_output=True,
                               text=True, timeout=30)
        return any(s.strip() != "idle" for s in nodes.stdout.split())

    def wait_idle(self, timeout_s: float = 60.0) -> float:
        """Poll (10 ms) until no job is left and every node is idle; seconds waited."""
        t0 = time.perf_counter()
        while self.busy():
            if time.perf_counter() - t0 > timeout_s:
                sys.exit(f"the lab did not become idle within {timeout_s:g} s")
            time.sleep(0.01)
        return time.perf_counter() - t0

    def verdicts(self, job_id: int) -> int:
        """How many lab nodes journaled a verdict for ``job_id``."""
        return self.count_rows("verdicts", job_id)

    def count_rows(self, table: str, job_id: int) -> int:
        """How many lab nodes have rows of ``job_id`` in ``table`` of their node journal."""
        found = 0
        for node in self.nodes:
            try:
                with open_node_journal(self.cfg, node, readonly=True) as j:
                    n = list(j.db.query(f"SELECT count(*) AS n FROM {table} WHERE job_id = ?", [job_id]))[0]["n"]
            except Exception:  # noqa: BLE001 - a journal not made yet: no rows
                n = 0
            found += bool(n)
        return found

    def apply(self, conf: str, ft: bool) -> None:
        """Write ``conf``, reconfigure, and wait until a probe job shows slurmd runs the wanted epilog."""
        write_file(self.lab.lay.slurm_conf, conf)
        subprocess.run(["/usr/bin/scontrol", "reconfigure"], env=self.env, check=True, timeout=60,
                       capture_output=True)
        want = (lambda seen: seen == len(self.nodes)) if ft else (lambda seen: seen == 0)
        deadline = time.monotonic() + SETTLE_S
        while True:
            self.wait_idle()
            job = self.probe()
            self.wait_idle()        # the epilogs have run once every node is idle again
            seen = self.verdicts(job)
            if ft and not want(seen):   # a verdict may wait a moment in a busy journal's spool
                end = time.monotonic() + 5
                while not want(seen) and time.monotonic() < end:
                    time.sleep(0.1)
                    seen = self.verdicts(job)
            if want(seen):
                if ft:   # the prolog ran too: its health rows for the probe (a detached child writes them)
                    time.sleep(0.5)
                    self.health_seen = self.count_rows("health", job)
                return
            if time.monotonic() > deadline:
                sys.exit(f"after reconfigure, probe job {job}: {seen} of {len(self.nodes)} nodes journaled a "
                         f"verdict (wanted {'all' if ft else 'none'})")

    def probe(self) -> int:
        """Run one job on every node; its job id."""
        proc = subprocess.run(["/usr/bin/srun", f"-N{len(self.nodes)}", "printenv", "SLURM_JOB_ID"], env=self.env,
                              capture_output=True, text=True, timeout=60, cwd="/")
        ids = {int(x) for x in proc.stdout.split() if x.isdigit()}
        if proc.returncode != 0 or len(ids) != 1:
            sys.exit(f"probe job failed (rc {proc.returncode}): {proc.stdout[-200:]} {proc.stderr.strip()[-500:]}")
        return ids.pop()

    def series(self, n: int) -> tuple[list[float], list[float]]:
        """``n`` jobs ``srun -N1 true``, each from an idle lab: (srun seconds, completing seconds)."""
        runs, completing = [], []
        for _ in range(n):
            self.wait_idle()
            runs.append(self.srun("-N1", "true"))
            completing.append(self.wait_idle())
        return runs, completing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="rounds (one ft series and one bare series each)")
    ap.add_argument("--per-round", type=int, default=4, help="jobs per series")
    ap.add_argument("--dir", default=str(DEFAULT_DIR))
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--ft-prolog-flags", default=None, help="PrologFlags of the ft series (default: the lab's)")
    ap.add_argument("--bare-prolog-flags", default=None, help="PrologFlags of the bare series (default: as ft)")
    ap.add_argument("--ft-without-ctld-hook", action="store_true", help="ft series without Prolog/EpilogSlurmctld")
    ap.add_argument("--ft-prolog", default=None,
                    help="Prolog= of the ft series (default: the lab's, slurm-ft's prolog/slurm-ft-prolog); e.g. a "
                         "wrapper running an older slurm-ft, for a before/after figure")
    ap.add_argument("--before-prolog", default=None,
                    help="adds a third series, 'before': the ft configuration with this Prolog= (a wrapper running "
                         "an older slurm-ft), alternating with the other two in every round, so that a before/after "
                         "figure is measured under the same load; prints before_* lines and before_added_s")
    args = ap.parse_args()
    if args.runs < 1 or args.per_round < 1:
        sys.exit("--runs and --per-round must be >= 1")

    lab = Lab(args.dir)
    lab.up(nodes=args.nodes, daemon=True, log=lambda *_: None)
    slurm = Slurm(conf=str(lab.lay.slurm_conf))
    reset_nodes(lab, slurm)
    original = lab.lay.slurm_conf.read_text()
    flags = args.ft_prolog_flags or conf_value(original, "PrologFlags")
    ft_settings: dict[str, str | None] = {"PrologFlags": flags}
    if args.ft_prolog:
        ft_settings["Prolog"] = args.ft_prolog
    if args.ft_without_ctld_hook:
        ft_settings.update(PrologSlurmctld=None, EpilogSlurmctld=None)
    confs = {
        **({"before": variant(original, {**ft_settings, "Prolog": args.before_prolog})} if args.before_prolog else {}),
        "ft": variant(original, ft_settings),
        "bare": variant(original, {"Prolog": "/bin/true", "Epilog": "/bin/true", "PrologSlurmctld": None,
                                   "EpilogSlurmctld": None, "PrologFlags": args.bare_prolog_flags or flags}),
    }
    bench = Bench(lab, slurm)
    # a `timeout` or kill -TERM still puts the lab's own slurm.conf back (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    times: dict[str, list[float]] = {name: [] for name in confs}
    done: dict[str, list[float]] = {name: [] for name in confs}
    try:
        for r in range(args.runs):
            for name in confs:
                bench.apply(confs[name], ft=name != "bare")
                t, c = bench.series(args.per_round)
                times[name] += t
                done[name] += c
                print(f"round{r}_{name}_s=" + ",".join(f"{x:.3f}" for x in t), flush=True)
    finally:
        write_file(lab.lay.slurm_conf, original)
        subprocess.run(["/usr/bin/scontrol", "reconfigure"], env=bench.env, timeout=60, capture_output=True)
    print(f"slurm_version={subprocess.run(['/usr/sbin/slurmctld', '-V'], capture_output=True, text=True).stdout.strip()}")
    print(f"ft_prolog_flags={flags}")
    print(f"bare_prolog_flags={args.bare_prolog_flags or flags}")
    print(f"ft_ctld_hook={'no' if args.ft_without_ctld_hook else 'yes'}")
    print(f"ft_prolog={conf_value(confs['ft'], 'Prolog')}")
    print(f"ft_probe_nodes_with_health_rows={bench.health_seen}")
    print(f"jobs_per_config={len(times['ft'])}")
    if args.before_prolog:
        print(f"before_prolog={args.before_prolog}")
    for name in ("bare", *(("before",) if args.before_prolog else ()), "ft"):
        print(f"{name}_median_s={statistics.median(times[name]):.3f}")
        print(f"{name}_min_s={min(times[name]):.3f}")
        print(f"{name}_max_s={max(times[name]):.3f}")
        print(f"{name}_completing_median_s={statistics.median(done[name]):.3f}")
    print("target_s=0.15")
    if args.before_prolog:
        print(f"before_added_s={statistics.median(times['before']) - statistics.median(times['bare']):.3f}")
    print(f"added_s={statistics.median(times['ft']) - statistics.median(times['bare']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
