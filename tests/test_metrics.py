"""`slurm-ft metrics`: Prometheus metrics computed from a real journal (and fake sinfo nodes)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from slurm_ft import config as config_mod
from slurm_ft.failover import daemonlock
from slurm_ft.admin import metrics
from slurm_ft.cli.main import main
from slurm_ft.errors import SlurmCommandError
from slurm_ft.journal import open_journal
from slurm_ft.slurm import Node

XID79 = [{"xid": 79, "bus_id": "0000:10:00"}]


def _journal(tmp_path: Path) -> tuple[Path, Path]:
    """A journal with: job 1 failed over once (Xid 79, 4 s to recover) then completed; job 2 a
    user error; job 3 out of retries; job 4 an unblamed (infra) failover, then an evacuation and
    a continuation; drains done / kept an admin's reason / stopped by the breaker."""
    path = tmp_path / "j" / "journal.db"
    with open_journal(path) as j:
        for job, state in ((1, "completed"), (2, "user-error"), (3, "max-retries-exceeded"), (4, "continued")):
            j.upsert_job(job, name=f"job{job}", user="alice", ft_enabled=1, retries=3, ft_state=state)
        j.upsert_job(9, ft_enabled=0, ft_state="not-configured")
        j.upsert_attempt(1, 0, nodes="n1", start=1000.0, end=1100.0, state="FAILED")
        j.upsert_attempt(1, 1, nodes="n2", start=1104.0, end=1200.0, state="COMPLETED")
        j.add_verdict(1, 0, "n1", "hardware", "xid-79", XID79, [], "drain_node", source="mailbox")
        j.record(1, 0, "failover", "n1", json.dumps({"reason": "hardware (xid-79)", "blamed": ["n1"]}))
        j.record(1, 0, "drain", "n1", "slurm-ft: Xid 79 GPU 0000:10:00 (job 1)")
        j.add_verdict(2, 0, "n2", "user", "cuda-oom", [], [], "none", source="mailbox")
        j.record(2, 0, "decide", detail="user-error: the job's own error (cuda-oom)")
        j.add_verdict(3, 2, "n3", "hardware", "xid-48", [{"xid": 48, "bus_id": "0000:20:00"}], [], "drain_node")
        j.record(3, 2, "decide", detail="max-retries-exceeded: 2 failovers of 2")
        j.record(3, 2, "drain", "n3", "slurm-ft: Xid 48 GPU 0000:20:00 (job 3)", status="skipped")
        j.finish(j.db.execute("SELECT max(id) FROM actions").fetchone()[0], "skipped",
                 "kept-admin-reason: slurm-ft: Xid 48 GPU 0000:20:00 (job 3)")
        j.add_verdict(4, 0, "n4", "infra", "nccl-timeout", [], [], "retry")
        j.upsert_attempt(4, 0, nodes="n4", start=2000.0, end=2010.0, state="FAILED")
        j.upsert_attempt(4, 1, nodes="n4", start=2131.0, state="RUNNING")
        j.record(4, 0, "failover", "", json.dumps({"reason": "infra", "blamed": []}))
        j.record(4, 1, "failover", "n4", "evacuated by admin")          # an evacuation's requeue: not counted
        j.record(4, 1, "evacuation", "n4", "drain --checkpoint")
        j.record(4, 2, "continue", "", "time limit: continued after its exit checkpoint")
        aid = j.intend(5, 0, "drain", "n5", "slurm-ft: Xid 79 (job 5)")
        j.finish(aid, "skipped", "circuit breaker open since 2026-11-30T10:00:00: slurm-ft: Xid 79 (job 5)")
        j.record(5, 0, "breaker-open", "n5", "breaker-open: 8 nodes in 3600 s")
        j.intend(6, 0, "drain", "n6", "slurm-ft: Xid 79 (job 6)")     # an intent, not done: not counted
    cfg = tmp_path / "slurm-ft.toml"
    cfg.write_text(f'[journal]\npath = "{path}"\n')
    return path, cfg


def _node(name, reason="", state="idle", drained=True):
    return Node(name=name, state=state, flags=["DRAIN"] if drained else [], reason=reason, reason_set_by_user="root",
                comment="", extra="", raw={})


class FakeSlurm:
    def __init__(self, nodes=None, error=None):
        self._nodes, self._error = nodes or [], error

    def nodes(self):
        if self._error:
            raise SlurmCommandError(self._error)
        return self._nodes


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(fam, **labels):
    for s in fam.samples:
        if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith(("_created",)):
            return s.value
    raise KeyError(labels)


def test_journal_counts(tmp_path):
    path, _ = _journal(tmp_path)
    with open_journal(path, readonly=True) as j:
        c = metrics.journal_counts(j)
    assert c["verdicts"][("hardware", "xid-79")] == 1 and c["verdicts"][("user", "cuda-oom")] == 1
    assert c["failovers"] == {("hardware", "xid-79", "yes"): 1, ("infra", "nccl-timeout", "no"): 1}
    assert c["decisions"] == {"user-error": 1, "max-retries-exceeded": 1}
    assert c["drains"] == {"drained": 1, "kept-admin-reason": 1, "breaker-open": 1}
    assert (c["evacuations"], c["continuations"], c["max_retries"]) == (1, 1, 1)
    assert c["jobs"] == {"completed": 1, "user-error": 1, "max-retries-exceeded": 1, "continued": 1}
    assert sorted(c["time_to_recover"]) == [4.0, 121.0]
    assert c["breaker_open"] is True


def test_exposition_with_nodes_and_heartbeat(tmp_path):
    path, cfg_path = _journal(tmp_path)
    daemonlock.beat(path, now=time.time() - 5)
    nodes = [_node("n1", "slurm-ft: Xid 79 GPU 0000:10:00 (job 1)"), _node("n2", "maintenance"),
             _node("n3", "slurm-ft: row_remap: GPU0 row remap pending"), _node("n4", "Not responding", "down", False),
             _node("n5", drained=False)]
    text = metrics.exposition(config_mod.load(cfg_path), FakeSlurm(nodes))
    f = _families(text)
    assert _value(f["slurm_ft_failovers"], **{"class": "hardware", "rule": "xid-79", "blamed": "yes"}) == 1
    assert _value(f["slurm_ft_verdicts"], **{"class": "infra", "rule": "nccl-timeout"}) == 1
    assert _value(f["slurm_ft_drains"], outcome="breaker-open") == 1
    assert _value(f["slurm_ft_evacuations"]) == 1 and _value(f["slurm_ft_continuations"]) == 1
    assert _value(f["slurm_ft_max_retries_exceeded"]) == 1
    assert _value(f["slurm_ft_jobs"], ft_state="continued") == 1
    assert _value(f["slurm_ft_breaker_open"]) == 1
    assert 4 <= _value(f["slurm_ft_daemon_heartbeat_age_seconds"]) < 60 and _value(f["slurm_ft_daemon_up"]) == 1
    out = {c: _value(f["slurm_ft_nodes_out_of_service"], category=c) for c in ("fault", "health", "admin", "slurm")}
    assert out == {"fault": 1, "health": 1, "admin": 1, "slurm": 1}
    ttr = f["slurm_ft_time_to_recover_seconds"]
    buckets = {s.labels["le"]: s.value for s in ttr.samples if s.name.endswith("_bucket")}
    assert buckets["2.0"] == 0 and buckets["5.0"] == 1 and buckets["130.0"] == 2 and buckets["+Inf"] == 2
    assert _value(ttr) is not None and "slurm_ft_time_to_recover_seconds_sum 125.0" in text
    assert "slurm_ft_failovers_total" in text and "slurm_ft_journal_readable 1.0" in text


def test_no_heartbeat_no_journal_no_slurm(tmp_path):
    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "none" / "journal.db")}})
    f = _families(metrics.exposition(cfg, FakeSlurm(error="sinfo: timed out")))
    assert _value(f["slurm_ft_journal_readable"]) == 0 and "slurm_ft_failovers" not in f
    assert math.isnan(_value(f["slurm_ft_daemon_heartbeat_age_seconds"])) and _value(f["slurm_ft_daemon_up"]) == 0
    assert _value(f["slurm_ft_slurm_up"]) == 0 and "slurm_ft_nodes_out_of_service" not in f


def test_stale_heartbeat_is_down(tmp_path):
    path, cfg_path = _journal(tmp_path)
    daemonlock._last.clear()
    daemonlock.beat(path, now=time.time() - 3600)
    f = _families(metrics.exposition(config_mod.load(cfg_path)))
    assert _value(f["slurm_ft_daemon_up"]) == 0 and _value(f["slurm_ft_daemon_heartbeat_age_seconds"]) >= 3600


def test_cli_prints_and_writes_a_textfile(tmp_path):
    _, cfg_path = _journal(tmp_path)
    r = CliRunner().invoke(main, ["metrics", "--no-slurm", "--config", str(cfg_path)])
    assert r.exit_code == 0 and "# TYPE slurm_ft_failovers_total counter" in r.output
    out = tmp_path / "textfile" / "slurm_ft.prom"
    out.parent.mkdir()
    r = CliRunner().invoke(main, ["metrics", "--no-slurm", "--config", str(cfg_path), "--textfile", str(out)])
    assert r.exit_code == 0 and r.output.strip() == f"wrote {out}"
    assert "slurm_ft_drains_total{outcome=\"drained\"} 1.0" in out.read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["slurm_ft.prom"]      # no temp file left
    r = CliRunner().invoke(main, ["metrics", "--textfile", str(out), "--port", "9"])
    assert r.exit_code == 2 and "choose one" in r.output


def test_cli_serves_metrics(tmp_path):
    import socket
    import subprocess
    import sys
    import urllib.request
    _, cfg_path = _journal(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "slurm_ft.cli.main", "metrics", "--no-slurm", "--port", str(port),
                             "--config", str(cfg_path)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 20
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        assert "slurm_ft_evacuations_total 1.0" in body
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0


def test_time_to_recover_has_buckets_under_a_second():
    """Issue 24: the lab recovers in about a second; every bucket was >= 1 s. Slurm's times are
    whole seconds, so a recovery within the fault's second is 0 s and lands in le=0.5."""
    assert metrics.RECOVER_BUCKETS[0] < 1.0 and list(metrics.RECOVER_BUCKETS) == sorted(metrics.RECOVER_BUCKETS)
    fam = metrics._histogram("slurm_ft_time_to_recover_seconds", "doc", [0.0, 0.4, 1.0, 2.0])
    buckets = {s.labels["le"]: s.value for s in fam.samples if s.name.endswith("_bucket")}
    assert buckets["0.5"] == 2 and buckets["1.0"] == 3 and buckets["2.0"] == 4 and buckets["+Inf"] == 4


def test_a_failover_slurm_refused_counts_as_failed_not_as_an_evacuation(tmp_path):
    """A refused requeue replaces the failover's detail with Slurm's refusal (plain text); its kind,
    typed when the intent was written, still says it was a fault's failover, so
    ``slurm_ft_failovers_failed_total`` (the install guide's alert) counts it. Read from the text,
    as before the typed column, it looked like an evacuation's requeue and was never counted."""
    path = tmp_path / "journal.db"
    with open_journal(path) as j:
        aid = j.intend(7, 0, "failover", "n1", json.dumps({"reason": "hardware (xid-79)", "blamed": ["n1"]}),
                       kind="blamed")
        j.finish(aid, "failed", "scontrol requeue 7: Requested operation is presently disabled")
        j.record(8, 0, "failover", "n2", "evacuated by admin", kind="evacuation")
    with open_journal(path, readonly=True) as j:
        c = metrics.journal_counts(j)
    assert c["failovers_failed"] == 1 and c["failovers"] == {}
