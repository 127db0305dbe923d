"""One daemon per journal (flock), the heartbeat and who reads it (ft-history, doctor), the
daemon command's root check and JSON logs."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_ft import logfmt
from slurm_ft.failover import daemonlock
from slurm_ft.cli.main import main
from slurm_ft.cli.history import command as history_command
from slurm_ft.journal import open_journal


def _config(tmp_path: Path, **failover) -> Path:
    cfg = tmp_path / "slurm-ft.toml"
    lines = [f'[journal]\npath = "{tmp_path}/j/journal.db"\nnode_path = "{tmp_path}/j/node-{{node}}.db"',
             f'[slurm]\nbin_dir = "{tmp_path}/no-slurm-here"\ncommand_timeout_s = 2.0']
    if failover:
        lines.append("[failover]\n" + "\n".join(f"{k} = {v}" for k, v in failover.items()))
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def test_second_lock_on_the_same_journal_is_refused_and_freed_on_release(tmp_path):
    journal = tmp_path / "journal.db"
    with daemonlock.acquire(journal) as first:
        assert daemonlock.lock_path(journal).read_text() == f"{os.getpid()}\n"
        with pytest.raises(daemonlock.DaemonRunning,
                           match=rf"another slurm-ft daemon \(pid {os.getpid()}\) is running"):
            daemonlock.acquire(journal)
        assert first.fd is not None
    with daemonlock.acquire(journal):              # released: a new daemon may start
        pass


def test_lock_dies_with_its_process(tmp_path):
    journal = tmp_path / "journal.db"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from slurm_ft.failover import daemonlock; "
                               f"l = daemonlock.acquire({str(journal)!r}); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(daemonlock.DaemonRunning, match=rf"\(pid {holder.pid}\)"):
            daemonlock.acquire(journal)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    with daemonlock.acquire(journal):              # SIGKILL leaves no stale lock behind
        pass


def test_lock_refuses_a_symlink(tmp_path):
    (tmp_path / "elsewhere").write_text("x")
    daemonlock.lock_path(tmp_path / "journal.db").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(daemonlock.SlurmFTError, match="is a symlink"):
        daemonlock.acquire(tmp_path / "journal.db")
    assert (tmp_path / "elsewhere").read_text() == "x"


def test_second_daemon_command_exits_with_a_clear_error(tmp_path):
    cfg = _config(tmp_path)
    (tmp_path / "j").mkdir()
    with daemonlock.acquire(tmp_path / "j" / "journal.db"):
        r = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "daemon", "--once", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: another slurm-ft daemon (pid {os.getpid()}) is running")
    assert "Traceback" not in r.stderr


def test_daemon_as_non_root_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = CliRunner().invoke(main, ["daemon", "--once", "--config", str(_config(tmp_path))])
    assert r.exit_code == 1 and "slurm-ft daemon runs as root" in r.output
    assert not (tmp_path / "j").exists()            # refused before it touched anything


def test_daemon_json_logs(tmp_path):
    """--log-format json: every log line is one JSON object (here: start, the failed cycle)."""
    r = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "daemon", "--once", "--log-format", "json",
                        "--config", str(_config(tmp_path))], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1                        # no Slurm commands in bin_dir: the cycle fails
    lines = r.stderr.strip().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records and records[0]["message"].startswith("slurm-ft daemon started")
    assert {"time", "level", "logger", "message", "pid"} <= set(records[0])
    assert any(rec["level"] == "ERROR" and "cycle failed" in rec["message"] for rec in records)
    assert lines[-1].startswith("Error: ")


def test_json_formatter_fields_exception_and_ascii():
    stream = __import__("io").StringIO()
    logfmt.setup("json", stream=stream)
    try:
        log = logging.getLogger("slurm_ft.test")
        log.info("job %s: \x1b[31mname\u00e9", 12, extra={"job_id": 12, "node": "n1"})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        logfmt.setup("text")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{"))
    assert first["message"] == "job 12: \x1b[31mname\u00e9" and first["job_id"] == 12 and first["node"] == "n1"
    assert first["level"] == "INFO" and first["logger"] == "slurm_ft.test" and first["time"].endswith("Z")
    assert "\\u001b" in stream.getvalue().splitlines()[0] and stream.getvalue().isascii()
    assert "ValueError: boom" in second["exception"]
    with pytest.raises(ValueError):
        logfmt.setup("xml")


# ------------------------------------------------------------------------------------ heartbeat
def test_beat_and_staleness(tmp_path):
    journal = tmp_path / "journal.db"
    assert daemonlock.staleness(journal) == ("missing", None)
    t0 = 1_000_000.0
    daemonlock.beat(journal, now=t0)
    hb = daemonlock.read_heartbeat(journal)
    assert hb["pid"] == os.getpid() and hb["time"] == t0 and hb["ok"] and hb["last_ok"] == t0
    assert oct(daemonlock.heartbeat_path(journal).stat().st_mode & 0o777) == "0o644"
    daemonlock.beat(journal, now=t0 + 0.3)                        # rate-limited: not written
    assert daemonlock.read_heartbeat(journal)["time"] == t0
    daemonlock.beat(journal, ok=False, now=t0 + 0.5)             # a change of health is written at once
    hb = daemonlock.read_heartbeat(journal)
    assert hb["time"] == t0 + 0.5 and not hb["ok"] and hb["last_ok"] == t0 + 0.3
    assert daemonlock.staleness(journal, 0.5, now=t0 + 10) == ("fresh", pytest.approx(9.5))
    state, age = daemonlock.staleness(journal, 0.5, now=t0 + 300)
    assert state == "stale" and age == pytest.approx(299.5)
    assert daemonlock.down_warning(journal, 0.5, now=t0 + 300).startswith("the slurm-ft daemon has not run for 300 s")
    assert daemonlock.stale_after(10.0) == 200.0                 # slow polls: 20 cycles


def test_beat_never_raises(tmp_path):
    daemonlock.beat(tmp_path / "missing-dir" / "journal.db")      # nowhere to write: the daemon goes on


def _journal_with_job(tmp_path: Path) -> Path:
    path = tmp_path / "j" / "journal.db"
    with open_journal(path) as j:
        j.upsert_job(5, name="train", user="root", ft_enabled=1, retries=3, ft_state="running")
    return path


def test_ft_history_warns_when_the_daemon_heartbeat_is_stale(tmp_path):
    path = _journal_with_job(tmp_path)
    runner = CliRunner()
    r = runner.invoke(history_command, ["-j", "5", "--journal", str(path)])
    assert r.exit_code == 0 and "daemon" not in r.output          # no heartbeat file: no warning on success
    daemonlock.beat(path, now=time.time() - 400)
    r = runner.invoke(history_command, ["-j", "5", "--journal", str(path)])
    assert r.exit_code == 0
    assert "ft-history: warning: the slurm-ft daemon has not run for 400 s" in r.stderr
    assert "daemon" not in r.stdout
    # the case: a faulted job the daemon never saw
    r = runner.invoke(history_command, ["-j", "1", "--journal", str(path)])
    assert r.exit_code == 1
    assert "job 1 is not in the journal" in r.stderr and "the slurm-ft daemon may be down: it has not run for 400 s" \
        in r.stderr
    daemonlock._last.clear()
    daemonlock.beat(path)
    r = runner.invoke(history_command, ["-j", "1", "--journal", str(path)])
    assert r.exit_code == 1 and "may be down" not in r.stderr and "warning" not in r.stderr


def test_ft_history_unknown_job_without_any_heartbeat_says_the_daemon_may_be_down(tmp_path):
    path = _journal_with_job(tmp_path)
    r = CliRunner().invoke(history_command, ["-j", "1", "--journal", str(path)])
    assert r.exit_code == 1
    assert f"the slurm-ft daemon may be down: no heartbeat ({daemonlock.heartbeat_path(path)})" in r.stderr
