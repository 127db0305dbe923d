"""A fake NVML at the ``pynvml`` function boundary, driven by a per-node inventory file.

``FakeNvml(path)`` has the ``pynvml`` functions slurm-ft calls, with the same arguments,
return shapes and ``pynvml.NVMLError_*`` exceptions. The inventory (``slurm_ft.nvml.inventory``)
is read at ``nvmlInit`` and never written by the fake, so a check sees one consistent snapshot.

Failure simulation (inventory keys):

- ``lost: true`` (GPU): ``nvmlDeviceGetHandleByIndex`` and every call on that GPU raise
  ``NVMLError_GpuIsLost``; ``nvmlDeviceGetCount`` still counts it, as the real driver does.
- ``nvml_hang_s`` (node: in ``nvmlInit``; GPU: before every call on that GPU, or only the
  calls named in ``hang_calls``) sleeps, like a hung driver.
- ``not_supported: ["nvmlDeviceGetRemappedRows", …]`` (GPU): those calls raise
  ``NVMLError_NotSupported``.
- a missing inventory file: ``nvmlInit`` raises ``NVMLError_DriverNotLoaded``.
"""

from __future__ import annotations

import inspect
import time
from types import SimpleNamespace
from typing import Any

import pynvml

from slurm_ft.nvml.inventory import (  # noqa: F401  (public here too)
    read, set_gpu_field, set_node_field, write_inventory)

__all__ = ["FakeNvml", "write_inventory", "set_gpu_field", "set_node_field"]


class FakeHandle:
    """Opaque device handle (like ``c_nvmlDevice_t``); only ``index`` is meaningful."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"FakeHandle({self.index})"


class FakeEventSet:
    """Event set from ``nvmlEventSetCreate``: pending ``c_nvmlEventData_t``-like records."""

    def __init__(self) -> None:
        self.pending: list[SimpleNamespace] = []


_ECC_KEYS = {
    (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): "ecc_volatile_corrected",
    (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): "ecc_volatile_uncorrected",
    (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): "ecc_aggregate_corrected",
    (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): "ecc_aggregate_uncorrected",
}
_THRESHOLD_KEYS = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "temperature_slowdown_c",
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "temperature_shutdown_c",
}
_RETIRED_KEYS = {
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "retired_pages_sbe",
    pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "retired_pages_dbe",
}


class FakeNvml:
    """The fake. Attribute access for ``pynvml`` constants and error classes falls through to
    ``pynvml``; a ``pynvml`` *function* the fake lacks is an ``AttributeError`` (a test bug)."""

    def __init__(self, inventory_path: str) -> None:
        self.inventory_path = inventory_path
        self._inv: dict[str, Any] | None = None
        self._init_count = 0

    def __getattr__(self, name: str) -> Any:
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"FakeNvml has no {name}")
        return value

    # -- library -------------------------------------------------------------------
    def nvmlInit(self) -> None:
        try:
            inv = read(self.inventory_path)
        except FileNotFoundError:
            raise pynvml.NVMLError_DriverNotLoaded() from None
        if inv["nvml_hang_s"] > 0:
            time.sleep(inv["nvml_hang_s"])
        self._inv = inv
        self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        if self._init_count == 0:
            raise pynvml.NVMLError_Uninitialized()
        self._init_count -= 1
        if self._init_count == 0:
            self._inv = None

    def _node(self) -> dict[str, Any]:
        if self._inv is None:
            raise pynvml.NVMLError_Uninitialized()
        return self._inv

    def _gpu(self, handle: Any, fn: str) -> dict[str, Any]:
        inv = self._node()
        if not isinstance(handle, FakeHandle):
            raise pynvml.NVMLError_InvalidArgument()
        for gpu in inv["gpus"]:
            if gpu["index"] == handle.index:
                break
        else:
            raise pynvml.NVMLError_InvalidArgument()
        if gpu["nvml_hang_s"] > 0 and (not gpu["hang_calls"] or fn in gpu["hang_calls"]):
            time.sleep(gpu["nvml_hang_s"])
        if gpu["lost"]:
            raise pynvml.NVMLError_GpuIsLost()
        if fn in gpu["not_supported"]:
            raise pynvml.NVMLError_NotSupported()
        return gpu

    # -- system / enumeration ---------------------------------------------------------
    def nvmlSystemGetDriverVersion(self) -> str:
        return self._node()["driver_version"]

    def nvmlDeviceGetCount(self) -> int:
        return len(self._node()["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        gpus = self._node()["gpus"]
        if not 0 <= index < len(gpus):
            raise pynvml.NVMLError_InvalidArgument()
        handle = FakeHandle(gpus[index]["index"])
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetIndex")["index"]

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:
        bus_id = self._gpu(handle, "nvmlDeviceGetPciInfo")["pci_bus_id"]
        domain, bus, devfn = bus_id.split(":")
        return SimpleNamespace(
            busId=bus_id,
            busIdLegacy=bus_id[4:],
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=int(devfn.split(".")[0], 16),
        )

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID")["uuid"]

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName")["name"]

    # -- health signals -------------------------------------------------------------
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu["temperature_c"]

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperatureThreshold")
        key = _THRESHOLD_KEYS.get(threshold)
        if key is None:
            raise pynvml.NVMLError_NotSupported()
        return gpu[key]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        key = _ECC_KEYS.get((error_type, counter_type))
        if key is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu[key]

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPages")
        key = _RETIRED_KEYS.get(cause)
        if key is None:
            raise pynvml.NVMLError_InvalidArgument()
        base = 0x1000 if key == "retired_pages_sbe" else 0x8000
        return [base + n for n in range(gpu[key])]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        return pynvml.NVML_FEATURE_ENABLED if gpu["retired_pages_pending"] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRemappedRows")
        return (
            gpu["remapped_rows_correctable"],
            gpu["remapped_rows_uncorrectable"],
            int(gpu["row_remap_pending"]),
            int(gpu["row_remap_failure"]),
        )

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")["throttle_reasons"]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")["throttle_reasons"]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration")["pcie_gen_current"]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration")["pcie_gen_max"]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth")["pcie_width_current"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth")["pcie_width_max"]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        links = self._gpu(handle, "nvmlDeviceGetNvLinkState")["nvlink_links"]
        if not links:
            raise pynvml.NVMLError_NotSupported()
        if not 0 <= link < len(links):
            raise pynvml.NVMLError_InvalidArgument()
        return pynvml.NVML_FEATURE_ENABLED if links[link] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetPersistenceMode")
        return pynvml.NVML_FEATURE_ENABLED if gpu["persistence_mode"] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetComputeMode")["compute_mode"]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        """``c_nvmlUtilization_t``: ``gpu`` (percent of time a kernel ran over the last sample
        period) from the inventory; ``memory`` is not modelled (0)."""
        return SimpleNamespace(gpu=self._gpu(handle, "nvmlDeviceGetUtilizationRates")["utilization_gpu"], memory=0)

    # -- events -------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._node()
        return FakeEventSet()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._gpu(handle, "nvmlDeviceGetSupportedEventTypes")
        return pynvml.nvmlEventTypeAll

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: FakeEventSet) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            for xid in gpu["xid_events"]:
                event_set.pending.append(
                    SimpleNamespace(
                        device=handle,
                        eventType=pynvml.nvmlEventTypeXidCriticalError,
                        eventData=xid,
                        gpuInstanceId=0xFFFFFFFF,
                        computeInstanceId=0xFFFFFFFF,
                    )
                )

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> SimpleNamespace:
        self._node()
        if event_set.pending:
            return event_set.pending.pop(0)
        raise pynvml.NVMLError_Timeout()

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        event_set.pending.clear()
