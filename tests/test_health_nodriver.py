"""`slurm-ft health` on a host without a usable NVIDIA driver (one clean line and a hint, no
traceback in the table or the JSON), and `slurm-ft health --act` on a healed node that is still
drained (it says so and how to resume it)."""

from __future__ import annotations

import json

import pynvml
import pytest
from click.testing import CliRunner

from slurm_ft import config as config_mod
from slurm_ft.errors import SlurmCommandError
from slurm_ft.health import actions
from slurm_ft.cli.health import health_command, render_table
from slurm_ft.health.result import CheckResult
from slurm_ft.health.runner import init_hint


class NoLibrary:
    """The real pynvml on a host without libnvidia-ml.so.1."""

    def nvmlInit(self):
        raise pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


@pytest.fixture
def no_driver(monkeypatch, tmp_path):
    from slurm_ft import nvml
    monkeypatch.setattr(nvml, "load", lambda backend, inventory=None: NoLibrary())
    cfg = tmp_path / "slurm-ft.toml"
    cfg.write_text('[health]\nisolation = "thread"\n')
    return str(cfg)


def test_table_without_nvml_is_one_clean_line_and_a_hint(no_driver):
    r = CliRunner().invoke(health_command, ["--config", no_driver, "--node", "n1"])
    assert r.exit_code == 1
    lines = r.output.splitlines()
    assert lines[1].split()[:2] == ["FAIL", "nvml_responsive"]
    assert lines[1].endswith("NVML init failed: NVML Shared Library Not Found")
    assert lines[2] == ("  nvml_responsive: libnvidia-ml.so.1 cannot be loaded: no NVIDIA driver on this host "
                        "(install it; on a host without GPUs, slurm-ft health has nothing to check)")
    assert "GPU-" not in r.output and "Traceback" not in r.output and "pynvml" not in r.output
    assert lines[-1] == "n1: unhealthy (0 pass, 0 warn, 1 fail)"


def test_json_without_nvml_has_no_traceback(no_driver):
    r = CliRunner().invoke(health_command, ["--config", no_driver, "--node", "n1", "--json"])
    result = json.loads(r.output)["results"][0]
    assert result["detail"].startswith("libnvidia-ml.so.1 cannot be loaded") and "Traceback" not in r.output


def test_hints_per_init_error():
    assert "modprobe nvidia" in init_hint(pynvml.NVMLError_DriverNotLoaded(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert "run as root" in init_hint(pynvml.NVMLError_NoPermission(pynvml.NVML_ERROR_NO_PERMISSION))


def test_a_crashing_check_still_shows_its_last_traceback_line():
    crash = CheckResult("temperature", "fail", 1, "GPU1 temperature check crashed",
                        detail="Traceback (most recent call last):\n  File x\nKeyError: 'sensor'\n")
    assert "  temperature GPU1: KeyError: 'sensor'" in render_table("n1", [crash]).splitlines()


# ----------------------------------------------------------------------------- --act, drained
class FakeSlurm:
    def __init__(self, state="IDLE+DRAIN", reason="", fail=False):
        self.info = {"State": state, "Reason": reason}
        self.fail, self.resumed = fail, []

    def show_node(self, node):
        if self.fail:
            raise SlurmCommandError("scontrol: slurmctld not responding")
        return self.info

    def resume(self, node):
        self.resumed.append(node)


PASS = [CheckResult("nvml_responsive", "pass", None, "NVML answered in 0.01 s")]


def act(slurm, auto_resume=False):
    logged: list[str] = []
    cfg = config_mod.from_dict({"failover": {"auto_resume": auto_resume}})
    return actions.act_on_node(cfg, "n1", PASS, slurm, logged.append), logged


def test_healed_node_still_drained_by_slurm_ft_says_so():
    # scontrol show node appends who set the reason and when: not repeated in the message
    outcome, logged = act(FakeSlurm(reason="slurm-ft: Xid 79 GPU 0000:10:00 (job 12) [root@2026-11-30T20:10:46]"))
    assert outcome == "still-drained"
    assert logged == ["n1: all checks pass, but the node is still drained (slurm-ft: Xid 79 GPU 0000:10:00 (job 12)); "
                      "slurm-ft does not resume it ([failover] auto_resume = false): an admin decides: "
                      "scontrol update NodeName=n1 State=RESUME"]


def test_healed_node_drained_by_an_admin_is_left_and_said():
    slurm = FakeSlurm(reason="bad fan, ticket 42")
    outcome, logged = act(slurm, auto_resume=True)
    assert outcome == "still-drained" and slurm.resumed == []
    assert "drained by someone else (bad fan, ticket 42): left drained" in logged[0]


def test_auto_resume_and_plain_nodes_unchanged():
    slurm = FakeSlurm(reason="slurm-ft: row_remap: GPU0 row remap pending")
    assert act(slurm, auto_resume=True)[0] == "resumed" and slurm.resumed == ["n1"]
    assert act(FakeSlurm(state="IDLE")) == ("none", [])
    outcome, logged = act(FakeSlurm(fail=True))
    assert outcome == "none" and "node state unknown" in logged[0]


def test_cli_act_prints_the_drain_note(no_driver, monkeypatch, tmp_path):
    """Through the CLI: results pass (fake healthy), the node is drained: the note is on stderr."""
    from slurm_ft import slurm as slurm_mod
    import slurm_ft.health as health_pkg
    from slurm_ft.health import scope
    monkeypatch.setattr(health_pkg, "run_checks", lambda cfg, node, only=None, **kw: PASS)
    monkeypatch.setattr(scope, "node_facts", lambda *a, **k: scope.NodeFacts("n1", 8))   # Slurm: gres/gpu:8
    monkeypatch.setattr(slurm_mod.Slurm, "from_config",
                        classmethod(lambda cls, cfg: FakeSlurm(reason="slurm-ft: Xid 79 GPU 0000:10:00 (job 12)")))
    monkeypatch.setattr(actions, "journal_results", lambda *a, **k: None)
    r = CliRunner().invoke(health_command, ["--config", no_driver, "--node", "n1", "--act"])
    assert r.exit_code == 0, r.output
    assert "still drained (slurm-ft: Xid 79 GPU 0000:10:00 (job 12))" in r.stderr
