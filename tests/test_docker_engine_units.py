"""Unit tests of the Docker lab's pure parts and of the Slurm version differences it found
(no Docker needed; the end-to-end suite is tests/test_docker_lab.py, marker ``docker``)."""

from __future__ import annotations

import pytest

from slurm_ft.errors import LabError
from slurm_ft.lab import docker_engine as D
from slurm_ft.lab import layout as L
import json
import subprocess

from slurm_ft.slurm import Job, Node, Slurm


def test_docker_bus_ids_never_collide_with_native_or_each_other():
    native = {L.bus_id(k, g) for k in range(1, L.MAX_LAB_NODES + 1) for g in range(L.GPUS_PER_NODE)}
    seen = set()
    for version in D.VERSIONS:
        ids = {D.bus_id(version, k, g) for k in range(1, L.MAX_NODES + 1) for g in range(L.GPUS_PER_NODE)}
        assert len(ids) == L.MAX_NODES * L.GPUS_PER_NODE
        assert not ids & native and not ids & seen
        seen |= ids
    assert D.bus_id("22.05", 1, 0) == "000000D0:10:00.0" and D.bus_id("24.11", 1, 1) == "000000D4:11:00.0"


def test_docker_inventory_uses_the_docker_bus_ids():
    gpus = D.inventory_gpus("24.11", "n2")
    assert [g["pci_bus_id"] for g in gpus] == ["000000D4:20:00.0", "000000D4:21:00.0"]


def test_version_choice(monkeypatch):
    monkeypatch.delenv("SLURM_FT_LAB_SLURM", raising=False)
    assert D.version_or_default(None) == "24.11"
    monkeypatch.setenv("SLURM_FT_LAB_SLURM", "22.05")
    assert D.version_or_default(None) == "22.05"
    with pytest.raises(LabError):
        D.version_or_default("23.02")


def test_image_tags_hash_their_inputs():
    a, b = D.image_tag("22.05"), D.image_tag("24.11")
    assert a != b and a.startswith("slurm-ft-lab:22.05-") and D.base_tag("22.05") != D.base_tag("24.11")
    assert D.image_tag("22.05") == a      # stable: a second build reuses the image


def test_docker_slurm_conf_is_the_same_for_both_versions():
    ip = {"ctl": "172.31.240.10", "n1": "172.31.240.11"}
    old = D.render_slurm_conf("22.05", ip, ["n1"])
    assert "CredType=cred/munge" in old and "CryptoType" not in old
    assert old.replace("sftlab2205", "sftlab2411") == D.render_slurm_conf("24.11", ip, ["n1"])
    assert "NodeName=n1 NodeHostname=n1 NodeAddr=172.31.240.11" in old


class CannedSlurm(Slurm):
    """Answers ``sinfo --json`` / ``scontrol show nodes --json`` as the two versions did."""

    def __init__(self, answers):
        super().__init__()
        self.answers, self.calls = answers, []

    def run(self, cmd, *args, check=True, **kw):
        self.calls.append((cmd, *args))
        rc, out = self.answers[(cmd, *args)]
        return subprocess.CompletedProcess([cmd, *args], rc, json.dumps(out) if out is not None else "", "")


def test_slurm_22_05_nodes_come_from_sinfo_json():
    """22.05: ``sinfo --json`` lists nodes (state "idle", state_flags); ``scontrol show nodes
    --json`` does not exist (rc 1)."""
    s = CannedSlurm({("sinfo", "--Node", "--json"): (0, {"nodes": [
        {"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": "slurm-ft: Xid 79", "extra": "e"}]})})
    [n] = s.nodes()
    assert (n.name, n.state, n.drained, n.extra) == ("n1", "idle", True, "e")
    assert s.calls == [("sinfo", "--Node", "--json")]


def test_slurm_24_11_nodes_come_from_scontrol_show_nodes_json():
    """24.11: ``sinfo --json`` lists partition/state groups (key ``sinfo``, no ``nodes``);
    ``scontrol show nodes --json`` lists nodes with ``state`` a list."""
    s = CannedSlurm({("sinfo", "--Node", "--json"): (0, {"sinfo": [{"nodes": {"nodes": ["n1"]}}]}),
                     ("scontrol", "show", "nodes", "--json"): (0, {"nodes": [
                         {"name": "n1", "state": ["IDLE", "DRAIN"], "reason": "r", "extra": "e"}]})})
    [n] = s.nodes()
    assert (n.name, n.state, n.drained, n.extra) == ("n1", "IDLE", True, "e")


# Shapes measured on the Docker lab (squeue --json / sinfo --json / scontrol show nodes --json).
def test_slurm_24_11_job_json_shapes():
    j = Job.from_json({"job_id": 7, "job_state": ["COMPLETED"], "restart_cnt": 1, "nodes": "n2",
                       "priority": {"set": True, "infinite": False, "number": 1000},
                       "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "infinite": False, "number": 0},
                                     "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""}}})
    assert (j.state, j.restart_count, j.priority, j.exit_code, j.exit_signal) == ("COMPLETED", 1, 1000, 0, None)


def test_slurm_22_05_job_json_shapes():
    j = Job.from_json({"job_id": 7, "job_state": "FAILED", "restart_cnt": 0, "nodes": "n1", "priority": 4294901758,
                       "exit_code": 768})
    assert (j.state, j.exit_code, j.exit_signal) == ("FAILED", 3, None)


def test_slurm_24_11_node_state_list():
    n = Node.from_json({"name": "n1", "state": ["IDLE", "DRAIN"], "reason": "slurm-ft: Xid 79", "extra": "x"})
    assert n.state == "IDLE" and n.drained and n.extra == "x"


def _frame(stream: int, data: bytes) -> bytes:
    import struct
    return struct.pack(">BxxxL", stream, len(data)) + data


def test_exec_frames_are_read_through_the_buffer_that_holds_them():
    """The Docker lab's exec reader (``read_frames``): when an exec's output arrives together with
    the HTTP headers, http.client's buffered reader holds it; docker-py's ``exec_run`` reads the
    raw socket under that buffer and loses it (frames out of step: ``114 is not a valid stream``)."""
    import io
    body = _frame(1, b'{"jobs": [') + _frame(2, b"warning\n") + _frame(1, b"]}")
    wire = io.BytesIO(b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n" + body)
    fp = io.BufferedReader(wire, buffer_size=8192)
    while fp.readline() not in (b"\r\n", b""):   # what http.client does with the headers
        pass
    assert fp.raw.read() == b""                   # the raw stream under it: the output is gone
    assert D.read_frames(fp) == (b'{"jobs": []}', b"warning\n")


@pytest.mark.parametrize("wire, what", [(b"r" * 12, "out of step"), (_frame(1, b"abc")[:5], "frame header"),
                                        (_frame(1, b"abc")[:-1], "inside a frame")])
def test_exec_frames_out_of_step_or_cut_are_errors(wire, what):
    import io
    with pytest.raises(LabError, match=what):
        D.read_frames(io.BufferedReader(io.BytesIO(wire)))
