"""``slurm-ft health`` through click's CliRunner: table, JSON, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_ft.cli.health import health_command
from slurm_ft.nvml import fake


@pytest.fixture
def conf(tmp_path: Path) -> str:
    fake.write_inventory(str(tmp_path / "n1.json"), "n1", [{"index": i} for i in range(2)])
    path = tmp_path / "slurm-ft.toml"
    path.write_text(f'[nvml]\nbackend = "fake"\ninventory = "{tmp_path}/{{node}}.json"\n'
                    '[health]\nisolation = "thread"\nexpected_gpus = 2\n')
    return str(path)


def invoke(*args: str):
    return CliRunner().invoke(health_command, list(args))


def test_healthy_table_exit_0(conf):
    res = invoke("--config", conf, "--node", "n1")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].split() == ["STATUS", "CHECK", "GPU", "MEASUREMENT"]
    assert "PASS    nvml_responsive" in res.output
    assert res.output.splitlines()[-1].startswith("n1: healthy (")


def test_unhealthy_json_exit_1(conf, tmp_path):
    fake.set_gpu_field(str(tmp_path / "n1.json"), 1, "pcie_width_current", "4")
    res = invoke("--config", conf, "--node", "n1", "--json")
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert doc["node"] == "n1" and doc["healthy"] is False
    bad = [r for r in doc["results"] if r["status"] == "fail"]
    assert bad == [{"check": "pcie_link", "status": "fail", "gpu": 1, "measurement": "GPU1 PCIe link x4 of x16",
                    "value": "gen5/5 x4/16", "detail": ""}]


def test_warning_is_still_healthy(conf, tmp_path):
    fake.set_gpu_field(str(tmp_path / "n1.json"), 0, "persistence_mode", "false")
    res = invoke("--config", conf, "--node", "n1", "--check", "persistence")
    assert res.exit_code == 0
    assert "WARN" in res.output and "1 warn, 0 fail" in res.output


def test_check_selects_and_repeats(conf):
    res = invoke("--config", conf, "--node", "n1", "--json", "--check", "temperature", "--check", "gpu_count")
    assert res.exit_code == 0
    assert {r["check"] for r in json.loads(res.output)["results"]} == {"nvml_responsive", "gpu_count", "temperature"}


def test_unknown_check_is_usage_error(conf):
    res = invoke("--config", conf, "--check", "tempurature")
    assert res.exit_code == 2 and "tempurature" in res.output


def test_config_error_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[health]\nnvml_timout_s = 3\n")
    res = invoke("--config", str(bad), "--node", "n1")
    assert res.exit_code == 2
    assert "Error:" in res.output and "health.nvml_timout_s" in res.output and "Traceback" not in res.output


def test_node_defaults_to_slurmd_nodename(conf, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    res = invoke("--config", conf, "--json")
    assert json.loads(res.output)["node"] == "n1"


def test_crash_shows_last_traceback_line(conf, monkeypatch):
    from slurm_ft.health import thermal

    def boom(ctx, handle):
        raise ValueError("bad sensor")

    monkeypatch.setattr(thermal, "fail_temperature", boom)
    res = invoke("--config", conf, "--node", "n1", "--check", "temperature")
    assert res.exit_code == 1
    assert "temperature GPU0: ValueError: bad sensor" in res.output


def test_help_text():
    res = invoke("--help")
    assert res.exit_code == 0 and "Exit status 0 when healthy" in res.output
