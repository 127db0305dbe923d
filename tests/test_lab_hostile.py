"""The hostile-user suite (docs/security.md): each attack done for real on the lab, by an ordinary
non-root user the lab creates, each asserting no drain, no blame, no exclusion, no priority or
time gained, nothing of another user's read."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.classify.table import signatures
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import job_gpu_index, wait_for
from slurm_ft.lab.inject import inject_xid
from slurm_ft.lab.users import LAB_USER, ensure_user, run_as

pytestmark = pytest.mark.lab

HW_OUTPUT_ROWS = [r for r in signatures() if r.source in ("output", "any") and r.cls == "hardware"]


@pytest.fixture(scope="module")
def user(lab):
    return ensure_user()


def _submit(lab, script: str, *extra: str) -> int:
    """sbatch ``script`` as the lab's ordinary user; returns the job id."""
    jobs = lab.lay.jobs_dir
    path = jobs / f"hostile-{time.time_ns()}.sh"
    path.write_text(script)
    os.chmod(path, 0o755)
    argv = ["/usr/bin/sbatch", "--parsable", f"--output={jobs}/%j.out", "--gres=gpu:1", *extra, str(path)]
    proc = run_as(LAB_USER, argv, lab.env(), cwd=str(jobs))
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def _journal(lab):
    return open_journal(config_mod.load(lab.lay.ft_conf).journal.path)


def _no_node_action(slurm, lab, job_id: int, *, priority_before: int | None = None) -> None:
    """No drain, no blame, no exclusion, no priority raised, for ``job_id``."""
    for n in slurm.nodes():
        assert not (n.drained and n.reason.startswith("slurm-ft:")), (n.name, n.reason)
    with _journal(lab) as j:
        acts = j.actions(job_id)
        assert not [a for a in acts if a["action"] == "drain" and a["status"] == "done"], acts
        assert not [a for a in acts if "Priority=" in (a["detail"] or "")], acts
        assert not (j.job(job_id) or {}).get("excluded_nodes")
    job = slurm.job(job_id)
    if job is not None:
        assert not job.excluded_nodes
        if priority_before is not None and job.state == "PENDING":
            assert job.priority <= priority_before


@pytest.mark.parametrize("code", [1, 0])
def test_hardware_looking_output_drains_nothing(lab, slurm, user, ft_history, code):
    """Attack 1: print every hardware-looking output row (CUDA ECC text, "GPU is lost", NODE_FAIL
    text...), exit 1 or 0. The epilog runs the trusted GPU checks, finds nothing: no drain; at
    most the site's one unblamed retry, without a priority boost."""
    text = lab.lay.jobs_dir / f"hostile-lines-{time.time_ns()}.txt"
    text.write_text("".join(f"{r.example}\n" for r in HW_OUTPUT_ROWS))
    os.chmod(text, 0o644)
    job_id = _submit(lab, f"#!/bin/sh\ncat {text}\nexit {code}\n", "--ft", "--ft-retries=3")
    if code == 0:
        h = ft_history(job_id, lambda h: h["ft_state"] == "completed", timeout_s=60)
        assert h["attempts"][0]["verdict"] in (None, "ok")  # ok verdicts stay in the node journal
    else:
        # the unblamed retry keeps Slurm's requeue delay (121 s: no queue jumping, and the node's
        # revoked job credential must expire before the job may start there again)
        h = ft_history(job_id, lambda h: h["ft_state"] == "max-retries-exceeded", timeout_s=240)
        assert [a["verdict"] for a in h["attempts"]] == ["unknown", "unknown"]
        assert all(a["rule"].startswith("unverified:") for a in h["attempts"])
    _no_node_action(slurm, lab, job_id)


def _kmsg_since(t0: float) -> list[str]:
    from slurm_ft.classify.sources import read_kmsg
    return read_kmsg(t0)


def test_process_named_like_an_xid_forges_nothing(lab, slurm, user, ft_history):
    """Attack 2: a process named "NVRM: Xid: 79," segfaults, so the kernel prints its name at the
    start of a kernel-log line."""
    t0 = time.monotonic()
    script = f"""#!/bin/sh
exec /usr/bin/python3 -c '
import ctypes
ctypes.CDLL(None).prctl(15, b"NVRM: Xid: 79, ", 0, 0, 0)
print("crashing", flush=True)
ctypes.string_at(0)
'
"""
    job_id = _submit(lab, script, "--ft", "--ft-retries=3")
    h = ft_history(job_id, lambda h: h["ft_state"] not in ("running", "failover-in-progress", "requeued"),
                   timeout_s=60)
    lines = [l for l in _kmsg_since(t0) if l.startswith("NVRM: Xid: 79,") and "segfault" in l]
    assert lines, "the kernel did not print the segfault line (show_unhandled_signals off?)"
    assert h["attempts"][0]["verdict"] != "hardware" and not h["attempts"][0]["xids"]
    _no_node_action(slurm, lab, job_id)


def test_alternating_infra_lines_get_one_unblamed_retry(lab, slurm, user, ft_history):
    """Attack 3: print an infra-looking line, a different one each attempt, to be failed over
    forever with a priority boost and a fresh time limit each time."""
    script = """#!/bin/sh
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then echo 'Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 milliseconds'
else echo 'srun: error: Task launch for 36.0 failed on node n1: Job credential expired'; fi
exit 1
"""
    job_id = _submit(lab, script, "--ft", "--ft-retries=5")
    before = slurm.job(job_id).priority
    h = ft_history(job_id, lambda h: h["ft_state"] == "max-retries-exceeded", timeout_s=240)
    assert len(h["attempts"]) == 2  # one unblamed retry ([failover] unblamed_retries = 1)
    _no_node_action(slurm, lab, job_id, priority_before=before)


def test_owner_cannot_raise_the_budget_by_rewriting_the_comment(lab, slurm, user, ft_history):
    """Attack 6: ``--ft-retries=0``, then ``scontrol update Comment='x,ft:retries=100,...'`` by the
    owner (the comma form the old parser accepted), then a real Xid 79 on its GPU: the budget
    fixed at submit (0) holds: not requeued."""
    job_id = _submit(lab, "#!/bin/sh\nsleep 300\n", "--ft", "--ft-retries=0")
    job = slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 30)
    assert "ft:retries=0," in job.admin_comment
    original = job.comment
    attack = f"x,ft:retries=100,ckpt_wait=5 {original}"
    proc = run_as(LAB_USER, ["/usr/bin/scontrol", "update", f"JobId={job_id}", f"Comment={attack}"], lab.env())
    assert proc.returncode == 0, proc.stderr
    proc = run_as(LAB_USER, ["/usr/bin/scontrol", "update", f"JobId={job_id}",
                             "AdminComment=slurm-ft:running ft:retries=100,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0"],
                  lab.env())
    assert proc.returncode != 0  # AdminComment is the administrators' field
    time.sleep(0.5)
    assert "ft:retries=0," in slurm.job(job_id).admin_comment
    inject_xid(job.nodes, 79, job_gpu_index(slurm, job_id))
    h = ft_history(job_id, lambda h: h["ft_state"] == "max-retries-exceeded", timeout_s=60)
    assert h["retries"] == 0 and len(h["attempts"]) == 1
    assert slurm.job(job_id).restart_count == 0


def test_owner_comment_rewrite_does_not_change_what_an_evacuation_spends(lab, slurm, user):
    """Attack 6b: the checkpoint-before-exit path (``slurm-ft drain --checkpoint``, also what a
    health-check evacuation runs) reads the options fixed at submit, not the live comment: the
    evacuation (not a fault) requeues the job, spends nothing from its retry budget of 0, and the
    journal keeps retries=0 whatever the comment now says."""
    job_id = _submit(lab, "#!/bin/sh\ntrap 'echo saved' USR1\nwhile :; do sleep 1; done\n", "--ft", "--ft-retries=0",
                     "--ft-ckpt-wait=2")
    job = slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 30)
    attack = f"ft:retries=100 {job.comment}"
    run_as(LAB_USER, ["/usr/bin/scontrol", "update", f"JobId={job_id}", f"Comment={attack}"], lab.env())
    out = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "drain", job.nodes, "--checkpoint",
                          "--config", str(lab.lay.ft_conf)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **lab.env()})
    assert "requeued excluding" in out.stdout, out.stdout + out.stderr
    from slurm_ft import config as config_mod
    from slurm_ft.journal import open_journal
    with open_journal(config_mod.load(lab.lay.ft_conf).journal.path) as j:
        assert j.job(job_id)["retries"] == 0 and j.failovers_done(job_id) == 0
    slurm.run("scancel", str(job_id))


def test_fault_storm_trips_the_circuit_breaker(lab, slurm, ft_history):
    """A storm (here: Xid 79 on two nodes at once) past the site's breaker (1 node): slurm-ft
    drains one node, stops draining, still fails both jobs over, and says so until reset."""
    conf = lab.lay.ft_conf
    saved = conf.read_text()
    conf.write_text(saved.replace("max_nodes = 3", "max_nodes = 1"))
    lab.daemon_start()
    try:
        from slurm_ft.lab.demo import submit_training, wait_started
        # one job on each of two nodes (pinned: this test only needs them requeued, not restarted)
        a = submit_training(lab, steps=400, extra=["-w", "n1"])
        b = submit_training(lab, steps=400, extra=["-w", "n2"])
        ja, jb = wait_started(slurm, a), wait_started(slurm, b)
        for sub, job in ((a, ja), (b, jb)):
            inject_xid(job.nodes, 79, job_gpu_index(slurm, sub.job_id))
            # one after the other: epilogs racing at the same instant may each see the count below
            # the limit (docs/security.md, residual risks)
            wait_for(lambda: slurm.job(sub.job_id).restart_count == 1, 60, f"job {sub.job_id} failed over")
        for sub in (a, b):
            again = slurm.wait_job(sub.job_id, lambda j: j.restart_count == 1, 60)
            assert again is not None, f"job {sub.job_id} not failed over"
        drained = [n.name for n in slurm.nodes() if n.drained and n.reason.startswith("slurm-ft:")]
        assert len(drained) == 1, drained
        status = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "breaker", "status", "--config", str(conf)],
                                capture_output=True, text=True, timeout=30, env={**os.environ, **lab.env()})
        assert status.returncode == 3 and "OPEN" in status.stdout, status.stdout + status.stderr
        for sub in (a, b):
            slurm.run("scancel", str(sub.job_id))
    finally:
        conf.write_text(saved)
        subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "breaker", "reset", "--config", str(conf)],
                       capture_output=True, timeout=30, env={**os.environ, **lab.env()})
        lab.daemon_start()


def test_journals_are_not_readable_by_other_users(lab, slurm, user):
    """Attack 5: read the node journals (other users' stderr excerpts) and the daemon journal."""
    jdir = lab.lay.journal_dir
    for path in [*jdir.glob("*.db")]:
        proc = run_as(LAB_USER, ["/bin/cat", str(path)], lab.env())
        assert proc.returncode != 0, f"{path} readable by {LAB_USER}"


@pytest.mark.parametrize("kind", ["char-device", "fifo", "symlinked-dir"])
def test_hostile_output_path_still_gets_a_verdict(lab, slurm, user, kind):
    """Issue 27 item 6: ``-e`` at a device (a copy of /dev/null the test makes: never
    /dev/watchdog), at a FIFO on a path whose directory the user swaps with a symlink during the
    epilog, or through a symlinked directory. The root epilog never opens any of them (IN_OPEN
    watched with inotify; a writer blocked on the FIFO stays blocked), logs why in one line,
    and the job still gets its verdict; no node action."""
    import ctypes
    import shutil
    import stat
    import threading

    from slurm_ft.lab.demo import wait_for

    libc = ctypes.CDLL(None, use_errno=True)
    ns = time.time_ns()
    d = lab.lay.jobs_dir / f"hostile-out-{ns}"
    d.mkdir()
    os.chown(d, user.pw_uid, user.pw_gid)
    os.chmod(d, 0o755)
    devdir = lab.lay.jobs_dir / f"hostile-dev-{ns}"          # root's directory: the user cannot swap it

    def users(p, mode=0o644, data=b""):
        p.write_bytes(data)
        os.chown(p, user.pw_uid, user.pw_gid)
        os.chmod(p, mode)

    def users_dir(p):
        p.mkdir()
        os.chown(p, user.pw_uid, user.pw_gid)
        os.chmod(p, 0o755)

    prepare = ""
    watched = []                                            # nodes the epilog must never open
    if kind == "char-device":
        devdir.mkdir(mode=0o755)
        err = devdir / "err"
        os.mknod(err, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.chown(err, user.pw_uid, user.pw_gid)            # the user's: only its type refuses it
        watched, reason = [err], "character device"
    elif kind == "fifo":
        users_dir(d / "out")
        users_dir(d / "decoy")
        users(d / "decoy" / "err.out", data=b"DECOY\n")
        err = d / "out" / "err.out"
        prepare = f"rm -f {err}; mkfifo -m 600 {err}"   # its stderr stays the unlinked file
        watched, reason = [d / "decoy" / "err.out"], "job output not read"
    else:
        users_dir(d / "real")
        os.symlink("real", d / "link")
        os.lchown(d / "link", user.pw_uid, user.pw_gid)
        err = d / "link" / "err.out"
        watched, reason = [], "is a symbolic link; refusing to follow it"
    script = (f"#!/bin/sh\necho to-stderr >&2\n{prepare}\necho ready\n"
              f"while [ ! -e {d}/go ]; do sleep 0.1; done\nexit 1\n")
    path = d / "job.sh"
    users(path, 0o755, script.encode())
    proc = run_as(LAB_USER, ["/usr/bin/sbatch", "--parsable", f"--output={d}/%j.out", f"--error={err}", str(path)],
                  lab.env(), cwd=str(d))
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip().split(";")[0])
    swapper = None
    fifo_fd = None
    fds = []
    try:
        job = slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 60)
        assert job is not None, f"job {job_id} did not start"
        node = job.nodes
        out = d / f"{job_id}.out"
        wait_for(lambda: out.exists() and "ready" in out.read_text(errors="replace"), 60, "the job's setup")
        if kind == "symlinked-dir":
            watched = [d / "real" / "err.out"]
            assert (d / "real" / "err.out").read_bytes() == b"to-stderr\n"
        opened = threading.Event()
        if kind == "fifo":
            assert stat.S_ISFIFO(os.lstat(err).st_mode)
            fifo_fd = os.open(err, os.O_PATH | os.O_CLOEXEC)    # this FIFO, wherever it is moved
            watched.append(err)

            def writer():                                   # returns only once a reader opened it
                os.close(os.open(f"/proc/self/fd/{fifo_fd}", os.O_WRONLY))
                opened.set()
            threading.Thread(target=writer, daemon=True).start()
        for p in watched:                                   # after Slurm opened the job's output
            ino = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            assert ino >= 0 and libc.inotify_add_watch(ino, bytes(p), 0x20) >= 0   # IN_OPEN
            fds.append(ino)
        if kind == "fifo":
            # the user swaps the directory on the path, with a symlink to the decoy, all along
            swapper = subprocess.Popen(
                ["/usr/sbin/runuser", "-u", LAB_USER, "--", "/bin/sh", "-c",
                 "while [ ! -e stop ]; do mv -T out held; ln -s decoy out; rm out; mv -T held out; done"],
                cwd=str(d), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (d / "go").touch()
        cfg = config_mod.load(lab.lay.ft_conf)

        def verdict():
            with open_journal(cfg.node_journal_path(node)) as j:
                return j.verdicts(job_id)
        (v, *_) = wait_for(verdict, 90, f"the epilog's verdict for job {job_id}")
        assert v["verdict"] in ("user", "unknown"), v
        log = cfg.node_state.log.replace("{node}", node)
        lines = [line for line in open(log, encoding="utf-8") if f" job {job_id} " in line]
        assert any(reason in line for line in lines), lines
        for ino in fds:
            try:
                events = os.read(ino, 4096)
            except BlockingIOError:
                events = b""
            assert events == b"", f"{kind}: the epilog opened a node it must never open"
        assert not opened.is_set(), "the FIFO was opened for reading"
        _no_node_action(slurm, lab, job_id)
    finally:
        (d / "stop").touch()
        if swapper is not None:
            swapper.wait(timeout=30)
        if fifo_fd is not None:                             # release the writer
            os.close(os.open(f"/proc/self/fd/{fifo_fd}", os.O_RDONLY | os.O_NONBLOCK))
            os.close(fifo_fd)
        for ino in fds:
            os.close(ino)
        slurm.run("scancel", str(job_id), check=False)
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(devdir, ignore_errors=True)


def test_small_failing_jobs_do_not_evict_a_hardware_verdict(lab, slurm, user):
    """Issue 27 item 9: a GPU ft job gets a real Xid 79; its epilog posts the hardware verdict in
    its node's mailbox field (``Extra``, at most ``[failover] mailbox_keep`` = 16 records). With the
    daemon stopped (so it cannot read the verdict first), the lab's ordinary user then runs 16
    tiny failing ft jobs on that node, one after the other, each posting its own non-hardware
    record. The hardware record stays in the field (two pools, slurm_ft.failover.verdict.bounded;
    the old newest-16 rule dropped it), and once the daemon runs it acts on it: the GPU job fails
    over to another node and the node is drained with the Xid reason (the test resumed it after
    the epilog's own drain, so this drain is the daemon's, from the mailbox)."""
    from slurm_ft.failover import mailbox
    from slurm_ft.failover.verdict import hardware_reserve
    from slurm_ft.lab.demo import submit_training, wait_started

    def records(node):
        return mailbox.parse(slurm.show_node(node).get("Extra", ""), node)

    gpu_job = submit_training(lab, steps=400)
    first = wait_started(slurm, gpu_job, timeout_s=120)
    node = first.nodes
    small: list[int] = []
    lab.daemon_stop()
    try:
        inject_xid(node, 79, job_gpu_index(slurm, gpu_job.job_id))
        hw = wait_for(lambda: [r for r in records(node) if r.job_id == gpu_job.job_id and r.hardware], 120,
                      f"the hardware record of job {gpu_job.job_id} in {node}'s mailbox")
        assert slurm.job(gpu_job.job_id).restart_count == 0        # nobody acted on it yet
        # the epilog drained the node itself; let the small jobs in (as an admin might)
        wait_for(lambda: slurm.job(gpu_job.job_id).ended, 60, f"job {gpu_job.job_id} to end")
        if any(n.drained for n in slurm.nodes() if n.name == node):
            slurm.resume(node)
        wait_for(lambda: any(n.name == node and not n.drained and n.state.lower() in ("idle", "mixed")
                             for n in slurm.nodes()), 60, f"{node} back in service")
        jobs = lab.lay.jobs_dir
        script = jobs / f"hostile-fail-{time.time_ns()}.sh"
        script.write_text("#!/bin/sh\nexit 1\n")
        os.chmod(script, 0o755)
        for _ in range(16):
            proc = run_as(LAB_USER, ["/usr/bin/sbatch", "--parsable", f"--output={jobs}/%j.out", "-w", node,
                                     "--ft", "--ft-retries=0", str(script)], lab.env(), cwd=str(jobs))
            assert proc.returncode == 0, proc.stderr
            job_id = int(proc.stdout.strip().split(";")[0])
            small.append(job_id)
            rec = wait_for(lambda: [r for r in records(node) if r.job_id == job_id], 120,
                           f"the record of small job {job_id} in {node}'s mailbox")
            assert not rec[0].hardware
        held = records(node)
        assert len(held) == 16, held
        assert hw[0] in held, f"the hardware verdict was evicted: {held}"
        # the rest are the newest small jobs: as many as the hardware records (this one, and any an
        # earlier test left on this node within the field) leave room for; at least their pool's share
        others = {r.job_id for r in held if not r.hardware}
        assert others == set(small[len(small) - len(others):]), (others, small)
        assert len(others) >= 16 - hardware_reserve(16), held
    finally:
        lab.daemon_start()
    again = wait_started(slurm, gpu_job, 1, timeout_s=180)
    assert again.nodes != node and again.restart_count == 1
    reason = wait_for(lambda: (r := slurm.show_node(node).get("Reason", "")).startswith("slurm-ft: Xid 79") and r,
                      60, f"{node} drained with the Xid reason")
    assert f"(job {gpu_job.job_id})" in reason
    assert any(n.drained for n in slurm.nodes() if n.name == node)
    slurm.run("scancel", str(gpu_job.job_id), *map(str, small), check=False)
