"""Hang detection (issue 13) without Slurm: the heartbeat format and its hostile-input reader, the
window state machine (grace, slow steady jobs, saves, output and GPU fallbacks), the root-side
file handling (the job's directory, its output opened as the job's user, py-spy as the job's
user), the watcher's act on a hang, and the prolog hook."""

from __future__ import annotations

import os
import stat
import subprocess
import time

import pytest

from slurm_ft import config
from slurm_ft.hang import evidence, heartbeat as hb, watcher as wt
from slurm_ft.data.client import slurm_ft_job as job_client  # the heartbeat writer hb re-exports
from slurm_ft.hang.watcher import Progress, Sample

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the watcher's side runs as root)")


# ------------------------------------------------------------------------------ heartbeat format
def test_pack_unpack_round_trip_and_garbage_is_refused():
    b = hb.Beat(7, 12.5, 1.7e9, 120, hb.SAVING, 4242, 11.0)
    assert hb.unpack(hb.pack(b)) == b and len(hb.pack(b)) == hb.SIZE
    assert hb.unpack(b"x" * 64) is None
    assert hb.unpack(hb.pack(b)[:20]) is None
    bad_state = bytearray(hb.pack(b))
    bad_state[40] = 9                                    # state field (bytes 40-43)
    assert hb.unpack(bytes(bad_state)) is None
    import struct
    nan = bytearray(hb.pack(b))
    struct.pack_into("<d", nan, 16, float("nan"))        # mono
    assert hb.unpack(bytes(nan)) is None


def test_writer_beats_are_seen_by_the_reader(tmp_path):
    w = hb.Writer(str(tmp_path), pid=123)
    w.beat(1)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        first = hb.read_dir(fd, os.geteuid())["123.hb"]
        w.beat(2, saving=True)
        second = hb.read_dir(fd, os.geteuid())["123.hb"]
        w.beat(3)
        third = hb.read_dir(fd, os.geteuid())["123.hb"]
    finally:
        os.close(fd)
    assert (first.step, first.seq, first.saving) == (1, 1, False)
    assert (second.step, second.seq, second.saving) == (2, 2, True) and second.since > 0
    assert (third.saving, third.since) == (False, 0.0)
    w.close()
    assert not (tmp_path / "123.hb").exists()


def test_a_beat_is_cheap():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        w = hb.Writer(d, pid=1)
        t0 = time.perf_counter()
        for i in range(20000):
            w.beat(i)
        per = (time.perf_counter() - t0) / 20000
    assert per < 20e-6, f"{per * 1e6:.1f} µs per beat"


def test_heartbeat_finds_the_job_directory_from_the_config(tmp_path, monkeypatch):
    root = tmp_path / "hb" / "n7"
    (root / "55").mkdir(parents=True)
    conf = tmp_path / "ft.toml"
    conf.write_text(f'[hang]\nheartbeat_dir = "{tmp_path}/hb/{{node}}"\n')
    env = {"SLURM_JOB_ID": "55", "SLURMD_NODENAME": "n7", "SLURM_FT_CONFIG": str(conf)}
    monkeypatch.setattr(job_client, "_writer", None)
    monkeypatch.setattr(job_client, "_next_try", 0.0)
    assert hb.heartbeat(3, env=env)
    assert hb.heartbeat(4)                     # then one store into memory
    (f,) = list((root / "55").iterdir())
    assert hb.unpack(f.read_bytes()).step == 4
    assert hb.mark_inplace(env) and (root / "55" / hb.INPLACE_MARK).exists()
    monkeypatch.setattr(job_client, "_writer", None)
    monkeypatch.setattr(job_client, "_next_try", 0.0)
    assert not hb.heartbeat(1, env={"SLURM_JOB_ID": "56", "SLURMD_NODENAME": "n7", "SLURM_FT_CONFIG": str(conf)})
    assert not hb.heartbeat(1, env={})         # not in a job: nothing, and no error


@root_only
def test_reader_is_safe_against_what_the_job_plants(tmp_path):
    """The job owns its directory. Root reads it: no link followed, no FIFO blocks, no file of
    another user (a hard link to root's file), nothing oversized, a bounded number of files."""
    d = tmp_path / "job"
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    secret = tmp_path / "secret"
    secret.write_bytes(hb.pack(hb.Beat(1, 1.0, 1.0, 999, 0, 1, 0.0)))      # root's file, valid content
    good = hb.Beat(5, 2.0, 2.0, 5, 0, 10, 0.0)

    def plant(name, data=None):
        p = d / name
        p.write_bytes(data if data is not None else hb.pack(good))
        os.chown(p, NOBODY, NOBODY)
    plant("10.hb")
    os.symlink(secret, d / "11.hb")                      # symlink to root's file
    os.link(secret, d / "12.hb")                         # hard link: root-owned
    os.mkfifo(d / "13.hb")                               # a FIFO would block a plain open
    os.chown(d / "13.hb", NOBODY, NOBODY)
    plant("14.hb", hb.pack(good) + b"\0" * 8192)         # oversized
    plant("notes.txt")                                   # not a heartbeat name
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        t0 = time.monotonic()
        got = hb.read_dir(fd, NOBODY)
        assert time.monotonic() - t0 < 1.0
        assert list(got) == ["10.hb"] and got["10.hb"].step == 5
        for i in range(300):
            plant(f"{1000 + i}.hb")
        assert len(hb.read_dir(fd, NOBODY)) <= hb.MAX_FILES
        os.symlink(secret, d / hb.INPLACE_MARK)
        assert not hb.inplace_marked(fd, NOBODY)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ the window
def beats(seq, mono, saving=False, since=0.0):
    return {"1.hb": hb.Beat(seq, mono, mono, seq, hb.SAVING if saving else 0, 1, since)}


def test_no_verdict_before_grace_plus_window():
    p = Progress(start=0.0, window_s=60, grace_s=1800)
    for t in range(0, 1860, 30):
        p.observe(t, Sample())
        assert not p.hung(t), t
    p.observe(1861, Sample())
    assert p.hung(1861)


def test_a_job_that_stops_beating_is_hung_one_window_after_its_last_beat():
    p = Progress(0.0, 60, 10)
    for t in range(0, 200, 2):
        p.observe(t, Sample(beats(t, t)))
    assert not p.hung(200)
    for t in range(200, 260, 2):
        p.observe(t, Sample(beats(99, 198)))               # the same beat again: no progress
    assert not p.hung(257)
    p.observe(260, Sample(beats(99, 198)))
    assert p.hung(260) and 59 <= p.quiet_s(260) <= 62


@pytest.mark.parametrize("step_s", [1, 20, 45, 59])
def test_a_slow_but_steady_job_is_never_hung(step_s):
    p = Progress(0.0, 60, 5)
    for t in range(0, 20 * 3600, 2):     # a look every 2 s; a beat every step_s
        seq = t // step_s
        p.observe(t, Sample(beats(seq, seq * step_s)))
        assert not p.hung(t), (step_s, t)


def test_a_save_longer_than_the_window_pauses_it_within_the_site_bound():
    p = Progress(0.0, 60, 5, save_max_s=600)
    p.observe(10, Sample(beats(1, 10)))
    for t in range(12, 400, 2):                           # a 390 s checkpoint
        p.observe(t, Sample(beats(2, 11, saving=True, since=11)))
        assert not p.hung(t)
    for t in range(400, 700, 2):                           # still "saving" past the bound
        p.observe(t, Sample(beats(2, 11, saving=True, since=11)))
    assert p.hung(698)


def test_without_heartbeats_output_growth_or_busy_gpus_count():
    p = Progress(0.0, 60, 5, busy_util_pct=5)
    size = 0
    for t in range(0, 600, 2):
        if t % 40 == 0:
            size += 10
        p.observe(t, Sample(output_size=size, util={0: 0}))
        assert not p.hung(t)
    for t in range(600, 700, 2):
        p.observe(t, Sample(output_size=size, util={0: 97}))   # silent but computing
        assert not p.hung(t)
    for t in range(700, 770, 2):
        p.observe(t, Sample(output_size=size, util={0: 0, 1: 2}))
    assert p.hung(768)
    # once a job has beaten, only heartbeats count (its log chatter does not hide a hang)
    q = Progress(0.0, 60, 0)
    q.observe(1, Sample(beats(1, 1)))
    for t in range(2, 80, 2):
        q.observe(t, Sample(output_size=t, util={0: 100}))
    assert q.hung(78)


def test_restart_gives_a_fresh_window_with_grace():
    p = Progress(0.0, 60, 30)
    p.observe(100, Sample())
    assert p.hung(100)
    p.restart(100)
    p.observe(150, Sample())
    assert not p.hung(150) and p.hung(190)


# ------------------------------------------------------------------------------ root-side files
@root_only
def test_job_directory_is_made_by_root_and_given_to_the_user(tmp_path):
    root = tmp_path / "hb"
    d = wt.make_job_dir(str(root), 42, NOBODY, NOBODY)
    st = os.lstat(d)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == NOBODY
    assert os.lstat(root).st_uid == 0 and not os.lstat(root).st_mode & 0o022
    # the previous attempt's files go (stale beats would count as a job that uses the helper)
    (root / "42" / "1.hb").write_bytes(b"x")
    target = tmp_path / "keep"
    target.mkdir()
    (target / "precious").write_text("x")
    os.symlink(target, root / "42" / "link")
    wt.make_job_dir(str(root), 42, NOBODY, NOBODY)
    assert os.listdir(root / "42") == [] and (target / "precious").exists()
    wt.remove_dir(d)
    assert not os.path.exists(d) and (target / "precious").exists()


@root_only
def test_heartbeat_root_must_be_roots_and_closed(tmp_path):
    from slurm_ft.errors import ConfigError
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(ConfigError):
        wt.make_job_dir(str(open_dir / "hb"), 1, NOBODY, NOBODY)
    user_dir = tmp_path / "users"
    user_dir.mkdir()
    os.chown(user_dir, NOBODY, NOBODY)
    with pytest.raises(ConfigError):
        wt.secure_root(str(user_dir))
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    with pytest.raises(ConfigError):
        wt.secure_root(str(tmp_path / "link"))


@pytest.fixture
def open_tmp():
    """A directory every user may enter (pytest's tmp_path sits under root's 0700 directory)."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="slurm-ft-hang-test-", dir="/tmp")
    os.chmod(d, 0o755)
    yield __import__("pathlib").Path(d)
    shutil.rmtree(d, ignore_errors=True)


@root_only
def test_output_is_opened_as_the_job_user_never_as_root(open_tmp):
    tmp_path = open_tmp
    mine = tmp_path / "job.out"
    mine.write_text("hello")
    os.chown(mine, NOBODY, NOBODY)
    fd = evidence.open_as_user(str(mine), NOBODY, NOBODY)
    assert fd is not None and os.fstat(fd).st_size == 5
    os.close(fd)
    secret = tmp_path / "shadow"
    secret.write_text("root only")
    os.chmod(secret, 0o600)
    assert evidence.open_as_user(str(secret), NOBODY, NOBODY) is None          # the user may not read it
    world = tmp_path / "world"
    world.write_text("readable by all, but root's")
    os.chmod(world, 0o644)
    assert evidence.open_as_user(str(world), NOBODY, NOBODY) is None           # not the job's file
    os.symlink(mine, tmp_path / "link.out")
    assert evidence.open_as_user(str(tmp_path / "link.out"), NOBODY, NOBODY) is None
    os.mkfifo(tmp_path / "fifo.out")
    os.chown(tmp_path / "fifo.out", NOBODY, NOBODY)
    t0 = time.monotonic()
    assert evidence.open_as_user(str(tmp_path / "fifo.out"), NOBODY, NOBODY) is None
    assert time.monotonic() - t0 < 5


@root_only
def test_py_spy_runs_as_the_job_user_and_its_absence_is_said(tmp_path):
    assert "py-spy is not installed" in evidence.stack_dump(None, os.getpid(), NOBODY, NOBODY, 5)
    py_spy = evidence.find_py_spy()
    if py_spy is None:
        pytest.skip("py-spy not installed")
    # a root process cannot be dumped by an ordinary user's py-spy: root never reads it for the job
    out = evidence.stack_dump(py_spy, os.getpid(), NOBODY, NOBODY, 20)
    assert out.startswith("no stack dump"), out
    # an own process is dumped
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no system python3 for a process of another user")
    child = subprocess.Popen(["/usr/bin/python3", "-c", "import time\ndef stuck():\n    time.sleep(60)\nstuck()"],
                             user=NOBODY, group=NOBODY, extra_groups=[], cwd="/")
    try:
        time.sleep(0.5)
        out = evidence.stack_dump(py_spy, child.pid, NOBODY, NOBODY, 20)
    finally:
        child.kill()
        child.wait()
    assert "stuck" in out, out
    # a py-spy that others could have replaced is not run
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\n")
    os.chmod(fake, 0o777)
    assert evidence.find_py_spy(str(fake)) is None


def test_fake_gpu_utilisation_comes_from_the_inventory(tmp_path):
    from slurm_ft.nvml import fake
    fake.write_inventory(str(tmp_path / "n1.json"), "n1", [{"index": 0}, {"index": 1, "utilization_gpu": 87}])
    cfg = config.from_dict({"nvml": {"backend": "fake", "inventory": str(tmp_path / "{node}.json")}})
    assert evidence.gpu_utilisation(cfg, "n1", None) == {0: 0, 1: 87}
    assert evidence.gpu_utilisation(cfg, "n1", (1,)) == {1: 87}
    assert evidence.gpu_utilisation(cfg, "n9", None) == {}


# ------------------------------------------------------------------------------ acting on a hang
class FakeSlurm:
    def __init__(self):
        self.extra = ""

    def show_node(self, node):
        return {"Extra": self.extra}

    def update_node(self, node, **f):
        self.extra = f["Extra"]

    def job(self, job_id):
        return None


def test_on_hang_records_evidence_posts_the_verdict_and_ends_the_processes(tmp_path, monkeypatch):
    from slurm_ft.failover import mailbox
    from slurm_ft.hang import procs
    from slurm_ft.journal import open_journal
    cfg = config.from_dict({"journal": {"node_path": str(tmp_path / "node-{node}.db")},
                            "node_state": {"dir": str(tmp_path / "state")},
                            "hang": {"heartbeat_dir": str(tmp_path / "hb" / "{node}"), "kill_wait_s": 0.0,
                                     "grace_s": 0.0, "py_spy": "/nonexistent/py-spy"}})
    (tmp_path / "hb" / "n1" / "9").mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    fake_procs = [procs.Proc(sleeper.pid, 1, os.geteuid(), "sleep", 9, "batch", procs.identity(sleeper.pid)[0])]
    monkeypatch.setattr(procs, "scan", lambda *a, **k: [p for p in fake_procs if sleeper.poll() is None])
    monkeypatch.setattr(evidence, "kernel_verdict", lambda *a, **k: None)
    slurm = FakeSlurm()
    w = wt.Watch(9, 0, "n1", os.geteuid(), os.getegid(), (0,), 60.0, 0.0)
    logs = []
    watcher = wt.Watcher(cfg, w, slurm, logs.append, clock=lambda: 100.0, sleep=lambda s: time.sleep(0.05))
    watcher.open()
    watcher.progress.observe(100.0, Sample())
    assert watcher.progress.hung(100.0)
    watcher.on_hang(100.0)
    sleeper.wait(5)
    assert sleeper.returncode is not None and watcher.ended
    (rec,) = mailbox.parse(slurm.extra)
    assert (rec.job_id, rec.attempt, rec.verdict, rec.rule) == (9, 0, "hang", "no-progress")
    with open_journal(tmp_path / "node-n1.db") as j:
        (v,) = j.verdicts(9)
    assert v["source"] == "watcher" and "no progress for 100 s (window 60 s" in v["evidence"][0]
    assert any("py-spy" in line and "no stack dump" in line for line in v["evidence"])
    watcher.close()
    assert not (tmp_path / "hb" / "n1" / "9").exists()


def test_on_hang_with_a_trusted_kernel_hardware_record_blames_the_node(tmp_path, monkeypatch):
    from slurm_ft.classify.model import Verdict
    from slurm_ft.failover import mailbox
    from slurm_ft.hang import procs
    cfg = config.from_dict({"journal": {"node_path": str(tmp_path / "node-{node}.db")},
                            "node_state": {"dir": str(tmp_path / "state")},
                            "hang": {"heartbeat_dir": str(tmp_path / "hb" / "{node}"), "act": False}})
    monkeypatch.setattr(procs, "scan", lambda *a, **k: [])
    kv = Verdict("hardware", "xid-79", (), ("NVRM: Xid (PCI:0000:10:00): 79, ...",), "drain_node")
    monkeypatch.setattr(evidence, "kernel_verdict", lambda *a, **k: kv)
    slurm = FakeSlurm()
    watcher = wt.Watcher(cfg, wt.Watch(9, 1, "n1", 0, 0, (0,), 60.0, 0.0), slurm, lambda m: None)
    watcher.on_hang(100.0)
    (rec,) = mailbox.parse(slurm.extra)
    assert (rec.verdict, rec.rule, rec.attempt) == ("hardware", "xid-79", 1)
    assert watcher.ended          # act = false: recorded only, once


def test_watcher_stops_when_the_epilog_removed_the_start_marker(tmp_path, monkeypatch):
    cfg = config.from_dict({"node_state": {"dir": str(tmp_path)}, "hang": {"poll_s": 0.01,
                                                                           "heartbeat_dir": str(tmp_path / "hb")}})
    w = wt.Watch(3, 0, "n1", os.geteuid(), os.getegid(), None, 60.0, time.monotonic())
    marker = tmp_path / "3.n1.json"
    marker.write_text("{}")
    calls = []

    def sleep(s):
        calls.append(s)
        if len(calls) == 5:
            marker.unlink()
    monkeypatch.setattr(evidence, "gpu_utilisation", lambda *a: {})
    watcher = wt.Watcher(cfg, w, FakeSlurm(), lambda m: None, sleep=sleep)
    assert watcher.run() == "the job left the node" and watcher.looks == 4


# ------------------------------------------------------------------------------ the prolog hook
def test_prolog_starts_a_watcher_only_when_the_job_asked(tmp_path, monkeypatch):
    from slurm_ft.node import prolog
    from slurm_ft.node.job import NodeJob
    started = []
    monkeypatch.setattr(wt, "start", lambda cfg, job, env, log: started.append(job.job_id))
    job = NodeJob(5, "n1", 0, 0, None, None, None, None, None, None)
    prolog.start_hang_watch(config.Config(), job, {"SPANK_FT": "1"}, print)
    prolog.start_hang_watch(config.Config(), job, {"SPANK_FT_HANG_TIMEOUT": "0"}, print)
    prolog.start_hang_watch(config.Config(), job, {"SPANK_FT_HANG_TIMEOUT": "x; rm -rf /"}, print)
    assert started == []
    prolog.start_hang_watch(config.Config(), job, {"SPANK_FT_HANG_TIMEOUT": "600"}, print)
    assert started == [5]

    def boom(*a):
        raise OSError("disk full")
    monkeypatch.setattr(wt, "start", boom)
    logs = []
    prolog.start_hang_watch(config.Config(), job, {"SPANK_FT_HANG_TIMEOUT": "600"}, logs.append)  # never raises
    assert "hang watcher not started" in logs[0]


def test_window_comes_from_the_submit_time_record_not_the_hint():
    class S:
        def __init__(self, admin):
            from slurm_ft.slurm import Job
            self.j = Job.from_json({"job_id": 4, "job_state": "RUNNING", "admin_comment": admin, "user_id": 1000,
                                    "group_id": 100})

        def job(self, job_id):
            return self.j
    tok = "slurm-ft:submitted ft:retries=3,ckpt_signal=USR1,ckpt_wait=600,hang_timeout={}"
    assert wt.window_of(S(tok.format(300)), 4)[:3] == (300.0, 1000, 100)
    assert wt.window_of(S(tok.format(0)), 4)[0] is None
    assert wt.window_of(S("slurm-ft:submitted ft:retries=100000"), 4)[0] is None
    assert wt.window_of(S(""), 4)[0] is None


def test_hang_config_is_validated():
    from slurm_ft.errors import ConfigError
    for bad in ({"poll_s": 0}, {"grace_s": -1}, {"busy_util_pct": 101}, {"heartbeat_dir": "relative"},
                {"py_spy": "py-spy"}, {"nope": 1}):
        with pytest.raises(ConfigError):
            config.from_dict({"hang": bad})
    c = config.from_dict({"hang": {"heartbeat_dir": "/run/x/{node}"}})
    assert c.heartbeat_root("n3") == "/run/x/n3" and c.hang.grace_s == 1800.0


def test_procs_scan_follows_stepd_trees_only(tmp_path):
    """A fake /proc: two stepds of job 7 (one of another lab by SLURM_CONF, one without it, as
    systemd's slurmd starts them), a user process named slurmstepd, the extern step."""
    from slurm_ft.hang import procs

    def proc(pid, ppid, comm, uid=0, cmdline=b"", env=b""):
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 0 0")
        (d / "cmdline").write_bytes(cmdline)
        (d / "environ").write_bytes(env)
        (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        os.chown(d, uid, uid) if os.geteuid() == 0 else None
    proc(10, 1, "slurmstepd", cmdline=b"slurmstepd: [7.0]\0", env=b"SLURM_CONF=/lab/a.conf\0")
    proc(11, 10, "python", uid=1000, env=b"SLURMD_NODENAME=n1\0")
    proc(12, 11, "python", uid=1000, env=b"SLURMD_NODENAME=n1\0")
    proc(20, 1, "slurmstepd", cmdline=b"slurmstepd: [7.batch]\0", env=b"SLURM_CONF=/lab/b.conf\0")
    proc(21, 20, "bash", uid=1000)
    proc(30, 1, "slurmstepd", cmdline=b"slurmstepd: [7.1]\0")                 # no SLURM_CONF: ours
    proc(31, 30, "sleep", uid=1000, env=b"SLURMD_NODENAME=n2\0")
    proc(40, 1, "slurmstepd", uid=1000, cmdline=b"slurmstepd: [7.2]\0")       # a user's fake stepd
    proc(41, 40, "python", uid=1000)
    proc(50, 1, "slurmstepd", cmdline=b"slurmstepd: [7.extern]\0")
    proc(51, 50, "sleep", uid=0)
    proc(60, 1, "slurmstepd", uid=1000, cmdline=b"slurmstepd: [7.3]\0")       # a user's fake stepd, made
    os.chown(tmp_path / "60", 0, 0) if os.geteuid() == 0 else None               # non-dumpable: /proc/60 is root's
    proc(61, 60, "python", uid=1000)
    if os.geteuid() != 0:
        pytest.skip("needs root to give the fake /proc entries their owners")
    got = procs.scan(7, conf="/lab/a.conf", proc_root=str(tmp_path))
    assert [(p.pid, p.step) for p in got] == [(11, "0"), (12, "0"), (31, "1")]
    assert [p.pid for p in procs.scan(7, conf="/lab/a.conf", node="n1", proc_root=str(tmp_path))] == [11, 12]
    assert [p.pid for p in procs.roots(got)] == [11, 31]
    assert procs.scan(8, proc_root=str(tmp_path)) == []
    assert {p.pid for p in procs.scan(7, proc_root=str(tmp_path))} == {11, 12, 21, 31}


@root_only
def test_an_output_file_that_appears_after_the_watcher_started_is_watched(open_tmp, monkeypatch):
    cfg = config.from_dict({"hang": {"heartbeat_dir": str(open_tmp / "hb")}})
    out = open_tmp / "7.out"
    w = wt.Watch(7, 0, "n1", NOBODY, NOBODY, None, 60.0, 0.0, stdout=str(out))
    monkeypatch.setattr(evidence, "gpu_utilisation", lambda *a: {})
    watcher = wt.Watcher(cfg, w, FakeSlurm(), lambda m: None)
    watcher.open()
    assert watcher.sample().output_size is None          # Slurm has not made it yet
    out.write_text("step 1\n")
    os.chown(out, NOBODY, NOBODY)
    assert watcher.sample().output_size == 7
    watcher.close()


@root_only
def test_epilog_backstop_stops_a_leftover_watcher_and_removes_its_directory(tmp_path):
    """A watcher that outlived its job (slurmd restarted, the watcher missed the end): the
    epilog removes the heartbeat directory and stops that watcher, and only that one: a pid
    file naming a process that is not this job's watcher (a recycled pid) signals nothing."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace
    root, state = tmp_path / "hb", tmp_path / "state"
    state.mkdir()
    cfg = SimpleNamespace(heartbeat_root=lambda node: str(root / node), node_state=SimpleNamespace(dir=str(state)))
    wt.make_job_dir(str(root / "n1"), 77, NOBODY, NOBODY)
    sleeper = "import time; time.sleep(60)"
    watcher = subprocess.Popen([sys.executable, "-c", sleeper, "slurm_ft.hang.watcher", "--job", "77"])
    other = subprocess.Popen([sys.executable, "-c", sleeper, "something-else", "--job", "77"])
    try:
        Path(wt.pid_file(cfg, 77, "n1")).write_text(f"{watcher.pid}\n")
        assert wt.epilog_cleanup(cfg, 77, "n1") is True
        assert watcher.wait(10) == -15
        assert not os.path.exists(hb.job_dir(str(root / "n1"), 77))
        assert not os.path.exists(wt.pid_file(cfg, 77, "n1"))
        Path(wt.pid_file(cfg, 78, "n1")).write_text(f"{other.pid}\n")
        assert wt.epilog_cleanup(cfg, 78, "n1") is False and other.poll() is None
        assert wt.epilog_cleanup(cfg, 79, "n1") is False          # nothing there: nothing to do
    finally:
        for p in (watcher, other):
            p.kill()
            p.wait()
