"""Drain report: content from the journals and Slurm's node states; hostile text escaped."""

from __future__ import annotations

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.report import collect, render
from slurm_ft.slurm import Node


class _Slurm:
    """Stands in for the one Slurm query the report makes (the lab tests cover real Slurm)."""

    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def test_report_lists_drains_xids_and_escapes(tmp_path):
    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db")}})
    with open_journal(cfg.journal.path) as j:
        j.add_verdict(7, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:10:00"}], [])
        j.add_verdict(8, 0, "n2", "user", "cuda-oom", [], [])
        j.record(7, 0, "drain", "n1", "slurm-ft: Xid 79 on 0000:10:00 (job 7)")
    with open_journal(tmp_path / "node-n1.db") as nj:
        nj.add_health("n1", [{"check": "row_remap", "status": "fail", "gpu": 0, "measurement": "pending"}])
    nodes = [Node.from_json({"name": "n1", "state": "idle", "state_flags": ["DRAIN"],
                             "reason": "slurm-ft: Xid 79 on 0000:10:00 (job 7)"}),
             Node.from_json({"name": "n3", "state": "idle", "state_flags": ["DRAIN"],
                             "reason": "<script>alert(1)</script>"}),
             Node.from_json({"name": "n2", "state": "idle", "state_flags": []})]
    data = collect(cfg, _Slurm(nodes), node_journals=str(tmp_path / "node-*.db"))
    assert [n.name for n in data.drained] == ["n1", "n3"]
    assert data.drained[0].by_slurm_ft and not data.drained[1].by_slurm_ft
    assert data.xids_by_node["n1"][79] == 1 and data.health_fails["n1"]["row_remap"] == 1
    html = render(data, "html")
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "Xid 79" in html and "row_remap" in html
    text = render(data, "text")
    assert "n1" in text and "Xid 79 x1" in text and "hardware 1" in text
