"""The Prolog/EpilogSlurmctld hook (contrib/slurm-ft-ctld-event, POSIX sh) and the daemon's reading
of its files (slurm_ft.failover.events): what it writes, what it refuses, and what an attacker's
job or a planted file can do (nothing but cost one read)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from slurm_ft.failover.events import EventSpool, parse
from slurm_ft.lab.layout import repo_root

HOOK = repo_root() / "contrib" / "slurm-ft-ctld-event"


def run_hook(events: Path, **env) -> None:
    base = {"PATH": "/usr/bin:/bin", "SLURM_FT_EVENTS_DIR": str(events), "SLURM_JOB_ID": "42",
            "SLURM_JOB_COMMENT": "ft:retries=3", "SLURM_JOB_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "n[1-2]"}
    p = subprocess.run(["/bin/sh", str(HOOK)], env={**base, **env}, capture_output=True, timeout=10)
    assert p.returncode == 0, p.stderr       # never fails: a failing PrologSlurmctld requeues the job


@pytest.fixture
def spool(tmp_path):
    d = tmp_path / "events"
    d.mkdir(mode=0o700)
    return d


def test_start_and_end_events_with_the_wait_status(spool):
    run_hook(spool, SLURM_SCRIPT_CONTEXT="prolog_slurmctld")
    run_hook(spool, SLURM_SCRIPT_CONTEXT="epilog_slurmctld", SLURM_JOB_EXIT_CODE="0")
    run_hook(spool, SLURM_SCRIPT_CONTEXT="epilog_slurmctld", SLURM_JOB_EXIT_CODE="256")
    run_hook(spool, SLURM_SCRIPT_CONTEXT="epilog_slurmctld")                         # no status: unknown
    evs = EventSpool(str(spool)).read()
    assert [(e.kind, e.job_id, e.restart, e.nodes, e.exit) for e in evs] == [
        ("start", 42, 1, "n[1-2]", None), ("end", 42, 1, "n[1-2]", 0), ("end", 42, 1, "n[1-2]", 256),
        ("end", 42, 1, "n[1-2]", None)]
    assert [e.routine for e in evs] == [True, True, False, False]
    assert os.listdir(spool) == []                                                  # consumed


def test_non_ft_jobs_and_bad_values_write_nothing_or_nothing_trusted(spool):
    run_hook(spool, SLURM_SCRIPT_CONTEXT="epilog_slurmctld", SLURM_JOB_COMMENT="plain job")
    run_hook(spool, SLURM_SCRIPT_CONTEXT="epilog_slurmctld", SLURM_JOB_ID="42; rm -rf /")
    run_hook(spool, SLURM_SCRIPT_CONTEXT="something_else")
    assert os.listdir(spool) == []
    run_hook(spool, SLURM_SCRIPT_CONTEXT="epilog_slurmctld", SLURM_JOB_EXIT_CODE="0 exit=0",
             SLURM_JOB_NODELIST="", SLURM_JOB_RESTART_COUNT="x")
    (ev,) = EventSpool(str(spool)).read()
    assert (ev.kind, ev.job_id, ev.restart, ev.nodes, ev.exit, ev.routine) == ("end", 42, 0, "", None, False)


def test_parse_refuses_what_the_hook_never_writes():
    assert parse("1.42.end", "end 42 0 n1 exit=99999999999") .exit is None          # out of range
    assert parse("1.42.end", "end 42 0 n1 exit=-1").exit is None
    assert parse("1.42.end", "end 42 0 $(reboot) exit=0").nodes == ""
    assert parse("1.42.start; rm", "start 42 0 n1") is None
    assert parse("1.42.end", "").job_id == 42 and parse("1.42.end", "").exit is None


def test_planted_links_and_big_files_cost_nothing(spool, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("end 7 0 n1 exit=1\n")
    os.symlink(secret, spool / "1.7.end")                                           # not followed
    (spool / "2.8.end").write_text("end 8 0 n1 exit=1 " + "x" * 100_000)           # read capped
    evs = EventSpool(str(spool)).read()
    assert [(e.job_id, e.exit) for e in evs] == [(7, None), (8, 1)]
    assert secret.exists() and os.listdir(spool) == []
