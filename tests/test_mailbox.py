"""The node mailbox keeps hardware and other verdicts in two pools (issue 27, item 9): failing
jobs post non-hardware records, and however many of them end on a node they never push one of
its newest hardware verdicts out of the field before the daemon has read it. Before: 16 tiny
failing jobs evicted another user's hardware verdict from the 16-slot field."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_ft.failover import mailbox
from slurm_ft.failover.verdict import bounded, hardware_reserve
from daemon_world import XID79, World

CLASSES = ("hardware", "user", "infra", "hang", "unknown", "ok")


class FieldSlurm:
    """The two Slurm calls a post makes: read the node's field, set it (one node, last writer wins)."""

    def __init__(self):
        self.field = ""

    def show_node(self, node):
        return {"Extra": self.field}

    def update_node(self, node, **kw):
        self.field = kw["Extra"]


def _rec(i: int, verdict: str) -> mailbox.Record:
    xids = ((79, "0000:10:00"),) if verdict == "hardware" else ()
    return mailbox.Record(1000 + i, 0, verdict, "xid-79" if xids else "python-traceback", xids, 1, 1.5 + i)


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(st.sampled_from(CLASSES), max_size=60), keep=st.integers(1, 24),
       batch=st.integers(1, 4))
def test_no_sequence_of_posts_evicts_one_of_the_newest_hardware_verdicts(kinds, keep, batch):
    slurm = FieldSlurm()
    posted: list[mailbox.Record] = []
    reserve = hardware_reserve(keep)
    for start in range(0, len(kinds), batch):      # an outbox posts several records at once
        recs = [_rec(i, k) for i, k in enumerate(kinds[start:start + batch], start)]
        mailbox._publish_locked(slurm, "n1", recs, "Extra", keep)
        posted += recs
        held = mailbox.parse(slurm.field)
        hardware = [r for r in posted if r.hardware]
        assert all(r in held for r in hardware[-reserve:] if reserve)        # never evicted
        assert len(held) <= keep and len(slurm.field) <= len(mailbox.HEADER) + keep * 80
        assert held == [r for r in posted if r in held]                      # order kept, no dupes
        if keep >= 2:                                                          # the newest of each kind
            for pool in (hardware, [r for r in posted if not r.hardware]):
                assert not pool or pool[-1] in held
        if len(posted) <= keep:                                                # nothing dropped early
            assert held == posted


def test_sixteen_failing_jobs_do_not_evict_a_hardware_verdict():
    slurm = FieldSlurm()
    hw = _rec(0, "hardware")
    mailbox._publish_locked(slurm, "n1", [hw], "Extra", 16)
    for i in range(1, 17):                                     # 16 tiny failing jobs, one by one
        mailbox._publish_locked(slurm, "n1", [_rec(i, "user")], "Extra", 16)
    held = mailbox.parse(slurm.field)
    assert hw in held and len(held) == 16
    assert [r.job_id for r in held if not r.hardware] == list(range(1002, 1017))    # the 15 newest


def test_a_pool_that_does_not_use_its_share_leaves_it_to_the_other():
    only_hw = [_rec(i, "hardware") for i in range(20)]
    assert bounded(only_hw, 16) == only_hw[-16:]
    only_user = [_rec(i, "user") for i in range(20)]
    assert bounded(only_user, 16) == only_user[-16:]
    mixed = [_rec(i, "hardware" if i < 12 else "user") for i in range(30)]
    kept = bounded(mixed, 16)
    assert [r.job_id for r in kept if r.hardware] == list(range(1004, 1012))      # the reserve: 8
    assert len(kept) == 16


@pytest.fixture
def w(tmp_path, monkeypatch):
    return World(tmp_path, nodes=3, monkeypatch=monkeypatch)


def test_a_hardware_verdict_behind_sixteen_failing_jobs_is_still_acted_on(w):
    """Daemon level: the job's epilog posts Xid 79 on its node, then 16 small jobs of another user
    fail there before the daemon reads the node: the job is still failed over."""
    jid = w.start()
    node = w.job(jid).nodes[0]
    w.step()
    w.slurm.end(jid, verdicts={node: XID79}, epilogs=True)
    for i in range(16):
        w.slurm.post(node, mailbox.Record(9000 + i, 0, "user", "python-traceback", (), 1, w.clock()))
    assert any(r.hardware and r.job_id == jid for r in mailbox.parse(w.slurm.node_recs[node].extra))
    w.step(n=8)
    assert w.slurm.requeues.get((jid, 0), 0) == 1
    with w.journal() as j:
        assert [v["verdict"] for v in j.verdicts(jid, 0)] == ["hardware"]
