"""Checks on the node's GPU inventory: ``gpu_count``, ``persistence`` and ``compute_mode``.

NVML: nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetPersistenceMode,
nvmlDeviceGetComputeMode.
"""

from __future__ import annotations

from typing import Any, Iterator

import pynvml

from slurm_ft.health.context import Context, per_gpu, verdict
from slurm_ft.health.result import CheckResult


def gpu_count(ctx: Context) -> list[CheckResult]:
    """Node-level. Usable GPUs (a handle could be had) vs. the expected count.

    ``value``: usable GPU count. Fails when fewer than ``expected_gpus`` (or 0 when no count
    is configured); warns when more (a config out of date, not a broken node).
    """
    ctx.progress("gpu_count", None)
    usable = len(ctx.handles)
    seen = f" ({ctx.count} seen by NVML)" if ctx.count != usable else ""
    expected = ctx.expected_gpus
    if expected > 0 and usable > expected:
        return [CheckResult("gpu_count", "warn", None, f"{usable} GPUs, expected {expected}{seen}", usable)]
    if expected > 0 and usable != expected:
        return [CheckResult("gpu_count", "fail", None, f"{usable} GPUs, expected {expected}{seen}", usable)]
    if expected == 0 and usable == 0:
        return [CheckResult("gpu_count", "fail", None, f"no GPUs{seen}", usable)]
    want = f", expected {expected}" if expected else ""
    return [CheckResult("gpu_count", "pass", None, f"{usable} GPUs{want}{seen}", usable)]


def _persistence(ctx: Context, handle: Any, index: int) -> CheckResult:
    mode = ctx.nv.nvmlDeviceGetPersistenceMode(handle)
    if mode == pynvml.NVML_FEATURE_ENABLED:
        return CheckResult("persistence", "pass", index, f"GPU{index} persistence mode on", 1)
    status = verdict(ctx.cfg.persistence_severity)
    return CheckResult("persistence", status, index, f"GPU{index} persistence mode off", 0)


def persistence(ctx: Context) -> Iterator[CheckResult]:
    """Per GPU: persistence mode on (``value`` 1) or off (0 -> ``persistence_severity``)."""
    return per_gpu(ctx, "persistence", _persistence)


#: ``nvmlComputeMode_t`` names (NVML API reference, nvmlDeviceGetComputeMode).
COMPUTE_MODES = {pynvml.NVML_COMPUTEMODE_DEFAULT: "Default", pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "Exclusive_Thread",
                 pynvml.NVML_COMPUTEMODE_PROHIBITED: "Prohibited",
                 pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "Exclusive_Process"}


def _compute_mode(ctx: Context, handle: Any, index: int) -> CheckResult:
    mode = ctx.nv.nvmlDeviceGetComputeMode(handle)
    name = COMPUTE_MODES.get(mode, f"unknown ({mode})")
    if mode == pynvml.NVML_COMPUTEMODE_PROHIBITED:
        # no process can create a CUDA context: "CUDA-capable device(s) is/are busy or unavailable"
        return CheckResult("compute_mode", "fail", index, f"GPU{index} compute mode {name}: no CUDA context possible",
                           mode)
    return CheckResult("compute_mode", "pass", index, f"GPU{index} compute mode {name}", mode)


def compute_mode(ctx: Context) -> Iterator[CheckResult]:
    """Per GPU: compute mode (``value``: nvmlComputeMode_t). Prohibited fails (an admin or a
    broken reset left the GPU unusable: every job on it gets cudaErrorDevicesUnavailable);
    Exclusive_Process is a site's choice and passes."""
    return per_gpu(ctx, "compute_mode", _compute_mode)
