"""Checkpoint helper, ack channel, HTTP endpoints, jobspec SPANK values, ft-history rendering."""

from __future__ import annotations

import os
import signal

import pytest

from slurm_ft.checkpoint import channel
from slurm_ft.checkpoint.helper import ExitCheckpoint, exit_checkpoint
from slurm_ft.checkpoint.http import check_bind
from slurm_ft.errors import ConfigError
from slurm_ft.failover import jobspec
from slurm_ft.history.query import _checkpoint, render_table
from slurm_ft.journal import open_journal


class FakeReporter:
    def __init__(self):
        self.calls = []

    def report(self, state, step=None, path=None):
        self.calls.append((state, step, path))
        return channel.Ack(state, 0, step, 0.0, path)


def test_ack_roundtrip_and_merge_keeps_other_words():
    ack = channel.Ack("saved", 1, 120, 1712345678.25, "/ckpt/a b,c.pt")
    word = ack.encode()
    assert " " not in word and channel.Ack.decode(word) == channel.Ack("saved", 1, 120, 1712345678.2, "/ckpt/a b,c.pt")
    comment = "ft:retries=2,ckpt_signal=USR2,ckpt_wait=600,hang_timeout=0 my note"
    merged = channel.merge(comment, ack)
    assert merged.startswith(comment) and channel.find(merged).step == 120
    again = channel.merge(merged, channel.Ack("failed", 1, None, 1.0, None))
    assert again.count(channel.PREFIX) == 1 and channel.find(again).state == "failed"
    # the ack word never makes a job look ft-enabled, nor breaks its options
    assert not jobspec.from_comment(channel.merge("", ack), 3).enabled
    assert jobspec.from_comment(merged, 3).retries == 2


@pytest.mark.parametrize("word", ["slurm-ft-ckpt:state=bogus,attempt=0,t=1", "slurm-ft-ckpt:state=saved",
                                  "slurm-ft-ckpt:state=saved,attempt=x,t=1", "other"])
def test_malformed_ack_is_ignored(word):
    assert channel.find(word) is None


def test_reporter_from_env():
    r = channel.Reporter.from_env({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "2"}, slurm=object())
    assert (r.job_id, r.attempt) == (42, 2)
    assert channel.Reporter.from_env({}, slurm=object()) is None


def test_signal_then_poll_saves_and_reports():
    rep = FakeReporter()
    saved = []

    @exit_checkpoint(signal="USR2", reporter=rep, report=True, env={})
    def save(step):
        saved.append(step)
        return f"/ckpt/{step}"

    with save:
        assert not save.poll(1)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert save.requested
        assert save.poll(7)
    assert saved == [7] and rep.calls == [("saving", 7, None), ("saved", 7, "/ckpt/7")]
    assert save.status()["status"] == "saved"
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # handler removed after the block


def test_failed_save_is_reported_and_raised():
    rep = FakeReporter()

    def boom(step):
        raise OSError("disk full")

    ckpt = ExitCheckpoint(boom, reporter=rep, report=True, env={"SLURM_FT_CKPT_SIGNAL": "HUP"})
    assert ckpt.signal_name == "HUP"
    ckpt.request()
    with pytest.raises(OSError):
        ckpt.poll(3)
    assert rep.calls[-1] == ("failed", 3, None) and ckpt.status()["status"] == "failed"


def test_only_rank_zero_reports_by_default():
    assert ExitCheckpoint(lambda s: None, env={"SLURM_PROCID": "1", "SLURM_JOB_ID": "5"}).reporter is None
    assert ExitCheckpoint(lambda s: None, env={"SLURM_PROCID": "0", "SLURM_JOB_ID": "5"}).reporter is not None


def test_http_notify_and_status(tmp_path):
    env = {"SLURM_FT_RUNTIME_DIR": str(tmp_path)}
    ckpt = ExitCheckpoint(lambda s: "/p", reporter=FakeReporter(), report=True, env=env)
    from slurm_ft.checkpoint import http
    for port in range(9400, 9500):
        try:
            ckpt.serve_http(port)
            break
        except OSError:
            continue
    try:
        assert http.notify(port, env=env)["accepted"]  # the job's secret, from its token file
        assert ckpt.requested and ckpt.poll(11)
        body = http.status(port, token=env["SLURM_FT_CKPT_TOKEN"])  # or from the environment
        assert body["status"] == "saved" and body["step"] == 11 and body["path"] == "/p"
    finally:
        ckpt.uninstall()


@pytest.mark.parametrize("host, port", [("127.0.0.1", 8999), ("127.0.0.1", 10000), ("0.0.0.0", 9000),
                                        ("8.8.8.8", 9000), ("localhost", 9000)])
def test_http_bind_is_checked(host, port):
    with pytest.raises(ConfigError):
        check_bind(host, port)


def test_jobspec_reads_spank_values_and_legacy_comment():
    o = jobspec.from_comment("ft:retries=2,ckpt_signal=USR2,ckpt_wait=20,hang_timeout=1800", 3)
    assert (o.enabled, o.retries, o.ckpt_signal, o.ckpt_wait_s, o.hang_timeout_s) == (True, 2, "USR2", 20, 1800)
    assert o.ckpt_signum == signal.SIGUSR2
    legacy = jobspec.from_comment("ft:retries=1", 3)
    assert legacy.enabled and legacy.ckpt_signal == "USR1" and legacy.ckpt_wait_s == 600
    for bad in ("ft:retries=-1", "ft:ckpt_signal=KILL", "ft:ckpt_wait=3601", "ft:hang_timeout=5", "ft:x=1"):
        with pytest.raises(ConfigError):
            jobspec.from_comment(bad, 3)
    assert jobspec.parse_signal("sigusr2") == "USR2" and jobspec.parse_signal("10") == "USR1"


def test_history_shows_checkpoint(tmp_path):
    with open_journal(tmp_path / "j.db") as j:
        j.upsert_job(9, name="t", user="u", ft_enabled=1, retries=2, ft_state="requeued", excluded_nodes="n1")
        j.upsert_attempt(9, 0, nodes="n[1-2]", state="REQUEUED")
        j.record(9, 0, "ckpt-notify", "n[1-2]", "SIGUSR2 to every task of steps 9.0; wait 60 s")
        j.record(9, 0, "ckpt-ack", "n[1-2]", "saved step=120 path=/ckpt/120")
        j.record(9, 0, "requeue", "9")
        from slurm_ft.history.query import history
        h = history(j, 9)
    assert h["attempts"][0]["checkpoint"] == {"result": "saved", "step": 120, "path": "/ckpt/120",
                                              "detail": "saved step=120 path=/ckpt/120"}
    assert "saved @120 /ckpt/120" in render_table(h)
    assert _checkpoint([{"action": "ckpt-timeout", "detail": "no ack", "status": "failed"}])["result"] == "timeout"


def test_notify_not_from_slurm_ft_bounds_the_wait_and_trains_on(capsys):
    """A notify that does not come from slurm-ft (the user's own ``kill -USR1``, a POST by hand):
    the loop saves, waits at most the bound for a requeue that never comes, says why, trains on
    (issue 25 item 6)."""
    import time

    rep = FakeReporter()
    ckpt = ExitCheckpoint(lambda step: f"/ckpt/{step}", reporter=rep, report=True,
                          env={"SLURM_FT_CKPT_WAIT": "1"})
    steps_done = []
    with ckpt:
        for step in range(5):
            if step == 2:
                ckpt.request("api")                       # not slurm-ft: nothing will requeue the job
            if ckpt.poll(step):
                t0 = time.monotonic()
                assert ckpt.wait_for_requeue() is False     # $SLURM_FT_CKPT_WAIT bounds it
                assert 0.9 <= time.monotonic() - t0 < 10
            steps_done.append(step)
    assert steps_done == [0, 1, 2, 3, 4]                    # training went on
    assert ckpt.state == "saved" and ckpt.wait_expired == {"source": "api", "step": 2, "waited_s": 1.0}
    err = capsys.readouterr().err
    assert "nothing ended the job within 1 s" in err and "did not come from slurm-ft" in err
    assert err.count("\n") == 1


def test_wait_for_requeue_bound_and_early_return():
    import threading

    from slurm_ft.data.client.slurm_ft_job import REQUEUE_WAIT_S
    from slurm_ft.failover.jobspec import DEFAULT_CKPT_WAIT_S
    assert REQUEUE_WAIT_S == DEFAULT_CKPT_WAIT_S == 600        # the job's default --ft-ckpt-wait
    ckpt = ExitCheckpoint(lambda step: None, reporter=FakeReporter(), report=True,
                          env={"SLURM_FT_CKPT_WAIT": "junk"})
    assert ckpt.wait_for_requeue(timeout=0.05) is False
    threading.Timer(0.05, ckpt.request, args=("signal",)).start()
    assert ckpt.wait_for_requeue(timeout=30) is True        # a new notification ends the wait early
