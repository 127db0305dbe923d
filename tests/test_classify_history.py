"""Count/window rules across jobs: earlier Xids from the node journal (real SQLite files)."""

from __future__ import annotations

import os
import time

import pytest

from slurm_ft.node import epilog
from slurm_ft.classify import Evidence, Policy, PriorXid, classify, from_config
from slurm_ft.classify.history import lookback_s, needs_history, prior_xids
from slurm_ft.config import Config, JournalConfig
from slurm_ft.journal import open_journal
from slurm_ft.node.job import NodeJob

BUS = "0000:3b:00"
OTHER = "0000:3d:00"
RULE = {"xid": {"31": {"count": 3, "window_s": 3600, "class": "hardware"}}}


def xid31(bus: str, pid: int) -> str:
    return f"NVRM: Xid (PCI:{bus}): 31, pid={pid}, name=python, Ch 00000008, intr 00000000. MMU Fault"


def record(path, job_id: int, bus: str, pid: int, created: float, attempt: int = 0, xid: int = 31) -> None:
    with open_journal(path) as j:
        j.add_verdict(job_id, attempt, "n1", "user", f"xid-{xid}",
                      xids=[{"xid": xid, "bus_id": bus, "gpu_index": 0, "kind": "xid",
                             "line": xid31(bus, pid).replace(": 31,", f": {xid},")}],
                      evidence=[xid31(bus, pid)], action="none", exit_code=1, created=created)


def job(job_id: int = 300, attempt: int = 0) -> NodeJob:
    return NodeJob(job_id=job_id, node="n1", attempt=attempt, uid=0, gpus=(0,), exit_code=1, signal=None,
                   stdout=None, stderr=None, work_dir=None)


def verdict_with_history(tmp_path, current_pid: int = 3003, job_id: int = 300, attempt: int = 0, policy=None):
    """What the epilog decides: classify, read the journal when a counted Xid was seen, classify again."""
    policy = policy or from_config(RULE)
    cfg = Config(journal=JournalConfig(node_path=str(tmp_path / "node-{node}.db")))
    ev = Evidence(kernel_lines=[xid31(BUS, current_pid)], exit_code=1, job_bus_ids=frozenset({BUS}),
                  node_bus_ids={BUS: 0, OTHER: 1}, now=time.time())
    first = classify(ev, policy)
    logged: list[str] = []
    with_prior = epilog.with_prior_xids(cfg, job(job_id, attempt), ev, policy, logged.append)
    return classify(with_prior, policy), first, with_prior, logged


@pytest.fixture
def journal_path(tmp_path):
    return tmp_path / "node-n1.db"


def test_two_earlier_31_within_the_hour_plus_this_one_is_hardware(tmp_path, journal_path):
    now = time.time()
    record(journal_path, 100, BUS, 1001, now - 1800)
    record(journal_path, 101, BUS, 1002, now - 600)
    v, first, ev, _ = verdict_with_history(tmp_path)
    assert first.verdict == "user"  # this job alone: one application fault
    assert len(ev.prior_xids) == 2 and all(isinstance(p, PriorXid) for p in ev.prior_xids)
    assert (v.verdict, v.rule, v.action) == ("hardware", "xid-31-count", "drain_node")


def test_earlier_31_outside_the_window_is_user(tmp_path, journal_path):
    now = time.time()
    record(journal_path, 100, BUS, 1001, now - 7200)
    record(journal_path, 101, BUS, 1002, now - 600)
    v, *_ = verdict_with_history(tmp_path)
    assert (v.verdict, v.rule) == ("user", "xid-31")


def test_earlier_31_on_another_gpu_is_user(tmp_path, journal_path):
    now = time.time()
    record(journal_path, 100, OTHER, 1001, now - 1800)
    record(journal_path, 101, OTHER, 1002, now - 600)
    v, *_ = verdict_with_history(tmp_path)
    assert (v.verdict, v.rule) == ("user", "xid-31")


def test_other_xids_and_empty_journal_do_not_count(tmp_path, journal_path):
    v, _, ev, logged = verdict_with_history(tmp_path)  # no journal yet: created empty, no prior
    assert v.verdict == "user" and ev.prior_xids == () and not logged
    now = time.time()
    record(journal_path, 100, BUS, 1001, now - 1800, xid=79)
    record(journal_path, 101, BUS, 1002, now - 600, xid=13)
    v, *_ = verdict_with_history(tmp_path)
    assert v.verdict == "user"


def test_the_same_process_seen_twice_counts_once(tmp_path, journal_path):
    """Overlapping kernel-log windows: two earlier verdicts hold the Xid of the current process."""
    now = time.time()
    record(journal_path, 100, BUS, 3003, now - 1800)
    record(journal_path, 101, BUS, 3003, now - 600)
    v, *_ = verdict_with_history(tmp_path, current_pid=3003)
    assert v.verdict == "user"
    record(journal_path, 102, BUS, 1002, now - 300)
    record(journal_path, 103, BUS, 1003, now - 200)
    assert verdict_with_history(tmp_path, current_pid=3003)[0].verdict == "hardware"


def test_this_jobs_own_earlier_record_is_left_out(tmp_path, journal_path):
    """The epilog of the same job+attempt run twice must not count its own Xids again."""
    now = time.time()
    record(journal_path, 300, BUS, 1001, now - 60)
    record(journal_path, 100, BUS, 1002, now - 600)
    assert verdict_with_history(tmp_path, job_id=300)[0].verdict == "user"
    # an earlier attempt of the same job is an earlier, independent run: it counts
    record(journal_path, 300, BUS, 1003, now - 1200, attempt=1)
    assert verdict_with_history(tmp_path, job_id=300, attempt=2)[0].verdict == "hardware"


def test_journal_is_read_only_when_a_counted_xid_is_seen(tmp_path, journal_path, monkeypatch):
    now = time.time()
    record(journal_path, 100, BUS, 1001, now - 1800)
    policy = from_config(RULE)
    assert needs_history([xid31(BUS, 1)], policy)
    assert needs_history(["noise", "[ 1.0] " + xid31(BUS, 1).upper().replace("XID", "Xid")], policy, kernel_records=False)
    assert not needs_history(["[ 1.0] " + xid31(BUS, 1)], policy)  # a kmsg record is never stripped
    assert not needs_history(["NVRM: Xid: 31, pid=1, no bus id"], policy)
    assert not needs_history(["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."], policy)
    assert not needs_history(["nothing here"] * 3, policy)
    no_rules = Policy(xids=policy.xids, signatures=policy.signatures, counts=())
    assert not needs_history([xid31(BUS, 1)], no_rules)

    def boom(*a, **kw):
        raise AssertionError("journal opened")

    monkeypatch.setattr("slurm_ft.journal.open_journal", boom)
    cfg = Config(journal=JournalConfig(node_path=str(tmp_path / "node-{node}.db")))
    ev = Evidence(kernel_lines=["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."], now=now)
    assert epilog.with_prior_xids(cfg, job(), ev, policy, print) is ev


def test_unreadable_journal_is_logged_not_fatal(tmp_path):
    (tmp_path / "node-n1.db").write_bytes(b"not a database" * 100)
    v, first, ev, logged = verdict_with_history(tmp_path)
    assert v.verdict == "user" and ev.prior_xids == ()
    assert logged and "earlier Xids unavailable" in logged[0]


def test_journal_query_is_bounded(journal_path):
    now = time.time()
    for n in range(30):
        record(journal_path, 1000 + n, BUS, 5000 + n, now - 30 + n)
    with open_journal(journal_path) as j:
        j.add_verdict(2000, 0, "n1", "ok", "clean-exit", created=now)  # no Xids: not returned
        rows = j.recent_xid_verdicts(now - 3600, limit=5, scan=1000)
        assert [r["job_id"] for r in rows] == [1029, 1028, 1027, 1026, 1025]  # newest first
        assert rows[0]["xids"][0]["xid"] == 31
        # only the newest `scan` rows are looked at
        assert [r["job_id"] for r in j.recent_xid_verdicts(now - 3600, limit=100, scan=3)] == [1029, 1028]
        assert j.recent_xid_verdicts(now + 10) == []


def test_prior_xids_from_rows_and_lookback():
    rows = [
        {"job_id": 1, "attempt": 0, "created": 100.0, "xids": [
            {"xid": 31, "bus_id": "00000000:3B:00.0", "kind": "xid", "line": xid31(BUS, 7)},
            {"xid": 31, "bus_id": None, "kind": "xid", "line": "NVRM: Xid: 31"},      # no bus: dropped
            {"xid": 24007, "bus_id": "0000:86:00", "kind": "sxid", "line": "SXid"},   # NVSwitch: dropped
            {"xid": "bad"}, "junk"]},
        {"job_id": 2, "attempt": 0, "created": "garbage", "xids": [{"xid": 31, "bus_id": BUS}]},
        {"job_id": 3, "attempt": 1, "created": 50.0, "xids": [{"xid": 13, "bus_id": BUS, "kind": "xid", "line": ""}]},
    ]
    assert prior_xids(rows) == (PriorXid(100.0, 31, BUS, 7), PriorXid(50.0, 13, BUS, None))
    assert prior_xids(rows, exclude=(3, 1)) == (PriorXid(100.0, 31, BUS, 7),)
    assert prior_xids(rows, limit=1) == (PriorXid(100.0, 31, BUS, 7),)
    assert lookback_s(from_config(RULE)) == 3600
    assert lookback_s(from_config({"xid": {"31": {"count": 2, "window_s": 86400, "class": "hardware"}}})) == 86400


def test_engine_counts_prior_events_per_rule_window():
    """Plain (time, xid, bus) tuples work too; each rule uses its own window."""
    now = 1_000_000.0
    policy = from_config({"xid": {"31": {"count": 3, "window_s": 3600, "class": "hardware"},
                                  "13": {"count": 2, "window_s": 60, "class": "hardware"}}})
    cur = [xid31(BUS, 9)]
    prior = ((now - 100, 31, BUS), (now - 3000, 31, BUS))
    assert classify(Evidence(kernel_lines=cur, prior_xids=prior, now=now), policy).rule == "xid-31-count"
    assert classify(Evidence(kernel_lines=cur, prior_xids=prior[:1], now=now), policy).rule == "xid-31"
    x13 = [xid31(BUS, 9).replace(": 31,", ": 13,")]
    assert classify(Evidence(kernel_lines=x13, prior_xids=((now - 100, 13, BUS),), now=now), policy).rule == "xid-13"
    assert classify(Evidence(kernel_lines=x13, prior_xids=((now - 30, 13, BUS),), now=now), policy).rule == "xid-13-count"
    # prior events alone never decide: the current job must show the Xid
    assert classify(Evidence(kernel_lines=[], prior_xids=prior * 3, now=now), policy).verdict == "unknown"
    # malformed entries are skipped, not fatal
    junk = (("x", 31, BUS), (now, 31), None, (now - 1, 31, None), (now - 5, 31, BUS, True))
    assert classify(Evidence(kernel_lines=cur, prior_xids=junk, now=now), policy).rule == "xid-31"


def test_shipped_recurring_rule_also_counts_earlier_jobs():
    """The default xid-app-recurring rule (13/31/43 from 3 processes on one GPU in 1 h -> unknown)."""
    now = time.time()
    prior = (PriorXid(now - 600, 13, BUS, 1), PriorXid(now - 300, 43, BUS, 2))
    v = classify(Evidence(kernel_lines=[xid31(BUS, 3)], prior_xids=prior, now=now))
    assert (v.verdict, v.rule) == ("unknown", "xid-app-recurring")


def _stub_scontrol(bin_dir, calls) -> None:
    os.makedirs(bin_dir, exist_ok=True)
    path = os.path.join(bin_dir, "scontrol")
    with open(path, "w") as fh:
        fh.write(f'#!/bin/sh\necho "$@" >> {calls}\n'
                 'if [ "$1" = show ]; then echo "NodeName=n1 State=IDLE Extra= Reason=(null)"; fi\nexit 0\n')
    os.chmod(path, 0o755)


def test_whole_epilog_counts_this_nodes_earlier_xids(tmp_path, monkeypatch):
    """epilog.run end to end (fake NVML, stub scontrol, real journal): the third Xid 31 on the
    job's GPU within the hour drains the node; the journal keeps the hardware verdict."""
    from slurm_ft.lab.layout import inventory_gpus
    from slurm_ft.nvml.fake import write_inventory

    inv = tmp_path / "inv-n1.json"
    write_inventory(str(inv), "n1", inventory_gpus("n1"))
    bus0 = "0000:10:00"  # GPU 0 of lab node n1
    calls = tmp_path / "scontrol.calls"
    _stub_scontrol(str(tmp_path / "bin"), calls)
    conf = tmp_path / "slurm-ft.toml"
    conf.write_text(f'''
[journal]
path = "{tmp_path}/journal.db"
node_path = "{tmp_path}/node-{{node}}.db"
[node_state]
dir = "{tmp_path}/state"
log = "{tmp_path}/epilog.log"
[nvml]
backend = "fake"
inventory = "{tmp_path}/inv-{{node}}.json"
[slurm]
bin_dir = "{tmp_path}/bin"
[classify.xid.31]
count = 3
window_s = 3600
class = "hardware"
''')
    now = time.time()
    node_db = tmp_path / "node-n1.db"
    record(node_db, 100, bus0, 1001, now - 1800)
    record(node_db, 101, bus0, 1002, now - 600)
    monkeypatch.setattr("slurm_ft.classify.sources.read_kmsg", lambda since, **kw: [xid31(bus0, 3003)])
    env = {"SLURM_FT_CONFIG": str(conf), "SLURM_JOB_ID": "300", "SLURMD_NODENAME": "n1",
           "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_EXIT_CODE": str(1 << 8), "SLURM_JOB_GPUS": "0",
           "SLURM_JOB_UID": str(os.getuid())}
    assert epilog.run(env) == 0
    with open_journal(node_db) as j:
        (got,) = j.verdicts(300)
    assert (got["verdict"], got["rule"], got["action"]) == ("hardware", "xid-31-count", "drain_node"), \
        (tmp_path / "epilog.log").read_text()
    assert "DRAIN" in calls.read_text().upper()

    # another job, Xid 31 on the same GPU, but the earlier ones on the other GPU: user
    other = tmp_path / "other"
    other.mkdir()
    conf2 = tmp_path / "slurm-ft-2.toml"
    conf2.write_text(conf.read_text().replace(f'node_path = "{tmp_path}/node-', f'node_path = "{other}/node-'))
    record(other / "node-n1.db", 100, "0000:11:00", 1001, now - 1800)
    record(other / "node-n1.db", 101, "0000:11:00", 1002, now - 600)
    assert epilog.run({**env, "SLURM_FT_CONFIG": str(conf2), "SLURM_JOB_ID": "301"}) == 0
    with open_journal(other / "node-n1.db") as j:
        (got,) = j.verdicts(301)
    assert (got["verdict"], got["rule"]) == ("user", "xid-31")
