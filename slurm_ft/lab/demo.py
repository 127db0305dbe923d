"""The failover demo (``make demo`` / ``slurm-ft lab demo``), also used by the end-to-end test.

Submit the example training job (ft-enabled, 1 node, 1 GPU); once it has checkpointed, inject Xid
79 on its GPU; expect: epilog verdict hardware -> node drained -> job requeued in place excluding
that node, priority raised -> RUNNING elsewhere within seconds, resuming from its checkpoint ->
COMPLETED; print ``ft-history``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ft.errors import LabError
from slurm_ft.slurm import Slurm
from slurm_ft.lab.cluster import Lab
from slurm_ft.lab.inject import inject_xid
from slurm_ft.lab.layout import repo_root


@dataclass
class Submitted:
    job_id: int
    out: Path
    ckpt: Path
    #: Bytes already in ``out`` when the job was submitted. Slurm hands a job id out again after a
    #: slurmctld state loss, and an ft job's output is appended (``--open-mode=append``) to the
    #: ``%j.out`` of the earlier job with that id: those bytes (its ``attempt 0 on`` line
    #: included) are not this job's.
    out_from: int = 0

    def output(self) -> str:
        """This job's own output so far ('' before it wrote any). A file shorter than
        :attr:`out_from` was truncated (a job without ``--open-mode=append``): all of it is ours."""
        try:
            with open(self.out, "rb") as fh:
                if os.fstat(fh.fileno()).st_size >= self.out_from:
                    fh.seek(self.out_from)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""


def submit_training(lab: Lab, *, steps: int = 60, step_time: float = 0.25, extra: list[str] = (),
                    comment: str = "ft") -> Submitted:
    """Submit examples/train.sbatch to the lab; returns the job id and its output/checkpoint paths."""
    jobs = lab.lay.jobs_dir
    stamp = f"{time.time_ns()}"
    ckpt = jobs / f"ckpt-{stamp}.json"
    repo = repo_root()
    argv = ["/usr/bin/sbatch", "--parsable", f"--output={jobs}/%j.out", f"--comment={comment}", *extra,
            str(repo / "examples" / "train.sbatch"), str(repo / "examples" / "train.py"), str(ckpt),
            "--steps", str(steps), "--step-time", str(step_time)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=lab.env())
    if proc.returncode != 0:
        raise LabError(f"sbatch failed: {proc.stderr.strip()}")
    job_id = int(proc.stdout.strip().split(";")[0])
    out = jobs / f"{job_id}.out"
    try:  # read before the job can write (it is scheduled, then its prolog runs, first)
        out_from = out.stat().st_size
    except OSError:
        out_from = 0
    return Submitted(job_id, out, ckpt, out_from)


def wait_started(slurm: Slurm, sub: Submitted, attempt: int = 0, timeout_s: float = 60):
    """Wait until attempt ``attempt`` of the job runs its own code (past the prolog: the job has
    printed its ``attempt N`` line); returns the Job."""
    def started():
        job = slurm.job(sub.job_id)
        if job is None or job.state != "RUNNING" or job.restart_count != attempt:
            return None
        text = sub.output()   # never an earlier job's with the same id (Submitted.out_from)
        # the trainer's own line (a line of its own: slurm-ft's marker "slurm-ft: attempt N on" is not it)
        return job if re.search(rf"^attempt {attempt} on", text, re.M) else None
    return wait_for(started, timeout_s, f"job {sub.job_id} attempt {attempt} to start")


def job_gpu_index(slurm: Slurm, job_id: int) -> int:
    """The (first) GPU index the job holds on its (first) node."""
    held = slurm.job_gpus(job_id)
    if not held:
        raise LabError(f"job {job_id} holds no GPU")
    return min(next(iter(held.values())))


def ckpt_step(path: Path) -> int:
    try:
        return json.loads(path.read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


def wait_for(pred, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval_s)
    raise LabError(f"timed out after {timeout_s:g} s waiting for {what}")


def reset_nodes(lab: Lab, slurm: Slurm) -> None:
    """Cancel leftover jobs, resume every drained lab node and make every fake GPU healthy again
    (test and demo isolation)."""
    from slurm_ft.nvml import fake
    from slurm_ft.lab import layout as L
    live = [str(j.job_id) for j in slurm.jobs() if not j.ended]
    if live:
        slurm.run("scancel", *live)
        wait_for(lambda: not any(not j.ended for j in slurm.jobs()), 30, "leftover jobs to end")
    for name in lab.nodes():
        lab.slurmd_start(name)  # no-op unless a test killed it
    for node in slurm.nodes():
        if node.drained or node.state.lower().startswith("down"):
            slurm.run("scontrol", "update", f"NodeName={node.name}", "State=RESUME", check=False)
        fake.write_inventory(str(lab.lay.inventory(node.name)), node.name, L.inventory_gpus(node.name))
    wait_for(lambda: all(n.state.lower() in ("idle", "mixed", "allocated") and not n.drained for n in slurm.nodes()),
             60, "every lab node idle")


def run_demo(lab_dir: str, log=print) -> bool:
    lab = Lab(lab_dir)
    lab.up(nodes=3, daemon=True, log=log)
    slurm = Slurm(conf=str(lab.lay.slurm_conf))
    reset_nodes(lab, slurm)
    job = submit_training(lab)
    log(f"submitted job {job.job_id} (output {job.out})")
    first = wait_started(slurm, job)
    gpu = job_gpu_index(slurm, job.job_id)
    log(f"job {job.job_id} running on {first.nodes} GPU {gpu}; waiting for a checkpoint")
    wait_for(lambda: ckpt_step(job.ckpt) >= 10, 60, "checkpoint at step 10")
    done = inject_xid(first.nodes, 79, gpu)
    t_fault = time.monotonic()
    log(f"injected on {first.nodes}: {done['line']}")
    again = slurm.wait_job(job.job_id, lambda j: j.state == "RUNNING" and j.restart_count >= 1, 120, 0.05)
    if again is None:
        raise LabError(f"job {job.job_id} was not failed over (see {lab.lay.log('daemon')})")
    t_back = time.monotonic() - t_fault
    log(f"job {job.job_id} RUNNING again on {again.nodes} {t_back:.2f} s after the fault")
    final = slurm.wait_job(job.job_id, lambda j: j.ended, 120, 0.5)
    out = job.out.read_text(errors="replace") if job.out.exists() else ""
    resumed = [int(s) for s in re.findall(r"resuming from step (\d+)", out)]
    node_info = slurm.show_node(first.nodes)
    log("--- job output ---\n" + out.rstrip())
    log(f"--- drain reason of {first.nodes}: {node_info.get('Reason', '')}")
    from slurm_ft.history.query import history, render_table
    from slurm_ft.journal import open_daemon_journal
    from slurm_ft import config as config_mod
    time.sleep(1.0)  # let the daemon record the final state
    with open_daemon_journal(config_mod.load(lab.lay.ft_conf), readonly=True) as journal:
        h = history(journal, job.job_id)
    log("--- ft-history -j %d ---\n%s" % (job.job_id, render_table(h)))
    checks = {
        "completed": final is not None and final.state == "COMPLETED",
        "moved to another node": again.nodes != first.nodes,
        "resumed from checkpoint (not step 0)": bool(resumed) and resumed[-1] > 0,
        "faulty node drained by slurm-ft": node_info.get("Reason", "").startswith("slurm-ft:"),
        "two attempts on record": len(h["attempts"]) >= 2,
    }
    for name, ok in checks.items():
        log(f"{'PASS' if ok else 'FAIL'}: {name}")
    log(f"failover_s={t_back:.2f}")
    return all(checks.values())
