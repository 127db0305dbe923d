"""The daemon's part in the other recovery paths (issue 13), on the in-memory Slurm with real
journals: in-place restarts the job's wrapper reported reach the journal (ft-history), and
``[bisect] auto`` starts one bisect for an unblamed multi-node failure."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurm_ft import bisect
from daemon_world import INFRA, World, XID79


def _rec(restarts, state="restarted", attempt=0):
    return (f"slurm-ft-run:attempt={attempt},restarts={restarts},of=2,state={state},verdict=infra,"
            f"rule=ib-completion-error,t=1.0")


def test_inplace_restarts_from_the_jobs_comment_are_journaled_once(tmp_path, monkeypatch):
    w = World(tmp_path, monkeypatch=monkeypatch)
    jid = w.start()
    w.step()
    base = w.job(jid).comment
    w.job(jid).comment = f"{base} {_rec(1)}"
    w.events and w.slurm.events.append(("epilog_slurmctld", jid, 0, w.job(jid).nodes[0]))
    w.step(n=3)
    w.job(jid).comment = f"{base} {_rec(2, 'escalated')}"
    w.slurm.end(jid, "FAILED", 1, verdicts={w.job(jid).nodes[0]: INFRA}, epilogs=True)
    w.step(n=8)
    with w.journal() as j:
        rows = [a for a in j.actions(jid, 0) if a["action"].startswith("inplace-")]
    assert [(a["action"], a["detail"].split()[1]) for a in rows if a["action"] == "inplace-restart"] == \
        [("inplace-restart", "1/2"), ("inplace-restart", "2/2")]
    assert [a["action"] for a in rows].count("inplace-escalate") == 1


def test_a_forged_record_buys_nothing(tmp_path, monkeypatch):
    """A user writes a record claiming 100 restarts of a future attempt, and one for the present:
    the future one is ignored; no retry, priority or blame comes with either."""
    w = World(tmp_path, monkeypatch=monkeypatch)
    jid = w.start()
    w.step()
    base = w.job(jid).comment
    w.job(jid).comment = f"{base} slurm-ft-run:attempt=5,restarts=100,of=100,state=restarted,verdict=hardware," \
                         f"rule=xid-79,t=1.0"
    w.slurm.end(jid, "FAILED", 1, verdicts={w.job(jid).nodes[0]: ("user", "python-traceback", ())}, epilogs=True)
    w.step(n=8)
    with w.journal() as j:
        assert not [a for a in j.actions(jid) if a["action"].startswith("inplace-")]
        assert not [a for a in j.actions(jid) if a["action"] in ("failover", "drain")]
    assert w.ft_state(jid) == "user-error"


class _Proc:
    pid = 4242

    def __init__(self):
        self.alive = True

    def poll(self):
        return None if self.alive else 0


@pytest.fixture
def spawned(monkeypatch):
    calls = []

    def spawn(cfg, job_id, attempt, nodes):
        calls.append((job_id, attempt, tuple(nodes)))
        return _Proc()
    monkeypatch.setattr(bisect, "spawn", spawn)
    return calls


def test_auto_bisect_one_at_a_time(tmp_path, monkeypatch, spawned):
    w = World(tmp_path, nodes=6, extra_config="[bisect]\nauto = true\n", monkeypatch=monkeypatch)
    a = w.start(node_count=2)
    b = w.start(node_count=2)
    w.step()
    for jid in (a, b):
        w.slurm.end(jid, "FAILED", 1, verdicts={n: INFRA for n in w.job(jid).nodes}, epilogs=True)
    w.step(n=8)
    assert [c[0] for c in spawned] == [a]
    with w.journal() as j:
        started = {jid: [(x["status"], x["detail"]) for x in j.actions(jid) if x["action"] == "bisect-start"]
                   for jid in (a, b)}
    assert started[a][0][0] == "done" and "pid 4242" in started[a][0][1]
    assert started[b][0][0] == "skipped" and "still running" in started[b][0][1]
    # hardware blamed a node: nothing to search for
    c = w.start(node_count=2)
    w.step()
    w.daemon.bisect_proc.alive = False
    w.slurm.end(c, verdicts={w.job(c).nodes[0]: XID79}, epilogs=True)
    w.step(n=8)
    assert [x[0] for x in spawned] == [a]


def test_auto_bisect_off_by_default(tmp_path, monkeypatch, spawned):
    w = World(tmp_path, nodes=6, monkeypatch=monkeypatch)
    a = w.start(node_count=2)
    w.step()
    w.slurm.end(a, "FAILED", 1, verdicts={n: INFRA for n in w.job(a).nodes}, epilogs=True)
    w.step(n=8)
    assert spawned == []


def test_spawned_bisect_command_line_is_an_argument_list():
    """What the daemon starts: ``python -m slurm_ft.cli.main bisect --nodes <hostlist> --job J
    --attempt A --from-daemon`` as an argument list (no shell), in its own session."""
    from slurm_ft import config
    captured = {}

    class P:
        def __init__(self, argv, **kw):
            captured.update(argv=argv, **kw)
    orig = subprocess.Popen
    subprocess.Popen = P
    try:
        bisect.spawn(config.Config(), 12, 1, ["n1", "n2", "n3"])
    finally:
        subprocess.Popen = orig
    assert captured["argv"][:5] == [sys.executable, "-I", "-u", "-m", "slurm_ft.cli.main"]
    assert captured["argv"][5:] == ["bisect", "--nodes", "n[1-3]", "--job", "12", "--attempt", "1", "--from-daemon"]
    assert captured["cwd"] == "/" and set(captured["env"]) <= {"PATH", "LC_ALL", "SLURM_CONF", "SLURM_FT_CONFIG"}
    assert captured["start_new_session"] is True
