"""High availability with Slurm's backup controller (issue 20), on the Docker lab with two
controller containers (``lab up --engine docker --controllers 2``): ``ctl`` (primary) and ``ctl2``
(backup) share StateSaveLocation, each runs a slurm-ft daemon with its own journal, and only the
one whose slurmctld is in control acts (slurm_ft.failover.leader).

Each test kills the primary's container (``docker kill``: slurmctld and daemon die together)
mid-failover; the backup's slurmctld takes control after SlurmctldTimeout (6 s in the lab) and
its daemon finishes the failover from Slurm's state and the node mailboxes: the job runs again
exactly once, no node is drained twice. Each prints the time from the takeover (the backup
daemon's ``active`` log line) to the job running again.

Run: ``SLURM_FT_LAB_SLURM=24.11 flock /tmp/slurm-ft-docker.lock .venv/bin/python -m pytest -m docker
tests/test_docker_ha.py`` (root, dockerd running). The module brings up its own two-controller lab
and leaves the lab as it found it (a one-controller lab again if one was up, else none).
"""

from __future__ import annotations

import os
import re
import time
import warnings
from datetime import datetime

import pytest

from slurm_ft.errors import LabError
from slurm_ft.failover import leader, mailbox
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import job_gpu_index, wait_for, wait_started
from slurm_ft.lab.docker_engine import DEFAULT_VERSION
from slurm_ft.lab.layout import GPUS_PER_NODE

#: The versions the HA cases run on in `make test` (each case takes 1.5-4 minutes of takeover,
#: about 6 minutes for the three; `make test` runs the Docker suite once per version and must stay
#: under 60 minutes): 26.05, the newest. They ran on 24.11 too (docs/architecture.md, "High
#: availability"). Set SLURM_FT_HA_ALL_VERSIONS=1 to run them on the version under test whatever it is.
HA_VERSIONS = ("26.05",)
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif((os.environ.get("SLURM_FT_LAB_SLURM") or DEFAULT_VERSION) not in HA_VERSIONS
                       and not os.environ.get("SLURM_FT_HA_ALL_VERSIONS"),
                       reason=f"the backup-controller cases run on Slurm {' and '.join(HA_VERSIONS)} in make test "
                              "(time budget)"),
]

ACTIVE = re.compile(r"^(\S+ \S+) WARNING slurm-ft daemon active: ")


@pytest.fixture(scope="module")
def ha_lab():
    if os.geteuid() != 0:
        pytest.skip("the Docker lab needs root")
    from slurm_ft.lab.docker_engine import DockerLab
    lab = DockerLab(os.environ.get("SLURM_FT_LAB_SLURM"))
    before = lab.status() if (lab.dir / "lab.json").exists() else {}
    lab.up(nodes=3, controllers=2, log=lambda *_: None)
    yield lab
    if before.get("running") and lab.controllers() != ["ctl"]:
        # the session's one-controller lab (tests/conftest.py docker_lab) was up: bring it back
        lab.up(nodes=len(before.get("nodes") or []) or 3, log=lambda *_: None)


def _in_control(lab) -> int | None:
    hb = leader.read_heartbeat(lab.dir / "ctld-state")
    return hb.index if hb is not None and time.time() - hb.time < 6 else None


@pytest.fixture
def ha(ha_lab):
    """Both controllers up, the primary in control, every node idle; the same after the test."""
    def ready():
        for name in ha_lab.controllers():
            if ha_lab.container(name).status != "running":
                ha_lab.start_controller(name, timeout_s=90)
        wait_for(lambda: _in_control(ha_lab) == 0, 90, "the primary slurmctld in control", 0.5)
        wait_for(lambda: "active" in _last_leader_line(ha_lab, "ctl"), 60, "the primary's daemon active", 0.5)
        slurm = ha_lab.slurm(30)
        ha_lab.reset(slurm)
        return slurm
    slurm = ready()
    yield ha_lab, slurm
    # the next test's setup runs ready() again and fails there if the lab is really stuck (the
    # module's teardown brings the one-controller lab back after the last one); here a node that
    # is slow to leave COMPLETING after a controller switch must not turn a passed test into an
    # error (24.11, seen once after the continuation case: no node idle within 90 s)
    try:
        ready()
    except LabError as exc:
        warnings.warn(f"HA lab not reset after the test (the next setup retries): {exc}")


def _last_leader_line(lab, ctl: str) -> str:
    try:
        lines = lab.log(ctl, "daemon.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((ln for ln in reversed(lines) if "slurm-ft daemon active" in ln or "standing by" in ln), "")


def _takeover_at(lab, after: float) -> float | None:
    """Epoch time of the backup daemon's first ``active`` line after ``after``, if any."""
    for ln in lab.log("ctl2", "daemon.log").read_text(errors="replace").splitlines():
        m = ACTIVE.match(ln)
        if m:
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= after - 1:
                return at
    return None


def _tail(lab, ctl: str = "ctl2", n: int = 25) -> str:
    try:
        lines = lab.log(ctl, "daemon.log").read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"no daemon log of {ctl}: {exc}"
    return f"{ctl}'s daemon log ends:\n" + "\n".join(lines[-n:])


def _wait_saved(lab, slurm) -> None:
    """Make the primary slurmctld save its job and node state now and wait for it (``job_state``,
    ``node_state`` in the shared StateSaveLocation rewritten after this call: a held job
    submitted and a node comment set make it save both tables whole), so that the backup takes
    over the state the primary's daemon acted on. A primary that dies before its save rolls
    Slurm back: that is the reconciliation's case (slurm_ft/failover/reconcile.py), not this one."""
    state = lab.dir / "ctld-state"
    since = time.time()
    held = lab.sbatch("--hold", "--job-name=ha-save", "--output=/dev/null", "--wrap=true").stdout.strip().split(";")[0]
    slurm.run("scontrol", "update", f"NodeName={lab.nodes()[-1]}", f"Comment=ha-save-{since:.0f}")

    def saved():
        try:
            return all((state / f).stat().st_mtime >= since for f in ("job_state", "node_state"))
        except OSError:
            return False
    wait_for(saved, 30, "the primary slurmctld to save its state", 0.2)
    slurm.run("scancel", held, check=False)


def _freeze_daemon(lab, ctl: str = "ctl") -> None:
    """SIGSTOP the daemon of ``ctl``: it acts no more (its container is killed next)."""
    lab.exec(ctl, ["/bin/kill", "-STOP", _daemon_pid(lab, ctl)])


def _daemon_pid(lab, ctl: str) -> str:
    return (lab.private(ctl) / "run" / "slurm-ft-daemon.pid").read_text().strip()


def _drains_done(lab, job_id: int, node: str) -> int:
    """Drains of ``node`` for the job that either controller's daemon carried out."""
    n = 0
    for ctl in lab.controllers():
        path = lab.daemon_journal(ctl)
        if not path.exists():
            continue
        with open_journal(path) as j:
            n += sum(1 for a in j.actions(job_id) if a["action"] == "drain" and a["target"] == node
                     and a["status"] == "done")
    return n


def _kill_primary_and_follow(lab, job_id: int, attempt: int = 1, timeout_s: float = 300):
    """Kill ``ctl``; wait for the backup's daemon to take over and the job's attempt ``attempt``
    to run. Returns (job, takeover time, kill time)."""
    killed = time.time()
    lab.kill_controller("ctl")
    backup = lab.slurm(30, on="ctl2")
    try:
        wait_for(lambda: _takeover_at(lab, killed), 60, "the backup's daemon to take over", 0.5)
    except Exception as exc:
        raise AssertionError(f"{exc}; {_tail(lab)}") from None
    again = backup.wait_job(job_id, lambda j: j.state == "RUNNING" and j.restart_count >= attempt, timeout_s, 0.5)
    if again is None:
        rc, out = lab.exec("ctl2", ["/usr/bin/scontrol", "show", "job", str(job_id)], check=False)
        raise AssertionError(f"not run again after the takeover: {out}\n{_tail(lab, n=60)}")
    return again, _takeover_at(lab, killed), killed


def _once(backup, job_id: int, attempt: int = 1) -> None:
    """Still attempt ``attempt`` a while later: no second requeue."""
    time.sleep(3)       # a second (duplicate) requeue would show within a daemon cycle or two
    job = backup.job(job_id)
    assert job.restart_count == attempt, f"job {job_id} requeued again: Restarts={job.restart_count}"


def _report(case: str, lab, again, takeover: float, killed: float) -> None:
    start = again.start_time or time.time()
    print(f"docker {lab.version} HA {case}: backup daemon active {takeover - killed:.1f} s after the kill; "
          f"job running again {start - takeover:.1f} s after the takeover ({start - killed:.1f} s after the kill)")


def test_primary_killed_after_the_verdict_before_the_requeue(ha):
    """The primary's daemon is frozen when the Xid strikes (it never decides); the epilog posts
    its verdict to the node's mailbox; then the primary's container dies. The backup's daemon
    reads the verdict from Slurm's node record and fails the job over, once."""
    lab, slurm = ha
    job = lab.submit_training(steps=2000, step_time=0.1)
    first = wait_started(slurm, job)
    _freeze_daemon(lab)
    lab.inject_xid(first.nodes, 79, job_gpu_index(slurm, job.job_id))
    wait_for(lambda: any(r.job_id == job.job_id and r.verdict == "hardware"
                         for r in mailbox.parse(slurm.show_node(first.nodes).get("Extra") or "", first.nodes)),
             60, "the node's verdict in its mailbox (Extra)", 0.3)
    wait_for(lambda: slurm.job(job.job_id).ended, 60, "the job to end", 0.3)
    _wait_saved(lab, slurm)
    assert slurm.job(job.job_id).restart_count == 0          # nobody requeued it yet
    again, takeover, killed = _kill_primary_and_follow(lab, job.job_id)
    backup = lab.slurm(30, on="ctl2")
    assert again.restart_count == 1 and again.nodes != first.nodes
    assert first.nodes in again.excluded_nodes
    _once(backup, job.job_id)
    assert backup.show_node(first.nodes)["Reason"].startswith("slurm-ft:")
    assert _drains_done(lab, job.job_id, first.nodes) <= 1
    _report("after the verdict, before the requeue", lab, again, takeover, killed)
    backup.run("scancel", str(job.job_id))


def _occupy(lab, slurm, nodes: list[str]) -> list[str]:
    """Every GPU of ``nodes`` taken by a plain (not ft) job, as on a full cluster; returns their
    job ids once all run."""
    ids = [lab.sbatch("--job-name=ha-busy", f"--nodelist={n}", f"--gres=gpu:{GPUS_PER_NODE}", "--output=/dev/null",
                      "--wrap=sleep 900").stdout.strip().split(";")[0] for n in nodes]
    wait_for(lambda: all((j := slurm.job(int(i))) is not None and j.state == "RUNNING" for i in ids), 60,
             f"the jobs that fill {','.join(nodes)} to run", 0.5)
    return ids


def _eligible_in(job) -> float | None:
    """Seconds until Slurm lets the pending ``job`` start (its requeue delay; <= 0: eligible now)."""
    eligible = job.raw.get("eligible_time")
    eligible = eligible.get("number") if isinstance(eligible, dict) else eligible
    return eligible - time.time() if eligible else None


def test_primary_killed_after_the_requeue_before_starttime(ha):
    """The primary's daemon requeued the job (Restarts=1) and the job has not started again when
    the primary dies: every other node's GPUs are taken (plain jobs, as on a full cluster, in
    place before the fault), so the window between the requeue and the job's new StartTime stays
    open for as long as the test wants, whatever the primary had time to do after its requeue.
    The backup's daemon takes over: it does not requeue again (Slurm's restart count says the
    requeue is done); once the GPUs are free the job runs, once, away from the faulty node."""
    lab, slurm = ha
    job = lab.submit_training(steps=2000, step_time=0.1)
    first = wait_started(slurm, job)
    busy = _occupy(lab, slurm, [n for n in lab.nodes() if n != first.nodes])
    lab.inject_xid(first.nodes, 79, job_gpu_index(slurm, job.job_id))
    seen = slurm.wait_job(job.job_id, lambda j: j.restart_count >= 1, 60, 0.05)
    assert seen is not None, f"the primary's daemon did not requeue; {_tail(lab, 'ctl')}"
    _freeze_daemon(lab)
    _wait_saved(lab, slurm)
    seen = slurm.job(job.job_id)
    assert seen.state == "PENDING" and seen.restart_count == 1, seen      # requeued, not started again
    delay = _eligible_in(seen)
    killed = time.time()
    lab.kill_controller("ctl")
    backup = lab.slurm(30, on="ctl2")
    try:
        wait_for(lambda: _takeover_at(lab, killed), 60, "the backup's daemon to take over", 0.5)
    except Exception as exc:
        raise AssertionError(f"{exc}; {_tail(lab)}") from None
    takeover = _takeover_at(lab, killed)
    pending = backup.job(job.job_id)
    assert pending.state == "PENDING" and pending.restart_count == 1, pending   # the window, after the takeover
    freed = time.time()
    backup.run("scancel", *busy)
    again = backup.wait_job(job.job_id, lambda j: j.state == "RUNNING" and j.restart_count >= 1, 180, 0.5)
    if again is None:
        rc, out = lab.exec("ctl2", ["/usr/bin/scontrol", "show", "job", str(job.job_id)], check=False)
        raise AssertionError(f"not run again after the takeover: {out}\n{_tail(lab, n=60)}")
    assert again.restart_count == 1 and again.nodes != first.nodes
    assert first.nodes in again.excluded_nodes
    _once(backup, job.job_id)
    assert backup.show_node(first.nodes)["Reason"].startswith("slurm-ft:")
    assert _drains_done(lab, job.job_id, first.nodes) <= 1
    start = again.start_time or time.time()
    state = ("with Slurm's requeue delay still on" if delay is not None and delay > 3
             else "with the requeue delay already cleared")
    print(f"docker {lab.version} HA after the requeue, before StartTime ({state} when killed): backup daemon "
          f"active {takeover - killed:.1f} s after the kill; GPUs freed {freed - takeover:.1f} s after the "
          f"takeover; job running again {start - freed:.1f} s after they were freed "
          f"({start - takeover:.1f} s after the takeover)")
    backup.run("scancel", str(job.job_id))


def test_primary_killed_during_a_continuation(ha):
    """A time-limit continuation under way (the checkpoint signal went out, the job saved): the
    primary dies; the backup's daemon finishes the continuation, once, from the job's checkpoint."""
    lab, slurm = ha
    # --time=2, --ft-ckpt-wait=50: the checkpoint signal ~60 s into the job, 60 s before the limit
    # (a takeover takes SlurmctldTimeout, then every Slurm command on the backup waits ~2 s for the
    # dead primary first)
    job = lab.submit_training(steps=5000, step_time=0.1, extra=["--time=2", "--ft-ckpt-wait=50"])
    wait_started(slurm, job)
    try:
        wait_for(lambda: "checkpoint at step" in job.out.read_text(errors="replace"), 100, "the checkpoint signal", 0.2)
    except Exception as exc:
        raise AssertionError(f"{exc}; {_tail(lab, 'ctl')}") from None
    _freeze_daemon(lab)
    _wait_saved(lab, slurm)
    state = slurm.job(job.job_id)
    print(f"continuation: primary frozen with the job {state.state}, Restarts={state.restart_count}")
    again, takeover, killed = _kill_primary_and_follow(lab, job.job_id)
    backup = lab.slurm(30, on="ctl2")
    assert again.restart_count == 1
    _once(backup, job.job_id)
    wait_for(lambda: "attempt 1" in job.out.read_text(errors="replace"), 30, "attempt 1 to print", 0.3)
    text = job.out.read_text(errors="replace")
    saved = int(re.search(r"attempt 0: checkpoint at step (\d+) on signal", text).group(1))
    wait_for(lambda: f"resuming from step {saved}" in job.out.read_text(errors="replace"), 30, "the resume", 0.3)
    assert not re.search(r"^attempt 2 ", job.out.read_text(errors="replace"), re.M)   # train.py's own lines
    _report("during a continuation", lab, again, takeover, killed)
    backup.run("scancel", str(job.job_id))
