"""An ordinary user's own history on the real lab (issues 25 and 26): the lab's ordinary user runs
``ft-history`` with the defaults -- no ``[journal] read_group``, no ``[history] endpoint``; the
journal is root's (0600) -- and gets it from the history service the lab's daemon runs
(slurm_ft/history/service.py), found through ``SlurmctldHost`` and authenticated with the real
munged: their own job with its evidence lines (``--detail``, exactly what root reads from the
file), not root's.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
import time

import pytest

from slurm_ft.lab.demo import wait_for
from slurm_ft.lab.users import LAB_USER, ensure_user, run_as, tool_argv, tool_env
from slurm_ft.slurm import parse_config, private_data

pytestmark = pytest.mark.lab

OOM = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"


def _submit(lab, d, name: str, script: str, user: str | None) -> int:
    argv = ["/usr/bin/sbatch", "--parsable", "--ft", "--ft-retries=1", "--gres=gpu:1", f"--output={d}/%j.out",
            f"--job-name={name}", f"--wrap={script}"]
    proc = run_as(user, argv, lab.env(), cwd=str(d)) if user else \
        subprocess.run(argv, capture_output=True, text=True, timeout=30, env=lab.env(), cwd=str(d))
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def test_user_sees_own_history_not_roots(lab, slurm, ft_history):
    ensure_user()
    env = tool_env(lab.env())
    d = lab.lay.jobs_dir / f"user-history-{time.time_ns()}"
    d.mkdir()
    d.chmod(0o777)
    mine = _submit(lab, d, "uh-mine", f"echo '{OOM}' >&2; exit 1", LAB_USER)
    roots = _submit(lab, d, "uh-root", "exit 0", None)
    ft_history(mine, lambda h: h["ft_state"] == "user-error" and h["attempts"][0]["verdicts"], timeout_s=120)
    ft_history(roots, lambda h: h["ft_state"] == "completed", timeout_s=120)
    journal = lab.lay.dir / "journal" / "daemon.db"
    assert not os.stat(journal).st_mode & 0o077, "the lab's journal is root's alone"

    def as_user(*args: str):
        return run_as(LAB_USER, tool_argv("ft-history", *args), env, cwd="/", timeout_s=90)

    # the service starts with the daemon: the first answer may take a few seconds
    listing = wait_for(lambda: (p := as_user("-X", "-n", "-P", "-S", "now-2hours")).returncode == 0 and p, 60,
                       "ft-history as the ordinary user", 1.0)
    ids = {line.split("|")[0] for line in listing.stdout.splitlines()}
    assert str(mine) in ids and str(roots) not in ids, listing.stdout
    assert "Traceback" not in listing.stderr and "permission denied" not in listing.stderr

    detail = as_user("-j", str(mine), "--detail")
    assert detail.returncode == 0, detail.stderr
    assert re.search(rf"^Job {mine} \(uh-mine\): ft state user-error.*user {LAB_USER}", detail.stdout, re.M)
    assert re.search(r"^\s+n\d user \(cuda-oom\): ", detail.stdout, re.M), detail.stdout
    # the evidence lines as root reads them from the file: the service gives the owner the same view
    as_root = subprocess.run([sys.executable, "-m", "slurm_ft.cli.history", "-j", str(mine), "--detail"],
                             capture_output=True, text=True, timeout=90, env=lab.env(), cwd="/")
    assert as_root.returncode == 0 and as_root.stdout == detail.stdout, (as_root.stdout, detail.stdout)

    # root's job, asked for by id: as Slurm itself shows other users' jobs (PrivateData)
    other = as_user("-j", str(roots))
    conf = parse_config(run_as(LAB_USER, ["/usr/bin/scontrol", "show", "config"], env, cwd="/").stdout)
    if "jobs" in private_data(conf):
        assert other.returncode == 1 and f"job {roots} is not in the journal" in other.stderr, other
        assert "not yours" in other.stderr
    else:
        assert other.returncode == 0 and f"Job {roots} (uh-root)" in other.stdout, other
    assert "Traceback" not in other.stderr

    # the daemon's service answered, for the uid MUNGE vouched for
    uid = pwd.getpwnam(LAB_USER).pw_uid
    log = lab.lay.log("daemon")
    wait_for(lambda: f"history service: {LAB_USER} (uid {uid})" in log.read_text(errors="replace"), 20,
             "the service's log line")
