"""Issue 20, item 3, on the real lab: the daemon's journal directory on a small filesystem that
fills during a failover. The failover still happens, the daemon's log says "disk full", and once
space returns the journal catches up (the failover and the verdict, once each) and ft-history is
true again.

The lab's own daemon is stopped for the test and a daemon of the code under test runs with a copy
of the lab's config whose ``[journal] path`` is on a 3 MiB tmpfs; the lab's daemon is started
again (and the tmpfs unmounted) in a ``finally``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_ft.history.query import history
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import job_gpu_index, submit_training, wait_for, wait_started
from slurm_ft.lab.inject import inject_xid

pytestmark = pytest.mark.lab


def _mount_tmpfs(mnt: Path, size: str) -> None:
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


def _fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass
        try:
            while True:
                fh.write(b"\0" * 512)
        except OSError:
            pass
    return filler


def _daemon_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def test_a_full_journal_disk_does_not_stop_the_failover_and_the_journal_catches_up(lab, slurm, tmp_path):
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "3m")
    journal = mnt / "journal" / "daemon.db"
    conf = tmp_path / "slurm-ft.toml"
    text = Path(lab.lay.ft_conf).read_text()
    text, n = re.subn(r'(?m)^path = ".*"$', f'path = "{journal}"', text, count=1)
    assert n == 1
    conf.write_text(text)
    log_path = tmp_path / "daemon.log"
    proc = None
    lab.daemon_stop()
    try:
        with open(log_path, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "slurm_ft.cli.main", "daemon"], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**lab.env(), "SLURM_FT_CONFIG": str(conf), "PYTHONUNBUFFERED": "1"})
        wait_for(lambda: journal.exists() and "daemon started" in _daemon_log(log_path), 60, "the daemon on the tmpfs")
        job = submit_training(lab, steps=400)
        first = wait_started(slurm, job)
        filler = _fill(mnt)
        gpu = job_gpu_index(slurm, job.job_id)
        t0 = time.monotonic()
        inject_xid(first.nodes, 79, gpu)
        again = slurm.wait_job(job.job_id, lambda j: j.state == "RUNNING" and j.restart_count == 1, 120, 0.1)
        elapsed = time.monotonic() - t0
        assert again is not None, f"no failover with the journal disk full; daemon log:\n{_daemon_log(log_path)[-3000:]}"
        assert again.nodes != first.nodes
        print(f"\nXid -> running elsewhere with the journal disk full: {elapsed:.2f} s")
        said = _daemon_log(log_path)
        assert f"journal {journal}: disk full (ENOSPC)" in said, said[-3000:]
        assert said.count("disk full (ENOSPC)") <= 3          # once per state change, not every cycle
        assert "cannot rollback" not in said and "aside" not in said
        assert any(n.drained for n in slurm.nodes() if n.name == first.nodes)
        # ft-history warns while the journal cannot take writes
        r = subprocess.run([sys.executable, "-m", "slurm_ft.cli.history", "-j", str(job.job_id), "--journal",
                            str(journal)], capture_output=True, text=True, env=lab.env())
        assert "disk full" in r.stderr, r.stderr
        filler.unlink()
        t1 = time.monotonic()

        def caught_up():
            with open_journal(journal, readonly=True) as j:
                fo = [a for a in j.actions(job.job_id, 0) if a["action"] == "failover"]
                hw = [v for v in j.verdicts(job.job_id, 0) if v["verdict"] == "hardware"]
                ran = [a for a in j.attempts(job.job_id) if a["attempt"] == 1]   # the run elsewhere, on record
                return (fo, hw) if fo and fo[0]["status"] == "done" and hw and ran else None
        fo, hw = wait_for(caught_up, 60, "the journal catching up")
        print(f"space back -> journal caught up: {time.monotonic() - t1:.2f} s")
        assert len(fo) == 1 and len(hw) == 1 and hw[0]["node"] == first.nodes
        with open_journal(journal, readonly=True) as j:
            h = history(j, job.job_id)
        assert len(h["attempts"]) >= 2 and h["attempts"][0]["verdict"] == "hardware"
        r = subprocess.run([sys.executable, "-m", "slurm_ft.cli.history", "-j", str(job.job_id), "--journal",
                            str(journal), "--json"], capture_output=True, text=True, env=lab.env())
        assert r.returncode == 0 and "disk full" not in r.stderr, r.stderr
        assert json.loads(r.stdout)["attempts"][0]["verdict"] == "hardware"
        slurm.run("scancel", str(job.job_id), check=False)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        lab.daemon_start()
