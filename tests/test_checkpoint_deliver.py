"""The checkpoint signal goes only to the job's processes that catch it (checkpoint/deliver.py).

Process tables are built as /proc shows them (SigCgt/SigIgn hex masks, slurmstepd titles); the
lab tests (test_lab_job_shapes.py, test_spank_lab.py) run the real step on real processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest

from slurm_ft.checkpoint import deliver
from slurm_ft.checkpoint.deliver import deliver as deliver_on_node, job_processes
from slurm_ft.failover import policy

USR1 = 1 << (signal.SIGUSR1 - 1)
USR2 = 1 << (signal.SIGUSR2 - 1)
UID = 1000

@dataclass
class P:
    """One process of a fake /proc, as the kernel shows it."""
    pid: int
    ppid: int
    comm: str
    uid: int = UID
    cmdline: str | None = None
    cgt: int = 0
    ign: int = 0
    cgroup: str = ""
    node: str | None = None
    dir_uid: int | None = None      # owner of /proc/PID when not ``uid`` (a non-dumpable process: 0)


def proc(pid, ppid, comm, *, uid=UID, cmdline=None, cgt=0, ign=0, cgroup="", node=None, dir_uid=None):
    return P(pid, ppid, comm, uid, cmdline or comm, cgt, ign, cgroup, node, dir_uid)


def table(*procs):
    return {p.pid: p for p in procs}


def fake_proc(root, procs) -> str:
    """Write ``procs`` as /proc shows them (stat, status, cmdline, cgroup, environ; /proc/PID
    owned by the process's uid) under ``root``; returns that directory."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the fake /proc entries their owners")
    root.mkdir(exist_ok=True)
    for p in procs.values():
        d = root / str(p.pid)
        d.mkdir()
        (d / "stat").write_text(f"{p.pid} ({p.comm}) S {p.ppid} " + " ".join(["0"] * 17) + f" {p.pid * 10} 0")
        (d / "status").write_text(f"Name:\t{p.comm}\nPPid:\t{p.ppid}\nUid:\t{p.uid}\t{p.uid}\t{p.uid}\t{p.uid}\n"
                                  f"SigIgn:\t{p.ign:016x}\nSigCgt:\t{p.cgt:016x}\n")
        (d / "cmdline").write_bytes(p.cmdline.encode() + b"\0")
        (d / "cgroup").write_text(p.cgroup)
        (d / "environ").write_bytes(f"SLURMD_NODENAME={p.node}\0".encode() if p.node else b"")
        owner = p.uid if p.dir_uid is None else p.dir_uid
        os.chown(d, owner, owner)
    return str(root)


def batch_job(job_id=7, trainer_cgt=USR1):
    """slurmstepd [7.batch] -> bash (no trap) -> python (handler) ; slurmstepd [7.0] -> python;
    an unrelated process of the same user; another job's process."""
    return table(
        proc(100, 1, "slurmstepd", uid=0, cmdline=f"slurmstepd: [{job_id}.batch]"),
        proc(101, 100, "slurm_script", cgt=1 << 16 | 1 << 1),       # bash: SIGCHLD, SIGINT
        proc(102, 101, "python3", cgt=trainer_cgt),
        proc(103, 101, "srun", cgt=1 << 32),                      # srun: sigwait, nothing caught
        proc(200, 1, "slurmstepd", uid=0, cmdline=f"slurmstepd: [{job_id}.0]"),
        proc(201, 200, "python3", cgt=USR1),
        proc(300, 1, "python3", cgt=USR1),                         # not in the job
        proc(400, 1, "slurmstepd", uid=0, cmdline="slurmstepd: [8.batch]"),
        proc(401, 400, "python3", cgt=USR1),                       # another job
    )


def test_only_catching_processes_of_the_job_are_signalled(tmp_path):
    sent = []
    report = deliver_on_node(7, signal.SIGUSR1, own_step=None, proc_root=fake_proc(tmp_path / "proc", batch_job()), uid=UID,
                             kill=lambda pid, sig: sent.append((pid, sig)), node="n1")
    assert sorted(sent) == [(102, signal.SIGUSR1), (201, signal.SIGUSR1)]
    skipped = {s["pid"]: s["why"] for s in report.skipped}
    assert skipped[101].startswith("no handler")          # the batch shell is never killed
    assert skipped[103] == "forwards signals itself"       # srun would deliver it a second time
    assert 300 not in skipped and 401 not in skipped       # not this job's


def test_program_without_handler_and_ignoring_one_are_left_alone(tmp_path):
    sent = []
    procs = batch_job(trainer_cgt=0)
    procs[201] = proc(201, 200, "python3", ign=USR1)
    report = deliver_on_node(7, signal.SIGUSR1, own_step=None, proc_root=fake_proc(tmp_path / "proc", procs), uid=UID,
                             kill=lambda pid, sig: sent.append(pid), node="n1")
    assert sent == [] and not report.signalled
    assert {s["pid"]: s["why"] for s in report.skipped}[201] == "ignores the signal"


def test_other_signal_mask_bits_do_not_count(tmp_path):
    sent = []
    deliver_on_node(7, signal.SIGUSR2, own_step=None, proc_root=fake_proc(tmp_path / "proc", batch_job()), uid=UID,
                    kill=lambda pid, sig: sent.append(pid), node="n1")
    assert sent == []                                       # they catch USR1, not USR2


def test_own_step_other_users_and_other_nodes_are_skipped(tmp_path):
    procs = batch_job()
    procs[500] = proc(500, 1, "slurmstepd", uid=0, cmdline="slurmstepd: [7.3]")
    procs[501] = proc(501, 500, "python3", cgt=USR1)                     # the delivering step
    procs[202] = proc(202, 200, "python3", cgt=USR1, uid=UID + 1)        # someone else's
    procs[203] = proc(203, 200, "python3", cgt=USR1, node="n2")          # same host, node n2
    sent = []
    deliver_on_node(7, signal.SIGUSR1, own_step="3", proc_root=fake_proc(tmp_path / "proc", procs), uid=UID,
                    kill=lambda pid, sig: sent.append(pid), node="n1")
    assert sorted(sent) == [102, 201]


def test_a_user_process_titled_slurmstepd_is_not_a_step(tmp_path):
    procs = batch_job()
    procs[600] = proc(600, 1, "python3", cmdline="slurmstepd: [7.9]", cgt=USR1)  # uid 1000: forged title
    procs[601] = proc(601, 600, "python3", cgt=USR1)
    found = {p.pid for p in job_processes(7, UID, "n1", fake_proc(tmp_path / "proc", procs))}
    assert 601 not in found and 600 not in found


def test_cgroup_membership_counts_when_the_tree_is_broken(tmp_path):
    procs = batch_job()
    procs[700] = proc(700, 1, "python3", cgt=USR1, cgroup="0::/slurm/uid_1000/job_7/step_0/user/task_0\n")
    found = {p.pid: p.step for p in job_processes(7, UID, "n1", fake_proc(tmp_path / "proc", procs))}
    assert found[700] == "0"


def test_job_id_prefix_does_not_match_another_job(tmp_path):
    procs = table(proc(100, 1, "slurmstepd", uid=0, cmdline="slurmstepd: [77.batch]"),
                  proc(101, 100, "python3", cgt=USR1))
    assert job_processes(7, UID, None, fake_proc(tmp_path / "proc", procs)) == []


def test_a_non_dumpable_user_process_is_neither_a_stepd_nor_the_users(tmp_path):
    """The kernel gives /proc/PID of a process that made itself non-dumpable to root: a user's
    process named and titled slurmstepd that way is still no step (its real uid is the user's),
    and such a process is not counted as the user's (the owner of /proc/PID is not)."""
    procs = batch_job()
    procs[800] = proc(800, 1, "slurmstepd", cmdline="slurmstepd: [7.8]", dir_uid=0)
    procs[801] = proc(801, 800, "python3", cgt=USR1)
    procs[802] = proc(802, 200, "python3", cgt=USR1, dir_uid=0)
    found = {p.pid for p in job_processes(7, UID, "n1", fake_proc(tmp_path / "proc", procs))}
    assert found == {101, 102, 103, 201}


def test_the_extern_step_is_the_deliverys_but_never_the_hang_watchers(tmp_path):
    """Processes adopted into the extern step (ssh sessions) may catch the checkpoint signal;
    the hang watcher's scan never ends them (the same scanner, another filter)."""
    from slurm_ft.hang import procs as scanner

    procs = table(proc(900, 1, "slurmstepd", uid=0, cmdline="slurmstepd: [7.extern]"),
                  proc(901, 900, "sleep"), proc(902, 1, "python3", cgt=USR1,
                                                   cgroup="0::/slurm/uid_1000/job_7/step_extern/user\n"))
    root = fake_proc(tmp_path / "proc", procs)
    assert [(p.pid, p.step) for p in job_processes(7, UID, "n1", root)] == [(901, "extern"), (902, "extern")]
    assert scanner.scan(7, uid=UID, proc_root=root) == []


def test_deliver_main_on_this_host_reads_real_proc(tmp_path):
    """The node half run stand-alone, as srun runs it (the program :func:`deliver._node_source`
    builds, ``-I``), and with no site-packages at all (``-S``: nothing of slurm-ft importable): a
    real process with a handler under no step of the job is not signalled, and the output is one
    JSON line."""
    assert len(deliver._node_source().encode()) < 128 * 1024   # one argv string: the kernel's MAX_ARG_STRLEN
    for flags in (["-I"], ["-I", "-S"]):
        out = subprocess.run([sys.executable, *flags, "-c", deliver._node_source(), "--job", "999999",
                              "--signal", "USR1"], capture_output=True, text=True, timeout=30, cwd="/")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["signalled"] == [] and report["error"] == ""


def test_signal_job_parses_reports_strictly():
    class FakeSlurm:
        def run(self, *args, **kw):
            self.args, self.kw = args, kw
            lines = [json.dumps({"node": "n1", "signalled": [{"pid": 5, "comm": "python3", "step": "0"}],
                                 "skipped": [{"pid": 6, "comm": "bash", "step": "batch", "why": "no handler"}],
                                 "error": ""}),
                     "garbage the owner printed", json.dumps({"node": "n2"})]
            return subprocess.CompletedProcess(args, 0, "\n".join(lines), "")

    class Job:
        job_id, nodes = 7, "n[1-2]"
        raw = {"user_id": 4242, "group_id": 4242}

    s = FakeSlurm()
    d = deliver.signal_job(s, Job(), "USR1")
    assert d.signalled == 1 and [n.node for n in d.nodes] == ["n1"]
    assert s.kw["as_user"] == (4242, 4242)                 # the owner's uid, never root's
    assert "--overlap" in s.args and "--nodes=2" in s.args and "--nodelist=n[1-2]" in s.args
    assert "python3[5]" in d.summary() and "bash[6]" in d.summary()


def test_signal_job_refused_step_is_an_error_not_an_exception():
    class FakeSlurm:
        def run(self, *args, **kw):
            return subprocess.CompletedProcess(args, 1, "", "srun: error: Unable to create step")

    class Job:
        job_id, nodes = 7, "n1"
        raw = {"user_id": 4242, "group_id": 4242}

    d = deliver.signal_job(FakeSlurm(), Job(), "USR1")
    assert d.signalled == 0 and "Unable to create step" in d.error


# ---------------------------------------------------------------- what the policy does after it
def _decide(**kw):
    base = dict(slurm_state="FAILED", failovers_done=0, retries=3, verdicts=[], job_nodes=["n1"],
                seconds_since_end=60)
    base.update(kw)
    return policy.decide(**base)


def test_death_after_an_evacuation_signal_is_an_evacuation_not_the_users_error():
    user = [{"node": "n1", "verdict": "user", "rule": "signal-other", "xids": []}]
    d = _decide(verdicts=user, notified=policy.NOTIFY_EVACUATION)
    assert d.kind == policy.EVACUATE and not d.blamed_nodes
    assert _decide(verdicts=user, notified=policy.NOTIFY_EVACUATION, evacuations_done=10).kind == policy.USER_ERROR


def test_hardware_during_an_evacuation_is_still_a_failover():
    hw = [{"node": "n1", "verdict": "hardware", "rule": "xid-79", "xids": [{"xid": 79}]}]
    assert _decide(verdicts=hw, notified=policy.NOTIFY_EVACUATION).kind == "failover"


def test_time_limit_continues_only_after_a_save():
    assert _decide(slurm_state="TIMEOUT", notified=policy.NOTIFY_TIME_LIMIT, saved=True).kind == policy.CONTINUE
    assert _decide(slurm_state="TIMEOUT", notified=policy.NOTIFY_TIME_LIMIT).kind == policy.TIMEOUT
    assert _decide(slurm_state="TIMEOUT").kind == policy.TIMEOUT
    assert _decide(slurm_state="TIMEOUT", notified=policy.NOTIFY_TIME_LIMIT, saved=True,
                   continuations_done=10).kind == policy.TIMEOUT


def test_exit_zero_after_an_evacuation_save_is_requeued():
    assert _decide(slurm_state="COMPLETED", notified=policy.NOTIFY_EVACUATION, saved=True).kind == policy.EVACUATE
    assert _decide(slurm_state="COMPLETED").kind == policy.COMPLETED


def test_cancel_wins_over_everything():
    assert _decide(slurm_state="CANCELLED", notified=policy.NOTIFY_EVACUATION).kind == policy.CANCELLED


def test_time_limit_seconds_from_both_json_shapes():
    from slurm_ft.failover.machine import time_limit_s as _time_limit_s

    class J:
        def __init__(self, v):
            self.raw = {"time_limit": v}

    assert _time_limit_s(J(1)) == 60.0
    assert _time_limit_s(J({"set": True, "infinite": False, "number": 2})) == 120.0
    assert _time_limit_s(J({"set": True, "infinite": True, "number": 0})) is None
    assert _time_limit_s(J(0xFFFFFFFE)) is None and _time_limit_s(J(None)) is None
