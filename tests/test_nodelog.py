"""The node log (``[node_state] log``, slurm_ft.node.log): on by default at a root-owned path, its
directory created when missing (0750, never through a symlink), a log that cannot be written said
once on stderr (slurmd's log), one line per message."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from slurm_ft import config as config_mod
from slurm_ft.node import log as nodelog
from slurm_ft.errors import ConfigError
from slurm_ft.node.log import NodeLog

JOB = SimpleNamespace(job_id=7, attempt=0, node="n1")


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(nodelog, "_warned", set())


def test_on_by_default_at_a_root_path():
    assert config_mod.Config().node_state.log == "/var/log/slurm-ft/node.log"
    with pytest.raises(ConfigError, match="node_state.log"):
        config_mod.from_dict({"node_state": {"log": "relative/node.log"}})
    assert config_mod.from_dict({"node_state": {"log": ""}}).node_state.log == ""


def test_missing_directories_are_created(tmp_path, capsys):
    path = tmp_path / "var/log/slurm-ft/node-{node}.log"
    log = NodeLog("prolog", JOB, str(path))
    log("first\nsecond")
    log("third")
    made = tmp_path / "var/log/slurm-ft"
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o750 and stat.S_IMODE(os.stat(tmp_path / "var").st_mode) == 0o750
    f = made / "node-n1.log"
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o640 and os.stat(f).st_uid == os.getuid()
    lines = f.read_text().splitlines()
    assert len(lines) == 2 and lines[0].endswith("slurm-ft prolog: job 7 attempt 0 on n1: first\\x0asecond")
    assert "cannot be written" not in capsys.readouterr().err


def test_a_symlinked_directory_is_never_followed_and_said_once(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "log").symlink_to(elsewhere)
    log = NodeLog("epilog", JOB, str(tmp_path / "log/sub/node.log"))
    log("one")
    log("two")
    assert list(elsewhere.iterdir()) == []
    err = capsys.readouterr().err
    assert err.count("cannot be written") == 1 and err.count("slurm-ft epilog: job 7") == 2


def test_a_symlink_made_in_place_of_a_directory_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a/b").symlink_to(tmp_path)
    with pytest.raises(OSError):
        nodelog.make_log_dir(str(tmp_path / "a/b/c"))


def test_a_log_file_that_is_a_symlink_is_not_followed(tmp_path, capsys):
    target = tmp_path / "target"
    target.write_text("")
    (tmp_path / "node.log").symlink_to(target)
    NodeLog("prolog", JOB, str(tmp_path / "node.log"))("x")
    assert target.read_text() == "" and "cannot be written" in capsys.readouterr().err


def test_an_unwritable_log_still_logs_to_stderr_once(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    log = NodeLog("prolog", JOB, str(tmp_path / "file/node.log"))
    for _ in range(3):
        log("msg")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and sum("cannot be written" in e for e in err) == 1
    assert all("\n" not in e for e in err)
