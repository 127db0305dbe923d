"""Checks on heat and clocks: ``temperature`` and ``throttle``.

NVML: nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU), nvmlDeviceGetTemperatureThreshold
(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN), nvmlDeviceGetCurrentClocksEventReasons (named
...ThrottleReasons before driver 535). Bit names: NVML API reference, "ClocksEventReasons".
"""

from __future__ import annotations

from typing import Any, Iterator

import pynvml

from slurm_ft.health.config import THROTTLE_BITS
from slurm_ft.health.context import Context, per_gpu
from slurm_ft.health.result import CheckResult


def fail_temperature(ctx: Context, handle: Any) -> int:
    """°C at which this GPU fails: config, else the GPU's slowdown threshold, else the fallback."""
    cfg = ctx.cfg
    if cfg.temperature_fail_c:
        return cfg.temperature_fail_c
    try:
        return ctx.nv.nvmlDeviceGetTemperatureThreshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    except pynvml.NVMLError_NotSupported:
        return cfg.temperature_fallback_c


def _temperature(ctx: Context, handle: Any, index: int) -> CheckResult:
    temp = ctx.nv.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    limit = fail_temperature(ctx, handle)
    warn_at = limit - ctx.cfg.temperature_warn_margin_c
    if temp >= limit:
        return CheckResult("temperature", "fail", index, f"GPU{index} {temp} C (fail at {limit} C)", temp)
    if temp >= warn_at:
        return CheckResult("temperature", "warn", index, f"GPU{index} {temp} C (warn at {warn_at} C)", temp)
    return CheckResult("temperature", "pass", index, f"GPU{index} {temp} C", temp)


def temperature(ctx: Context) -> Iterator[CheckResult]:
    """Per GPU: core temperature (``value``, °C) against the fail temperature and warn margin."""
    return per_gpu(ctx, "temperature", _temperature)


def reason_names(mask: int) -> list[str]:
    """Bitmask -> THROTTLE_BITS names, in bit order (unknown bits as ``0x…``)."""
    names = [name for name, bit in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS.values())
    return names + ([hex(rest)] if rest else [])


def _throttle(ctx: Context, handle: Any, index: int) -> CheckResult:
    nv = ctx.nv
    getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = getter(handle)
    active = set(reason_names(mask))
    failing = [n for n in ctx.cfg.throttle_fail if n in active]
    warning = [n for n in ctx.cfg.throttle_warn if n in active]
    if failing:
        return CheckResult("throttle", "fail", index, f"GPU{index} throttled: {', '.join(failing)}", hex(mask))
    if warning:
        return CheckResult("throttle", "warn", index, f"GPU{index} throttled: {', '.join(warning)}", hex(mask))
    shown = ", ".join(sorted(active)) or "none"
    return CheckResult("throttle", "pass", index, f"GPU{index} clock reasons: {shown}", hex(mask))


def throttle(ctx: Context) -> Iterator[CheckResult]:
    """Per GPU: active clock event reasons (``value``: bitmask as hex text) against
    ``throttle_fail`` / ``throttle_warn``."""
    return per_gpu(ctx, "throttle", _throttle)
