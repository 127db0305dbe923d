#!/usr/bin/env python3
"""slurm-ft against Slurm alone: the same faults, side by side, on the same lab, in one run.

Run as root from the repo, under the lock of the lab it drives:
``flock /tmp/slurm-ft-lab.lock .venv/bin/python benchmarks/vs_slurm.py [--scenario NAME ...]`` (the
native lab, the host's Slurm) or ``flock /tmp/slurm-ft-docker.lock .venv/bin/python
benchmarks/vs_slurm.py --engine docker --slurm 26.05 ...`` (the Docker lab of that Slurm version).
Starts the lab if needed (``slurm-ft lab up [--engine docker --slurm V]``). The lab-specific
operations (submit, faults, the slurm.conf switch) are benchmarks/vs_labs.py's.

Each scenario runs the same job twice:

* ``slurm``: **Slurm alone, as a careful site configures it**: the job is submitted with
  ``--requeue``, ``JobRequeue=1``, and the node ``Epilog=`` is a common site epilog that drains the
  node and exits non-zero when any ``NVRM: Xid`` reached the kernel log since the job started
  (benchmarks/baseline/xid-drain-epilog.sh, the pattern of public Slurm GPU health-check
  epilogs); no ``Prolog``, no controller hook, slurm-ft's daemon stopped. On Slurm >= 25.11 the
  job asks for **expedited requeue** (``--requeue=expedite``, ``SlurmctldParameters`` +
  ``enable_expedited_requeue``): a job that exits non-zero while an epilog fails, or whose node
  fails, is requeued at once as the highest-priority job (slurm_ft/slurm/versions.py);
* ``slurm-ft``: the lab as it is (slurm-ft's prolog, epilog, controller hook and daemon).

and, on Slurm >= 25.11 when asked for (``--config slurm-ft-expedite``), an experiment:

* ``slurm-ft-expedite``: slurm-ft as it is, the job submitted with ``--requeue=expedite``
  (expedited requeue enabled), and a node ``Epilog=`` that runs slurm-ft's epilog, then exits 1
  when it drained the node for this job (its verdict: hardware), so that slurmctld requeues the
  job at once (benchmarks/expedite/ft-expedite-epilog.sh); slurm-ft's daemon still runs (its own
  requeue where Slurm's does not come). A row gives the faulty node's drain reason (does Slurm's
  ``Epilog error`` replace slurm-ft's?) and the job's restart count (a double requeue). Measured and
  decided against: docs/architecture.md, "Riding on Slurm's expedited requeue (26.05)".

* ``slurm-ft-handoff`` (Slurm >= 25.11): slurm-ft with the hand-off on (``[failover]
  handoff_wait_s = 2`` in the lab's slurm-ft.toml, the daemon restarted on it) and
  ``SchedulerParameters`` + ``requeue_delay=-1`` (a requeued job eligible the moment its epilogs
  end): the epilog of a failed 1-node ft job waits for the daemon's requeue, so that slurmctld
  starts the job in the epilog-complete RPC (slurm_ft/node/handoff.py).

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

For each run it prints: requeued (and whether that was right; ``held``: requeued held, as an
expedited job whose epilogs all passed is: it never runs again by itself, so it counts as not
rerun), where the job ran next (the faulty node again?), seconds from the fault to RUNNING again,
GPU-seconds lost (work redone since the last checkpoint + time not running, times the job's GPUs;
a job lost: the work since its last checkpoint, ``+`` the time until someone resubmits it),
healthy nodes drained, job lost, the job's restart count at the end and the faulty nodes' drain
reasons, and the run's wrong actions (a requeue that should not have happened or did not happen,
the job put on the faulty node again, the faulty node left in service, each healthy node drained).
Rows are appended
to ``--results`` (JSON lines), so the scenarios can run in pieces (each piece under the lock for
minutes, not the whole run); the summary table is printed over the latest row of each
(scenario, configuration) there, then ``scenarios=N``, ``slurm_ft_wrong_actions=N``,
``slurm_wrong_actions=N`` and, last, ``slurm_ft_wrong_actions=N`` again (the headline).
``--summary`` prints the table from ``--results`` without running anything. ``--repeat N`` runs
each scenario N times (the configurations interleaved); a second table gives the median and the
spread of fault->RUNNING of every (scenario, configuration) run more than once.

Waits: a requeue is awaited up to ``--wait`` s (Slurm alone holds a requeued job 121 s: the
credential lifetime + 1, SLURM_LAB_NOTES.md); a job that ended and stayed ended, not requeued, for
``SETTLED_S`` counts as not requeued.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from job_overhead import conf_value, variant  # noqa: E402
from vs_labs import DockerBenchLab, NativeBenchLab, pci_of  # noqa: E402

from slurm_ft.lab.demo import ckpt_step, job_gpu_index, wait_for  # noqa: E402
from slurm_ft.lab import layout as L  # noqa: E402
from slurm_ft.lab.layout import DEFAULT_DIR  # noqa: E402
from slurm_ft.nvml import fake  # noqa: E402
from slurm_ft.slurm import split_nodes  # noqa: E402
from slurm_ft.slurm.versions import (  # noqa: E402
    EXPEDITE_CONF_KEY, EXPEDITE_CONF_WORD, REQUEUE_HOLD_STATE, has_expedited_requeue, requeue_option,
    with_param)

HERE = Path(__file__).resolve().parent
BASELINE_EPILOG = HERE / "baseline" / "xid-drain-epilog.sh"
EXPEDITE_EPILOG = HERE / "expedite" / "ft-expedite-epilog.sh"
#: The per-node wrapper written beside the lab's slurm.conf (the lab's one kernel log: this node's GPUs only).
WRAPPER = "vs-slurm-baseline-epilog"
#: The slurm-ft-expedite epilog written beside the lab's slurm.conf.
FT_EXPEDITE = "vs-slurm-ft-expedite-epilog"
#: The site epilog as copied beside the lab's slurm.conf (a Docker lab's containers see only that folder).
SITE_EPILOG = "vs-slurm-xid-drain-epilog.sh"
SAVED = "vs_slurm.slurm.conf.orig"
CONFIGS = ("slurm", "slurm-ft", "slurm-ft-expedite", "slurm-ft-handoff")
#: Lines a configuration adds to the ``[failover]`` table of the lab's slurm-ft.toml.
FT_SETTINGS = {"slurm-ft-handoff": "handoff_wait_s = 2.0"}
SAVED_TOML = "vs_slurm.slurm-ft.toml.orig"
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
#: A 1-GPU job as PyTorch behaves when its GPU fails: the trainer's CUDA context dies (the lab's
#: Xid injection SIGKILLs the processes holding the GPU) and the job exits 1 with a CUDA error,
#: not by the signal (the batch shell leaves the GPU to the trainer, so the injection spares it).
#: It matters on Slurm >= 25.11: expedited requeue acts on a non-zero exit code, not on a job
#: killed by a signal (measured on 26.05.5: ``WTERMSIG 9`` and a failed epilog: no requeue).
CUDA_JOB = ("exec env -u SLURM_JOB_GPUS -u SLURM_STEP_GPUS sh -c 'SLURM_JOB_GPUS=\"$0\" {train}; rc=$?; "
            "if [ $rc -gt 128 ]; then echo \"RuntimeError: CUDA error: unspecified launch failure\" >&2; "
            "exit 1; fi; exit $rc' \"$SLURM_JOB_GPUS\"")
#: Job state reasons of a held job (a requeue that waits for someone to release it).
HELD = ("JobHeldAdmin", "JobHeldUser", "launch_failed_requeued_held", "job_requeued_in_held_state")


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
    held: bool = False               # requeued, but held: it never runs again by itself
    restarts: int = 0                # the job's restart count at the end (2+: requeued twice)
    faulty_reasons: dict = field(default_factory=dict)   # faulty node -> its drain/down reason
    engine: str = "native"
    slurm_version: str = ""

    def line(self) -> str:
        reran = self.requeued and not self.held
        rq = f"{'held' if self.held else 'yes' if self.requeued else 'no'} " \
             f"({'right' if reran == self.expect_requeue else 'wrong'})"
        t = "-" if self.fault_to_running_s is None else f"{self.fault_to_running_s:.2f}"
        nxt = "-" if not self.next_nodes else f"{self.next_nodes}{' (faulty node again)' if self.faulty_again else ''}"
        reasons = ";".join(f"{n}={r!r}" for n, r in self.faulty_reasons.items())
        return (f"{self.scenario} [{self.config}]: requeued={rq} next={nxt} fault_to_running_s={t} "
                f"gpu_s_lost={self.gpu_s_lost:.1f}{'+' if self.lost_open else ''} "
                f"healthy_drained={','.join(self.healthy_drained) or 0} "
                f"faulty_in_service={'yes' if self.faulty_in_service else 'no'} "
                f"job_lost={'yes' if self.job_lost else 'no'} wrong_actions={self.wrong_actions}"
                + f" job={self.job_id} restarts={self.restarts}" + (f" reasons={reasons}" if reasons else "")
                + (f" ({self.note})" if self.note else ""))


def held(job) -> bool:
    """A requeued job that waits for someone to release it (held, or an expedited job's
    ``REQUEUE_HOLD``)."""
    return (REQUEUE_HOLD_STATE in (job.state, *job.flags)
            or (job.state == "PENDING" and (job.reason in HELD or job.priority == 0)))


class Runner:
    """One configuration's runs on the lab (``config``: one of :data:`CONFIGS`)."""

    def __init__(self, blab, config: str, wait_s: float, version: str):
        self.blab, self.slurm, self.config, self.wait_s = blab, blab.slurm, config, wait_s
        self.version = version
        expedite = config == "slurm-ft-expedite" or (config == "slurm" and has_expedited_requeue(version))
        self.requeue = requeue_option(version, expedite)

    def new_row(self, scenario: str, expect: bool) -> Row:
        return Row(scenario, self.config, expect, engine=self.blab.engine, slurm_version=self.version)

    # jobs ---------------------------------------------------------------------------------
    def submit(self, body: str, *, nodes: int = 1, steps: int = 3000, every: int = 10) -> tuple[int, Path, Path]:
        """Submit a job script whose ``{train}`` is ``python3 examples/train.py`` with its checkpoint;
        the same sbatch options in every configuration but the requeue option. Returns (job id,
        output, checkpoint) as host paths."""
        stamp = time.time_ns()
        jobs, host = self.blab.jobs_job, self.blab.jobs_host
        train = (f"{self.blab.train} --ckpt {jobs}/vs-ckpt-{stamp}.json --steps {steps} --step-time {STEP_S} "
                 f"--every {every}")
        script = host / f"vs-job-{stamp}.sh"
        script.write_text("#!/bin/sh\n" + body.format(train=train) + "\n")
        script.chmod(0o755)
        job_id = self.blab.sbatch([f"--output={jobs}/%j.out", "--open-mode=append", self.requeue, "--comment=ft",
                                   f"--nodes={nodes}", "--ntasks-per-node=1", "--gres=gpu:1",
                                   f"{jobs}/vs-job-{stamp}.sh"])
        return job_id, host / f"{job_id}.out", host / f"vs-ckpt-{stamp}.json"

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
        """Wait for the job to run again (or to stay ended, or held), then measure the row."""
        row.job_id = job_id
        progress_s = max(0.0, t_fault - t_start)
        t_run, ended_since, held_since, job = None, None, None, None
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
            if job.restart_count >= 1 and held(job):
                held_since = held_since or time.monotonic()
                if time.monotonic() - held_since > SETTLED_S:
                    break
            else:
                held_since = None
            time.sleep(0.05)
        # the epilogs of the ended attempt have run (the node idle or drained); an expedited job's
        # epilog failure and slurm-ft's daemon both act on it: give a second requeue time to show
        time.sleep(8.0 if "expedite" in self.requeue else 2.0)
        job = self.slurm.job(job_id) or job
        row.requeued = job is not None and job.restart_count >= 1
        row.restarts = job.restart_count if job is not None else 0
        row.held = bool(row.requeued and t_run is None and held(job))
        if row.held:
            row.note = (row.note + "; " if row.note else "") + f"held: {job.state} {job.reason}"
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
        row.faulty_reasons = {n: states[n].reason for n in sorted(faulty) if n in states and n not in admin}
        row.healthy_drained = sorted(out_of_service - faulty - set(admin))
        row.faulty_in_service = bool(row.expect_requeue and faulty and not (faulty <= out_of_service | set(admin)))
        # a requeue that never runs by itself (held) is no rerun: wrong only where one was due
        reran = row.requeued and not row.held
        row.wrong_actions = ((reran != row.expect_requeue) + row.faulty_again + row.faulty_in_service
                             + len(row.healthy_drained))
        return row

    # scenarios ----------------------------------------------------------------------------
    def xid(self, name: str, xid: int, expect: bool) -> Row:
        job_id, out, ckpt = self.submit(CUDA_JOB)
        job, t_start = self.started(job_id, out)
        wait_for(lambda: ckpt_step(ckpt) >= 20, 60, "a checkpoint", 0.05)
        gpu = job_gpu_index(self.slurm, job_id)
        self.blab.inject_xid(job.nodes, xid, gpu)
        t_fault = time.monotonic()
        return self.outcome(self.new_row(name, expect), job_id, out, t_fault, t_start,
                            {job.nodes} if expect else set(), 1)

    def oom(self) -> Row:
        job_id, out, _ = self.submit("{train} || exit $?\necho '%s' >&2\nexit 1" % OOM, steps=30)
        job, t_start = self.started(job_id, out)
        wait_for(lambda: (j := self.slurm.job(job_id)) is not None and j.state != "RUNNING", 60, "the OOM", 0.05)
        return self.outcome(self.new_row("oom", False), job_id, out, time.monotonic(), t_start, set(), 1)

    def nccl(self) -> Row:
        job_id, out, ckpt = self.submit("exec srun {train}")
        job, t_start = self.started(job_id, out)
        wait_for(lambda: ckpt_step(ckpt) >= 20, 60, "a checkpoint", 0.05)
        self.blab.inject_infra(job.nodes, job_id, NCCL_TIMEOUT)
        t_fault = time.monotonic()
        return self.outcome(self.new_row("nccl-timeout", True), job_id, out, t_fault, t_start, set(), 1)

    def node_loss(self) -> Row:
        job_id, out, ckpt = self.submit("exec {train}")
        job, t_start = self.started(job_id, out)
        wait_for(lambda: ckpt_step(ckpt) >= 20, 60, "a checkpoint", 0.05)
        self.blab.lose_node(job.nodes)
        t_fault = time.monotonic()
        try:
            return self.outcome(self.new_row("node-loss", True), job_id, out, t_fault, t_start, {job.nodes}, 1)
        finally:
            self.slurm.run("scancel", str(job_id), check=False)
            self.blab.node_back(job.nodes)

    def two_node(self) -> Row:
        job_id, out, ckpt = self.submit("exec srun --kill-on-bad-exit=1 {train}", nodes=2)
        job, t_start = self.started(job_id, out, ntasks=2)
        wait_for(lambda: ckpt_step(ckpt) >= 20, 60, "a checkpoint", 0.05)
        held = self.slurm.job_gpus(job_id)
        victim = split_nodes(job.nodes)[-1]
        self.blab.inject_xid(victim, 79, min(held[victim]))
        t_fault = time.monotonic()
        return self.outcome(self.new_row("two-node", True), job_id, out, t_fault, t_start, {victim}, 2)

    def black_hole(self) -> Row:
        inv = str(self.blab.inventory(BLACK_HOLE))
        for gpu in range(L.GPUS_PER_NODE):
            fake.set_gpu_field(inv, gpu, "row_remap_pending", "true")
        others = [n for n in self.blab.nodes() if n != BLACK_HOLE]
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
        return self.outcome(self.new_row("black-hole", True), job_id, out, t_fault, t_fault, {BLACK_HOLE}, 1)

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
            rc, text = self.blab.drain_checkpoint(node, job_id, f"{OWN} maintenance")
            if rc != 0:
                print(f"# slurm-ft drain --checkpoint: rc {rc}: {text.strip()[-300:]}")
        return self.outcome(self.new_row("maintenance", True), job_id, out, t_fault, t_start, {node}, 1,
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


def configurations(blab, original: str, version: str, wanted: list[str]) -> dict[str, str]:
    """slurm.conf text of each configuration in ``wanted``; writes their epilogs beside slurm.conf."""
    expedite = has_expedited_requeue(version)
    sched = {EXPEDITE_CONF_KEY: with_param(conf_value(original, EXPEDITE_CONF_KEY),
                                           EXPEDITE_CONF_WORD)} if expedite else {}
    confs = {"slurm-ft": original}
    if "slurm" in wanted:
        site = blab.write_extra(SITE_EPILOG, BASELINE_EPILOG.read_text())
        cases = []
        for node in blab.nodes():
            ids = [pci_of(bus) for bus in blab.bus_ids(node)]
            cases.append(f"  {node}) XID_PCI_FILTER='{'|'.join(ids)}' ;;")
        wrapper = blab.write_extra(
            WRAPPER, "#!/bin/sh\n# benchmarks/vs_slurm.py: the site epilog, this lab node's GPUs only (one kernel log)\n"
            'case "$SLURMD_NODENAME" in\n' + "\n".join(cases) + "\n  *) XID_PCI_FILTER='none' ;;\nesac\n"
            f"export XID_PCI_FILTER\nexec /bin/sh {site}\n")
        confs["slurm"] = variant(original, {"Prolog": None, "Epilog": wrapper, "PrologSlurmctld": None,
                                            "EpilogSlurmctld": None, "JobRequeue": "1", **sched})
    if "slurm-ft-expedite" in wanted:
        if not expedite:
            sys.exit(f"--config slurm-ft-expedite needs Slurm >= 25.11 (expedited requeue); this lab runs {version}")
        text = EXPEDITE_EPILOG.read_text().replace("@FT_EPILOG@", conf_value(original, "Epilog") or "/bin/true")
        confs["slurm-ft-expedite"] = variant(original, {"Epilog": blab.write_extra(FT_EXPEDITE, text), **sched})
    if "slurm-ft-handoff" in wanted:
        if not expedite:
            sys.exit(f"--config slurm-ft-handoff needs Slurm >= 25.11 (requeue_delay); this lab runs {version}")
        confs["slurm-ft-handoff"] = variant(original, {"SchedulerParameters": with_param(
            conf_value(original, "SchedulerParameters"), "requeue_delay=-1")})
    return confs


def ft_settings(toml: Path, original: str, config: str) -> bool:
    """Write the lab's slurm-ft.toml for ``config`` (``original`` plus :data:`FT_SETTINGS` under
    ``[failover]``); True when its text changed (the daemon must start again to read it)."""
    extra = FT_SETTINGS.get(config)
    text = original.replace("[failover]\n", f"[failover]\n{extra}\n", 1) if extra else original
    if toml.read_text() == text:
        return False
    tmp = toml.with_name(".slurm-ft.toml.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, toml)
    return True


def summary(rows: list[dict]) -> None:
    latest: dict[tuple[str, str], dict] = {}
    runs: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        latest[(r["scenario"], r["config"])] = r
        if r["fault_to_running_s"] is not None:
            runs.setdefault((r["scenario"], r["config"]), []).append(r["fault_to_running_s"])
    names = [s for s in SCENARIOS if any(k[0] == s for k in latest)]
    head = ("scenario", "config", "requeued", "ran next on", "fault->RUNNING s", "GPU-s lost", "healthy drained",
            "job lost", "wrong")
    table = [head]
    for s in names:
        for c in CONFIGS:
            r = latest.get((s, c))
            if r is None:
                continue
            reran = r["requeued"] and not r.get("held")
            rq = (("held" if r.get("held") else "yes" if r["requeued"] else "no")
                  + (" (right)" if reran == r["expect_requeue"] else " (WRONG)"))
            nxt = r["next_nodes"] + (" (faulty again)" if r["faulty_again"] else "") if r["next_nodes"] else "-"
            t = "-" if r["fault_to_running_s"] is None else f"{r['fault_to_running_s']:.2f}"
            table.append((s, c, rq, nxt, t, f"{r['gpu_s_lost']:.1f}{'+' if r['lost_open'] else ''}",
                          ",".join(r["healthy_drained"]) or "0", "yes" if r["job_lost"] else "no",
                          str(r["wrong_actions"])))
    print_table(table)
    repeated = [(s, c, v) for (s, c), v in runs.items() if len(v) > 1]
    if repeated:
        print_table([("scenario", "config", "runs", "fault->RUNNING median s", "min s", "max s")]
                    + [(s, c, str(len(v)), f"{statistics.median(v):.2f}", f"{min(v):.2f}", f"{max(v):.2f}")
                       for s, c, v in sorted(repeated, key=lambda x: (list(SCENARIOS).index(x[0]), x[1]))])
    ft = sum(r["wrong_actions"] for (s, c), r in latest.items() if c == "slurm-ft")
    alone = sum(r["wrong_actions"] for (s, c), r in latest.items() if c == "slurm")
    print(f"scenarios={len(names)}")
    print(f"slurm_ft_wrong_actions={ft}")
    print(f"slurm_wrong_actions={alone}")
    print(f"slurm_ft_gpu_s_lost={sum(r['gpu_s_lost'] for (s, c), r in latest.items() if c == 'slurm-ft'):.1f}")
    print(f"slurm_gpu_s_lost={sum(r['gpu_s_lost'] for (s, c), r in latest.items() if c == 'slurm'):.1f}+")
    if any(c == "slurm-ft-handoff" for (s, c) in latest):
        print("slurm_ft_handoff_wrong_actions="
              f"{sum(r['wrong_actions'] for (s, c), r in latest.items() if c == 'slurm-ft-handoff')}")
    if any(c == "slurm-ft-expedite" for (s, c) in latest):
        print("slurm_ft_expedite_wrong_actions="
              f"{sum(r['wrong_actions'] for (s, c), r in latest.items() if c == 'slurm-ft-expedite')}")
    print(f"slurm_ft_wrong_actions={ft}")


def print_table(table: list[tuple]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for i, row in enumerate(table):
        print("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="repeatable; default: all")
    ap.add_argument("--config", default="both",
                    help="comma list of " + ", ".join(CONFIGS) + " (slurm-ft-expedite, slurm-ft-handoff: Slurm >= 25.11 "
                         "only); "
                         "'both' (default): slurm,slurm-ft")
    ap.add_argument("--engine", choices=("native", "docker"), default="native")
    ap.add_argument("--slurm", default="26.05", help="the Docker lab's Slurm version (--engine docker)")
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="the native lab's directory")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each scenario in each configuration")
    ap.add_argument("--wait", type=float, default=200.0, help="seconds to wait for a requeued job to run again")
    ap.add_argument("--results", default=None,
                    help="JSON lines of the runs (default /tmp/vs_slurm-<version>.jsonl; Docker: -docker-<version>)")
    ap.add_argument("--fresh", action="store_true", help="start --results empty")
    ap.add_argument("--summary", action="store_true", help="only print the summary of --results")
    args = ap.parse_args()
    configs = ["slurm", "slurm-ft"] if args.config == "both" else [c.strip() for c in args.config.split(",")]
    if not configs or any(c not in CONFIGS for c in configs):
        ap.error(f"--config: a comma list of {', '.join(CONFIGS)} (or 'both')")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    if args.summary:     # no lab needed
        if args.results:
            results = Path(args.results)
        elif args.engine == "docker":
            found = sorted(Path("/tmp").glob(f"vs_slurm-docker-{args.slurm}*.jsonl"))
            results = found[-1] if found else Path(f"/tmp/vs_slurm-docker-{args.slurm}.jsonl")
        else:
            v = subprocess.run(["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True).stdout.split()
            results = Path(f"/tmp/vs_slurm-{v[-1] if v else 'unknown'}.jsonl")
        print(f"results={results}")
        summary(load(results))
        return 0
    blab = DockerBenchLab(args.slurm, args.nodes) if args.engine == "docker" else NativeBenchLab(args.dir, args.nodes)
    version = blab.version()
    tag = version.split()[-1] if version else "unknown"
    results = Path(args.results or f"/tmp/vs_slurm-{'docker-' if args.engine == 'docker' else ''}{tag}.jsonl")
    if args.fresh:
        results.unlink(missing_ok=True)
    print(f"slurm_version={version}")
    print(f"engine={args.engine}")
    saved = blab.extra_dir / SAVED
    original = blab.read_conf()
    if WRAPPER in original or FT_EXPEDITE in original:   # a killed run left its variant in place
        if not saved.exists():
            sys.exit(f"{blab.conf_path} runs a benchmark epilog and no saved copy is left: take the lab down and up")
        original = saved.read_text()
    saved.write_text(original)
    toml = blab.conf_path.with_name("slurm-ft.toml")
    saved_toml = blab.extra_dir / SAVED_TOML
    toml_original = saved_toml.read_text() if saved_toml.exists() else toml.read_text()
    saved_toml.write_text(toml_original)
    blab.reset()
    confs = configurations(blab, original, version, configs)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    current = None
    try:
        for i, name in enumerate((args.scenario or list(SCENARIOS)) * args.repeat):
            # every other scenario in reverse order: one slurm.conf switch fewer each time, and each
            # configuration goes first as often as second
            for config in (configs if i % 2 == 0 else configs[::-1]):
                if ft_settings(toml, toml_original, config) and config != "slurm":
                    blab.daemon_stop()          # to read the new settings
                if config == "slurm":
                    blab.daemon_stop()
                else:
                    blab.daemon_start()
                if current != config:
                    blab.apply(confs[config], ft=config != "slurm")
                    current = config
                blab.reset()
                t0 = time.monotonic()
                try:
                    row = SCENARIOS[name](Runner(blab, config, args.wait, version))
                finally:
                    blab.reset()
                print(row.line() + f" took_s={time.monotonic() - t0:.0f}", flush=True)
                with open(results, "a") as fh:
                    fh.write(json.dumps(asdict(row)) + "\n")
    finally:
        blab.restore(original)
        if ft_settings(toml, toml_original, "slurm-ft"):
            blab.daemon_stop()
        saved_toml.unlink(missing_ok=True)
        blab.daemon_start()
        blab.reset()
        saved.unlink(missing_ok=True)
        for extra in (WRAPPER, FT_EXPEDITE, SITE_EPILOG):
            blab.remove_extra(extra)
    summary(load(results))
    return 0


def load(results: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    except OSError:
        return []


if __name__ == "__main__":
    sys.exit(main())
