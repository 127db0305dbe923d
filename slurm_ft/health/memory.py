"""Checks on GPU memory health: ``ecc_volatile_uncorrected``, ``retired_pages``, ``row_remap``.

NVML: nvmlDeviceGetTotalEccErrors, nvmlDeviceGetRetiredPages,
nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetRemappedRows.
Sources: NVIDIA "Dynamic Page Retirement" (pre-Ampere) and "GPU Memory Error Management"
(row remapping, A100 and later) in docs.nvidia.com/deploy.
"""

from __future__ import annotations

from typing import Any, Iterator

import pynvml

from slurm_ft.health.context import Context, per_gpu
from slurm_ft.health.result import CheckResult


def _ecc(ctx: Context, handle: Any, index: int) -> CheckResult:
    n = ctx.nv.nvmlDeviceGetTotalEccErrors(
        handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    limit = ctx.cfg.ecc_volatile_uncorrected_max
    status = "fail" if n > limit else "warn" if n else "pass"
    return CheckResult("ecc_volatile_uncorrected", status, index,
                       f"GPU{index} {n} volatile uncorrectable ECC errors" + (f" (max {limit})" if n else ""), n)


def ecc_volatile_uncorrected(ctx: Context) -> Iterator[CheckResult]:
    """Per GPU: uncorrectable ECC errors since the driver loaded (``value``: count).

    Fails above ``ecc_volatile_uncorrected_max``, warns for 1..max. ECC off / no ECC: NotSupported -> pass.
    """
    return per_gpu(ctx, "ecc_volatile_uncorrected", _ecc)


def _retired(ctx: Context, handle: Any, index: int) -> CheckResult:
    nv = ctx.nv
    pending = nv.nvmlDeviceGetRetiredPagesPendingStatus(handle) == pynvml.NVML_FEATURE_ENABLED
    total = sum(len(nv.nvmlDeviceGetRetiredPages(handle, cause)) for cause in (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
    if pending:
        return CheckResult("retired_pages", "fail", index, f"GPU{index} page retirement pending (reset needed)", total)
    if total >= ctx.cfg.retired_pages_fail_at:
        return CheckResult("retired_pages", "fail", index,
                           f"GPU{index} {total} retired pages (RMA at {ctx.cfg.retired_pages_fail_at})", total)
    if total >= ctx.cfg.retired_pages_warn_at:
        return CheckResult("retired_pages", "warn", index,
                           f"GPU{index} {total} retired pages (warn at {ctx.cfg.retired_pages_warn_at})", total)
    return CheckResult("retired_pages", "pass", index, f"GPU{index} {total} retired pages", total)


def retired_pages(ctx: Context) -> Iterator[CheckResult]:
    """Per GPU (pre-Ampere): a retirement pending a reset fails; so does a total at or above
    ``retired_pages_fail_at``, warns at ``retired_pages_warn_at`` (``value``: retired pages,
    SBE + DBE). Row-remapping GPUs
    answer NotSupported -> pass."""
    return per_gpu(ctx, "retired_pages", _retired)


def _row_remap(ctx: Context, handle: Any, index: int) -> CheckResult:
    corr, unc, pending, failure = ctx.nv.nvmlDeviceGetRemappedRows(handle)
    rows = corr + unc
    if failure:
        return CheckResult("row_remap", "fail", index, f"GPU{index} row remap failed", rows)
    if pending:
        return CheckResult("row_remap", "fail", index, f"GPU{index} row remap pending", rows)
    if rows >= ctx.cfg.row_remap_warn_at:
        return CheckResult("row_remap", "warn", index, f"GPU{index} {rows} remapped rows ({unc} uncorrectable)", rows)
    return CheckResult("row_remap", "pass", index, f"GPU{index} {rows} remapped rows", rows)


def row_remap(ctx: Context) -> Iterator[CheckResult]:
    """Per GPU (Ampere and later): a pending remap (needs a GPU reset) or a failed remap
    (RMA) fails; ``row_remap_warn_at`` remapped rows or more warn. ``value``: remapped rows (correctable + uncorrectable)."""
    return per_gpu(ctx, "row_remap", _row_remap)
