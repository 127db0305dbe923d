"""Lab directory safety (no Slurm daemon is started here): root refuses a lab directory another
user could have prepared in a shared parent (a symlink, someone else's directory, a
group/world-writable one, a planted symlink inside) and never writes through a symlink; its own
directory stays reusable."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time

import pytest
from click.testing import CliRunner

from slurm_ft.cli.main import main
from slurm_ft.errors import LabError
from slurm_ft.lab import cluster
from slurm_ft.lab.cluster import Lab, check_lab_dir, write_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the lab runs as root; these tests chown files")


def _mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_creates_its_own_dir_0755_and_accepts_it_again(tmp_path):
    d = tmp_path / "lab"
    old = os.umask(0o077)
    try:
        assert check_lab_dir(d, create=True)
    finally:
        os.umask(old)
    assert _mode(d) == 0o755 and os.lstat(d).st_uid == 0
    (d / "lab.json").write_text("{}")
    assert check_lab_dir(d, create=True) and check_lab_dir(d)
    assert check_lab_dir(tmp_path / "missing") is False


@pytest.mark.parametrize("hostile, message", [
    ("other_owner", "owned by uid 65534, not root"),
    ("world_writable", "writable by group or others"),
    ("symlink", "is a symlink"),
    ("file", "not a directory"),
    ("planted_symlink", "a symlink in the lab directory"),
    ("planted_file", "owned by uid 65534 in the lab directory"),
])
def test_refuses_a_hostile_lab_dir(tmp_path, hostile, message):
    d = tmp_path / "lab"
    victim = tmp_path / "victim"
    victim.mkdir()
    if hostile == "other_owner":
        d.mkdir(mode=0o755)
        os.chown(d, 65534, 65534)
    elif hostile == "world_writable":
        d.mkdir()
        os.chmod(d, 0o777)
    elif hostile == "symlink":
        d.symlink_to(victim)
    elif hostile == "file":
        d.write_text("")
    elif hostile == "planted_symlink":
        d.mkdir(mode=0o755)
        (d / "slurm.conf").symlink_to(victim / "passwd")
    elif hostile == "planted_file":
        d.mkdir(mode=0o755)
        (d / "lab.json").write_text("{}")
        os.chown(d / "lab.json", 65534, 65534)
    with pytest.raises(LabError, match=message):
        check_lab_dir(d, create=True)
    assert list(victim.iterdir()) == []


def test_refuses_unsafe_parents_but_accepts_sticky_shared_ones(tmp_path):
    shared = tmp_path / "vartmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)                                  # like /var/tmp
    assert check_lab_dir(shared / "lab", create=True)
    os.chmod(shared, 0o777)                                   # no sticky bit: others may rename our dir
    with pytest.raises(LabError, match="without the sticky bit"):
        check_lab_dir(shared / "lab")
    os.chmod(shared, 0o755)
    os.chown(shared, 65534, 65534)
    with pytest.raises(LabError, match="owned by uid 65534"):
        check_lab_dir(shared / "lab")


def test_write_file_never_follows_a_symlink(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(LabError, match="symlink"):
        write_file(tmp_path / "link", "overwritten")
    assert target.read_text() == "keep"
    write_file(tmp_path / "plain", "ok")
    assert (tmp_path / "plain").read_text() == "ok"


def test_lab_up_refuses_hostile_dir_with_one_line_error(tmp_path):
    d = tmp_path / "lab"
    d.mkdir(mode=0o755)
    os.chown(d, 65534, 65534)
    r = CliRunner().invoke(main, ["lab", "up", "--dir", str(d)])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.startswith("Error: ") and "owned by uid 65534" in r.output and len(r.output.splitlines()) == 1
    assert list(d.iterdir()) == []                            # nothing written into it
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    r = CliRunner().invoke(main, ["lab", "up", "--dir", str(link)])
    assert r.exit_code == 1 and "symlink" in r.output and list((tmp_path / "real").iterdir()) == []


def test_lab_down_never_signals_pids_from_a_hostile_state_file(tmp_path):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        start = cluster._proc_start(victim.pid)
        d = tmp_path / "lab"
        d.mkdir(mode=0o755)
        (d / "lab.json").write_text(json.dumps({"procs": [{"name": "slurmctld", "pid": victim.pid, "start": start}]}))
        os.chown(d, 65534, 65534)                             # a user prepared this directory
        r = CliRunner().invoke(main, ["lab", "down", "--dir", str(d)])
        assert r.exit_code == 1 and "owned by uid 65534" in r.output
        with pytest.raises(LabError):
            Lab(d).daemon_stop()
        time.sleep(0.1)
        assert victim.poll() is None                          # still alive
    finally:
        victim.kill()
        victim.wait()


def test_fresh_files_idempotent_in_own_dir_jobs_sticky(tmp_path):
    lab = Lab(tmp_path / "lab")
    lab._fresh_files(["n1"], log=lambda *_: None)
    d = lab.lay.dir
    assert _mode(d) == 0o755 and _mode(d / "jobs") == 0o1777 and _mode(d / "journal") == 0o755
    assert "NodeName=n1" in lab.lay.slurm_conf.read_text()
    (d / "jobs" / "1.out").write_text("job output")           # a job's output: archived on the next start
    (d / "run" / "slurmctld.pid").write_text("999999")        # stale state of a killed lab
    lab._fresh_files(["n1"], log=lambda *_: None)
    assert not (d / "run" / "slurmctld.pid").exists() and _mode(d / "jobs") == 0o1777
    archived = list((d / "archive").glob("*/jobs/1.out"))
    assert len(archived) == 1 and archived[0].read_text() == "job output"
    os.remove(lab.lay.gres_conf)
    lab.lay.gres_conf.symlink_to(tmp_path / "elsewhere")       # planted (needs root, but never followed)
    with pytest.raises(LabError, match="symlink"):
        lab._fresh_files(["n1"], log=lambda *_: None)
    assert not (tmp_path / "elsewhere").exists()
