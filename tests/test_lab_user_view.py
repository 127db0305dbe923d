"""What the job's owner sees (issue 25), on the real lab, as the lab's ordinary user.

Every job here is a bare ``python3 -I`` program that imports only the stdlib-only job client by
path (slurm_ft/data/client/slurm_ft_job.py), submitted by the ordinary user with sbatch. Each
test reads what that user reads: ``scontrol show job`` and ``sacct`` (the ft state in
AdminComment), ``squeue``, the job's own log (the SPANK plugin's attempt markers, the daemon's
give-up line) and ``slurm-ft wait`` (run as that user beside the job: it never stops at a
failover's transient ``FAILED``). ft-history is read as the owner, through slurm-ft's history
service (the lab's journal is root's); for the hang: a hang's evidence there is the
watcher's numbers-only summary (last heartbeat, stack dump size) and the stack's top frames, which
the watcher sends the service privately (slurm_ft.hang.report); they are in the job's own log too.

Each test prints what the owner sees (``-s``): docs/user-guide.md's screens are that output.
"""

from __future__ import annotations

import calendar
import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from slurm_ft.lab.demo import job_gpu_index, wait_for
from slurm_ft.lab.inject import inject_xid
from slurm_ft.lab.layout import repo_root
from slurm_ft.lab.users import LAB_USER, ensure_user, run_as, tool_argv, tool_env

pytestmark = pytest.mark.lab

CLIENT_DIR = str(repo_root() / "slurm_ft" / "data" / "client")
TRAIN = r'''
import os, sys, time
sys.path.insert(0, sys.argv[1])
from slurm_ft_job import exit_checkpoint, heartbeat

mode, steps, step_s = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
job = os.environ["SLURM_JOB_ID"]
ckpt = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt-" + job)
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print("train: attempt %s on %s from step %d" % (os.environ.get("SLURM_RESTART_COUNT", "0"),
      os.environ.get("SLURMD_NODENAME"), start), flush=True)


def write(step):
    with open(ckpt + ".tmp", "w") as fh:
        fh.write(str(step))
    os.replace(ckpt + ".tmp", ckpt)
    return ckpt


save = exit_checkpoint(write)

with save:
    for step in range(start, steps):
        if mode == "bug" and step == 2:
            print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr, flush=True)
            sys.exit(1)
        if mode == "hang" and step == 2:
            time.sleep(3600)
        time.sleep(step_s)
        heartbeat(step)
        if step % 5 == 0:
            write(step)
        if save.poll(step):
            save.wait_for_requeue()
print("train: done", flush=True)
'''


@pytest.fixture(scope="module")
def user(lab):
    ensure_user()
    return tool_env(lab.env())


@pytest.fixture
def jobdir(lab):
    d = lab.lay.jobs_dir / f"user-view-{time.time_ns()}"
    d.mkdir()
    d.chmod(0o777)
    (d / "train.py").write_text(TRAIN)
    return d


def submit(lab, d: Path, mode: str, steps: int, step_s: float, *extra: str) -> int:
    argv = ["/usr/bin/sbatch", "--parsable", "--ft", "--gres=gpu:1", "--open-mode=append",
            f"--output={d}/%x-%j.out", f"--job-name=uv-{mode}", *extra,
            f"--wrap=exec /usr/bin/python3 -I {d}/train.py {CLIENT_DIR} {mode} {steps} {step_s}"]
    proc = run_as(LAB_USER, argv, lab.env(), cwd=str(d))
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def log(d: Path, mode: str, job_id: int) -> str:
    try:
        return (d / f"uv-{mode}-{job_id}.out").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def as_user(user_env, *argv: str) -> subprocess.CompletedProcess:
    return run_as(LAB_USER, list(argv), user_env, timeout_s=60)


def show(user_env, job_id: int) -> dict[str, str]:
    """``scontrol show job`` as the owner: JobState, Reason, Restarts, AdminComment."""
    out = as_user(user_env, "/usr/bin/scontrol", "show", "job", str(job_id)).stdout
    got = {k: re.search(rf"\b{k}=(\S+)", out).group(1) for k in ("JobState", "Reason", "Restarts")
           if re.search(rf"\b{k}=(\S+)", out)}
    m = re.search(r"AdminComment=(.*)", out)
    got["AdminComment"] = m.group(1).strip() if m else ""
    return got


def sacct_admin(user_env, job_id: int) -> str:
    out = as_user(user_env, "/usr/bin/sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,AdminComment").stdout
    return out.strip().splitlines()[-1] if out.strip() else ""


def screen(lab, user_env, job_id: int, d: Path, mode: str, *extra: str) -> None:
    """Print, as docs/user-guide.md shows them, what the owner sees of ``job_id`` now: squeue,
    scontrol's state lines, sacct, the job's log, then ``ft-history -j`` run as the owner (the
    lab's journal is root's: the history service answers), asserted to show the job. ``extra``:
    lines printed first (``slurm-ft wait``'s answer)."""
    out = [f"===== screen {mode} job {job_id}", *extra]
    q = as_user(user_env, "/usr/bin/squeue", "-j", str(job_id), "-o", "%.5i %.8j %.9T %.10r %R").stdout
    out += [f"$ squeue -j {job_id} -o '%.5i %.8j %.9T %.10r %R'", q.rstrip()]
    sc = as_user(user_env, "/usr/bin/scontrol", "show", "job", str(job_id)).stdout
    out += [f"$ scontrol show job {job_id} | grep -E 'JobState|Restarts|AdminComment'",
            *[line for line in sc.splitlines() if re.search(r"JobState=|Restarts=|AdminComment=", line)]]
    sa = as_user(user_env, "/usr/bin/sacct", "-j", str(job_id), "-X", "-o", "JobID,JobName,State,AdminComment%110")
    out += [f"$ sacct -j {job_id} -X -o JobID,JobName,State,AdminComment%110", sa.stdout.rstrip()]
    out += [f"$ cat uv-{mode}-{job_id}.out", log(d, mode, job_id).rstrip()]
    # as the owner: through the controller's history service (the lab's journal is root's)
    hist = wait_for(lambda: (p := as_user(user_env, *tool_argv("ft-history", "-j", str(job_id)))).returncode == 0
                    and p, 60, "ft-history as the owner", 1.0)
    out += [f"$ ft-history -j {job_id}", (hist.stdout + hist.stderr).rstrip(), "===== end"]
    print("\n" + "\n".join(out))
    assert re.search(rf"^Job {job_id} \(", hist.stdout, re.M) and "Traceback" not in hist.stderr, hist


class Waiter:
    """``slurm-ft wait JOBID`` run by the owner from before the fault; records when it returned
    and what Slurm said then."""

    def __init__(self, user_env, slurm, job_id: int):
        full = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C.UTF-8", **user_env}
        self.proc = subprocess.Popen(["/usr/sbin/runuser", "-u", LAB_USER, "--",
                                      *tool_argv("slurm-ft", "wait", str(job_id), "--poll", "0.3")],
                                     env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.slurm, self.job_id, self.at_exit = slurm, job_id, None
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        self.proc.wait()
        self.at_exit = self.slurm.job(self.job_id)

    def result(self, timeout_s: float = 120) -> tuple[int, str]:
        out, err = self.proc.communicate(timeout=timeout_s)
        self.thread.join(10)
        return self.proc.returncode, (out + err).strip()


def states_seen(slurm, job_id: int, stop: threading.Event, seen: list) -> None:
    """What a naive poller of ``scontrol show job`` sees, every 0.1 s (for the docs' figures)."""
    while not stop.is_set():
        j = slurm.job(job_id)
        if j is not None and (not seen or seen[-1] != (j.state, j.restart_count)):
            seen.append((j.state, j.restart_count))
        time.sleep(0.1)


def running(slurm, job_id: int, attempt: int, d: Path, mode: str, timeout_s: float = 60):
    def ok():
        j = slurm.job(job_id)
        return j if j is not None and j.state == "RUNNING" and j.restart_count == attempt and \
            f"train: attempt {attempt}" in log(d, mode, job_id) else None
    return wait_for(ok, timeout_s, f"job {job_id} attempt {attempt} running", 0.2)


def test_failover_marker_and_wait(lab, slurm, user, jobdir, ft_history):
    job = submit(lab, jobdir, "xid", 30, 0.5, "--ft-retries=3")
    first = running(slurm, job, 0, jobdir, "xid")
    waiter = Waiter(user, slurm, job)
    stop, seen = threading.Event(), []
    poller = threading.Thread(target=states_seen, args=(slurm, job, stop, seen), daemon=True)
    poller.start()
    t0 = time.monotonic()
    inject_xid(first.nodes, 79, job_gpu_index(slurm, job))
    again = running(slurm, job, 1, jobdir, "xid")
    print(f"\nfailover: fault -> attempt 2 running in {time.monotonic() - t0:.1f} s")
    assert again.nodes != first.nodes
    marker = wait_for(lambda: re.search(r"^slurm-ft: attempt 2/4 on (\S+) after hardware fault \(Xid 79, GPU "
                                        r"[0-9a-f:.]+\) on (\S+); budget 2 left$", log(jobdir, "xid", job), re.M),
                      20, "attempt marker")
    assert (marker.group(1), marker.group(2)) == (again.nodes, first.nodes)
    seen_by_owner = show(user, job)
    assert seen_by_owner["Restarts"] == "1"
    assert "attempt 2/4 after hardware fault (Xid 79" in seen_by_owner["AdminComment"]
    rc, out = waiter.result()
    stop.set()
    print(f"failover: a naive poller saw {seen}")
    assert rc == 0, out
    assert out.startswith(f"{job} completed"), out
    assert waiter.at_exit.state == "COMPLETED" and waiter.at_exit.restart_count == 1
    assert "train: done" in log(jobdir, "xid", job)
    assert wait_for(lambda: "slurm-ft:completed" in sacct_admin(user, job), 20, "final state in sacct")
    h = ft_history(job, lambda h: h["ft_state"] == "completed")
    assert h["attempts"][0]["verdict"] == "hardware"
    screen(lab, user, job, jobdir, "xid", f"$ slurm-ft wait {job}; echo exit $?", out, f"exit {rc}")


def test_user_bug_gives_up_with_a_reason(lab, slurm, user, jobdir):
    # the output is --output=%x-%j.out (issue 25 item 5): the CUDA OOM in it is read (user-error)
    job = submit(lab, jobdir, "bug", 10, 0.2, "--ft-retries=2")
    rc, out = Waiter(user, slurm, job).result()
    assert rc == 3, out
    assert out.startswith(f"{job} user-error"), out
    text = log(jobdir, "bug", job)
    assert re.search(r"^slurm-ft: gave up after attempt 1: user-error: .*fix it and resubmit", text, re.M), text
    assert show(user, job)["JobState"] == "FAILED"
    assert wait_for(lambda: "slurm-ft:user-error gave up after attempt 1" in sacct_admin(user, job), 20, "sacct")
    screen(lab, user, job, jobdir, "bug", f"$ slurm-ft wait {job}; echo exit $?", out, f"exit {rc}")


def test_retries_exhausted_gives_up_with_a_reason(lab, slurm, user, jobdir):
    job = submit(lab, jobdir, "last", 40, 0.5, "--ft-retries=0")
    first = running(slurm, job, 0, jobdir, "last")
    waiter = Waiter(user, slurm, job)
    inject_xid(first.nodes, 79, job_gpu_index(slurm, job))
    rc, out = waiter.result()
    assert rc == 5, out
    text = log(jobdir, "last", job)
    assert re.search(r"^slurm-ft: gave up after attempt 1: max-retries-exceeded: hardware fault .*budget 0 is "
                     r"used up; retry budget used up", text, re.M), text
    assert wait_for(lambda: "slurm-ft:max-retries-exceeded" in sacct_admin(user, job), 20, "sacct")
    screen(lab, user, job, jobdir, "last", f"$ slurm-ft wait {job}; echo exit $?", out, f"exit {rc}")


def test_continuation_marker(lab, slurm, user, jobdir):
    # --time=1: the checkpoint signal comes --ft-ckpt-wait + 10 s before the limit (45 s in)
    job = submit(lab, jobdir, "cont", 52, 1.0, "--time=1", "--ft-ckpt-wait=5")
    running(slurm, job, 0, jobdir, "cont")
    waiter = Waiter(user, slurm, job)
    running(slurm, job, 1, jobdir, "cont", timeout_s=90)
    assert wait_for(lambda: re.search(r"^slurm-ft: attempt 2 on \S+ after a time-limit continuation \(checkpoint "
                                      r"saved\); budget 3 left$", log(jobdir, "cont", job), re.M), 20, "marker")
    rc, out = waiter.result()
    assert rc == 0, out
    assert waiter.at_exit.state == "COMPLETED" and waiter.at_exit.restart_count == 1
    wait_for(lambda: "slurm-ft:completed" in sacct_admin(user, job), 20, "final state in sacct")
    screen(lab, user, job, jobdir, "cont", f"$ slurm-ft wait {job}; echo exit $?", out, f"exit {rc}")


def test_image_pull_rejected_is_the_owners_to_fix(lab, slurm, user, jobdir):
    """A container image the registry refuses (pyxis's lines, as tests/test_lab_image_pull.py
    prints them): its own final state image-pull-failed (the seed's imagepullbackoff), not
    retried, the give-up line says what to fix."""
    from test_lab_image_pull import REJECTED
    (jobdir / "pull.err").write_text(REJECTED)
    argv = ["/usr/bin/sbatch", "--parsable", "--ft", "--gres=gpu:1", "--open-mode=append", "--ft-retries=2",
            f"--output={jobdir}/%x-%j.out", "--job-name=uv-pull", f"--wrap=cat {jobdir}/pull.err >&2; exit 1"]
    proc = run_as(LAB_USER, argv, lab.env(), cwd=str(jobdir))
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout.strip().split(";")[0])
    rc, out = Waiter(user, slurm, job).result()
    assert rc == 10 and out.startswith(f"{job} image-pull-failed"), out
    assert re.search(r"^slurm-ft: gave up after attempt 1: image-pull-failed: .*image-pull-rejected.*"
                     r"container image could not be imported", log(jobdir, "pull", job), re.M), log(jobdir, "pull", job)
    wait_for(lambda: "slurm-ft:image-pull-failed" in sacct_admin(user, job), 20, "final state in sacct")
    screen(lab, user, job, jobdir, "pull", f"$ slurm-ft wait {job}; echo exit $?", out, f"exit {rc}")


def test_hang_says_why_it_waits(lab, slurm, user, jobdir, ft_history):
    """A hang: the watcher's block in the owner's log (the word hang, the last heartbeat's time,
    the stack's top frames), the reason it waits in Slurm's own fields, the evidence summary in
    ft-history, the stack's frames in the owner's ft-history --detail (the watcher's private report
    to the history service, never Slurm's node field), then the owner's scancel: cancelled."""
    job = submit(lab, jobdir, "hang", 100, 0.5, "--ft-hang-timeout=60")
    running(slurm, job, 0, jobdir, "hang")
    t_run = time.time()

    def requeued():
        j = slurm.job(job)
        return j if j is not None and j.state == "PENDING" and j.restart_count == 1 else None
    wait_for(requeued, 120, "hang detected and requeued", 0.5)
    block = wait_for(lambda: re.search(
        r"^slurm-ft: hang on (n\d+): no progress for (\d+) s \(window 60 s\); last heartbeat (\S+Z), step 1; "
        r"ending the job's processes: slurm-ft decides whether it runs again\n"
        r"slurm-ft: hang: stack of pid \d+ \(python3?[^)]*\), innermost first:\n"
        r"((?:slurm-ft: hang:   .*\n)+)", log(jobdir, "hang", job), re.M), 20, "hang block in the job's log")
    node, quiet, beat_at, frames = block.group(1), int(block.group(2)), block.group(3), block.group(4)
    assert quiet >= 60, block.group(0)
    beat = calendar.timegm(time.strptime(beat_at, "%Y-%m-%dT%H:%M:%SZ"))
    assert t_run - 30 <= beat <= time.time() - 60, (beat_at, t_run)      # the step-1 beat, a window ago
    assert "train.py" in frames and len(frames.splitlines()) <= 5, frames  # the hung line of the owner's code

    def waiting():   # once the epilogs are done, Slurm's reason is its requeue delay (BeginTime)
        s = show(user, job)
        return s if "waits out Slurm's requeue delay" in s["AdminComment"] and s["Reason"] == "BeginTime" else None
    seen = wait_for(waiting, 30, "why it waits", 0.5)
    assert seen["JobState"] == "PENDING", seen
    assert f"attempt 2/4 after hang (no-progress) on {node}" in seen["AdminComment"], seen
    squeue = as_user(user, "/usr/bin/squeue", "-j", str(job), "-h", "-o", "%T %r").stdout.strip()
    assert squeue == "PENDING BeginTime", squeue
    h = ft_history(job, lambda h: h["attempts"] and h["attempts"][0].get("verdict") == "hang" and any(
        "last heartbeat" in e for v in h["attempts"][0]["verdicts"] for e in v["evidence"]))
    (ev,) = [e for v in h["attempts"][0]["verdicts"] if v["verdict"] == "hang" for e in v["evidence"]]
    assert ev.startswith(f"hang on {node}: no progress for ") and f"last heartbeat {beat_at}, step 1" in ev, ev
    assert re.search(r"; stack dump of 1 process \(\d+ frames?\) in the job's log$", ev), ev
    assert "train.py" not in ev                                            # numbers only through Slurm's node field
    # the owner's own view (slurm-ft's history service, as ft-history finds it for a user): the same line
    own = wait_for(lambda: (p := as_user(user, *tool_argv("ft-history", "-j", str(job), "--json"))).returncode == 0
                   and p, 60, "ft-history --json as the owner", 1.0)
    mine = json.loads(own.stdout)
    assert ev in [e for v in mine["attempts"][0]["verdicts"] if v["verdict"] == "hang" for e in v["evidence"]], mine
    # the frames themselves: the watcher's hang report (root's MUNGE credential to the history service)
    detail = wait_for(lambda: (p := as_user(user, *tool_argv("ft-history", "-j", str(job), "--detail"))).returncode
                      == 0 and "train.py" in p.stdout and p, 60, "the stack in ft-history --detail as the owner", 1.0)
    stack = re.search(rf"^    stack of pid \d+ \(python3?[^)]*\) on {node}, innermost first:\n((?:      \S.*\n?)+)",
                      detail.stdout, re.M)
    assert stack, detail.stdout
    innermost = stack.group(1).splitlines()[0].strip()
    assert "train.py" in innermost and innermost == frames.splitlines()[0].split("slurm-ft: hang:", 1)[1].strip(), \
        (innermost, frames)                                              # the log block's innermost frame
    print(f"\n$ ft-history -j {job} --detail   # as {LAB_USER}\n{detail.stdout.rstrip()}")
    screen(lab, user, job, jobdir, "hang")
    waiter = Waiter(user, slurm, job)
    assert as_user(user, "/usr/bin/scancel", str(job)).returncode == 0
    rc, out = waiter.result()
    assert rc == 7, out
    wait_for(lambda: "slurm-ft:cancelled" in sacct_admin(user, job) or show(user, job)["JobState"] == "CANCELLED",
             20, "cancelled")
    screen(lab, user, job, jobdir, "hang", f"$ scancel {job}; slurm-ft wait {job}; echo exit $?", out, f"exit {rc}")
