"""`slurm-ft daemon --log-file PATH` (issue 24, item 7): a daemon run without systemd logs to a
root-owned file that rotates itself, never through a symlink nor into a directory another user
can change (slurm_ft/failover/logfile.py)."""

from __future__ import annotations

import logging
import os
import stat

import pytest
from click.testing import CliRunner

from slurm_ft.admin import install
from slurm_ft.failover import logfile
from slurm_ft.cli.main import main


@pytest.fixture
def logdir(tmp_path):
    d = tmp_path / "log"
    d.mkdir(mode=0o750)
    if install.untrusted(d):
        pytest.skip(f"tmp dir not root-safe: {install.untrusted(d)}")
    return d


@pytest.fixture(autouse=True)
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        if h not in handlers:
            h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_log_lines_go_to_the_file_and_it_rotates(logdir):
    path = logdir / "daemon.log"
    logging.getLogger().setLevel(logging.INFO)
    handler = logfile.attach(str(path), max_bytes=2000, backups=2)
    log = logging.getLogger("slurm_ft.daemon")
    for i in range(200):
        log.info("cycle %d: nothing to do %s", i, "x" * 40)
    handler.flush()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_uid == os.geteuid()
    assert (logdir / "daemon.log.1").is_file() and (logdir / "daemon.log.2").is_file()
    assert not (logdir / "daemon.log.3").exists()                  # backups=2
    assert path.stat().st_size <= 2000
    assert "cycle 199: nothing to do" in path.read_text()
    assert stat.S_IMODE((logdir / "daemon.log.1").stat().st_mode) == 0o640


def test_a_symlink_at_the_path_is_refused_never_followed(logdir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (logdir / "daemon.log").symlink_to(victim)
    with pytest.raises(logfile.LogFileError, match="daemon.log"):
        logfile.attach(str(logdir / "daemon.log"))
    assert victim.read_text() == "keep\n"


def test_a_hard_link_another_users_file_or_a_fifo_is_refused(logdir, tmp_path):
    other = logdir / "other"
    other.write_text("")
    os.link(other, logdir / "linked.log")
    with pytest.raises(logfile.LogFileError, match="hard links"):
        logfile.attach(str(logdir / "linked.log"))
    theirs = logdir / "theirs.log"
    theirs.write_text("")
    os.chown(theirs, 65534, 65534)
    with pytest.raises(logfile.LogFileError, match="owned by uid 65534"):
        logfile.attach(str(theirs))
    os.mkfifo(logdir / "fifo.log")                                 # refused at once, never blocking on it
    with pytest.raises(logfile.LogFileError, match="fifo.log: (not a regular file|No such device)"):
        logfile.attach(str(logdir / "fifo.log"))
    os.mkdir(logdir / "dir.log")
    with pytest.raises(logfile.LogFileError, match="dir.log"):
        logfile.attach(str(logdir / "dir.log"))


def test_a_directory_others_can_write_is_refused(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)                                                # sticky, world-writable, like /tmp
    with pytest.raises(logfile.LogFileError, match="writable by group or others"):
        logfile.attach(str(d / "daemon.log"))
    assert not (d / "daemon.log").exists()


def test_daemon_command_logs_to_the_file(logdir, tmp_path, monkeypatch):
    from slurm_ft.failover import daemon as daemon_mod
    cfg = tmp_path / "slurm-ft.toml"
    cfg.write_text(f'[journal]\npath = "{tmp_path / "journal" / "journal.db"}"\n')

    def fake_run(self, once=False):
        logging.getLogger("slurm_ft.daemon").info("fake cycle, once=%s", once)

    monkeypatch.setattr(daemon_mod.Daemon, "__init__", lambda self, cfg: None)
    monkeypatch.setattr(daemon_mod.Daemon, "run", fake_run)
    path = logdir / "daemon.log"
    r = CliRunner().invoke(main, ["daemon", "--once", "--config", str(cfg), "--log-file", str(path),
                                  "--log-format", "json"])
    assert r.exit_code == 0, r.output
    for h in logging.getLogger().handlers:
        h.flush()
    text = path.read_text()
    assert '"message": "fake cycle, once=True"' in text and "fake cycle" not in r.output


def test_daemon_command_refuses_an_untrusted_log_dir(tmp_path, monkeypatch):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    r = CliRunner().invoke(main, ["daemon", "--once", "--log-file", str(d / "daemon.log")])
    assert r.exit_code == 1 and "writable by group or others" in r.output
