"""Check name -> function (``fn(ctx) -> iterable of CheckResult``, yielded as made), in run order (config.CHECK_NAMES)."""

from __future__ import annotations

from typing import Callable, Iterable

from slurm_ft.health import device, links, memory, thermal, xid
from slurm_ft.health.config import CHECK_NAMES
from slurm_ft.health.context import Context
from slurm_ft.health.result import CheckResult

CHECKS: dict[str, Callable[[Context], Iterable[CheckResult]]] = {
    "gpu_count": device.gpu_count,
    "persistence": device.persistence,
    "compute_mode": device.compute_mode,
    "ecc_volatile_uncorrected": memory.ecc_volatile_uncorrected,
    "retired_pages": memory.retired_pages,
    "row_remap": memory.row_remap,
    "temperature": thermal.temperature,
    "throttle": thermal.throttle,
    "pcie_link": links.pcie_link,
    "nvlink": links.nvlink,
    "xid_events": xid.xid_events,
}
assert tuple(CHECKS) == CHECK_NAMES
