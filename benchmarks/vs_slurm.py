#!/usr/bin/env python3
"""slurm-ft against Slurm alone: the same faults, side by side, on the same lab, in one run.

Run as root from the repo, under the lab lock:
``flock /tmp/slurm-ft-lab.lock .venv/bin/python benchmarks/vs_slurm.py [--scenario NAME ...]``.
Starts the lab if needed (``slurm-ft lab up``, as benchmarks/failover_latency.py does).

Each scenario runs the same job twice:

* ``slurm``: **Slurm alone, as a careful site configures it**: the job is submitted with
  ``--requeue``, ``JobRequeue=1``, and the node ``Epilog=`` is a common site epilog that drains the
  node and exits non-zero when any ``NVRM: Xid`` reached the kernel log since the job started
  (benchmarks/baseline/xid-drain-epilog.sh, the pattern of public Slurm GPU health-check
  epilogs); no ``Prolog``, no controller hook, slurm-ft's daemon stopped;
* ``slurm-ft``: the lab as it is (slurm-ft's prolog, epilog, controller hook and daemon).

The lab is switched between the two with ``scontrol reconfigure`` and a probe job that proves which
epilog slurmd runs (benchmarks/job_overhead.py's ``variant()`` and ``Bench.apply``); its own
slurm.conf is put back at the end, also on an error or SIGTERM (a copy is kept beside it while the
baseline is in place, and a later run restores it first if a killed run left the baseline behind).

Scenarios (``--scenario``, repeatable; default all): ``xid79`` (Xid 79 on the GPU of a 1-node
job), ``oom`` (CUDA out of memory: a user fault), ``xid13`` (Xid 13 from the application: a user
fault), ``nccl-timeout`` (the NCCL watchdog times out a collective: retry from the checkpoint, blame
no node), ``node-loss`` (the node's slurmd is killed), ``two-node`` (a 2-node job, Xid 79 on one
node's GPU), ``black-hole`` (every GPU of n1 fails its health check, a pending row remap in the
fake NVML inventory, slurm_ft/nvml/fake.py, and every job started there dies at once with an ECC
error without an Xid), ``maintenance`` (the job's node is evacuated for maintenance: slurm alone
``scontrol update State=DRAIN`` + ``scontrol requeue``; slurm-ft ``slurm-ft drain --checkpoint``).

For each run it prints: requeued (and whether that was right), where the job ran next (the faulty
node again?), seconds from the fault to RUNNING again, GPU-seconds lost (work redone since the last
checkpoint + time not running, times the job's GPUs; a job lost: the work since its last
checkpoint, ``+`` the time until someone resubmits it), healthy nodes drained, job lost, and the
run's wrong actions (a requeue that should not have happened or did not happen, the job put on the
faulty node again, the faulty node left in service, each healthy node drained). Rows are appended
to ``--results`` (JSON lines), so the scenarios can run in pieces (each piece under the lock for
minutes, not the whole run); the summary table is printed over the latest row of each
(scenario, configuration) there, then ``scenarios=N``, ``slurm_ft_wrong_actions=N``,
``slurm_wrong_actions=N`` and, last, ``slurm_ft_wrong_actions=N`` again (the headline).
``--summary`` prints the table from ``--results`` without running anything.

Waits: a requeue is awaited up to ``--wait`` s (Slurm alone holds a requeued job 121 s: the
credential lifetime + 1, SLURM_LAB_NOTES.md); a job that ended and stayed ended, not requeued, for
``SETTLED_S`` counts as not requeued.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from job_overhead import Bench, variant  # noqa: E402

from slurm_ft.lab.cluster import Lab, write_file  # noqa: E402
from slurm_ft.lab.demo import ckpt_step, job_gpu_index, reset_nodes, wait_for  # noqa: E402
from slurm_ft.lab.inject import inject_infra, inject_xid, xid_line  # noqa: E402
from slurm_ft.lab import layout as L  # noqa: E402
from slurm_ft.lab.layout import DEFAULT_DIR, repo_root  # noqa: E402
from slurm_ft.nvml import fake  # noqa: E402
from slurm_ft.slurm import Slurm, split_nodes  # noqa: E402

BASELINE_EPILOG = Path(__file__).resolve().parent / "baseline" / "xid-drain-epilog.sh"
#: The per-node wrapper written into the lab directory (the lab's one kernel log: this node's GPUs only).
WRAPPER = "vs-slurm-baseline-epilog"
#: A job that ended, not requeued, and stayed so this long (s) counts as not requeued.
SETTLED_S = 12.0
STEP_S = 0.1
#: Reason prefix of the benchmark's own drains (holding nodes out; the admin's maintenance).
OWN = "vs_slurm:"
NCCL_TIMEOUT = ("[E ProcessGroupNCCL.cpp:737] [Rank 0] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=4695, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600412 milliseconds "
                "before timing out.")
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
BLACK_HOLE = "n1"


@dataclass
class Row:
    scenario: str
    config: str
    expect_requeue: bool
    requeued: bool = False
    next_nodes: str = ""
    faulty_again: bool = False
    fault_to_running_s: float | None = None
    gpu_s_lost: float = 0.0
    lost_open: bool = False          # + the time until someone resubmits the job
    healthy_drained: list[str] = field(default_factory=list)
    faulty_in_service: bool = False
    job_lost: bool = False
    wrong_actions: int = 0
    note: str = ""
    job_id: int = 0

    def line(self) -> str:
        rq = f"{'yes' if self.requeued else 'no'} ({'right' if self.requeued == self.expect_requeue else 'wrong'})"
        t = "-" if self.fault_to_running_s is None else f"{self.fault_to_running_s:.2f}"
        nxt = "-" if not self.next_nodes else f"{self.next_nodes}{' (faulty node again)' if self.faulty_again else ''}"
        return (f"{self.scenario} [{self.config}]: requeued={rq} next={nxt} fault_to_running_s={t} "
                f"gpu_s_lost={self.gpu_s_lost:.1f}{'+' if self.lost_open else ''} "
                f"healthy_drained={','.join(self.healthy_drained) or 0} "
                f"faulty_in_service={'yes' if self.faulty_in_service else 'no'} "
                f"job_lost={'yes' if self.job_lost else 'no'} wrong_actions={self.wrong_actions}"
                + f" job={self.job_id}" + (f" ({self.note})" if self.note else ""))


class Runner:
    """One configuration's runs on the lab (``config``: ``slurm`` or ``slurm-ft``)."""

    def __init__(self, lab: Lab, slurm: Slurm, config: str, wait_s: float):
        self.lab, self.slurm, self.config, self.wait_s = lab, slurm, config, wait_s
        self.env = lab.env()
        self.jobs = lab.lay.jobs_dir
        self.train = repo_root() / "examples" / "train.py"

    # jobs ---------------------------------------------------------------------------------
    def submit(self, body: str, *, nodes: int = 1, steps: int = 3000, every: int = 10) -> tuple[int, Path, Path]:
        """Submit a job script whose ``{train}`` is ``python3 examples/train.py`` with its checkpoint;
        the same sbatch options in both configurations. Returns (job id, output, checkpoint)."""
        stamp = time.time_ns()
        ckpt = self.jobs / f"vs-ckpt-{stamp}.json"
        script = self.jobs / f"vs-job-{stamp}.sh"
        train = (f"python3 {self.train} --ckpt {ckpt} --steps {steps} --step-time {STEP_S} --every {every}")
        write_file(script, "#!/bin/sh\n" + body.format(train=train) + "\n", 0o755)
        argv = ["/usr/bin/sbatch", "--parsable", f"--output={self.jobs}/%j.out", "--open-mode=append",
                "--requeue", "--comment=ft", f"--nodes={nodes}", "--ntasks-per-node=1", "--gres=gpu:1", str(script)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=self.env, cwd=str(self.jobs))
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {proc.stderr.strip()}")
        job_id = int(proc.stdout.strip().split(";")[0])
        out = self.jobs / f"{job_id}.out"
        return job_id, out, ckpt

    @staticmethod
    def text(out: Path) -> str:
        try:
            return out.read_text(errors="replace")
        except OSError:
            return ""

    def started(self, job_id: int, out: Path, ntasks: int = 1, timeout_s: float = 60):
        """Wait until attempt 0's trainer runs on ``ntasks`` nodes; (job, monotonic start)."""
        def ok():
            job = self.slurm.job(job_id)
            if job is None or job.state != "RUNNING" or job.restart_count != 0:
                return None
            return job if len(set(re.findall(r"^attempt 0 on (\S+)", self.text(out), re.M))) >= ntasks else None
        job = wait_for(ok, timeout_s, f"job {job_id} to start", 0.05)
        return job, time.monotonic()

    # the outcome --------------------------------------------------------------------------
    def outcome(self, row: Row, job_id: int, out: Path, t_fault: float, t_start: float, faulty: set[str],
                gpus: int, admin: set[str] = frozenset()) -> Row:
        """Wait for the job to run again (or to stay ended), then measure the row."""
        row.job_id = job_id
        progress_s = max(0.0, t_fault - t_start)
        t_run, ended_since, job = None, None, None
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            job = self.slurm.job(job_id)
            if job is None:
                break
            if job.state == "RUNNING" and job.restart_count >= 1 and job.reason != "Prolog":
                t_run = time.monotonic()
                break
            if job.ended and job.restart_count == 0:
                ended_since = ended_since or time.monotonic()
                if time.monotonic() - ended_since > SETTLED_S:
                    break
            else:
                ended_since = None
            time.sleep(0.05)
        time.sleep(2.0)       # the epilogs of the ended attempt have run (the node idle or drained)
        job = self.slurm.job(job_id) or job
        row.requeued = job is not None and job.restart_count >= 1
        text = self.text(out)
        if t_run is not None:
            row.next_nodes = job.nodes if job.state == "RUNNING" else ""
            row.fault_to_running_s = t_run - t_fault
            row.faulty_again = bool(faulty & set(split_nodes(row.next_nodes)))
            wait_for(lambda: re.search(r"^attempt 1 on .*(from step \d+)", self.text(out), re.M), 30,
                     f"job {job_id} attempt 1 to start", 0.1)
            text = self.text(out)
            resumed = int(re.search(r"^attempt 1 on .*from step (\d+)", text, re.M).group(1))
            redone_s = max(0.0, progress_s - resumed * STEP_S)
            row.gpu_s_lost = gpus * (row.fault_to_running_s + redone_s)
        elif row.expect_requeue:
            row.job_lost = True
            saved = max([int(s) for s in re.findall(r"checkpoint at step (\d+)", text)] + [0])
            row.gpu_s_lost = gpus * max(0.0, progress_s - saved * STEP_S)
            row.lost_open = True
        states = {n.name: n for n in self.slurm.nodes()}
        out_of_service = {n for n, s in states.items()
                          if (s.drained or s.state.lower().startswith("down")) and not s.reason.startswith(OWN)}
        row.healthy_drained = sorted(out_of_service - faulty - set(admin))
        row.faulty_in_service = bool(row.expect_requeue and faulty and not (faulty <= out_of_service | set(admin)))
        row.wrong_actions = ((row.requeued != row.expect_requeue) + row.faulty_again + row.faulty_in_service
                             + len(row.healthy_drained))
        return row

    # scenarios ----------------------------------------------------------------------------
    def xid(self, name: str, xid: int, expect: bool) -> Row:
        job_id, out, ckpt = self.submit("exec {train}")
        job, t_start = self.started(job_id, out)
        wait_for(lambda: ckpt_step(ckpt) >= 20, 60, "a checkpoint", 0.05)
        gpu = job_gpu_index(self.slurm, job_id)
        inject_xid(job.nodes, xid, gpu, lab_dir=str(self.lab.lay.dir))
        t_fault = time.monotonic()
        return self.outcome(Row(name, self.config, expect), job_id, out, t_fault, t_start,
                            {job.nodes} if expect else set(), 1)

    def oom(self) -> Row:
        job_id, out, _ = self.submit("{train} || exit $?\necho '%s' >&2\nexit 1" % OOM, steps=30)
        job, t_start = self.started(job_id, out)
        wait_for(lambda: (j := self.slurm.job(job_id)) is not None and j.state != "RUNNING", 60, "the OOM", 0.05)
        return self.outcome(Row("oom", self.config, False), job_id, out, time.monotonic(), t_start, set(), 1)

    def nccl(self) -> Row:
        job_id, out, ckpt = self.submit("exec srun {train}")
        job, t_start = self.started(job_id, out)
        wait_for(lambda: ckpt_step(ckpt) >= 20, 60, "a checkpoint", 0.05)
        inject_infra(job.nodes, conf=str(self.lab.lay.slurm_conf), job_id=job_id, message=NCCL_TIMEOUT)
        t_fault = time.monotonic()
        return self.outcome(Row("nccl-timeout", self.config, True), job_id, out, t_fault, t_start, set(), 1)

    def node_loss(self) -> Row:
        job_id, out, ckpt = self.submit("exec {train}")
        job, t_start = self.started(job_id, out)
        wait_for(lambda: ckpt_step(ckpt) >= 20, 60, "a checkpoint", 0.05)
        self.lab.slurmd_kill(job.nodes)
        t_fault = time.monotonic()
        try:
            return self.outcome(Row("node-loss", self.config, True), job_id, out, t_fault, t_start, {job.nodes}, 1)
        finally:
            self.slurm.run("scancel", str(job_id), check=False)
            self.lab.slurmd_start(job.nodes)

    def two_node(self) -> Row:
        job_id, out, ckpt = self.submit("exec srun --kill-on-bad-exit=1 {train}", nodes=2)
        job, t_start = self.started(job_id, out, ntasks=2)
        wait_for(lambda: ckpt_step(ckpt) >= 20, 60, "a checkpoint", 0.05)
        held = self.slurm.job_gpus(job_id)
        victim = split_nodes(job.nodes)[-1]
        inject_xid(victim, 79, min(held[victim]), lab_dir=str(self.lab.lay.dir))
        t_fault = time.monotonic()
        return self.outcome(Row("two-node", self.config, True), job_id, out, t_fault, t_start, {victim}, 2)

    def black_hole(self) -> Row:
        inv = str(self.lab.lay.inventory(BLACK_HOLE))
        for gpu in range(L.GPUS_PER_NODE):
            fake.set_gpu_field(inv, gpu, "row_remap_pending", "true")
        others = [n for n in self.lab.nodes() if n != BLACK_HOLE]
        for n in others:      # the scheduler's only choice is the black hole; given back once it chose
            self.slurm.drain(n, f"{OWN} keep free")
        t_fault = time.monotonic()
        try:
            job_id, out, _ = self.submit(f'if [ "$SLURMD_NODENAME" = {BLACK_HOLE} ]; then echo "{ECC}" >&2; exit 1; fi\n'
                                         "exec {train}")
            self.slurm.wait_job(job_id, lambda j: j.restart_count >= 1 or j.ended, 30, 0.05)
        finally:
            for n in others:
                self.slurm.resume(n)
        return self.outcome(Row("black-hole", self.config, True), job_id, out, t_fault, t_fault, {BLACK_HOLE}, 1)

    def maintenance(self) -> Row:
        job_id, out, ckpt = self.submit("exec {train}", every=50)
        job, t_start = self.started(job_id, out)
        wait_for(lambda: ckpt_step(ckpt) >= 50, 60, "a checkpoint", 0.05)
        time.sleep(3.0)       # the admin comes between two checkpoints
        node = job.nodes
        t_fault = time.monotonic()
        if self.config == "slurm":
            self.slurm.drain(node, f"{OWN} maintenance")
            self.slurm.run("scontrol", "requeue", str(job_id))
        else:
            r = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "drain", node, "--checkpoint", "--job",
                                str(job_id), "--reason", f"{OWN} maintenance"], env=self.env, capture_output=True,
                               text=True, timeout=120)
            if r.returncode != 0:
                print(f"# slurm-ft drain --checkpoint: rc {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}")
        return self.outcome(Row("maintenance", self.config, True), job_id, out, t_fault, t_start, {node}, 1,
                            admin={node})


SCENARIOS = {
    "xid79": lambda r: r.xid("xid79", 79, True),
    "oom": Runner.oom,
    "xid13": lambda r: r.xid("xid13", 13, False),
    "nccl-timeout": Runner.nccl,
    "node-loss": Runner.node_loss,
    "two-node": Runner.two_node,
    "black-hole": Runner.black_hole,
    "maintenance": Runner.maintenance,
}


def baseline_conf(lab: Lab, original: str) -> str:
    """The lab's slurm.conf as Slurm alone (the site epilog through the per-node wrapper)."""
    cases = []
    for node in lab.nodes():
        k = L.node_number(node)
        ids = [re.search(r"PCI:([^)]*)\)", xid_line(L.bus_id(k, g), 0, 0)).group(1) for g in range(L.GPUS_PER_NODE)]
        cases.append(f"  {node}) XID_PCI_FILTER='{'|'.join(ids)}' ;;")
    wrapper = lab.lay.dir / WRAPPER
    write_file(wrapper, "#!/bin/sh\n# benchmarks/vs_slurm.py: the site epilog, this lab node's GPUs only (one kernel log)\n"
               'case "$SLURMD_NODENAME" in\n' + "\n".join(cases) + "\n  *) XID_PCI_FILTER='none' ;;\nesac\n"
               f"export XID_PCI_FILTER\nexec /bin/sh {BASELINE_EPILOG}\n", 0o755)
    return variant(original, {"Prolog": None, "Epilog": str(wrapper), "PrologSlurmctld": None,
                              "EpilogSlurmctld": None, "JobRequeue": "1"})


def summary(rows: list[dict]) -> None:
    latest: dict[tuple[str, str], dict] = {}
    for r in rows:
        latest[(r["scenario"], r["config"])] = r
    names = [s for s in SCENARIOS if any(k[0] == s for k in latest)]
    head = ("scenario", "config", "requeued", "ran next on", "fault->RUNNING s", "GPU-s lost", "healthy drained",
            "job lost", "wrong")
    table = [head]
    for s in names:
        for c in ("slurm", "slurm-ft"):
            r = latest.get((s, c))
            if r is None:
                continue
            rq = ("yes" if r["requeued"] else "no") + (" (right)" if r["requeued"] == r["expect_requeue"] else " (WRONG)")
            nxt = r["next_nodes"] + (" (faulty again)" if r["faulty_again"] else "") if r["next_nodes"] else "-"
            t = "-" if r["fault_to_running_s"] is None else f"{r['fault_to_running_s']:.2f}"
            table.append((s, c, rq, nxt, t, f"{r['gpu_s_lost']:.1f}{'+' if r['lost_open'] else ''}",
                          ",".join(r["healthy_drained"]) or "0", "yes" if r["job_lost"] else "no",
                          str(r["wrong_actions"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        print("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    ft = sum(r["wrong_actions"] for (s, c), r in latest.items() if c == "slurm-ft")
    alone = sum(r["wrong_actions"] for (s, c), r in latest.items() if c == "slurm")
    print(f"scenarios={len(names)}")
    print(f"slurm_ft_wrong_actions={ft}")
    print(f"slurm_wrong_actions={alone}")
    print(f"slurm_ft_gpu_s_lost={sum(r['gpu_s_lost'] for (s, c), r in latest.items() if c == 'slurm-ft'):.1f}")
    print(f"slurm_gpu_s_lost={sum(r['gpu_s_lost'] for (s, c), r in latest.items() if c == 'slurm'):.1f}+")
    print(f"slurm_ft_wrong_actions={ft}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="repeatable; default: all")
    ap.add_argument("--config", choices=("both", "slurm", "slurm-ft"), default="both")
    ap.add_argument("--dir", default=str(DEFAULT_DIR))
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--wait", type=float, default=200.0, help="seconds to wait for a requeued job to run again")
    ap.add_argument("--results", default=None, help="JSON lines of the runs (default /tmp/vs_slurm-<version>.jsonl)")
    ap.add_argument("--fresh", action="store_true", help="start --results empty")
    ap.add_argument("--summary", action="store_true", help="only print the summary of --results")
    args = ap.parse_args()
    version = subprocess.run(["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True).stdout.strip()
    results = Path(args.results or f"/tmp/vs_slurm-{version.split()[-1] if version else 'unknown'}.jsonl")
    if args.fresh and not args.summary:
        results.unlink(missing_ok=True)

    def load() -> list[dict]:
        try:
            return [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
        except OSError:
            return []

    print(f"slurm_version={version}")
    if args.summary:
        summary(load())
        return 0
    lab = Lab(args.dir)
    lab.up(nodes=args.nodes, daemon=True, log=lambda *_: None)
    slurm = Slurm(conf=str(lab.lay.slurm_conf))
    saved = lab.lay.dir / "vs_slurm.slurm.conf.orig"
    original = lab.lay.slurm_conf.read_text()
    if WRAPPER in original:        # a killed run left the baseline in place: its saved copy is the lab's own
        if not saved.exists():
            sys.exit(f"{lab.lay.slurm_conf} runs {WRAPPER} and no saved copy is left: `slurm-ft lab down` and up again")
        original = saved.read_text()
    write_file(saved, original)
    reset_nodes(lab, slurm)
    confs = {"slurm": baseline_conf(lab, original), "slurm-ft": original}
    bench = Bench(lab, slurm)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    configs = ("slurm", "slurm-ft") if args.config == "both" else (args.config,)
    try:
        for name in args.scenario or list(SCENARIOS):
            for config in configs:
                if config == "slurm":
                    lab.daemon_stop()
                else:
                    lab.daemon_start()
                bench.apply(confs[config], ft=config == "slurm-ft")
                reset_nodes(lab, slurm)
                t0 = time.monotonic()
                try:
                    row = SCENARIOS[name](Runner(lab, slurm, config, args.wait))
                finally:
                    reset_nodes(lab, slurm)
                print(row.line() + f" took_s={time.monotonic() - t0:.0f}", flush=True)
                with open(results, "a") as fh:
                    fh.write(json.dumps(asdict(row)) + "\n")
    finally:
        write_file(lab.lay.slurm_conf, original)
        subprocess.run(["/usr/bin/scontrol", "reconfigure"], env=lab.env(), timeout=60, capture_output=True)
        lab.daemon_start()
        reset_nodes(lab, slurm)
        saved.unlink(missing_ok=True)
        (lab.lay.dir / WRAPPER).unlink(missing_ok=True)
    summary(load())
    return 0


if __name__ == "__main__":
    sys.exit(main())
