"""A verdict a slurmctld state rollback erased from a node's mailbox field is re-posted by the
node from its sent ledger (issue 20, slurm_ft/failover/repost.py), and the daemon acts on it once:
never a second failover for a verdict it had read before the rollback."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_ft.failover import mailbox, repost
from slurm_ft.journal import open_node_journal
from daemon_world import XID79, World

CLASSES = ("hardware", "user", "infra", "unknown")


class FieldSlurm:
    """A node's record as far as a post goes: its field, read and set (last writer wins)."""

    def __init__(self):
        self.field = ""
        self.reads = self.writes = 0

    def show_node(self, node):
        self.reads += 1
        return {"Extra": self.field}

    def update_node(self, node, **kw):
        self.writes += 1
        self.field = kw["Extra"]


class Cfg:
    """The two config tables a post reads."""

    def __init__(self, state_dir: str, keep: int = 16):
        self.node_state = type("NS", (), {"dir": state_dir})()
        self.failover = type("FO", (), {"mailbox_field": "Extra", "mailbox_keep": keep})()

    def node_journal_path(self, node: str) -> str:
        return f"{self.node_state.dir}/node-{node}.db"


def _rec(i: int, verdict: str, t0: float) -> mailbox.Record:
    xids = ((79, "0000:10:00"),) if verdict == "hardware" else ()
    return mailbox.Record(1000 + i, 0, verdict, "xid-79" if xids else "python-traceback", xids, 1, t0 + i)


@settings(max_examples=150, deadline=None)
@given(kinds=st.lists(st.sampled_from(CLASSES), min_size=1, max_size=30), keep=st.integers(1, 20),
       cut=st.integers(0, 30), data=st.data())
def test_a_rolled_back_field_gets_back_everything_it_held(tmp_path_factory, kinds, keep, cut, data):
    """Posts one at a time; slurmctld rolls the field back to what it held after ``cut`` posts
    (or any earlier text); the next check puts back every record the field held before the
    rollback, keeps the bound, and a second check changes nothing."""
    state = str(tmp_path_factory.mktemp("ns"))
    slurm, t0 = FieldSlurm(), time.time()
    snapshots = [""]
    for i, k in enumerate(kinds):
        mailbox._publish_locked(slurm, "n1", [_rec(i, k, t0)], "Extra", keep, state_dir=state)
        snapshots.append(slurm.field)
    before = mailbox.parse(slurm.field)
    slurm.field = snapshots[min(cut, len(snapshots) - 1)]               # the rollback
    rolled = mailbox.parse(slurm.field)
    # the next hook on the node: nothing of its own to post (a check)
    back = mailbox._publish_locked(slurm, "n1", [], "Extra", keep, state_dir=state)
    after = mailbox.parse(slurm.field)
    assert set(before) <= set(after), (before, after)
    assert len(after) <= keep
    assert {r.key for r in back} == {r.key for r in after} - {r.key for r in rolled}
    assert [r.time for r in after] == sorted(r.time for r in after)
    writes = slurm.writes
    assert mailbox._publish_locked(slurm, "n1", [], "Extra", keep, state_dir=state) == []
    assert slurm.writes == writes


def test_a_confirmed_record_is_forgotten_and_never_reposted(tmp_path):
    """Seen in the field CONFIRM_S after its post: slurmctld has saved it; the ledger drops it."""
    state, slurm, t0 = str(tmp_path), FieldSlurm(), time.time()
    rec = _rec(0, "hardware", t0)
    mailbox._publish_locked(slurm, "n1", [rec], "Extra", 16, state_dir=state)
    assert repost.read_ledger(state, "n1")["records"]
    later = t0 + repost.CONFIRM_S + 1
    back, ledger = repost.plan(repost.read_ledger(state, "n1"), mailbox.parse(slurm.field), 16, later)
    assert back == [] and ledger["records"] == []


def test_a_record_pushed_out_by_newer_ones_is_not_reposted(tmp_path):
    state, slurm, t0 = str(tmp_path), FieldSlurm(), time.time()
    for i in range(6):
        mailbox._publish_locked(slurm, "n1", [_rec(i, "user", t0)], "Extra", 4, state_dir=state)
    assert [r.job_id for r in mailbox.parse(slurm.field)] == [1002, 1003, 1004, 1005]
    assert mailbox._publish_locked(slurm, "n1", [], "Extra", 4, state_dir=state) == []
    assert {e["r"].split(",")[0] for e in repost.read_ledger(state, "n1")["records"]} == \
        {"1002.0", "1003.0", "1004.0", "1005.0"}


def test_reposts_of_one_record_are_bounded(tmp_path):
    """Slurm losing the record again and again: at most MAX_REPOSTS re-posts."""
    state, slurm = str(tmp_path), FieldSlurm()
    mailbox._publish_locked(slurm, "n1", [_rec(0, "hardware", time.time())], "Extra", 16, state_dir=state)
    n = 0
    for _ in range(repost.MAX_REPOSTS + 3):
        slurm.field = ""
        n += len(mailbox._publish_locked(slurm, "n1", [], "Extra", 16, state_dir=state))
    assert n == repost.MAX_REPOSTS


def test_nothing_posted_nothing_read(tmp_path):
    """The fast path: no ledger, no outbox: no Slurm call, and pending() is False."""
    cfg, slurm = Cfg(str(tmp_path)), FieldSlurm()
    assert not repost.pending(cfg.node_state.dir, "n1")
    assert mailbox.flush_outbox(cfg, slurm, "n1")
    assert slurm.reads == 0


def test_check_is_rate_limited(tmp_path, monkeypatch):
    cfg, slurm = Cfg(str(tmp_path)), FieldSlurm()
    now = [time.time()]
    monkeypatch.setattr(time, "time", lambda: now[0])
    assert mailbox.post_verdict(cfg, slurm, _rec(0, "hardware", now[0]).on("n1"))
    assert not repost.pending(cfg.node_state.dir, "n1")        # just read: not due
    assert mailbox.flush_outbox(cfg, slurm, "n1") and slurm.reads == 1
    now[0] += repost.RECHECK_S
    assert repost.pending(cfg.node_state.dir, "n1")
    slurm.field = ""                                            # the rollback
    lines = []
    assert mailbox.flush_outbox(cfg, slurm, "n1", log=lines.append)
    assert [r.job_id for r in mailbox.parse(slurm.field)] == [1000] and slurm.reads == 2
    assert lines and "re-posted 1 verdict" in lines[0]


def test_a_damaged_or_symlinked_ledger_is_never_followed(tmp_path):
    state = tmp_path / "ns"
    state.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text('{"checked": 0, "records": [{"r": "1.0,hardware,x,,1,1.0", "posted": 0}]}')
    (state / "posted-n1.json").symlink_to(target)
    assert repost.read_ledger(str(state), "n1")["records"] == []
    (state / "posted-n1.json").unlink()
    (state / "posted-n1.json").write_text("not json")
    assert repost.read_ledger(str(state), "n1") == {"checked": 0.0, "records": []}


@pytest.fixture
def w(tmp_path, monkeypatch):
    return World(tmp_path, nodes=3, monkeypatch=monkeypatch)


def _epilog_posts(w, jid, node):
    """What the node's epilog does for an Xid 79: drain, post through the mailbox (the ledger)."""
    verdict, rule, xids = XID79
    w.slurm.drain_by_node(node, f"slurm-ft: Xid 79 GPU 0000:10:00 (job {jid})")
    rec = mailbox.Record(jid, 0, verdict, rule, xids, 1, w.clock()).on(node)
    assert mailbox.post_verdict(w.cfg, w.slurm, rec)


def _next_hook(w, node):
    """The node's next prolog/epilog with nothing of its own to post."""
    w.clock.advance(repost.RECHECK_S)
    return mailbox.flush_outbox(w.cfg, w.slurm, node)


def test_a_verdict_the_rollback_erased_before_the_daemon_read_it_is_reposted_and_acted_on(w):
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    saved = w.slurm.saved_state()                      # slurmctld's last save: before the fault
    w.slurm.end(jid, epilogs=True)
    _epilog_posts(w, jid, node)                        # ... and the daemon has not read it yet
    w.slurm.restart_ctld(down_s=2.0, state=saved)      # field, drain and the job's end: lost
    assert not mailbox.parse(w.slurm.node_recs[node].extra) and not w.slurm.node_recs[node].drain
    w.step(n=20)                                       # JobLaunchFailure, no verdict: decided without
    assert w.slurm.requeues.get((jid, 0), 0) == 0 and w.ft_state(jid) == "failed"
    assert _next_hook(w, node)                         # the node puts the verdict back
    assert [r.job_id for r in mailbox.parse(w.slurm.node_recs[node].extra)] == [jid]
    w.step(n=12)
    assert w.slurm.requeues.get((jid, 0), 0) == 1      # the decision reopened: failed over now, once
    assert w.slurm.node_recs[node].drain                # and the faulty node drained again
    assert _next_hook(w, node)
    w.step(n=12)
    assert w.slurm.requeues.get((jid, 0), 0) == 1
    with w.journal() as j:
        assert [v["verdict"] for v in j.verdicts(jid, 0)] == ["hardware"]
        assert sum(a["action"] == "failover" for a in j.actions(jid)) == 1
    with open_node_journal(w.cfg, node, readonly=True) as nj:
        rows = [a for a in nj.actions(jid) if a["action"] == repost.ACTION]
    assert len(rows) == 1 and "re-posted hardware (xid-79)" in rows[0]["detail"]


def test_a_verdict_the_daemon_had_read_is_reposted_without_a_second_failover(w):
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    saved = w.slurm.saved_state()
    w.slurm.end(jid, epilogs=True)
    _epilog_posts(w, jid, node)
    w.step(n=12)
    assert w.slurm.requeues.get((jid, 0), 0) == 1      # read and failed over before the crash
    w.slurm.restart_ctld(down_s=2.0, state=saved)      # ... which Slurm forgets, with the verdict
    assert _next_hook(w, node)                         # re-posted (the node cannot know it was read)
    assert mailbox.parse(w.slurm.node_recs[node].extra)
    w.step(n=150)                                      # the reconciler redoes the failover, once
    assert w.slurm.requeues.get((jid, 0), 0) == 1
    with w.journal() as j:
        assert [v["verdict"] for v in j.verdicts(jid, 0)] == ["hardware"]
        assert sum(a["action"] == "failover" for a in j.actions(jid)) == 1


def test_the_prolog_checks_in_its_detached_part_only_when_due(tmp_path, monkeypatch):
    """A passing prolog: nothing posted on the node, no work at all; a ledger due for a check, the
    check goes to the detached part (``later``), never before the job starts."""
    from slurm_ft.node import prolog
    from slurm_ft.node.job import NodeJob

    cfg, slurm = Cfg(str(tmp_path)), FieldSlurm()
    monkeypatch.setattr("slurm_ft.slurm.Slurm.from_config", classmethod(lambda cls, c: slurm))
    job = NodeJob(5, "n1", 0, 1000, None, None, None, None, None, None)
    later: list = []
    prolog.flush_mailbox(cfg, job, print, later)
    assert later == [] and slurm.reads == 0
    now = [time.time()]
    monkeypatch.setattr(time, "time", lambda: now[0])
    assert mailbox.post_verdict(cfg, slurm, _rec(0, "hardware", now[0]).on("n1"))
    assert repost.ledger_path(cfg.node_state.dir, "n1").endswith("/posted-n1.json")
    prolog.flush_mailbox(cfg, job, print, later)
    assert later == []                                  # just read: not due yet
    now[0] += repost.RECHECK_S
    slurm.field = ""                                    # the rollback
    prolog.flush_mailbox(cfg, job, print, later)
    assert len(later) == 1 and slurm.reads == 1          # deferred, not run
    later[0]()
    assert [r.job_id for r in mailbox.parse(slurm.field)] == [1000]


def test_healthcheckprogram_reposts_on_an_idle_node(tmp_path, monkeypatch):
    """`slurm-ft health --act` (Slurm's HealthCheckProgram, which runs on idle and drained nodes
    too) puts back what a rollback erased before its checks."""
    from click.testing import CliRunner

    from daemon_world import write_config
    from slurm_ft import config as config_mod
    from slurm_ft.cli.health import health_command

    path = write_config(tmp_path)
    cfg, slurm = config_mod.load(path), FieldSlurm()
    monkeypatch.setattr("slurm_ft.slurm.Slurm.from_config", classmethod(lambda cls, c: slurm))
    now = [time.time()]
    monkeypatch.setattr(time, "time", lambda: now[0])
    assert mailbox.post_verdict(cfg, slurm, _rec(0, "hardware", now[0]).on("n1"))
    slurm.field, now[0] = "", now[0] + repost.RECHECK_S          # the rollback; the next health check
    CliRunner().invoke(health_command, ["--config", str(path), "--node", "n1", "--act"])
    assert [r.job_id for r in mailbox.parse(slurm.field)] == [1000]
