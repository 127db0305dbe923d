"""Least privilege for journals: node journals root-only (0600, dirs 0700), the daemon journal
0640 root:[journal] read_group, side files (-wal/-shm) alike, permissions put right when root
reopens for writing, symlinks refused; readers without access get a one-line error.

The tests that read as another user run ``ft-history`` under ``setpriv`` as uid 65534 (tests run
as root)."""

from __future__ import annotations

import grp
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from slurm_ft import config as config_mod
from slurm_ft.errors import ConfigError, JournalError
from slurm_ft.journal import open_daemon_journal, open_journal, open_node_journal

NOGROUP = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="permission tests create root-owned files")
needs_setpriv = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                   reason="needs root and setpriv to run a child as another uid")


def _group_name(gid: int) -> str:
    return grp.getgrgid(gid).gr_name


def _mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _files(db: Path) -> list[Path]:
    return [p for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()]


@as_root
def test_node_journal_is_root_only_with_its_side_files_and_dirs(tmp_path):
    db = tmp_path / "new" / "sub" / "node-n1.db"
    with open_journal(db) as j:
        j.add_verdict(1, 0, "n1", "user", "cuda-oom", [], ["stderr excerpt"])
        files = _files(db)
        assert {p.name for p in files} == {"node-n1.db", "node-n1.db-wal", "node-n1.db-shm"}
        for p in files:
            assert _mode(p) == 0o600 and os.stat(p).st_uid == 0, p
    assert _mode(tmp_path / "new") == 0o700 and _mode(tmp_path / "new" / "sub") == 0o700


@as_root
def test_daemon_journal_is_0640_root_read_group(tmp_path):
    name = _group_name(NOGROUP)
    db = tmp_path / "d" / "journal.db"
    with open_journal(db, read_group=name) as j:
        j.upsert_job(1, name="x", user="u")
        for p in _files(db):
            st = os.stat(p)
            assert (_mode(p), st.st_uid, st.st_gid) == (0o640, 0, NOGROUP), p
    st = os.stat(db.parent)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o750, NOGROUP)


def test_unknown_read_group_is_a_config_error(tmp_path):
    db = tmp_path / "journal.db"
    with pytest.raises(ConfigError, match="journal.read_group.*no-such-group-xyz"):
        open_journal(db, read_group="no-such-group-xyz")
    assert not db.exists()
    cfg = config_mod.from_dict({"journal": {"path": str(db), "read_group": "no-such-group-xyz"}})
    with pytest.raises(ConfigError):
        open_daemon_journal(cfg)


@as_root
def test_root_writer_puts_permissions_back_on_an_existing_journal(tmp_path):
    db = tmp_path / "j.db"
    open_journal(db).close()
    keep = sqlite3.connect(db)                  # another connection keeps -wal/-shm in place
    keep.execute("INSERT INTO jobs (job_id, user) VALUES (3, 'u')")
    keep.commit()
    assert len(_files(db)) == 3
    for p in _files(db):                        # as an older slurm-ft left them
        os.chmod(p, 0o644)
    with open_journal(db):
        assert all(_mode(p) == 0o600 for p in _files(db))
    with open_journal(db, read_group=_group_name(NOGROUP)):
        assert all((_mode(p), os.stat(p).st_gid) == (0o640, NOGROUP) for p in _files(db))
    with open_journal(db):                      # read_group removed from the config: root-only again
        assert all((_mode(p), os.stat(p).st_gid) == (0o600, 0) for p in _files(db))
    keep.close()


@as_root
def test_config_helpers_pick_the_right_permissions(tmp_path):
    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db"), "read_group": _group_name(NOGROUP),
                                            "node_path": str(tmp_path / "node-{node}.db")}})
    open_daemon_journal(cfg).close()
    open_node_journal(cfg, "n1").close()
    assert _mode(tmp_path / "d.db") == 0o640 and _mode(tmp_path / "node-n1.db") == 0o600


def test_writer_refuses_a_symlink_at_the_journal_or_a_side_file(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    before = _mode(target)
    (tmp_path / "j.db").symlink_to(target)
    with pytest.raises(JournalError, match="symlink"):
        open_journal(tmp_path / "j.db")
    db = tmp_path / "k.db"
    open_journal(db).close()
    Path(f"{db}-wal").symlink_to(target)
    with pytest.raises(JournalError, match="symlink"):
        open_journal(db)
    assert target.read_text() == "keep me" and _mode(target) == before


# ------------------------------------------------------------------ as another user (setpriv)
@pytest.fixture
def world_dir():
    """A directory uid 65534 can reach (pytest's tmp_path is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="slurm-ft-test-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def fake_scontrol(directory: Path, private: str = "none") -> Path:
    """A bin dir whose ``scontrol show config`` reports ``PrivateData = private``."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(mode=0o755)
    script = bin_dir / "scontrol"
    script.write_text(f"#!/bin/sh\necho 'Configuration data as of 2025-01-01T00:00:00'\n"
                      f"echo 'PrivateData             = {private}'\necho 'SlurmUser               = slurm(64030)'\n")
    script.chmod(0o755)
    return bin_dir


def write_config(directory: Path, journal: Path, bin_dir: Path, read_group: str = "") -> Path:
    conf = directory / "slurm-ft.toml"
    conf.write_text(f'[journal]\npath = "{journal}"\nread_group = "{read_group}"\n'
                    f'[slurm]\nbin_dir = "{bin_dir}"\n')
    conf.chmod(0o644)
    return conf


def ft_history_as(args: list[str], uid: int = 65534, gid: int = 65534, groups: str | None = None):
    """Run ``ft-history ARGS`` as ``uid``/``gid`` (supplementary groups ``groups``, or none)."""
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}",
            f"--groups={groups}" if groups else "--clear-groups",
            sys.executable, "-m", "slurm_ft.cli.history", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C.UTF-8"})


def _journal_with_jobs(path: Path, read_group: str = "") -> None:
    with open_journal(path, read_group=read_group) as j:
        j.upsert_job(5, name="mine", user="nobody", ft_enabled=1, retries=1, ft_state="running", excluded_nodes="")
        j.upsert_attempt(5, 0, nodes="n1", start=1.0, state="RUNNING")
        j.upsert_job(6, name="theirs", user="alice", ft_enabled=1, retries=1, ft_state="running", excluded_nodes="")


@needs_setpriv
def test_user_without_access_gets_one_line_error(world_dir):
    db = world_dir / "journal.db"
    _journal_with_jobs(db)                      # root-only, 0600
    conf = write_config(world_dir, db, fake_scontrol(world_dir))
    # a user who cannot read the journal asks the history service (test_history_service.py); this
    # fake Slurm names no controller to ask
    r = ft_history_as(["-j", "5", "--config", str(conf)])
    assert r.returncode == 1, r
    err = r.stderr.strip()
    assert "Traceback" not in r.stderr and len(err.splitlines()) == 1, r.stderr
    assert "cannot find the controller to ask for your history" in err
    assert r.stdout == ""


@needs_setpriv
def test_read_group_member_reads_daemon_journal_with_and_without_writer(world_dir):
    group = _group_name(NOGROUP)
    db = world_dir / "jdir" / "journal.db"
    _journal_with_jobs(db, read_group=group)
    conf = write_config(world_dir, db, fake_scontrol(world_dir), read_group=group)
    assert _mode(db.parent) == 0o750 and _mode(db) == 0o640
    # the daemon is running (its connection keeps -wal/-shm): the reader uses them read-only
    with open_journal(db, read_group=group):
        r = ft_history_as(["-j", "5", "--config", str(conf)])
        assert r.returncode == 0 and "Job 5 (mine)" in r.stdout, r
    # no writer: no -wal/-shm, the reader may not create them, and reads the file as it is
    assert not Path(f"{db}-wal").exists()
    r = ft_history_as(["-j", "5", "--config", str(conf)])
    assert r.returncode == 0 and "Job 5 (mine)" in r.stdout, r
    assert not Path(f"{db}-shm").exists()       # the reader wrote nothing
    # not in the group: refused, one line
    r = ft_history_as(["-j", "5", "--config", str(conf), "--journal", str(db)], gid=1)
    assert r.returncode == 1 and "permission denied" in r.stderr and "Traceback" not in r.stderr, r
