"""Unit tests of the Docker lab's pure parts and of the Slurm version differences it found
(no Docker needed; the end-to-end suite is tests/test_docker_lab.py, marker ``docker``)."""

from __future__ import annotations

import pytest

from slurm_ft.errors import LabError
from slurm_ft.lab import docker_engine as D
from slurm_ft.lab import layout as L
import json
import subprocess
import time

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
    assert D.bus_id("26.05", 1, 0) == "000000D8:10:00.0"


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


def test_docker_slurm_conf_is_the_same_for_every_version():
    ip = {"ctl": "172.31.240.10", "n1": "172.31.240.11"}
    old = D.render_slurm_conf("22.05", ip, ["n1"])
    assert "CredType=cred/munge" in old and "CryptoType" not in old
    assert old.replace("sftlab2205", "sftlab2411") == D.render_slurm_conf("24.11", ip, ["n1"])
    assert old.replace("sftlab2205", "sftlab2605") == D.render_slurm_conf("26.05", ip, ["n1"])
    assert "NodeName=n1 NodeHostname=n1 NodeAddr=172.31.240.11" in old


def test_26_05_is_debian_testing_with_python_3_14():
    assert D.VERSIONS["26.05"][:2] == ("forky", "3.14")
    assert D.version_or_default("26.05") == "26.05"


def test_debootstrap_script_of_a_suite_newer_than_debootstrap_is_sids(tmp_path):
    """bookworm's debootstrap has no ``forky`` script: debootstrap is given its ``sid`` one (the
    one every Debian suite's script links to); a suite it knows gets none (its own)."""
    (tmp_path / "sid").write_text("# sid\n")
    (tmp_path / "trixie").symlink_to("sid")
    assert D.debootstrap_script("trixie", tmp_path) == []
    assert D.debootstrap_script("forky", tmp_path) == [str(tmp_path / "sid")]
    (tmp_path / "sid").unlink()
    with pytest.raises(LabError, match="no script for forky"):
        D.debootstrap_script("forky", tmp_path)


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


# Shapes measured on the Docker lab (squeue --json / sinfo --json / scontrol show nodes --json);
# 26.05.5 prints the same shapes as 24.11 for every field slurm-ft reads (docs/lab.md).
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


# -- reboots (issue 26): RebootProgram, restart policy, the entry's boot step ------------------------
def test_docker_slurm_conf_reboots_nodes_and_runs_the_health_check_at_slurmd_start():
    conf = D.render_slurm_conf("24.11", {"ctl": "172.31.241.10", "n1": "172.31.241.11"}, ["n1"])
    lines = conf.splitlines()
    assert f"RebootProgram={D.CONF}/reboot-node" in lines
    assert f"HealthCheckProgram={D.CONF}/health-check" in lines and "HealthCheckInterval=65535" in lines
    assert f"SLURM_FT_CONFIG={D.CONF}/slurm-ft.toml" in D.HEALTH_CHECK and "health --act" in D.HEALTH_CHECK


def test_node_containers_restart_after_a_power_cut_but_not_after_a_manual_stop():
    # on-failure: an exit by SIGKILL (137) restarts; docker kill / stop are manual stops (never restarted)
    assert D.NODE_RESTART_POLICY == {"Name": "on-failure", "MaximumRetryCount": 0}


def test_reboot_program_refuses_to_run_outside_a_lab_container_and_the_power_switch_cuts_only_pid1s_children():
    text = D.REBOOT_NODE
    guard = text.index("docker-init")
    assert "exit 1" in text[guard:text.index("esac")]
    assert text.index(f">{D.REBOOT_MARKER}") > text.index("esac")     # the marker only in a lab container
    assert "kill" not in text     # it cuts nothing itself: 26.05's slurmd runs it in a PID namespace of its own
    switch = D.POWER_SWITCH
    assert "pkill -KILL -P 1" in switch and "kill -KILL -1" not in switch and D.REBOOT_MARKER in switch
    assert D.REBOOT_MARKER.startswith(D.PRIVATE + "/")
    # started by the entry after its boot step removed the last reboot's marker, before slurmd
    assert D.ENTRY.index(D.rebooted_sh()) < D.ENTRY.index(switch) < D.ENTRY.index('slurmd $boot -D -N "$role"')


def test_the_power_switch_cuts_once_the_marker_appears(tmp_path):
    marker, cut = tmp_path / "reboot-requested", tmp_path / "cut"
    switch = D.POWER_SWITCH.replace(D.REBOOT_MARKER, str(marker)).replace("exec pkill -KILL -P 1", f"echo cut >{cut}")
    assert str(marker) in switch and str(cut) in switch
    proc = subprocess.Popen(["/bin/sh", "-c", switch + "wait\n"])
    try:
        time.sleep(1.2)
        assert not cut.exists()          # no marker: the power stays on
        marker.write_text("2026-12-03T05:00:00\n")
        proc.wait(timeout=10)
        assert cut.read_text() == "cut\n"
    finally:
        proc.kill()


def _boot(root, role="n1"):
    """Run the entry's boot step (rebooted_sh) with ``root`` for /lab; returns $boot."""
    script = f"set -eu\nrole={role}\n{D.rebooted_sh(str(root))}printf %s \"$boot\"\n"
    proc = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _lab_dir(tmp_path):
    (tmp_path / "nvml").mkdir()
    (tmp_path / "log").mkdir()
    (tmp_path / "nvml" / "n1.json").write_text('{"sick": true}\n')
    (tmp_path / "nvml" / "n1.at-boot.json").write_text('{"healthy": true}\n')
    return tmp_path


def test_entry_boot_step_without_marker_is_a_plain_start(tmp_path):
    root = _lab_dir(tmp_path)
    assert _boot(root) == ""
    assert (root / "nvml" / "n1.json").read_text() == '{"sick": true}\n'
    assert not (root / "log" / "reboot.log").exists()


def test_entry_boot_step_after_a_reboot_heals_the_gpus_and_starts_slurmd_as_rebooted(tmp_path):
    root = _lab_dir(tmp_path)
    (root / "reboot-requested").write_text("x\n")
    assert _boot(root) == "-b"
    assert (root / "nvml" / "n1.json").read_text() == '{"healthy": true}\n'
    assert not (root / "reboot-requested").exists()
    assert sorted(p.name for p in (root / "nvml").iterdir()) == ["n1.at-boot.json", "n1.json"]
    assert "lab reboot of n1: container restarted, GPUs healed" in (root / "log" / "reboot.log").read_text()
    assert _boot(root) == ""          # the marker is gone: the next start is a plain one


def test_entry_boot_step_leaves_a_fault_that_survives_reboots(tmp_path):
    root = _lab_dir(tmp_path)
    (root / "reboot-requested").write_text("x\n")
    (root / "nvml" / "n1.survives-reboot").write_text("x\n")
    assert _boot(root) == "-b"
    assert (root / "nvml" / "n1.json").read_text() == '{"sick": true}\n'
    assert "GPUs left faulty (fault survives reboot)" in (root / "log" / "reboot.log").read_text()


def test_entry_boot_step_never_fails_without_an_at_boot_inventory(tmp_path):
    root = _lab_dir(tmp_path)
    (root / "nvml" / "n1.at-boot.json").unlink()
    (root / "reboot-requested").write_text("x\n")
    assert _boot(root) == "-b"          # a failed start would make Docker restart it again and again
    assert (root / "nvml" / "n1.json").read_text() == '{"sick": true}\n'


def test_sticky_fault_marker_is_the_one_the_entry_reads(tmp_path):
    lab = D.DockerLab("24.11", dir=tmp_path)
    (tmp_path / "n1" / "nvml").mkdir(parents=True)
    lab.sticky_fault("n1", True)
    assert lab.sticky_path("n1") == tmp_path / "n1" / "nvml" / "n1.survives-reboot" and lab.sticky_path("n1").exists()
    assert "nvml/$role.survives-reboot" in D.rebooted_sh()
    lab.sticky_fault("n1", False)
    lab.sticky_fault("n1", False)     # already off: no error
    assert not lab.sticky_path("n1").exists()
    assert lab.at_boot_inventory("n1") == tmp_path / "n1" / "nvml" / "n1.at-boot.json"


@pytest.mark.parametrize("init, ok", [(b"/sbin/docker-init\0--\0/etc/slurm-lab/entry\0n1\0", True),
                                      (b"/sbin/init\0splash\0", False), (b"/lib/systemd/systemd\0", False)])
def test_reboot_program_guard_knows_a_lab_container_by_its_pid_1(tmp_path, init, ok):
    # only the guard runs here (up to its `esac`), on a stand-in for /proc/1/cmdline
    (tmp_path / "cmdline").write_bytes(init)
    guard = D.REBOOT_NODE[:D.REBOOT_NODE.index("esac\n") + 5].replace("/proc/1/cmdline", str(tmp_path / "cmdline"))
    proc = subprocess.run(["/bin/sh", "-c", guard + "echo passed\n"], capture_output=True, text=True, timeout=10)
    assert (proc.returncode == 0 and proc.stdout == "passed\n") is ok, (proc.returncode, proc.stdout, proc.stderr)
