"""Checks on the GPU's links: ``pcie_link`` and ``nvlink``.

NVML: nvmlDeviceGetCurrPcieLinkGeneration / nvmlDeviceGetMaxPcieLinkGeneration,
nvmlDeviceGetCurrPcieLinkWidth / nvmlDeviceGetMaxPcieLinkWidth (the "Max" calls give the best
the GPU *and this slot* allow, so a Gen4 host is not a Gen5 GPU's fault),
nvmlDeviceGetNvLinkState(link) for link in 0..NVML_NVLINK_MAX_LINKS-1.
"""

from __future__ import annotations

from typing import Any, Iterator

import pynvml

from slurm_ft.health.context import Context, per_gpu, verdict
from slurm_ft.health.result import CheckResult

_RANK = {"pass": 0, "warn": 1, "fail": 2}


def _pcie(ctx: Context, handle: Any, index: int) -> CheckResult:
    nv = ctx.nv
    gen, gen_max = nv.nvmlDeviceGetCurrPcieLinkGeneration(handle), nv.nvmlDeviceGetMaxPcieLinkGeneration(handle)
    width, width_max = nv.nvmlDeviceGetCurrPcieLinkWidth(handle), nv.nvmlDeviceGetMaxPcieLinkWidth(handle)
    value = f"gen{gen}/{gen_max} x{width}/{width_max}"
    status, problems = "pass", []
    if width < width_max:
        problems.append(f"x{width} of x{width_max}")
        status = max(status, verdict(ctx.cfg.pcie_width_severity), key=_RANK.__getitem__)
    if gen < gen_max:
        problems.append(f"gen{gen} of gen{gen_max}")
        status = max(status, verdict(ctx.cfg.pcie_gen_severity), key=_RANK.__getitem__)
    if problems:
        return CheckResult("pcie_link", status, index, f"GPU{index} PCIe link {', '.join(problems)}", value)
    return CheckResult("pcie_link", "pass", index, f"GPU{index} PCIe gen{gen} x{width}", value)


def pcie_link(ctx: Context) -> Iterator[CheckResult]:
    """Per GPU: PCIe link width below max -> ``pcie_width_severity``; generation below max ->
    ``pcie_gen_severity`` (GPUs drop link speed at idle to save power, hence warn by default).
    ``value``: ``"gen<cur>/<max> x<cur>/<max>"``."""
    return per_gpu(ctx, "pcie_link", _pcie)


def _nvlink(ctx: Context, handle: Any, index: int) -> CheckResult:
    up, down = [], []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = ctx.nv.nvmlDeviceGetNvLinkState(handle, link)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            if link == 0:
                raise pynvml.NVMLError_NotSupported() from None
            break
        (up if state == pynvml.NVML_FEATURE_ENABLED else down).append(link)
    if down:
        status = "fail" if len(down) > ctx.cfg.nvlink_max_down else "warn"
        links = ",".join(map(str, down))
        return CheckResult("nvlink", status, index, f"GPU{index} {len(down)} NVLink links down ({links})", len(down))
    return CheckResult("nvlink", "pass", index, f"GPU{index} {len(up)} NVLink links up", len(down))


def nvlink(ctx: Context) -> Iterator[CheckResult]:
    """Per GPU: NVLink links down (``value``: count) above ``nvlink_max_down`` fail, 1..max
    warn. A GPU
    without NVLink (NotSupported on link 0) passes."""
    return per_gpu(ctx, "nvlink", _nvlink)
