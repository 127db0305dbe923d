"""Hang detection on the real lab (issue 13). The lab's [hang] section: grace 5 s, a look every
2 s; every job here asks for the shortest window the token allows (60 s). Five jobs run at once:

- a job that stops making progress after 5 steps: ``hang`` after the window, stack dump recorded,
  requeued by the daemon; its node's slurmd is restarted meanwhile and the watcher carries on;
- a job whose checkpoint takes longer than the window (reported ``saving``): not touched;
- a slow but steady job (a step every 45 s, window 60 s): not touched;
- a job without the helper whose output grows: not touched;
- a job without the helper, silent and idle: ``hang`` (output and GPU utilisation).

It also measures the watcher's CPU cost and the detection latency (printed)."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.hang.watcher import pid_file
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import wait_for
from slurm_ft.lab.layout import repo_root

pytestmark = pytest.mark.lab
WINDOW = 60
TRAIN = str(repo_root() / "examples" / "train.py")


def submit(lab, name: str, wrap: str, *extra: str) -> int:
    jobs = lab.lay.jobs_dir
    p = subprocess.run(["/usr/bin/sbatch", "--parsable", f"--job-name=hang-{name}", "--ft",
                        f"--ft-hang-timeout={WINDOW}", "--gres=gpu:1", f"--output={jobs}/%j.out", *extra,
                        f"--wrap={wrap}"], env=lab.env(), capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.strip().split(";")[0])


def train(lab, job: str, *args: str) -> str:
    return f"exec python3 {TRAIN} --ckpt {lab.lay.jobs_dir}/ckpt-{job}-{time.time_ns()}.json " + " ".join(args)


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])     # utime + stime


def test_hang_detection_end_to_end(lab, slurm):
    cfg = config_mod.load(lab.lay.ft_conf)
    def out(j):
        """The job's output so far; empty until slurmstepd has created the file (the hang watcher
        starts in the prolog, before the batch step opens its output)."""
        try:
            return (lab.lay.jobs_dir / f"{j}.out").read_text(errors="replace")
        except FileNotFoundError:
            return ""
    hung = submit(lab, "hung", train(lab, "hung", "--steps 100000 --step-time 0.2 --hang-at-step 5"))
    saving = submit(lab, "saving", train(lab, "saving", f"--steps 30 --step-time 0.5 --slow-save-at-step 10 "
                                                        f"--slow-save-s {WINDOW + 30}"))
    steady = submit(lab, "steady", train(lab, "steady", "--steps 3 --step-time 45"))
    talker = submit(lab, "talker", "for i in 1 2 3 4 5 6; do echo tick $i; sleep 20; done")
    silent = submit(lab, "silent", "exec sleep 3600")
    jobs = {"hung": hung, "saving": saving, "steady": steady, "talker": talker, "silent": silent}
    running = {k: slurm.wait_job(j, lambda x: x.state == "RUNNING", 60, 0.2) for k, j in jobs.items()}
    assert all(running.values()), running
    node = {k: j.nodes for k, j in running.items()}
    # every job has its watcher, a detached root process that is not slurmd's child
    pids = {k: int(wait_for(lambda k=k: _read(pid_file(cfg, jobs[k], node[k])), 30, f"{k}'s watcher"))
            for k in jobs}
    for k, pid in pids.items():
        assert os.getsid(pid) == pid, f"{k}'s watcher is not in a session of its own"
    t0 = time.monotonic()
    ticks0 = cpu_ticks(pids["steady"])
    # the hung job's node loses its slurmd for a moment (slurmd restarts): the watcher carries on
    wait_for(lambda: "hanging at step 5" in out(hung), 60, "the hung job to hang")
    t_hang = time.monotonic()
    lab.slurmd_kill(node["hung"])
    time.sleep(1.0)
    lab.slurmd_start(node["hung"])
    assert _alive(pids["hung"]), "the watcher died with slurmd"

    def hang_verdict(job_id):
        with open_journal(cfg.node_journal_path(node[[k for k, v in jobs.items() if v == job_id][0]])) as j:
            v = [x for x in j.verdicts(job_id) if x["verdict"] == "hang"]
        return v[0] if v else None

    v = wait_for(lambda: hang_verdict(hung), WINDOW + 40, "the hung job's hang verdict", interval_s=0.5)
    latency = time.monotonic() - t_hang
    assert v["rule"] == "no-progress" and v["source"] == "watcher"
    ev = "\n".join(v["evidence"])
    assert re.search(r"no progress for \d+ s \(window 60 s", ev), ev
    assert re.search(r"last heartbeat: step 5, \d+ s ago, pid \d+", ev), ev
    assert "GPU utilisation: GPU" in ev
    assert "stack of pid" in ev and "train.py" in ev and "main (train.py:" in ev, ev    # py-spy's dump
    # ...and the daemon requeues it (a retry spent, nobody blamed)
    requeued = slurm.wait_job(hung, lambda j: j.restart_count >= 1, 30, 0.2)
    assert requeued is not None, slurm.job(hung)
    def failover_done():
        with open_journal(cfg.journal.path) as j:
            acts = j.actions(hung, 0)
            done = j.failovers_done(hung)
        return acts if done == 1 else None
    acts = wait_for(failover_done, 30, "the daemon's failover of the hung job")
    assert not any(a["action"] == "drain" for a in acts)
    slurm.run("scancel", str(hung), check=False)
    assert WINDOW <= latency <= WINDOW + 10, latency
    elapsed = time.monotonic() - t0
    cpu = (cpu_ticks(pids["steady"]) - ticks0) / os.sysconf("SC_CLK_TCK") / elapsed   # still watching
    # the silent job without the helper: found by its output and GPUs
    sv = wait_for(lambda: hang_verdict(silent), WINDOW + 40, "the silent job's hang verdict", interval_s=0.5)
    assert "no heartbeat" in "\n".join(sv["evidence"]) and "output did not grow" in "\n".join(sv["evidence"])
    # the others finish untouched
    for k in ("saving", "steady", "talker"):
        done = slurm.wait_job(jobs[k], lambda j: j.ended, 200, 1.0)
        assert done is not None and done.state == "COMPLETED", (k, done)
        assert hang_verdict(jobs[k]) is None, k
    assert "slow checkpoint done" in out(saving)
    with open_journal(cfg.journal.path) as j:
        for k in ("saving", "steady", "talker"):
            assert not [v for v in j.verdicts(jobs[k]) if v["verdict"] == "hang"], k
    print(f"watcher CPU: {100 * cpu:.3f}% of a core over {elapsed:.0f} s (a look every {cfg.hang.poll_s:g} s)")
    assert cpu < 0.01
    print(f"hang detection latency: {latency:.1f} s after the last progress (window {WINDOW} s)")
    # every watcher has gone with its job
    for k in ("saving", "steady", "talker"):
        wait_for(lambda k=k: not _alive(pids[k]), 30, f"{k}'s watcher to exit")


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
