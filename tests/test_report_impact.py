"""What faults cost in the drain report (slurm_ft.report.impact) and its inline SVG charts
(slurm_ft.report.charts): figures from a real journal, labels escaped, valid SVG whatever the
node names hold."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections import Counter

from hypothesis import given, strategies as st

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.report import charts, collect, render
from slurm_ft.report.impact import day_of, impact
from slurm_ft.slurm import Node


class _Slurm:
    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def _journal(path, now):
    """Job 7: Xid 79 on n1 (attempt 0 ran 1000 s, saved a checkpoint 100 s before its end), running
    again 20 s later on n2; job 8: a hang on n2, 60 s to recover, no checkpoint; job 9: a user bug
    (not a fault); job 10: infra on n3, not running again yet."""
    with open_journal(path) as j:
        j.upsert_attempt(7, 0, nodes="n1", start=now - 2000, end=now - 1000)
        j.upsert_attempt(7, 1, nodes="n2", start=now - 980)
        j.add_verdict(7, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:10:00"}], [])
        j.add_verdict(7, 0, "n2", "unknown", "exit-nonzero", [], [])
        j.record(7, 0, "ckpt-ack", "n1", "step 400")
        j.db.execute("UPDATE actions SET created = ? WHERE action = 'ckpt-ack'", [now - 1100])
        j.upsert_attempt(8, 0, nodes="n2", start=now - 600, end=now - 300)
        j.upsert_attempt(8, 1, nodes="n3", start=now - 240)
        j.add_verdict(8, 0, "n2", "hang", "heartbeat", [], [])
        j.upsert_attempt(9, 0, nodes="n1", start=now - 100, end=now - 50)
        j.add_verdict(9, 0, "n1", "user", "cuda-oom", [], [])
        j.upsert_attempt(10, 0, nodes="n3", start=now - 100, end=now - 10)
        j.add_verdict(10, 0, "n3", "infra", "nccl-timeout", [], [])
        j.db.conn.commit()


def test_time_to_recover_and_hours_lost(tmp_path):
    now = time.time()
    _journal(tmp_path / "d.db", now)
    with open_journal(tmp_path / "d.db", readonly=True) as j:
        got = impact(j.db, now - 86400, {"n1": 4, "n2": 4, "n3": 0})
    assert got.recover_s == [20.0, 60.0]            # job 10 is not running again: not counted
    assert got.percentiles() == {50: 20.0, 90: 60.0, 99: 60.0}
    # job 7: 20 s to recover + 100 s since its checkpoint, one node with 4 GPUs
    assert abs(got.node_hours_by_node["n1"] - 120 / 3600) < 1e-9
    assert abs(got.gpu_hours_by_node["n1"] - 4 * 120 / 3600) < 1e-9
    # job 8: 60 s + 300 s of work without a checkpoint, on n2 (4 GPUs)
    assert abs(got.gpu_hours_by_class["hang"] - 4 * 360 / 3600) < 1e-9
    assert "user" not in got.node_hours_by_class
    assert sum(got.per_day[day_of(now)].values()) == 3 and got.per_day[day_of(now)]["hardware"] == 1


def test_report_has_charts_and_the_figures_in_json(tmp_path):
    now = time.time()
    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db")}})
    _journal(cfg.journal.path, now)
    nodes = [Node.from_json({"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "gres": "gpu:4",
                             "reason": "slurm-ft: Xid 79 GPU 0000:10:00 (job 7)"}),
             Node.from_json({"name": "n2", "state": "idle", "state_flags": [], "gres": "gpu:tesla:4(S:0)"})]
    data = collect(cfg, _Slurm(nodes), now=now)
    html = render(data, "html")
    assert html.count("<svg") >= 3 and "Faults per day by class" in html and "p50 20.0 s" in html
    js = render(data, "json")
    assert '"p90": 60.0' in js and '"gpu_hours_lost"' in js
    assert "p50 20.0 s" in render(data, "text")


name = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


@given(st.dictionaries(name, st.integers(1, 500), min_size=1, max_size=20))
def test_charts_are_valid_svg_whatever_the_labels(counts):
    """Node names and Xid keys are untrusted: every chart parses as XML and carries no element
    the labels name (a ``<script>`` label stays text)."""
    per_day = {f"2026-11-{i + 1:02d}": Counter({"hardware": v, "infra": v // 2})
               for i, v in enumerate(list(counts.values())[:28])}
    for svg in (charts.hbars(Counter(counts), "t"), charts.xid_histogram({"n1": Counter(counts)}),
                charts.faults_per_day(per_day)):
        root = ET.fromstring(str(svg))
        tags = {el.tag.split("}")[-1] for el in root.iter()}
        assert tags <= {"svg", "title", "rect", "text", "line"}


def test_no_data_no_chart():
    assert charts.hbars(Counter(), "t") == "" and charts.faults_per_day({}) == ""
    assert charts.xid_histogram({}) == ""
