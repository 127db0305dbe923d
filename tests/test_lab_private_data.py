"""Issue 25 under Slurm's ``PrivateData=jobs``, on the real lab: the lab runs ``PrivateData=none``,
so tests/test_lab_user_history.py only ever sees that side. Here the lab's slurm.conf gets
``PrivateData=jobs`` (:meth:`slurm_ft.lab.cluster.Lab.private_data`, ``scontrol reconfigure``) for
one test and loses it again in a ``finally``; the daemon is restarted both times so that its
history service reads PrivateData at once (it reads it every ``ACCESS_TTL_S``, 300 s). A test
killed before its ``finally`` leaves nothing behind for the next session: the ``lab`` fixture
starts a fresh incarnation (slurm.conf written anew), and ``lab up`` on a running lab restarts it
when its slurm.conf still holds the setting (:meth:`~slurm_ft.lab.cluster.Lab.hook_leftovers`).

As the lab's ordinary user: Slurm's own commands hide root's job, ``ft-history`` lists only the
user's own job (``-a`` too), root's job asked for by id reads like an unknown one (exit 1, "not
yours"), the own job's ``--detail`` has its evidence lines; root still sees both.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from slurm_ft.lab.cluster import Lab
from slurm_ft.lab.demo import wait_for
from slurm_ft.lab.users import LAB_USER, ensure_user, run_as, tool_argv, tool_env
from slurm_ft.slurm import parse_config, private_data

from test_lab_user_history import OOM, _submit  # noqa: E402  the same jobs as the PrivateData=none case


def _ids(listing: str) -> set[str]:
    return {line.split("|")[0] for line in listing.splitlines() if line.strip()}


def _owners(listing: str) -> set[str]:
    """The users of ``-o jobid,user -P`` rows."""
    return {line.split("|")[1] for line in listing.splitlines() if line.strip()}


@pytest.mark.lab
def test_private_data_jobs_shows_the_user_only_their_own(lab, slurm, ft_history):
    ensure_user()
    env = tool_env(lab.env())

    def as_user(argv: list[str], timeout_s: float = 90):
        return run_as(LAB_USER, argv, env, cwd="/", timeout_s=timeout_s)

    def as_root(argv: list[str]):
        return subprocess.run(argv, capture_output=True, text=True, timeout=90, env=lab.env(), cwd="/")

    assert not lab.hook_leftovers(), "the lab started with a test's slurm.conf setting"
    try:
        lab.private_data("jobs")
        lab.daemon_start()  # its history service reads PrivateData afresh
        wait_for(lambda: "jobs" in private_data(parse_config(as_user(["/usr/bin/scontrol", "show", "config"]).stdout)),
                 20, "PrivateData=jobs in scontrol show config", 0.5)

        d = lab.lay.jobs_dir / f"private-data-{time.time_ns()}"
        d.mkdir()
        d.chmod(0o777)
        mine = _submit(lab, d, "pd-mine", f"echo '{OOM}' >&2; exit 1", LAB_USER)
        roots = _submit(lab, d, "pd-root", "exit 0", None)
        ft_history(mine, lambda h: h["ft_state"] == "user-error" and h["attempts"][0]["verdicts"], timeout_s=120)
        ft_history(roots, lambda h: h["ft_state"] == "completed", timeout_s=120)

        # Slurm's own PrivateData: the user's squeue and scontrol do not show root's job; root's do
        q = as_user(["/usr/bin/squeue", "-h", "-t", "all", "-o", "%i"])
        assert q.returncode == 0 and str(mine) in q.stdout.split() and str(roots) not in q.stdout.split(), q
        show = as_user(["/usr/bin/scontrol", "show", "job", str(roots)])
        assert f"JobId={roots} " not in show.stdout, show.stdout
        assert f"JobId={mine} " in as_user(["/usr/bin/scontrol", "show", "job", str(mine)]).stdout
        q = as_root(["/usr/bin/squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split()
        assert str(mine) in q and str(roots) in q, q

        # ft-history through the service (the service starts with the daemon: the first answer may
        # take a few seconds): only the user's own job, even when asking for every user's
        # (earlier tests of this lab may have left jobs of the same user: only the owner is asserted)
        cols = ["-X", "-n", "-P", "-o", "jobid,user", "-S", "now-2hours"]
        listing = wait_for(lambda: (p := as_user(tool_argv("ft-history", *cols))).returncode == 0 and p, 60,
                           "ft-history as the ordinary user", 1.0)
        assert str(mine) in _ids(listing.stdout) and str(roots) not in _ids(listing.stdout), listing.stdout
        assert _owners(listing.stdout) == {LAB_USER}, listing.stdout
        every = as_user(tool_argv("ft-history", *cols, "-a"))
        assert every.returncode == 0, every
        assert str(mine) in _ids(every.stdout) and str(roots) not in _ids(every.stdout), every.stdout
        assert _owners(every.stdout) == {LAB_USER}, every.stdout
        for p in (listing, every):
            assert "Traceback" not in p.stderr and "permission denied" not in p.stderr.lower(), p.stderr

        # root's job by id reads exactly like an unknown one
        other = as_user(tool_argv("ft-history", "-j", str(roots)))
        assert other.returncode == 1, other
        assert f"job {roots} is not in the journal" in other.stderr and "not yours (Slurm PrivateData=jobs)" \
            in other.stderr, other.stderr
        assert "Traceback" not in other.stderr and not other.stdout.strip(), other

        # the own job's evidence lines, as root reads them from the file
        detail = as_user(tool_argv("ft-history", "-j", str(mine), "--detail"))
        assert detail.returncode == 0, detail.stderr
        assert re.search(rf"^Job {mine} \(pd-mine\): ft state user-error.*user {LAB_USER}", detail.stdout, re.M)
        assert re.search(r"^\s+n\d user \(cuda-oom\): ", detail.stdout, re.M), detail.stdout
        from_file = as_root([sys.executable, "-m", "slurm_ft.cli.history", "-j", str(mine), "--detail"])
        assert from_file.returncode == 0 and from_file.stdout == detail.stdout, (from_file.stdout, detail.stdout)

        # root still sees both
        both = as_root([sys.executable, "-m", "slurm_ft.cli.history", "-X", "-n", "-P", "-a", "-S", "now-2hours"])
        assert both.returncode == 0 and {str(mine), str(roots)} <= _ids(both.stdout), both
    finally:
        try:
            lab.private_data(None)
        finally:
            lab.daemon_start()  # the service forgets PrivateData=jobs at once
    assert not lab.hook_leftovers()
    conf = parse_config(as_root(["/usr/bin/scontrol", "show", "config"]).stdout)
    assert "jobs" not in private_data(conf), conf.get("PrivateData")


def test_hook_leftovers_are_the_test_settings_only(tmp_path):
    """Unit: ``hook_leftovers`` names a test hook's lines left in slurm.conf (not the rendered ones,
    not ``slurm.conf.local``'s), so that ``lab up`` restarts such a lab."""
    lab = Lab(tmp_path / "lab")
    lab.lay.dir.mkdir()
    assert lab.hook_leftovers() == []
    lab.lay.slurm_conf.write_text("ClusterName=slurmftlab\nSlurmdTimeout=10\n")
    assert lab.hook_leftovers() == []
    lab.lay.slurm_conf.write_text("ClusterName=slurmftlab\nPrivateData=jobs\nHealthCheckInterval=65535\n")
    assert lab.hook_leftovers() == ["PrivateData=jobs", "HealthCheckInterval=65535"]
    (lab.lay.dir / "slurm.conf.local").write_text("# a benchmark's own\nHealthCheckInterval=65535\n")
    assert lab.hook_leftovers() == ["PrivateData=jobs"]
