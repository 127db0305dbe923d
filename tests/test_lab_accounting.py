"""The lab's accounting (slurmdbd on a private MariaDB, slurm_ft/lab/accounting.py): files and
modes of a fresh start, nothing left of a killed lab's database, and ``sacct`` answering on the
running lab."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from slurm_ft.lab import accounting as acct
from slurm_ft.lab.cluster import Lab
from slurm_ft.lab.layout import Layout

root_only = pytest.mark.skipif(os.geteuid() != 0 or bool(acct.missing_executables()),
                               reason="needs root and Debian's slurmdbd + mariadb-server-core (make setup)")


def _mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@root_only
def test_fresh_start_makes_a_root_only_database_and_drops_a_killed_labs(tmp_path):
    lab = Lab(tmp_path / "lab", port_base=19500)
    lab._fresh_files(["n1"], log=lambda *_: None)
    d = lab.lay.dir
    assert _mode(d / "accounting") == 0o700 and (d / "accounting" / "db" / "mysql").is_dir()
    assert _mode(lab.lay.slurmdbd_conf) == 0o600                     # slurmdbd refuses anything else
    conf = lab.lay.slurmdbd_conf.read_text()
    assert "DbdPort=19519" in conf and "StorageUser=root" in conf and "StoragePass" not in conf
    slurm_conf = lab.lay.slurm_conf.read_text()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in slurm_conf
    assert "AccountingStoragePort=19519" in slurm_conf
    # what a killed lab leaves: its socket, pid file and database; the next start drops them
    (d / "accounting" / "mysqld.sock").write_text("")
    (d / "accounting" / "mysqld.pid").write_text("999999")
    (d / "accounting" / "db" / "stale").mkdir()
    lab._fresh_files(["n1"], log=lambda *_: None)
    assert not (d / "accounting" / "mysqld.sock").exists() and not (d / "accounting" / "mysqld.pid").exists()
    assert not (d / "accounting" / "db" / "stale").exists() and (d / "accounting" / "db" / "mysql").is_dir()


def test_mariadb_is_reached_by_its_socket_only():
    lay = Layout(Path("/x"), 16800)
    argv = acct.mariadbd_argv(lay)
    assert argv[:2] == [acct.MARIADBD, "--no-defaults"] and "--skip-networking" in argv
    assert f"--socket={acct.socket_path(lay)}" in argv and acct.socket_path(lay) == "/x/accounting/mysqld.sock"
    assert acct.slurmdbd_env(lay, {"PATH": "/usr/bin"})["MYSQL_UNIX_PORT"] == "/x/accounting/mysqld.sock"
    assert lay.dbd_port == 16819


@pytest.mark.lab
def test_sacct_answers_on_the_lab(lab, slurm):
    job_id = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true").stdout.strip().split(";")[0]
    assert slurm.wait_job(int(job_id), lambda j: j.ended, 60, 0.2).state == "COMPLETED"
    out = subprocess.run(["/usr/bin/sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State"],
                         capture_output=True, text=True, timeout=30, env=lab.env(), check=True).stdout
    assert out.split() == [f"{job_id}|COMPLETED"]
