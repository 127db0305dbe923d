"""Checkpoint-before-exit and requeue for jobs as users write them (issue 15), on the real lab.

The ``sbatch`` lines of docs/user-guide.md ("Script shapes that work") are run verbatim from a
work directory that holds the repo's ``examples/`` (a symlink), as a user runs them from a
checkout. Each ends in the documented state with its checkpoint saved and, where the policy says
so, running again from it. Also: an admin's requeue is an evacuation, not a fault; a program
without a handler is never killed by slurm-ft's signal; a job that dies after the signal is
requeued, never blamed on its user; a time limit without a save ends ``timeout``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import wait_for
from slurm_ft.lab.layout import repo_root
from slurm_ft.slurm import split_nodes

pytestmark = pytest.mark.lab

GUIDE = repo_root() / "docs" / "user-guide.md"


def guide_lines() -> list[str]:
    """The sbatch lines of the guide's "Script shapes that work" block, in order."""
    text = GUIDE.read_text()
    block = text.split("## Script shapes that work", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip().startswith("sbatch ")]


def run_line(lab, workdir: Path, line: str) -> int:
    """Run one guide line verbatim (no shell) in ``workdir``; returns the job id."""
    proc = subprocess.run(shlex.split(line), cwd=workdir, env=lab.env(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, f"{line}: {proc.stderr}"
    return int(re.search(r"Submitted batch job (\d+)", proc.stdout).group(1))


def cli(lab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", *args], env=lab.env(), capture_output=True,
                          text=True, timeout=120)


def journal(lab):
    return open_journal(config_mod.load(lab.lay.ft_conf).journal.path)


def out_text(workdir: Path, job_id: int) -> str:
    p = workdir / f"ft-train-{job_id}.out"
    return p.read_text() if p.exists() else ""


def wait_running(slurm, job_id: int, attempt: int, timeout_s: float = 90):
    job = slurm.wait_job(job_id, lambda j: j.state == "RUNNING" and j.restart_count == attempt, timeout_s, 0.2)
    assert job is not None, f"job {job_id} attempt {attempt} not running: {slurm.job(job_id)}"
    return job


def no_fault_spent(lab, job_id: int) -> None:
    with journal(lab) as j:
        assert j.failovers_done(job_id) == 0
        assert not [a for a in j.actions(job_id) if a["action"] == "drain"]
        assert not [v for v in j.verdicts(job_id) if v["verdict"] == "hardware"]


def test_guide_lists_every_shape():
    lines = guide_lines()
    assert len(lines) == 4 and all("examples/" in line for line in lines)
    for line in lines:
        assert (repo_root() / shlex.split(line)[-1]).exists()


def test_noexec_script_drain_checkpoint_saves_requeues_resumes(lab, slurm, workdir):
    line = next(line for line in guide_lines() if "train-noexec" in line)
    job_id = run_line(lab, workdir, line)
    job = wait_running(slurm, job_id, 0)
    wait_for(lambda: "starting from step 0" in out_text(workdir, job_id), 30, "trainer up")
    time.sleep(1.0)
    t0 = time.monotonic()
    r = cli(lab, "drain", job.nodes, "--checkpoint", "--job", str(job_id), "--reason", "maintenance: PSU swap")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert "python3[" in r.stdout and "slurm_script[" in r.stdout  # trainer signalled, shell left alone
    assert "checkpoint saved" in r.stdout
    again = wait_running(slurm, job_id, 1)
    assert job.nodes not in split_nodes(again.nodes) and job.nodes in split_nodes(again.excluded_nodes)
    wait_for(lambda: "attempt 1 on" in out_text(workdir, job_id), 30, "attempt 1 to start")
    text = out_text(workdir, job_id)
    saved = int(re.search(r"attempt 0: checkpoint at step (\d+) on signal", text).group(1))
    assert f"resuming from step {saved}" in text
    node = next(n for n in slurm.nodes() if n.name == job.nodes)
    assert node.reason.endswith("maintenance: PSU swap")        # the admin's reason, not a fault's
    no_fault_spent(lab, job_id)
    with journal(lab) as j:
        assert [a["status"] for a in j.actions(job_id) if a["action"] == "evacuation"] == ["done"]
        assert any(a["action"] == "ckpt-ack" and a["status"] == "done" for a in j.actions(job_id, 0))
    print(f"noexec drain --checkpoint: signal -> saved -> requeued in {took:.2f} s")
    slurm.run("scancel", str(job_id))


def test_time_limit_shapes_continue_from_their_checkpoint(lab, slurm, workdir):
    lines = [line for line in guide_lines() if "--time=" in line]
    assert len(lines) == 3
    jobs = [run_line(lab, workdir, line) for line in lines]
    # a job with nothing that catches the signal: it ends TIMEOUT, and slurm-ft says so
    plain = run_line(lab, workdir, "sbatch --ft --time=1 --output=ft-train-%j.out --wrap=exec\\ sleep\\ 600")
    for job_id in jobs:
        wait_running(slurm, job_id, 0)
    times = []
    for job_id in jobs:
        wait_running(slurm, job_id, 1, timeout_s=150)
        wait_for(lambda: re.search(r"attempt 1 .*resuming from step", out_text(workdir, job_id)), 30, "resume")
        text = out_text(workdir, job_id)
        saved = int(re.search(r"attempt 0: checkpoint at step (\d+) on signal", text).group(1))
        assert f"resuming from step {saved}" in text
        no_fault_spent(lab, job_id)
        with journal(lab) as j:
            wait_for(lambda: any(a["attempt"] == 1 and a["start"] for a in j.attempts(job_id)), 30, "attempt 1 row")
            acts = j.actions(job_id, 0)
            notify = next(a for a in acts if a["action"] == "ckpt-notify")
            ack = next(a for a in acts if a["action"] == "ckpt-ack" and a["status"] == "done")
            cont = next(a for a in acts if a["action"] == "continue" and a["status"] == "done")
            first = next(a for a in j.attempts(job_id) if a["attempt"] == 0)
            second = next(a for a in j.attempts(job_id) if a["attempt"] == 1)
        assert notify["detail"].startswith("time-limit:")
        assert "srun[" not in notify["detail"].split("(left alone")[0]  # srun never signalled
        limit_at = first["start"] + 60
        assert notify["created"] < limit_at and cont["created"] < limit_at   # requeued before the limit
        times.append((ack["created"] - notify["created"], cont["created"] - ack["created"],
                      second["start"] - cont["created"]))
        slurm.run("scancel", str(job_id))
    done = slurm.wait_job(plain, lambda j: j.ended, 150, 1.0)
    assert done is not None and done.state == "TIMEOUT"
    with journal(lab) as j:
        wait_for(lambda: j.job(plain)["ft_state"] == "timeout", 30, "timeout state")
    assert "running" not in slurm.job(plain).admin_comment   # nothing stale on a finished job
    for (ack, requeue, run) in times:
        print(f"time limit: signal->ack {ack:.2f} s, ack->requeue {requeue:.2f} s, requeue->running {run:.2f} s")


def test_admin_requeue_with_drained_node_is_an_evacuation(lab, slurm, workdir):
    line = next(line for line in guide_lines() if "train-ft.sbatch" in line)
    job_id = run_line(lab, workdir, line.replace("sbatch ", "sbatch --ft-retries=0 ", 1))
    job = wait_running(slurm, job_id, 0)
    slurm.run("scontrol", "update", f"NodeName={job.nodes}", "State=DRAIN", "Reason=maintenance")
    slurm.run("scontrol", "requeue", str(job_id))
    again = wait_running(slurm, job_id, 1, timeout_s=200)   # Slurm's own requeue delay applies
    assert again.nodes != job.nodes
    no_fault_spent(lab, job_id)
    node = next(n for n in slurm.nodes() if n.name == job.nodes)
    assert node.reason == "maintenance"
    with journal(lab) as j:
        assert any(a["action"] == "evacuation" for a in j.actions(job_id, 0))
    slurm.run("scancel", str(job_id))


def test_program_without_handler_is_not_killed_by_the_signal(lab, slurm, workdir):
    (workdir / "plain.py").write_text("import time\nprint('plain program up', flush=True)\ntime.sleep(600)\n")
    job_id = run_line(lab, workdir, f"sbatch --ft --output=ft-train-%j.out --wrap=exec\\ python3\\ {workdir}/plain.py")
    job = wait_running(slurm, job_id, 0)
    wait_for(lambda: "plain program up" in out_text(workdir, job_id), 30, "program up")
    r = cli(lab, "drain", job.nodes, "--checkpoint", "--job", str(job_id))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SIGUSR1 to 0 process(es)" in r.stdout and "requeued excluding" in r.stdout
    again = wait_running(slurm, job_id, 1)
    assert again.nodes != job.nodes
    no_fault_spent(lab, job_id)
    with journal(lab) as j:
        first = next(a for a in j.attempts(job_id) if a["attempt"] == 0)
        assert first["signal"] != 10        # never died of SIGUSR1
        assert j.job(job_id)["ft_state"] in ("evacuated", "running")
    slurm.run("scancel", str(job_id))


def test_job_dying_of_the_signal_is_requeued_not_blamed(lab, slurm, workdir):
    prog = "import signal,sys,time; signal.signal(signal.SIGUSR1, lambda *a: sys.exit(3)); time.sleep(600)"
    (workdir / "dies.py").write_text(prog)
    job_id = run_line(lab, workdir, f"sbatch --ft --output=ft-train-%j.out --wrap=exec\\ python3\\ {workdir}/dies.py")
    job = wait_running(slurm, job_id, 0)
    time.sleep(2.0)     # python up and its handler installed
    r = cli(lab, "drain", job.nodes, "--checkpoint", "--job", str(job_id))
    assert r.returncode == 3, r.stdout + r.stderr           # the admin learns it died instead of saving
    assert "ended instead of saving" in r.stdout
    again = wait_running(slurm, job_id, 1)
    assert again.nodes != job.nodes
    no_fault_spent(lab, job_id)
    with journal(lab) as j:
        assert j.job(job_id)["ft_state"] in ("evacuated", "running")
        assert any(a["action"] == "evacuation" and a["status"] == "done" for a in j.actions(job_id, 0))
    slurm.run("scancel", str(job_id))


@pytest.mark.parametrize("output", ["%x-%j.out", "%j.out"])
def test_job_name_in_the_output_pattern_is_diagnosed_like_the_job_id(lab, ft_history, workdir, output):
    """``--output=%x-%j.out`` (issue 25 item 5): submitted as the lab's ordinary user, a job that
    prints a CUDA OOM and exits 1 is ``user (cuda-oom)``, exactly as with ``%j.out``: the epilog
    expands the job name (one ``scontrol show job``: 22.05's epilog environment has no
    SLURM_JOB_NAME) and reads the file Slurm wrote."""
    from slurm_ft.lab.users import LAB_USER, ensure_user, run_as

    ensure_user()
    name = f"oom{time.time_ns() % 10**9}"
    script = workdir / f"{name}.sh"
    script.write_text("#!/bin/sh\necho 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2\n"
                      "exit 1\n")
    script.chmod(0o755)
    argv = ["/usr/bin/sbatch", "--parsable", f"--job-name={name}", f"--output={output}", "--ft", "--ft-retries=1",
            str(script)]
    proc = run_as(LAB_USER, argv, lab.env(), cwd=str(workdir))
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip().split(";")[0])
    h = ft_history(job_id, lambda h: h["attempts"] and h["attempts"][0]["verdict"], timeout_s=120)
    first = h["attempts"][0]
    expected = workdir / output.replace("%x", name).replace("%j", str(job_id))
    assert expected.exists(), sorted(p.name for p in workdir.iterdir())     # the file Slurm wrote
    assert (first["verdict"], first["rule"]) == ("user", "cuda-oom"), h
    assert not any(line.startswith("output not read") for v in first["verdicts"] for line in v["evidence"]), h


def test_every_filename_pattern_escape_expands_to_the_file_slurm_wrote(lab, slurm, workdir):
    """Slurm's own expansion on the lab (22.05), escape by escape: the file slurmstepd created for
    a plain job and for an array task is the path the epilog expands (slurm_ft.node.output_pattern.expand_pattern),
    including ``%a`` of a job that is no array task (Slurm's NO_VAL), widths, and ``%N``: the host's
    short name (measured: ``vm`` for node n1), not the NodeName."""
    import socket

    from slurm_ft.node.output_pattern import expand_pattern
    from slurm_ft.lab.users import LAB_USER, ensure_user, run_as
    from slurm_ft.node.job import NodeJob

    ensure_user()
    name = f"pat{time.time_ns() % 10**9}"
    plain = "p-%A-%a-%J-%s-%n-%t-%N-%u-%x-%4j-%12j-%3x-%%.out"
    array = "a-%A_%a-%2a-%j.out"
    ids = []
    for extra, pattern in (([], plain), (["--array=3"], array)):
        argv = ["/usr/bin/sbatch", "--parsable", f"--job-name={name}", f"--output={pattern}", *extra,
                "--wrap=echo hello"]
        proc = run_as(LAB_USER, argv, lab.env(), cwd=str(workdir))
        assert proc.returncode == 0, proc.stderr
        ids.append(int(proc.stdout.strip().split(";")[0]))
    for job_id, pattern in zip(ids, (plain, array)):
        # a one-task array's task keeps the master's job id: one record either way
        job = slurm.wait_job(job_id, lambda j: j.ended and bool(j.nodes), 120, 0.3)
        assert job is not None, f"job {job_id}: {slurm.job(job_id)}"
        task = job.raw.get("array_task_id")
        array_task = int(task) if str(task or "").isdigit() else None
        nj = NodeJob(job_id=job.job_id, node=job.nodes, attempt=0, uid=None, gpus=None, exit_code=0, signal=None,
                     stdout=pattern, stderr=None, work_dir=str(workdir), job_name=name, user=LAB_USER,
                     array_job_id=int(job.raw.get("array_job_id") or 0), array_task_id=array_task,
                     host=socket.gethostname().split(".")[0])      # the lab's nodes share this host
        path = expand_pattern(pattern, nj)
        wait_for(lambda: os.path.exists(path), 60, f"{path} (have {sorted(os.listdir(workdir))})")
        if pattern == array:
            assert nj.array_job_id == job_id and array_task == 3, job.raw
        else:
            assert nj.array_job_id == 0 and "-4294967294-" in path
