"""Lab: the trust boundary of issue 27 on the real Slurm lab (root code facing what any user of a
node can do). Each test is self-contained: fresh jobs, fresh ports, its own time window."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.lab


_CKPT_SERVER = r'''
import os, sys, time
from slurm_ft.checkpoint import ExitCheckpoint
wd = sys.argv[1]
os.makedirs(wd + "/rt", mode=0o700, exist_ok=True)
os.environ["SLURM_FT_RUNTIME_DIR"] = wd + "/rt"
ck = ExitCheckpoint(lambda s: wd + "/ckpt-%d" % s, report=False)
for port in range(9700, 10000):
    try:
        ck.serve_http(port)
        break
    except OSError:
        continue
with open(wd + "/port.tmp", "w") as f:
    f.write("%d %d %s\n" % (port, os.getpid(), ck.token_path))
os.rename(wd + "/port.tmp", wd + "/port")
step = 0
while True:
    step += 1
    if ck.poll(step):
        print("saved at step", step, flush=True)
    time.sleep(0.05)
'''

_FLOOD = r'''
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(n):
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    except OSError:
        pass
print("opened", len(held), flush=True)
sys.stdin.read()          # hold them (idle, unauthenticated) until the test closes stdin
'''


def _proc_threads_fds(pid: int) -> tuple[int, int]:
    import os
    from pathlib import Path
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def test_300_idle_connections_to_the_checkpoint_port_cost_the_job_nothing(lab, slurm, workdir):
    """Issue 27 item 9: 300 idle unauthenticated connections to a job's checkpoint port (opened
    by another user of the node) were 300 threads in the training process. Now the job's process
    keeps its thread count, holds at most MAX_CONNECTIONS of them, and its own notify is answered
    at once, amid the flood."""
    import pwd
    import subprocess
    import sys
    import time

    from slurm_ft.checkpoint import http
    from slurm_ft.lab.demo import wait_for
    from slurm_ft.lab.users import LAB_USER

    (workdir / "srv.py").write_text(_CKPT_SERVER)
    proc = subprocess.run(["/usr/bin/sbatch", "--parsable", f"--output={workdir}/out.log",
                           f"--wrap=exec {sys.executable} {workdir}/srv.py {workdir}"],
                          capture_output=True, text=True, timeout=30, env=lab.env())
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip().split(";")[0])
    flood = None
    try:
        assert slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 60) is not None
        wait_for(lambda: (workdir / "port").exists(), 60, "checkpoint server up")
        port_s, pid_s, token_path = (workdir / "port").read_text().split()
        port, pid = int(port_s), int(pid_s)
        threads0, fds0 = _proc_threads_fds(pid)
        try:
            user = pwd.getpwnam(LAB_USER)
            as_user = {"user": user.pw_uid, "group": user.pw_gid}
        except KeyError:
            as_user = {}
        flood = subprocess.Popen(["/usr/bin/python3", "-I", "-c", _FLOOD, str(port), "300"], cwd="/",
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **as_user)
        line = flood.stdout.readline()
        assert line.startswith("opened "), line
        opened = int(line.split()[1])
        assert opened >= 250, line          # the kernel's backlog let (nearly) all of them connect
        time.sleep(0.5)                     # the server has accepted what it will accept
        threads, fds = _proc_threads_fds(pid)
        assert threads == threads0, (threads0, threads)
        assert fds <= fds0 + http.MAX_CONNECTIONS + 2, (fds0, fds)
        t0 = time.monotonic()
        answer = http.notify(port, token_file=token_path, timeout_s=10)   # the job's own request
        took = time.monotonic() - t0
        assert answer["accepted"], answer
        wait_for(lambda: "saved at step" in (workdir / "out.log").read_text(), 30, "the job to save")
        assert _proc_threads_fds(pid)[0] == threads0
        print(f"300 idle connections: threads {threads0} -> {threads}, fds {fds0} -> {fds}, "
              f"notify answered in {took:.3f} s")
    finally:
        if flood is not None:
            flood.stdin.close()
            flood.wait(10)
        slurm.run("scancel", str(job_id), check=False)


# -- the journal boundary (issue 27, item 8) ------------------------------------------------------
#: Runs as the job (its owner, the lab's ordinary user): watches for the checkpoint-delivery step
#: slurm-ft starts in this job (``srun --jobid=J --overlap ...``, run as the job's owner, on the
#: controller), takes a copy of that srun's stdout (``pidfd_getfd``: same uid, so allowed; the
#: pipe itself is root's and cannot be reopened through /proc), the pipe the daemon reads the
#: delivery report from, and writes report lines of its own into it: one holding lone surrogates
#: (JSON escapes), one invalid UTF-8.
_FORGER = r'''
import ctypes, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_getfd = 438


def stdout_of(pid):
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1
    if pidfd >= 0:
        fd = libc.syscall(SYS_pidfd_getfd, pidfd, 1, 0)
        os.close(pidfd)
        if fd >= 0:
            return fd
    return os.open("/proc/%d/fd/1" % pid, os.O_WRONLY)


jid = os.environ["SLURM_JOB_ID"].encode()
me = os.getuid()
forged = [
    json.dumps({"node": "n1\udcff", "signalled": [{"pid": 4242, "comm": "forged\udcff\ud800", "step": "0"}],
                "skipped": [], "error": "\udcff"}).encode() + b"\n",
    b'{"node": "n1\xff\xfe", "signalled": [], "skipped": [], "error": "\xc3("}\n',
]
done = set()
print("forger ready", flush=True)
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    for name in os.listdir("/proc"):
        if not name.isdigit() or name in done:
            continue
        try:
            if os.stat("/proc/" + name).st_uid != me:
                continue
            with open("/proc/%s/cmdline" % name, "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"--jobid=" + jid in argv and b"--overlap" in argv:
            done.add(name)
            try:
                fd = stdout_of(int(name))
                for line in forged:
                    os.write(fd, line)
                os.close(fd)
                print("forged into", name, flush=True)
            except OSError as exc:
                print("cannot forge into", name, exc, flush=True)
    time.sleep(0.01)
'''


def _daemon_log_tail(lab, offset: int) -> str:
    try:
        with open(lab.lay.log("daemon"), "rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _daemon_log_size(lab) -> int:
    import os
    try:
        return os.path.getsize(lab.lay.log("daemon"))
    except OSError:
        return 0


def _xid79_fails_over(lab, slurm) -> None:
    """A real injected Xid 79 under a training job still fails it over (the daemon works)."""
    from slurm_ft.lab.demo import ckpt_step, job_gpu_index, submit_training, wait_for, wait_started
    from slurm_ft.lab.inject import inject_xid

    sub = submit_training(lab, steps=400)
    try:
        first = wait_started(slurm, sub, timeout_s=90)
        wait_for(lambda: ckpt_step(sub.ckpt) >= 3, 90, "checkpoint")
        inject_xid(first.nodes, 79, job_gpu_index(slurm, sub.job_id))
        again = slurm.wait_job(sub.job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 120)
        assert again is not None and again.nodes != first.nodes, again
    finally:
        slurm.run("scancel", str(sub.job_id), check=False)


def test_a_lone_surrogate_in_a_delivery_report_does_not_wedge_the_daemon(lab, slurm, workdir):
    """The job's owner writes delivery-report lines holding lone surrogates and invalid UTF-8
    into the checkpoint-delivery step's output. Before: the ``ckpt-notify`` row could not be
    written (sqlite3 cannot bind a lone surrogate), every later daemon cycle failed on it, and a
    restarted daemon crash-looped on its spool. Now the boundary stores it as U+FFFD, nothing is
    set aside, and a real Xid 79 afterwards still fails its job over."""
    from slurm_ft import config as config_mod
    from slurm_ft.journal import open_journal
    from slurm_ft.lab.demo import wait_for
    from slurm_ft.lab.users import LAB_USER, ensure_user, run_as

    ensure_user()
    log_at = _daemon_log_size(lab)
    (workdir / "forger.py").write_text(_FORGER)
    (workdir / "forger.py").chmod(0o644)
    out = workdir / "forger.out"
    # --time=1: the daemon sends the time-limit checkpoint signal about 30 s into the job
    proc = run_as(LAB_USER, ["/usr/bin/sbatch", "--parsable", f"--output={out}", "--ft", "--time=1",
                             "--gres=gpu:1", f"--wrap=exec /usr/bin/python3 -I {workdir}/forger.py"],
                  lab.env(), cwd=str(workdir))
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip().split(";")[0])
    path = config_mod.load(lab.lay.ft_conf).journal.path

    def notified():
        with open_journal(path, readonly=True) as j:
            rows = [a for a in j.actions(job_id) if a["action"] == "ckpt-notify"]
        return rows[0] if rows else None
    try:
        wait_for(lambda: out.exists() and "forger ready" in out.read_text(errors="replace"), 90, "the job to start")
        row = wait_for(notified, 120, "the time-limit checkpoint signal (ckpt-notify row)", interval_s=0.5)
        text = out.read_text(errors="replace")
        assert "forged into" in text, text                      # the attack happened
        assert "forged\ufffd\ufffd[4242]" in row["detail"], row["detail"]   # stored, cleaned once
        row["detail"].encode("utf-8")
        with open_journal(path, readonly=True) as j:
            assert j.dead_letter_count() == 0
    finally:
        slurm.run("scancel", str(job_id), check=False)
    _xid79_fails_over(lab, slurm)
    tail = _daemon_log_tail(lab, log_at)
    assert "UnicodeEncodeError" not in tail and "cycle failed unexpectedly" not in tail, tail[-3000:]


def _lab_writer(cfg_path: str, job_id: int, n: int, go) -> None:
    from slurm_ft import config as config_mod
    import time

    from slurm_ft.journal import open_daemon_journal

    go.wait()
    with open_daemon_journal(config_mod.load(cfg_path), spool=True, busy_timeout_s=0.05) as j:
        for i in range(n):
            j.finish(j.intend(job_id, i, "lab-writer", "none", "concurrent writer"))
        while not j.flush():
            time.sleep(0.05)


def test_a_write_locked_journal_with_concurrent_writers_leaves_no_action_in_intent(lab, slurm):
    """While another process holds the daemon journal's write lock (in pulses) and 4 other
    writers record actions, the daemon handles a real Xid 79: its writes wait in the spool, and
    once the lock is gone every action, the daemon's and the writers', is finished; none stays
    in ``intent`` (before: 1-3 of 1,200 ``finish()`` updates were lost). (The daemon closes an
    intent it finds open as ``abandoned``; a writer's row it caught between intend and finish
    may end so: still not ``intent``.)"""
    import multiprocessing
    import sqlite3
    import time

    from slurm_ft import config as config_mod
    from slurm_ft.journal import open_journal
    from slurm_ft.lab.demo import ckpt_step, job_gpu_index, submit_training, wait_for, wait_started
    from slurm_ft.lab.inject import inject_xid

    cfg_path = str(lab.lay.ft_conf)
    path = config_mod.load(cfg_path).journal.path
    base = 60_000_000 + (time.time_ns() // 1000) % 1_000_000 * 4   # job ids Slurm never hands out here
    sub = submit_training(lab, steps=400)
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    writers = [ctx.Process(target=_lab_writer, args=(cfg_path, base + w, 150, go)) for w in range(4)]
    held = None
    try:
        first = wait_started(slurm, sub, timeout_s=90)
        wait_for(lambda: ckpt_step(sub.ckpt) >= 3, 90, "checkpoint")
        for p in writers:
            p.start()
        held = sqlite3.connect(path, timeout=30, isolation_level=None)
        held.execute("BEGIN IMMEDIATE")
        go.set()
        inject_xid(first.nodes, 79, job_gpu_index(slurm, sub.job_id))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 12:              # the lock, held in pulses for 12 s
            time.sleep(1.0)
            held.execute("ROLLBACK")
            time.sleep(0.1)
            held.execute("BEGIN IMMEDIATE")
        held.execute("ROLLBACK")
        held.close()
        held = None
        for p in writers:
            p.join(120)
        assert [p.exitcode for p in writers] == [0, 0, 0, 0]
        again = slurm.wait_job(sub.job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 150)
        assert again is not None and again.nodes != first.nodes, again

        def settled():
            with open_journal(path, readonly=True) as j:
                mine = [a for a in j.pending_intents() if a["job_id"] == sub.job_id or base <= a["job_id"] < base + 4]
                rows = [a for w in range(4) for a in j.actions(base + w)]
                finished = [a for a in rows if a["status"] in ("done", "abandoned")]
                return (mine, rows) if not mine and len(rows) == len(finished) == 600 else None
        wait_for(settled, 60, "every action done (none left in intent)", interval_s=0.5)
        with open_journal(path, readonly=True) as j:
            acts = j.actions(sub.job_id, 0)
            assert any(a["action"] == "failover" and a["status"] == "done" for a in acts), acts
            assert not [a for a in acts if a["status"] == "intent"], acts
            assert j.dead_letter_count() == 0
    finally:
        if held is not None:
            held.close()
        for p in writers:
            if p.is_alive():
                p.kill()
        slurm.run("scancel", str(sub.job_id), check=False)
