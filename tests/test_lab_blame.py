"""Blame needs proof, on the real lab (issue 27): a job is blamed only for its own GPUs' faults,
and text a user puts into a kernel record blames no one.

Jobs run as the lab's ordinary user (``slurm_ft.lab.users``) next to root's GPU job on one node;
faults are real kernel-log records (``/dev/kmsg``), read by the real epilogs."""

from __future__ import annotations

import os
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.lab import layout as L
from slurm_ft.lab.demo import job_gpu_index, submit_training, wait_for, wait_started
from slurm_ft.lab.inject import inject_xid
from slurm_ft.lab.users import LAB_USER, ensure_user, run_as

pytestmark = pytest.mark.lab

NODE = "n1"
OTHERS = ("n2", "n3")
ACTIVE = ("running", "failover-in-progress", "requeued")


@pytest.fixture(scope="module")
def user(lab):
    return ensure_user()


def _submit_cpu_job(lab, flag, *extra: str) -> int:
    """An ft job WITHOUT GPUs, as the lab's user: waits for ``flag`` to exist, then exits 1 (its
    own failure). Returns the job id."""
    jobs = lab.lay.jobs_dir
    path = jobs / f"blame-cpu-{time.time_ns()}.sh"
    path.write_text(f"#!/bin/sh\necho cpu job on $SLURMD_NODENAME gpus=${{SLURM_JOB_GPUS:-none}}\n"
                    f"while [ ! -e {flag} ]; do sleep 0.2; done\nexit 1\n")
    os.chmod(path, 0o755)
    argv = ["/usr/bin/sbatch", "--parsable", f"--output={jobs}/%j.out", "--ft", "--ft-retries=3", *extra, str(path)]
    proc = run_as(LAB_USER, argv, lab.env(), cwd=str(jobs))
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def _running_on(slurm, job_id: int, node: str):
    return wait_for(lambda: (lambda j: j if j is not None and j.state == "RUNNING" and j.nodes == node else None)(
        slurm.job(job_id)), 90, f"job {job_id} running on {node}")


def _journal(lab):
    return open_journal(config_mod.load(lab.lay.ft_conf).journal.path)


def _pin_to_node(slurm):
    """Hold the other nodes out so the next jobs start on NODE."""
    for n in OTHERS:
        slurm.drain(n, "test: keep free")


def _unpin(slurm):
    for n in OTHERS:
        slurm.resume(n)


def test_cpu_only_job_next_to_a_gpu_fault_is_not_blamed(lab, slurm, user, ft_history):
    """Three CPU-only ft jobs of the lab user share n1 with root's GPU job; that GPU gets a real
    Xid 79, then the CPU jobs exit 1 on their own. The GPU job fails over (its GPU's fault); the
    CPU jobs own no GPU: their verdict is ``user``, no Xid, no failover."""
    flag = lab.lay.jobs_dir / f"blame-go-{time.time_ns()}"
    _pin_to_node(slurm)
    try:
        gpu_job = submit_training(lab, steps=600)
        assert wait_started(slurm, gpu_job, timeout_s=90).nodes == NODE
        cpu_jobs = [_submit_cpu_job(lab, flag) for _ in range(3)]
        for j in cpu_jobs:
            _running_on(slurm, j, NODE)
    finally:
        _unpin(slurm)
    assert not slurm.job_gpus(cpu_jobs[0]), "a CPU-only job was given a GPU"
    inject_xid(NODE, 79, job_gpu_index(slurm, gpu_job.job_id))
    flag.write_text("go\n")
    again = slurm.wait_job(gpu_job.job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 240)
    assert again is not None and again.nodes != NODE, "the GPU job did not fail over"
    for j in cpu_jobs:
        h = ft_history(j, lambda h: h["ft_state"] not in ACTIVE and h["attempts"]
                       and h["attempts"][0]["verdict"], timeout_s=120)
        first = h["attempts"][0]
        assert first["verdict"] == "user" and not first["xids"], (j, h)
        assert h["failovers"] == 0 and h["ft_state"] == "user-error", (j, h)
    with _journal(lab) as jr:
        for j in cpu_jobs:
            assert all(v["verdict"] != "hardware" for v in jr.verdicts(j)), jr.verdicts(j)
    slurm.run("scancel", str(gpu_job.job_id))


def test_forged_kernel_records_blame_no_one(lab, slurm, user, ft_history):
    """Records of the exact shapes the kernel prints with a user-chosen process or file name,
    carrying the victim GPU's bus id and driver words, land in the kernel log while root's GPU job
    and the user's CPU job run on n1; the CPU job then exits 1. Nothing is drained, the GPU job
    keeps running where it is, the CPU job's verdict is not hardware."""
    flag = lab.lay.jobs_dir / f"blame-go-{time.time_ns()}"
    _pin_to_node(slurm)
    try:
        victim = submit_training(lab, steps=600)
        assert wait_started(slurm, victim, timeout_s=90).nodes == NODE
        cpu_job = _submit_cpu_job(lab, flag)
        _running_on(slurm, cpu_job, NODE)
    finally:
        _unpin(slurm)
    gpu = job_gpu_index(slurm, victim.job_id)
    nvml_bus = L.bus_id(L.node_number(NODE), gpu)            # 00000000:10:00.0
    bus = f"{nvml_bus[4:8]}:{nvml_bus[9:11]}:{nvml_bus[12:14]}".lower()   # 0000:10:00
    pid = os.getpid()
    forged = [
        # "%s (%d): ..." with a 14/15-byte process name (fs/proc/base.c, mm/mmap.c, ipc/shm.c)
        f"NVRM: Xid: 79, ({pid}): /proc/{pid}/oom_adj is deprecated, please use /proc/{pid}/oom_score_adj instead.",
        f"NVRM: Xid (PCI: ({pid}): VmData 4096 exceed data ulimit 4096. Update limits.",
        f"GPU {bus}.0 ({pid}): Using mlock ulimits for SHM_HUGETLB is obsolete",
        # "%s[%d]: segfault at ... in <file>" and a file name in fs/exec.c
        f"NVRM: GPU {bus}[{pid}]: segfault at 0 ip 0 sp 0 error 4 in GPU {bus}.0: GPU has fallen off the bus.[7f+1]",
        f"process '/tmp/NVRM: Xid (PCI:{bus}): 79, pid=1, name=x, GPU has fallen off the bus.' started with executable stack",
        f"python3 ({pid}): NVRM: Xid (PCI:{bus}): 79, pid={pid}, name=python3, GPU has fallen off the bus.",
    ]
    with open("/dev/kmsg", "w") as fh:
        for line in forged:
            fh.write(f"<4>{line}\n")
            fh.flush()
    flag.write_text("go\n")
    h = ft_history(cpu_job, lambda h: h["ft_state"] not in ACTIVE and h["attempts"] and h["attempts"][0]["verdict"],
                   timeout_s=120)
    first = h["attempts"][0]
    assert first["verdict"] != "hardware" and not first["xids"], h
    assert h["failovers"] == 0, h
    # the CPU job's epilog drains (if it ever would) before its verdict reaches the journal
    job = slurm.job(victim.job_id)
    assert job.state == "RUNNING" and job.restart_count == 0 and job.nodes == NODE
    for n in slurm.nodes():
        assert not (n.drained and n.reason.startswith("slurm-ft:")), (n.name, n.reason)
    with _journal(lab) as jr:
        assert jr.verdicts(victim.job_id) == []
        acts = jr.actions(cpu_job)
        assert not [a for a in acts if a["action"] == "drain" and a["status"] == "done"], acts
    slurm.run("scancel", str(victim.job_id))
