"""The ``[health]`` TOML table: which checks run and their thresholds. Strict.

Every key, its default and its source is documented in ``docs/health-checks.md``;
the defaults below are the single place those numbers live.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from slurm_ft.errors import ConfigError, HostlistError
from slurm_ft.health.result import CHECK_NAMES  # noqa: F401 - the checks' names live with their result

#: Clock event ("throttle") reason names -> NVML bit (``nvmlClocksEventReason*``, NVML API reference).
THROTTLE_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

SEVERITIES = ("fail", "warn", "ignore")
ISOLATIONS = ("subprocess", "thread")


@dataclass(frozen=True)
class HealthConfig:
    #: Checks to run (names from CHECK_NAMES), in CHECK_NAMES order.
    checks: tuple[str, ...] = CHECK_NAMES
    #: Checks not to run (applied after ``checks``).
    skip: tuple[str, ...] = ()
    #: Seconds all NVML work may take together; past it: ``nvml_responsive`` fail.
    nvml_timeout_s: float = 10.0
    #: ``subprocess`` (a hung driver call is abandoned in a child process the prolog does
    #: not wait for) or ``thread`` (cheaper; a thread stuck in the kernel can delay exit).
    isolation: str = "subprocess"
    #: GPUs this node must have; 0 = at least one. ``expected_gpus_by_node`` wins per node.
    expected_gpus: int = 0
    expected_gpus_by_node: dict[str, int] = field(default_factory=dict)
    #: Volatile (since driver load) uncorrectable ECC errors allowed per GPU (more: fail;
    #: 1..max: warn).
    ecc_volatile_uncorrected_max: int = 0
    #: Retired pages (SBE + DBE) at which the GPU fails: NVIDIA's RMA threshold is 60
    #: (Dynamic Page Retirement, docs.nvidia.com/deploy/dynamic-page-retirement).
    retired_pages_fail_at: int = 60
    #: Retired pages at which the GPU warns (slurm-ft's choice: half way to RMA).
    retired_pages_warn_at: int = 30
    #: Remapped rows (correctable + uncorrectable) at which the GPU warns; a pending or
    #: failed remap always fails (NVIDIA "GPU Memory Error Management").
    row_remap_warn_at: int = 1
    #: Temperature (°C) at which the GPU fails; 0 = the GPU's own slowdown threshold
    #: (nvmlDeviceGetTemperatureThreshold SLOWDOWN), ``temperature_fallback_c`` if unknown.
    temperature_fail_c: int = 0
    temperature_fallback_c: int = 85
    #: Warn this many °C below the fail temperature.
    temperature_warn_margin_c: int = 5
    #: Clock event reasons (THROTTLE_BITS names) that fail / warn; others pass.
    throttle_fail: tuple[str, ...] = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
    throttle_warn: tuple[str, ...] = ("sw_thermal_slowdown",)
    #: Verdict when the PCIe link runs below max generation (GPUs down-train at idle: warn).
    pcie_gen_severity: str = "warn"
    #: Verdict when the PCIe link has fewer lanes than its max (a degraded link: fail).
    pcie_width_severity: str = "fail"
    #: NVLink links allowed down per GPU (more: fail; 1..max: warn).
    nvlink_max_down: int = 0
    #: Verdict when persistence mode is off.
    persistence_severity: str = "warn"
    #: Xid codes that fail the node (NVIDIA Xid catalog: hardware / reset / RMA actions).
    xid_fail: tuple[int, ...] = (48, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140, 154)
    #: Xid codes ignored (application errors: 8, 11, 13, 31, 43, 45). Other codes warn.
    xid_ignore: tuple[int, ...] = (8, 11, 13, 31, 43, 45)
    #: Milliseconds to wait on the NVML event set for each Xid event.
    xid_wait_ms: int = 0
    #: Also read Xids from the kernel log of the last this-many seconds (0 = NVML event set
    #: only). Uses slurm_ft.classify's /dev/kmsg reader and Xid parser.
    xid_kmsg_window_s: float = 0.0
    #: Scope (slurm_ft.health.scope, docs/health-checks.md "Which nodes are checked"): a Slurm
    #: hostlist (ClusterShell syntax, ``gpu[01-64]``) of the nodes checked; "" = every node
    #: whose Slurm record has ``gres/gpu``.
    nodes: str = ""
    #: Hostlist of nodes never checked (wins over ``nodes`` and ``partitions``).
    exclude_nodes: str = ""
    #: Only nodes in one of these Slurm partitions are checked; [] = any partition.
    partitions: tuple[str, ...] = ()
    #: Seconds the prolog reuses a node's Slurm record (its gres and partitions), cached under
    #: ``[node_state] dir``, before asking slurmctld again (``scontrol show node``); 0 = every job.
    scope_cache_s: float = 300.0

    @property
    def enabled(self) -> tuple[str, ...]:
        """Checks that run, in run order."""
        return tuple(c for c in CHECK_NAMES if c in self.checks and c not in self.skip)

    def expected_for(self, node: str) -> int:
        """Expected GPU count for ``node`` (0 = at least one)."""
        return self.expected_gpus_by_node.get(node, self.expected_gpus)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _coerce(key: str, value: Any, default: Any) -> Any:
    where = f"health.{key}"
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = _is_int(value)
    elif isinstance(default, float):
        ok = _is_int(value) or isinstance(value, float)
        value = float(value) if ok else value
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, tuple):
        ok = isinstance(value, list)
        if ok:
            want = int if default and _is_int(default[0]) or key.startswith("xid_") else str
            ok = all(_is_int(x) if want is int else isinstance(x, str) for x in value)
            value = tuple(value)
    elif isinstance(default, dict):
        ok = isinstance(value, dict) and all(_is_int(v) for v in value.values())
        value = dict(value) if ok else value
    else:  # pragma: no cover - every field has one of the types above
        ok = False
    if not ok:
        raise ConfigError(f"{where}: expected {type(default).__name__}, got {value!r}")
    return value


def _names(key: str, values: tuple[str, ...], known: Any) -> None:
    for v in values:
        if v not in known:
            raise ConfigError(f"health.{key}: unknown name {v!r} (known: {', '.join(known)})")


def from_config(table: dict[str, Any]) -> HealthConfig:
    """Validate the raw ``[health]`` table and build a :class:`HealthConfig`.

    Raises :class:`ConfigError` naming the key for unknown keys, wrong types, unknown check or
    throttle-reason names, bad severities and out-of-range numbers.
    """
    if not isinstance(table, dict):
        raise ConfigError("[health]: must be a table")
    defaults = HealthConfig()
    known = {f.name: f for f in dataclasses.fields(HealthConfig)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"unknown key health.{key} (known: {', '.join(sorted(known))})")
        values[key] = _coerce(key, value, getattr(defaults, key))
    cfg = HealthConfig(**values)
    _names("checks", cfg.checks, CHECK_NAMES)
    _names("skip", cfg.skip, CHECK_NAMES)
    _names("throttle_fail", cfg.throttle_fail, THROTTLE_BITS)
    _names("throttle_warn", cfg.throttle_warn, THROTTLE_BITS)
    for key in ("pcie_gen_severity", "pcie_width_severity", "persistence_severity"):
        if getattr(cfg, key) not in SEVERITIES:
            raise ConfigError(f"health.{key}: one of {', '.join(SEVERITIES)}, got {getattr(cfg, key)!r}")
    if cfg.isolation not in ISOLATIONS:
        raise ConfigError(f"health.isolation: one of {', '.join(ISOLATIONS)}, got {cfg.isolation!r}")
    if not 0 < cfg.nvml_timeout_s <= 600:
        raise ConfigError(f"health.nvml_timeout_s: must be > 0 and <= 600, got {cfg.nvml_timeout_s}")
    for key in ("expected_gpus", "ecc_volatile_uncorrected_max", "nvlink_max_down", "xid_wait_ms",
                "temperature_warn_margin_c", "temperature_fail_c"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"health.{key}: must be >= 0, got {getattr(cfg, key)}")
    for key in ("retired_pages_fail_at", "retired_pages_warn_at", "row_remap_warn_at"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"health.{key}: must be >= 1, got {getattr(cfg, key)}")
    if cfg.xid_wait_ms > 1000:
        raise ConfigError(f"health.xid_wait_ms: at most 1000, got {cfg.xid_wait_ms}")
    if cfg.xid_kmsg_window_s < 0:
        raise ConfigError(f"health.xid_kmsg_window_s: must be >= 0, got {cfg.xid_kmsg_window_s}")
    if cfg.scope_cache_s < 0:
        raise ConfigError(f"health.scope_cache_s: must be >= 0, got {cfg.scope_cache_s}")
    for key in ("nodes", "exclude_nodes"):
        if not getattr(cfg, key):
            continue
        from slurm_ft.slurm.records import (  # ClusterShell: only when a hostlist is set (the worker stays lean)
            split_nodes)
        try:
            split_nodes(getattr(cfg, key))
        except HostlistError as exc:
            raise ConfigError(f"health.{key}: {exc}") from None
    for node, n in cfg.expected_gpus_by_node.items():
        if n < 0:
            raise ConfigError(f"health.expected_gpus_by_node.{node}: must be >= 0, got {n}")
    return cfg
