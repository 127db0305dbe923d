"""The deadline: subprocess and thread isolation, hung drivers, dead workers, init failures."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from slurm_ft.config import from_dict
from slurm_ft.health import run_checks, runner, unhealthy
from slurm_ft.nvml import fake


def config(tmp_path: Path, isolation: str, **health):
    fake.write_inventory(str(tmp_path / "n1.json"), "n1", [{"index": i} for i in range(4)])
    return from_dict({"nvml": {"backend": "fake", "inventory": str(tmp_path / "{node}.json")},
                      "health": {"isolation": isolation, **health}})


@pytest.mark.parametrize("isolation", ["subprocess", "thread"])
def test_same_verdicts_either_way(tmp_path, isolation):
    cfg = config(tmp_path, isolation, expected_gpus=4)
    fake.set_gpu_field(str(tmp_path / "n1.json"), 2, "row_remap_pending", "true")
    results = run_checks(cfg, "n1")
    assert results[0].check == "nvml_responsive" and results[0].status == "pass"
    assert [(r.check, r.gpu) for r in unhealthy(results)] == [("row_remap", 2)]


@pytest.mark.parametrize("isolation", ["subprocess", "thread"])
def test_hung_init_is_bounded(tmp_path, isolation):
    cfg = config(tmp_path, isolation, nvml_timeout_s=0.5)
    fake.set_node_field(str(tmp_path / "n1.json"), "nvml_hang_s", "5")
    t0 = time.monotonic()
    results = run_checks(cfg, "n1")
    took = time.monotonic() - t0
    assert 0.5 <= took < 1.5
    assert [(r.check, r.status) for r in results] == [("nvml_responsive", "fail")]
    assert results[0].measurement == "NVML did not answer within 0.5 s (in nvmlInit)"


def test_subprocess_keeps_results_before_the_hang(tmp_path):
    cfg = config(tmp_path, "subprocess", nvml_timeout_s=1.0)
    fake.set_gpu_field(str(tmp_path / "n1.json"), 3, "nvml_hang_s", "5")
    fake.set_gpu_field(str(tmp_path / "n1.json"), 3, "hang_calls", "nvmlDeviceGetTemperature")
    results = run_checks(cfg, "n1", only=["row_remap", "temperature"])
    assert [r.gpu for r in results if r.check == "row_remap"] == [0, 1, 2, 3]
    assert [r.gpu for r in results if r.check == "temperature"] == [0, 1, 2]
    assert results[0].measurement.endswith("(in temperature on GPU3)")


@pytest.mark.parametrize("isolation", ["subprocess", "thread"])
def test_missing_inventory_is_driver_not_loaded(tmp_path, isolation):
    cfg = config(tmp_path, isolation)
    results = run_checks(cfg, "n9")
    assert [(r.check, r.status) for r in results] == [("nvml_responsive", "fail")]
    assert results[0].measurement == "NVML init failed: Driver Not Loaded"


def test_invalid_inventory_is_init_fail_not_crash(tmp_path):
    cfg = config(tmp_path, "thread")
    (tmp_path / "n1.json").write_text(json.dumps({"node": "n1", "gpus": [{"index": 0, "tmp": 1}]}))
    results = run_checks(cfg, "n1")
    assert results[0].status == "fail" and "unknown key 'tmp'" in results[0].measurement


def test_dead_worker_is_fail_with_its_stderr(tmp_path, monkeypatch):
    cfg = config(tmp_path, "subprocess")
    monkeypatch.setattr(runner, "FORK_WORKER", False)    # the spawned worker (a forked one: test_prolog_detach)
    monkeypatch.setattr(runner, "worker_argv", lambda: [
        sys.executable, "-c", "import sys; sys.stderr.write('Segmentation fault'); sys.exit(139)"])
    results = run_checks(cfg, "n1")
    assert [(r.check, r.status) for r in results] == [("nvml_responsive", "fail")]
    assert "status 139" in results[0].measurement and "Segmentation fault" in results[0].detail


def test_unknown_only_name_is_config_error(tmp_path):
    from slurm_ft.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown check 'temp'"):
        run_checks(config(tmp_path, "thread"), "n1", only=["temp"])


def test_import_is_cheap():
    import subprocess

    code = "import sys, slurm_ft.health; print(sorted(m for m in ('click', 'pynvml', 'slurm_ft.health.runner') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent.parent)
    assert out.stdout.strip() == "[]"
