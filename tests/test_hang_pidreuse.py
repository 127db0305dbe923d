"""The hang watcher never signals a reused pid (issue 27, item 9: it SIGTERMed pids from a scan up
to ~320 s old). Processes are pinned with pidfds at the scan, after their start time and owner
were checked against it (slurm_ft.hang.procs, "Pinning").

The reuse itself is made deterministic in a fresh pid namespace (root, ``unshare``), where
``/proc/sys/kernel/ns_last_pid`` picks the next pid: process A is scanned, exits, process B gets
A's pid, and the watcher acts on its old scan. Without root the same paths are checked with real
processes: an exited process is not signalled, a live process whose start time is not the
scanned one is never pinned."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from slurm_ft.hang import procs


def _proc_of(p: subprocess.Popen, start_time: int | None = None) -> procs.Proc:
    start, uid = procs.identity(p.pid)
    return procs.Proc(p.pid, os.getpid(), uid, "sleep", 9, "batch", start if start_time is None else start_time)


@pytest.fixture
def sleepers():
    made = []

    def spawn():
        p = subprocess.Popen(["sleep", "60"])
        made.append(p)
        return p
    yield spawn
    for p in made:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_start_time_is_field_22():
    start, uid = procs.identity(os.getpid())
    with open(f"/proc/{os.getpid()}/stat") as fh:
        assert int(fh.read().rpartition(")")[2].split()[19]) == start and uid == os.geteuid()


def test_an_exited_scanned_process_is_not_signalled(sleepers):
    a, b = sleepers(), sleepers()
    (pinned,) = procs.pin([_proc_of(a)])
    a.kill()
    a.wait()
    assert pinned.alive() is False and pinned.signal(signal.SIGTERM) is False
    assert procs.end_pinned([pinned], 0.0) == []
    assert b.poll() is None
    pinned.close()


def test_a_live_process_that_is_not_the_scanned_one_is_never_pinned(sleepers):
    b = sleepers()
    reused = _proc_of(b, start_time=procs.identity(b.pid)[0] - 1)       # the scan saw an earlier process
    other_owner = procs.Proc(b.pid, 1, procs.identity(b.pid)[1] + 1, "sleep", 9, "batch", procs.identity(b.pid)[0])
    unknown = procs.Proc(b.pid, 1, os.geteuid(), "sleep", 9, "batch")    # no start time: never pinned
    assert procs.pin([reused, other_owner, unknown]) == []
    assert b.poll() is None


def test_pinned_processes_are_ended(sleepers):
    a = sleepers()
    trap = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print(1, flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    trap.stdout.readline()                        # its SIGTERM handler is in place
    pinned = procs.pin([_proc_of(a), _proc_of(trap)])
    killed = procs.end_pinned(pinned, 0.3, sleep=lambda s: time.sleep(0.02))
    assert a.wait(5) == -signal.SIGTERM and trap.wait(5) == -signal.SIGKILL and killed == [trap.pid]
    for p in pinned:
        p.close()


def test_without_pidfds_the_check_is_made_before_kill(sleepers, monkeypatch):
    def no_pidfd(pid, flags=0):
        raise OSError(errno.ENOSYS, "pidfd_open")
    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    a, b = sleepers(), sleepers()
    (pinned,) = procs.pin([_proc_of(a)])
    assert pinned.fd is None and pinned.alive()
    a.kill()
    a.wait()
    assert pinned.signal(signal.SIGTERM) is False and b.poll() is None
    (pb,) = procs.pin([_proc_of(b)])
    assert pb.signal(signal.SIGTERM) and b.wait(5) == -signal.SIGTERM


# ------------------------------------------------------------------------------ real pid reuse
SCRIPT = textwrap.dedent('''
    import os, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from slurm_ft import config
    from slurm_ft.hang import evidence, procs, watcher as wt

    def spawn():
        return subprocess.Popen(["sleep", "60"])

    def reuse(pid):
        """A new process with exactly ``pid`` (this pid namespace's next pid is ns_last_pid + 1)."""
        time.sleep(0.05)                       # a later start time (clock ticks) than the old process
        with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
            fh.write(str(pid - 1))
        p = spawn()
        assert p.pid == pid, (p.pid, pid)
        return p

    def scanned(p):
        start, uid = procs.identity(p.pid)
        return procs.Proc(p.pid, os.getpid(), uid, "sleep", 9, "batch", start)

    # 1. pinned at the scan; the process exits and its pid is reused before the signal
    a = spawn(); q = scanned(a); (pa,) = procs.pin([q])
    a.kill(); a.wait(); b = reuse(a.pid)
    assert pa.signal(15) is False and procs.end_pinned([pa], 0.0) == [] and b.poll() is None
    b.kill(); b.wait()

    # 2. the pid is reused between the scan and the pin: the start time differs, never pinned
    a = spawn(); q = scanned(a); a.kill(); a.wait(); b = reuse(a.pid)
    assert procs.identity(b.pid)[0] != q.start_time
    assert procs.pin([q]) == [] and b.poll() is None
    b.kill(); b.wait()

    # 3. the watcher: the job's process exits while the evidence is gathered (py-spy, Slurm: up
    #    to minutes) and another process takes its pid; the watcher ends nothing of it
    tmp = sys.argv[2]
    cfg = config.from_dict({"journal": {"node_path": tmp + "/node-{node}.db"},
                            "node_state": {"dir": tmp + "/state"},
                            "hang": {"heartbeat_dir": tmp + "/hb/{node}", "kill_wait_s": 0.0, "grace_s": 0.0,
                                     "py_spy": "/nonexistent/py-spy"}})
    os.makedirs(tmp + "/hb/n1/9")
    a = spawn(); q = scanned(a)
    procs.scan = lambda *x, **k: [q]
    evidence.kernel_verdict = lambda *x, **k: None
    other = []
    real_evidence = wt.Watcher.evidence
    def slow_evidence(self, now, found):
        lines = real_evidence(self, now, found)
        a.kill(); a.wait(); other.append(reuse(a.pid))
        return lines
    wt.Watcher.evidence = slow_evidence

    class FakeSlurm:
        extra = ""
        def show_node(self, node): return {"Extra": self.extra}
        def update_node(self, node, **f): self.extra = f["Extra"]
        def job(self, job_id): return None

    w = wt.Watch(9, 0, "n1", q.uid, os.getegid(), (0,), 60.0, 0.0)
    logs = []
    watcher = wt.Watcher(cfg, w, FakeSlurm(), logs.append, clock=lambda: 100.0, sleep=lambda s: time.sleep(0.01))
    watcher.open()
    watcher.progress.observe(100.0, wt.Sample())
    watcher.on_hang(100.0)
    (b,) = other
    time.sleep(0.2)
    assert b.poll() is None, "the process that reused the pid was signalled"
    assert watcher.ended and any("ending the job processes" in m for m in logs), logs
    b.kill(); b.wait()
    print("PIDREUSE-OK")
''')


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_a_reused_pid_is_never_signalled(tmp_path):
    from slurm_ft.lab.layout import repo_root
    script = tmp_path / "reuse.py"
    script.write_text(SCRIPT)
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script), str(repo_root()),
                        str(tmp_path / "w")], capture_output=True, text=True, timeout=60)
    if p.returncode != 0 and "unshare failed" in p.stderr:
        pytest.skip(f"no pid namespace here: {p.stderr.strip()}")
    assert p.returncode == 0 and "PIDREUSE-OK" in p.stdout, p.stdout + p.stderr
