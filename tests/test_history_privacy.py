"""ft-history honours Slurm's PrivateData=jobs: a user other than root and SlurmUser sees only
their own jobs; another user's job reads exactly like an unknown one."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from slurm_ft import config as config_mod
from slurm_ft.history import query as history_mod
from slurm_ft.errors import SlurmCommandError, SlurmFTError
from slurm_ft.history.query import Viewer, current_viewer, history
from slurm_ft.cli.history import command
from slurm_ft.journal import open_journal
from slurm_ft.slurm import parse_config, private_data

from test_journal_perms import fake_scontrol, ft_history_as, needs_setpriv, world_dir, write_config  # noqa: F401

CONFIG_TEXT = """Configuration data as of 2025-01-01T00:00:00
AccountingStorageBackupHost = (null)
PrivateData             = jobs,usage
SlurmUser               = slurm(64030)
SLURM_CONF              = /etc/slurm/slurm.conf

Cgroup Support Configuration:
PrivateData = none
"""


def _journal(path):
    with open_journal(path) as j:
        j.upsert_job(5, name="mine", user="alice", ft_enabled=1, retries=1, ft_state="running", excluded_nodes="")
        j.upsert_attempt(5, 0, nodes="n1", start=1.0, state="RUNNING")
        j.upsert_job(6, name="theirs", user="bob", ft_enabled=1, retries=1, ft_state="running", excluded_nodes="")
        j.add_verdict(7, 0, "n2", "user", "cuda-oom", [], [])     # not ft-enabled: no owner on record
    return path


def test_parse_scontrol_show_config():
    conf = parse_config(CONFIG_TEXT)
    assert conf["PrivateData"] == "jobs,usage" and conf["SlurmUser"] == "slurm(64030)"
    assert private_data(conf) == {"jobs", "usage"}
    assert private_data({"PrivateData": "none"}) == set() and private_data({}) == set()
    assert private_data({"PrivateData": "Jobs"}) == {"jobs"}


def test_private_viewer_sees_only_own_jobs(tmp_path):
    alice = Viewer(1000, "alice", private_jobs=True)
    with open_journal(_journal(tmp_path / "j.db"), readonly=True) as j:
        assert history(j, 5, viewer=alice)["name"] == "mine"
        with pytest.raises(SlurmFTError) as other:
            history(j, 6, viewer=alice)
        with pytest.raises(SlurmFTError) as unknown:
            history(j, 99, viewer=alice)
        with pytest.raises(SlurmFTError, match="job 7 is not in the journal"):
            history(j, 7, viewer=alice)                          # owner unknown: hidden too
        # another user's job and an unknown job read the same (no oracle for job ids)
        assert str(other.value).replace("job 6", "job N") == str(unknown.value).replace("job 99", "job N")
        assert "job 6 is not in the journal" in str(other.value) and "PrivateData=jobs" in str(other.value)
        for everyone in (Viewer(1000, "alice", private_jobs=False), Viewer(0, "root", True),
                         Viewer(64030, "slurm", True, slurm_user="slurm"), None):
            assert history(j, 6, viewer=everyone)["name"] == "theirs"
            assert history(j, 7, viewer=everyone)["ft_state"] == "not-configured"


class _FakeSlurm:
    def __init__(self, text=None, error=None):
        self.text, self.error, self.calls = text, error, 0

    def show_config(self):
        self.calls += 1
        if self.error:
            raise self.error
        return parse_config(self.text)


def test_current_viewer_reads_private_data_once_and_fails_closed():
    cfg = config_mod.Config()
    s = _FakeSlurm(CONFIG_TEXT)
    v = current_viewer(cfg, uid=65534, slurm=s)
    assert (v.user, v.private_jobs, v.slurm_user, s.calls) == ("nobody", True, "slurm", 1)
    assert not v.sees_all
    assert current_viewer(cfg, uid=65534, slurm=_FakeSlurm("PrivateData = none\n")).sees_all
    broken = current_viewer(cfg, uid=65534, slurm=_FakeSlurm(error=SlurmCommandError("scontrol: timed out")))
    assert broken.private_jobs and not broken.sees_all              # Slurm unreachable: own jobs only
    root_slurm = _FakeSlurm(CONFIG_TEXT)
    assert current_viewer(cfg, uid=0, slurm=root_slurm).sees_all and root_slurm.calls == 0


def test_cli_hides_other_users_jobs(tmp_path, monkeypatch):
    db = _journal(tmp_path / "j.db")
    monkeypatch.setattr(history_mod, "current_viewer", lambda cfg: Viewer(1000, "alice", private_jobs=True))
    r = CliRunner().invoke(command, ["-j", "6", "--journal", str(db)])
    assert r.exit_code == 1 and "job 6 is not in the journal" in r.output and "theirs" not in r.output
    r = CliRunner().invoke(command, ["-j", "5", "--journal", str(db)])
    assert r.exit_code == 0 and "Job 5 (mine)" in r.output


def test_privacy_scontrol_comes_only_from_a_root_controlled_config(tmp_path):
    conf = tmp_path / "slurm-ft.toml"
    conf.write_text('[slurm]\nbin_dir = "/home/mallory/bin"\n')
    cfg = config_mod.load(conf)
    if os.geteuid() == 0:
        assert config_mod.trusted_bin_dir(cfg) == "/home/mallory/bin"    # root-owned, 0644: trusted
        os.chown(conf, 65534, 65534)
        assert config_mod.trusted_bin_dir(cfg) == "/usr/bin"             # a user's own config: not
    conf.chmod(0o666)
    assert config_mod.trusted_bin_dir(cfg) == "/usr/bin"


@needs_setpriv
def test_other_users_job_hidden_for_a_real_non_root_user(world_dir):  # noqa: F811
    import grp

    group = grp.getgrgid(65534).gr_name
    db = world_dir / "journal.db"
    with open_journal(db, read_group=group) as j:
        j.upsert_job(5, name="mine", user="nobody", ft_enabled=1, retries=1, ft_state="running", excluded_nodes="")
        j.upsert_job(6, name="theirs", user="alice", ft_enabled=1, retries=1, ft_state="running", excluded_nodes="")
    conf = write_config(world_dir, db, fake_scontrol(world_dir, "jobs,usage"), read_group=group)
    r = ft_history_as(["-j", "5", "--config", str(conf)])
    assert r.returncode == 0 and "Job 5 (mine)" in r.stdout, r
    r = ft_history_as(["-j", "6", "--config", str(conf), "--json"])
    assert r.returncode == 1 and "job 6 is not in the journal" in r.stderr and "theirs" not in r.stdout + r.stderr
    assert "Traceback" not in r.stderr
