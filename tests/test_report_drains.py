"""Drain report: who took each node out (counts that add up), flapping nodes and GPUs (RMA
candidates), GPU index/serial where the evidence has them, hostlists, JSON, hostile text, and
`-o` errors without tracebacks. Real SQLite journals under tmp_path; Slurm's node list faked
(the lab tests cover real Slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from slurm_ft import config as config_mod
from slurm_ft.cli.main import main
from slurm_ft.journal import open_journal
from slurm_ft.report import collect, reason_category, render, write_report
from slurm_ft.report.nodeset import fold
from slurm_ft.slurm import Node

from test_journal_perms import needs_setpriv, world_dir  # noqa: F401

NOW = time.time()
BUS = "0000:10:00"


class _Slurm:
    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def _node(name, reason="", flags=("DRAIN",), state="idle", at=NOW - 100, by="root"):
    return Node.from_json({"name": name, "state": state, "state_flags": list(flags), "reason": reason,
                           "reason_changed_at": at, "reason_set_by_user": by})


def _cfg(tmp_path):
    return config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db")}})


def _drain_record(j, job, node, reason, status="done", detail=None):
    aid = j.intend(job, 0, "drain", node, reason)
    j.finish(aid, status, detail)


def _cluster(tmp_path):
    """n1: three Xid 79 faults on the same GPU (epilog drains); n2: one Xid 48 (daemon drain);
    n3: an admin's drain (slurm-ft kept it); n4: `slurm-ft drain` by an admin; n5: a prolog health
    check; n6: `slurm-ft health --act` (only in Slurm and its node journal); n7: Slurm's own."""
    cfg = _cfg(tmp_path)
    with open_journal(cfg.journal.path) as j:
        for job in (11, 12, 13):
            j.add_verdict(job, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": BUS}], [], created=NOW - 50)
            _drain_record(j, job, "n1", f"slurm-ft: Xid 79 on {BUS} (job {job})", "skipped",
                          f"already-drained: slurm-ft: Xid 79 on {BUS} (job {job})")
        j.add_verdict(14, 0, "n2", "hardware", "xid-48", [{"xid": 48, "bus_id": "0000:20:00"}], [])
        _drain_record(j, 14, "n2", "slurm-ft: Xid 48 on 0000:20:00 (job 14)")
        j.add_verdict(17, 0, "n3", "hardware", "xid-79", [{"xid": 79, "bus_id": BUS}], [])
        _drain_record(j, 17, "n3", "slurm-ft: Xid 79 on 0000:10:00 (job 17)", "skipped",
                      "kept-admin-reason: slurm-ft: Xid 79 on 0000:10:00 (job 17)")
        j.add_verdict(15, 1, "n5", "hardware", "health:row_remap", [], [])
        j.add_verdict(16, 0, "n8", "user", "cuda-oom", [], [])
    with open_journal(tmp_path / "node-n1.db") as nj:      # the node's own copy knows the GPU index
        nj.add_verdict(11, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": BUS, "gpu_index": 2}], [])
    with open_journal(tmp_path / "node-n6.db") as nj:
        nj.add_health("n6", [{"check": "row_remap", "status": "fail", "gpu": 1, "measurement": "row remap pending"}])
    nodes = [_node("n1", f"slurm-ft: Xid 79 on {BUS} (job 13)"),
             _node("n2", "slurm-ft: Xid 48 on 0000:20:00 (job 14)"),
             _node("n3", "fan broken, RMA ticket 42", by="alice"),
             _node("n4", "slurm-ft: drained by admin"),
             _node("n5", "slurm-ft: row_remap: GPU0 row remap pending"),
             _node("n6", "slurm-ft: row_remap: GPU1 row remap pending"),
             _node("n7", "Not responding", flags=(), state="down", by="slurm"),
             _node("n8", flags=())]
    return cfg, _Slurm(nodes)


def test_reason_categories():
    assert reason_category("slurm-ft: Xid 79 on 0000:10:00 (job 12)") == "fault"
    assert reason_category("slurm-ft: xid-31-repeated (job 3)") == "fault"
    assert reason_category("slurm-ft: row_remap: GPU0 row remap pending") == "health"
    assert reason_category("slurm-ft: nvml_responsive: NVML timed out") == "admin"    # not a check slurm-ft drains on
    assert reason_category("slurm-ft: drained by admin") == "admin"
    assert reason_category("slurm-ft: drain --checkpoint by admin") == "admin"
    assert reason_category("bad fan") == "admin"
    assert reason_category("Not responding") == reason_category("") == reason_category("Kill task failed") == "slurm"


def test_counts_add_up_and_separate_slurm_ft_from_admins(tmp_path):
    cfg, slurm = _cluster(tmp_path)
    data = collect(cfg, slurm, node_journals=str(tmp_path / "node-*.db"), now=NOW)
    oos = data.out_of_service()
    assert {c: sorted(v) for c, v in oos.items()} == {"fault": ["n1", "n2"], "health": ["n5", "n6"],
                                                        "admin": ["n3", "n4"], "slurm": ["n7"]}
    assert sum(len(v) for v in oos.values()) == len(data.drained) == 7
    by = data.drain_counts()
    assert by == {"fault": 4, "health": 2, "admin": 2, "slurm": 1}          # 3x n1 (epilog) + n2 (daemon)
    assert sum(by.values()) == len(data.drains)
    sources = {(e.node, e.source) for e in data.drains}
    assert ("n5", "prolog") in sources and ("n6", "health check on the node") in sources
    assert ("n3", "Slurm node state (set by alice)") in sources and ("n2", "daemon") in sources
    assert [(x.node, x.outcome) for x in data.not_drained] == [("n3", "an admin's reason kept")]
    text = render(data, "text")
    assert "Nodes out of service now: 7 = 2 slurm-ft (fault verdict) + 2 slurm-ft (health check) + 2 admin + 1 Slurm" \
        in text
    assert ("Drains in the window: 9 = 6 by slurm-ft (4 fault verdicts + 2 health checks) + "
            "3 by admins or Slurm (2 admin + 1 Slurm)") in text
    html = render(data, "html")
    assert "9 = 6 by slurm-ft (4 fault verdicts + 2 health checks)" in html
    doc = json.loads(render(data, "json"))
    assert doc["out_of_service"]["total"] == sum(v["count"] for v in doc["out_of_service"]["by"].values()) == 7
    assert doc["drains"]["total"] == doc["drains"]["by_slurm_ft"] + doc["drains"]["by_admins_or_slurm"] == 9
    assert doc["out_of_service"]["by"]["fault"]["nodes"] == "n[1-2]"


def test_flapping_node_and_gpu_are_rma_candidates(tmp_path):
    cfg, slurm = _cluster(tmp_path)
    data = collect(cfg, slurm, node_journals=str(tmp_path / "node-*.db"), now=NOW)
    assert [n.node for n in data.flapping_nodes] == ["n1"]
    gpu = data.flapping_gpus[0]
    assert (gpu.node, gpu.bus_id, gpu.index, gpu.serial, gpu.faults) == ("n1", BUS, 2, None, 3)
    assert gpu.xids == {"79": 3}
    n6 = next(g for g in data.gpus if g.node == "n6")
    assert (n6.bus_id, n6.index, n6.checks) == (None, 1, {"row_remap": 1})
    text = render(data, "text")
    assert f"RMA candidate: n1 GPU {BUS} (index 2, serial not recorded): 3 faults" in text
    assert "flapping node: n1: 3 faults (xid-79 x3)" in text
    assert "GPU serial numbers are not recorded by slurm-ft" in text
    assert "RMA candidate" in render(data, "html")
    doc = json.loads(render(data, "json"))
    assert doc["flapping"] == {"nodes": "n1", "gpus": [{"node": "n1", "bus_id": BUS, "index": 2}]}
    # the threshold is an option; the daemon journal alone knows only bus ids
    data = collect(cfg, slurm, flap_threshold=4, now=NOW)
    assert not data.flapping_nodes and not data.flapping_gpus
    assert data.gpus[0].index is None and any("GPU index: known only from node journals" in n for n in data.notes)


def test_faults_on_different_gpus_flag_the_node_not_the_gpus(tmp_path):
    cfg = _cfg(tmp_path)
    with open_journal(cfg.journal.path) as j:
        for job, bus in ((1, "0000:10:00"), (2, "0000:20:00"), (3, "0000:30:00")):
            j.add_verdict(job, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": bus, "serial": f"S{job}"}], [])
        j.add_verdict(4, 0, "n2", "hardware", "slurm-node-fail", [], [])
    data = collect(cfg, _Slurm([]), now=NOW)
    assert [n.node for n in data.flapping_nodes] == ["n1"] and not data.flapping_gpus
    assert sorted(g.serial for g in data.gpus) == ["S1", "S2", "S3"]      # shown when the evidence has one
    assert [n.faults for n in data.node_faults] == [3, 1]


def test_health_check_failing_until_it_passes_counts_once(tmp_path):
    cfg = _cfg(tmp_path)
    open_journal(cfg.journal.path).close()
    with open_journal(tmp_path / "node-n1.db") as nj:
        for status in ("fail", "fail", "fail", "pass", "fail", "fail", "pass", "fail"):
            nj.add_health("n1", [{"check": "temperature", "status": status, "gpu": 0, "measurement": "95 C"}])
            time.sleep(0.002)
    data = collect(cfg, _Slurm([]), node_journals=str(tmp_path / "node-*.db"), now=time.time())
    assert data.health_fails == {"n1": {"temperature": 3}}
    assert data.node_faults[0].faults == 3 and data.node_faults[0].flapping


def test_old_events_are_outside_the_window(tmp_path):
    cfg = _cfg(tmp_path)
    with open_journal(cfg.journal.path) as j:
        j.add_verdict(1, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": BUS}], [], created=NOW - 10 * 86400)
    data = collect(cfg, _Slurm([_node("n9", "old admin drain", at=NOW - 10 * 86400)]), now=NOW)
    assert data.node_faults == [] and data.drains == [] and len(data.drained) == 1


def test_hostlists_fold_with_clustershell_and_without(monkeypatch):
    assert fold(["n3", "n1", "n2", "n10", "gpu07", "n2"]) == "gpu07,n[1-3,10]"
    assert fold([]) == ""
    # names NodeSet would read as its own syntax are listed as they are, never parsed
    assert fold(["n1", "n2", "x[1-3]", "a,b", "<b>"]) == "n[1-2],<b>,a,b,x[1-3]"
    monkeypatch.setitem(sys.modules, "ClusterShell.NodeSet", None)       # not installed
    assert fold(["n10", "n2", "n1"]) == "n1,n2,n10"


HOSTILE = "<script>alert(1)</script>\x1b[31m\r\x07|\x9b"


def _raw_controls(text: str) -> set[str]:
    return {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f}


def test_hostile_reasons_and_names_are_escaped_everywhere(tmp_path):
    cfg = _cfg(tmp_path)
    with open_journal(cfg.journal.path) as j:
        for job in (1, 2, 3):
            j.add_verdict(job, 0, f"n1{HOSTILE}", "hardware", f"xid-79{HOSTILE}",
                          [{"xid": 79, "bus_id": f"{BUS}{HOSTILE}", "serial": HOSTILE}], [])
        _drain_record(j, 1, f"n1{HOSTILE}", f"slurm-ft: {HOSTILE} (job 1)")
    nodes = [_node(f"n2{HOSTILE}", f"<b>admin</b>{HOSTILE}", by=f"alice{HOSTILE}"),
             _node("n3", f"slurm-ft: row_remap: {HOSTILE}")]
    data = collect(cfg, _Slurm(nodes), now=NOW)
    html = render(data, "html")
    assert "<script>" not in html and "<b>admin" not in html and "&lt;script&gt;" in html
    assert not _raw_controls(html)
    text = render(data, "text")
    assert not _raw_controls(text) and "\\x1b[31m\\x0d\\x07" in text and "\\x9b" in text
    out = render(data, "json")
    assert out.isascii() and not _raw_controls(out)
    doc = json.loads(out)
    assert doc["out_of_service"]["nodes"][0]["reason"] == f"<b>admin</b>{HOSTILE}"   # data kept, escaped in print
    assert doc["gpu_faults"][0]["serial"] == HOSTILE


# ------------------------------------------------------------------------------------ CLI
def _write_config(tmp_path):
    conf = tmp_path / "slurm-ft.toml"
    conf.write_text(f'[journal]\npath = "{tmp_path / "d.db"}"\n')
    return conf


def test_cli_formats_and_output_file(tmp_path, monkeypatch):
    cfg, slurm = _cluster(tmp_path)
    conf = _write_config(tmp_path)
    monkeypatch.setattr("slurm_ft.slurm.Slurm.from_config", classmethod(lambda cls, c: slurm))
    r = CliRunner().invoke(main, ["report", "--config", str(conf), "--json", "--flap-threshold", "2"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["flapping"]["nodes"] == "n1"
    r = CliRunner().invoke(main, ["report", "--config", str(conf), "--format", "json"])
    assert json.loads(r.output)["flap_threshold"] == 3
    r = CliRunner().invoke(main, ["report", "--config", str(conf), "--json", "--format", "html"])
    assert r.exit_code == 2 and "contradict" in r.output
    r = CliRunner().invoke(main, ["report", "--config", str(conf), "--flap-threshold", "1"])
    assert r.exit_code == 2
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["report", "--config", str(conf), "--format", "html", "-o", str(out)])
    assert r.exit_code == 0 and r.output == f"wrote {out}\n"
    umask = os.umask(0)
    os.umask(umask)
    assert out.read_text().startswith("<!doctype html>") and out.stat().st_mode & 0o777 == 0o644 & ~umask
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".slurm-ft-report.")]


@pytest.mark.parametrize("target", ["/nonexistent/dir/r.html", "{tmp}/missing/r.html", "{tmp}"])
def test_cli_output_into_a_missing_dir_is_one_line_exit_1(tmp_path, target):
    target = target.format(tmp=tmp_path)
    r = CliRunner().invoke(main, ["report", "-o", target])        # fails before any config or Slurm call
    assert r.exit_code == 1, r.output
    assert r.output.startswith(f"Error: {target}: cannot write the report:") and len(r.output.splitlines()) == 1
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)


def test_write_report_replaces_a_planted_symlink_instead_of_following_it(tmp_path):
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0\n")
    link = tmp_path / "report.html"
    link.symlink_to(victim)
    write_report(str(link), "<p>report</p>")
    assert victim.read_text() == "root:x:0:0\n"
    assert not link.is_symlink() and link.read_text() == "<p>report</p>"


@needs_setpriv
def test_cli_output_without_permission_is_one_line_exit_1(world_dir):  # noqa: F811
    locked = world_dir / "locked"
    locked.mkdir(mode=0o755)                       # root's; uid 65534 may not create files in it
    for target in (locked / "r.html", "/root/r.html"):
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                            "slurm_ft.cli.main", "report", "-o", str(target)], capture_output=True, text=True, timeout=60,
                           cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C.UTF-8"})
        assert r.returncode == 1, r
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "cannot write the report" in r.stderr and "permission denied" in r.stderr.lower()
    assert not os.listdir(locked)


# ------------------------------------------------------------------------------------ acknowledgement (issue 24)
def test_ack_clears_a_flapping_node_and_new_faults_count_again(tmp_path, monkeypatch):
    """n1 flapped because of test drains: an admin acknowledges it (journaled, with a reason);
    it is no longer flagged, its old faults are shown as acknowledged; a fault after the
    acknowledgement counts again."""
    from slurm_ft.report.ack import ACK_ACTION

    cfg, slurm = _cluster(tmp_path)
    conf = _write_config(tmp_path)
    monkeypatch.setattr("slurm_ft.slurm.Slurm.from_config", classmethod(lambda cls, c: slurm))
    r = CliRunner().invoke(main, ["report", "--config", str(conf), "--json", "--flap-threshold", "2"])
    assert json.loads(r.output)["flapping"]["nodes"] == "n1"
    r = CliRunner().invoke(main, ["report", "--config", str(conf), "--json", "--flap-threshold", "2",
                                  "--ack", "n1", "--ack-reason", "test drains  of the burn-in"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["flapping"] == {"nodes": "", "gpus": []}
    n1 = next(n for n in doc["node_faults"] if n["node"] == "n1")
    assert n1["faults"] == 0 and n1["acknowledged"] == 3 and n1["acked"]["reason"] == "test drains of the burn-in"
    with open_journal(cfg.journal.path, readonly=True) as j:
        rows = [a for a in j.actions(0) if a["action"] == ACK_ACTION]
    assert [(a["target"], a["status"]) for a in rows] == [("n1", "done")]
    text = render(collect(cfg, slurm, now=time.time() + 10), "text")
    assert "(+3 acknowledged" in text and "test drains of the burn-in" in text
    # faults after the acknowledgement count again
    later = time.time() + 5
    with open_journal(cfg.journal.path) as j:
        for job in (21, 22):
            j.add_verdict(job, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": BUS}], [], created=later)
    data = collect(cfg, slurm, flap_threshold=2, now=later + 10)
    assert [n.node for n in data.flapping_nodes] == ["n1"]
    assert next(n for n in data.node_faults if n.node == "n1").faults == 2


def test_ack_needs_a_reason_and_a_hostlist(tmp_path, monkeypatch):
    cfg, slurm = _cluster(tmp_path)
    conf = _write_config(tmp_path)
    monkeypatch.setattr("slurm_ft.slurm.Slurm.from_config", classmethod(lambda cls, c: slurm))
    r = CliRunner().invoke(main, ["report", "--config", str(conf), "--ack", "n1"])
    assert r.exit_code == 2 and "reason" in r.output
    r = CliRunner().invoke(main, ["report", "--config", str(conf), "--ack", "n[1", "--ack-reason", "x"])
    assert r.exit_code == 1 and "not a Slurm hostlist" in r.output


def test_observed_drains_are_reported_as_such(tmp_path):
    cfg = _cfg(tmp_path)
    with open_journal(cfg.journal.path) as j:
        j.add_verdict(31, 0, "n2", "hardware", "xid-79", [{"xid": 79, "bus_id": BUS}], [])
        _drain_record(j, 31, "n2", "slurm-ft: Xid 79 GPU 0000:10:00 (job 31)", "observed")
    data = collect(cfg, _Slurm([]), now=time.time())
    assert data.drains == []
    assert [(x.node, x.outcome) for x in data.not_drained] == [("n2", "observed only ([failover] mode = observe)")]
    assert "observed only" in render(data, "text")
