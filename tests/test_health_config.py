"""The [health] table: defaults, strictness, and validation at config load time."""

from __future__ import annotations

import pytest

from slurm_ft.config import from_dict
from slurm_ft.errors import ConfigError
from slurm_ft.health.config import CHECK_NAMES, HealthConfig, from_config


def test_empty_table_gives_defaults():
    cfg = from_config({})
    assert cfg == HealthConfig()
    assert cfg.enabled == CHECK_NAMES
    assert cfg.isolation == "subprocess" and cfg.nvml_timeout_s == 10.0


def test_values_are_read():
    cfg = from_config({"checks": ["nvlink", "temperature"], "skip": ["nvlink"], "nvml_timeout_s": 3,
                       "expected_gpus": 8, "expected_gpus_by_node": {"n7": 4}, "xid_fail": [79],
                       "throttle_warn": ["sw_power_cap"], "pcie_gen_severity": "ignore"})
    assert cfg.enabled == ("temperature",)
    assert cfg.nvml_timeout_s == 3.0
    assert cfg.expected_for("n1") == 8 and cfg.expected_for("n7") == 4
    assert cfg.xid_fail == (79,)


@pytest.mark.parametrize("table, word", [
    ({"temprature_fail_c": 80}, "unknown key health.temprature_fail_c"),
    ({"checks": ["gpu_cnt"]}, "health.checks: unknown name 'gpu_cnt'"),
    ({"skip": ["bogus"]}, "health.skip"),
    ({"throttle_fail": ["hot"]}, "health.throttle_fail: unknown name 'hot'"),
    ({"nvml_timeout_s": "10"}, "health.nvml_timeout_s: expected float"),
    ({"nvml_timeout_s": 0}, "health.nvml_timeout_s: must be > 0"),
    ({"expected_gpus": True}, "health.expected_gpus: expected int"),
    ({"expected_gpus": -1}, "health.expected_gpus: must be >= 0"),
    ({"expected_gpus_by_node": {"n1": "8"}}, "health.expected_gpus_by_node"),
    ({"xid_fail": ["79"]}, "health.xid_fail"),
    ({"checks": "gpu_count"}, "health.checks: expected tuple"),
    ({"persistence_severity": "panic"}, "health.persistence_severity"),
    ({"isolation": "process"}, "health.isolation"),
    ({"retired_pages_fail_at": 0}, "health.retired_pages_fail_at"),
    ({"xid_wait_ms": 5000}, "health.xid_wait_ms"),
])
def test_bad_tables_name_the_key(table, word):
    with pytest.raises(ConfigError, match=word.replace(".", r"\.").replace("(", r"\(")):
        from_config(table)


def test_typo_is_an_error_at_config_load():
    with pytest.raises(ConfigError, match="health.nvml_timout_s"):
        from_dict({"health": {"nvml_timout_s": 5}})
