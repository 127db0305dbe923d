"""NVML access behind one thin seam: the real ``pynvml`` module, or a fake driven by a JSON file.

Both backends expose the same ``pynvml`` function names and raise the same
``pynvml.NVMLError_*`` classes, so the health checks never know which one they talk to.
Constants (``NVML_TEMPERATURE_GPU``, ``nvmlClocksThrottleReason*`` …) are always read from
``pynvml`` itself.

Only the functions this project calls exist on the fake; see ``slurm_ft.nvml.fake``.
"""

from __future__ import annotations

from typing import Any

from slurm_ft.errors import ConfigError

BACKENDS = ("real", "fake")


def load(backend: str, inventory_path: str | None = None) -> Any:
    """Return an object exposing the ``pynvml`` functions we use.

    ``backend``: ``"real"`` returns the ``pynvml`` module itself (no wrapper: the real path
    stays thin); ``"fake"`` returns a :class:`slurm_ft.nvml.fake.FakeNvml` reading
    ``inventory_path`` (a per-node JSON file, see ``docs/health-checks.md``) at ``nvmlInit``.

    Raises :class:`ConfigError` for an unknown backend or a fake without an inventory path.
    Nothing touches the driver (or the inventory file) before ``nvmlInit()``.
    """
    if backend == "real":
        import pynvml

        return pynvml
    if backend == "fake":
        if not inventory_path:
            raise ConfigError("nvml.inventory: required when nvml.backend = 'fake'")
        from slurm_ft.nvml.fake import FakeNvml

        return FakeNvml(inventory_path)
    raise ConfigError(f"nvml.backend: real or fake, got {backend!r}")


def gpu_map(cfg, node: str, gpus) -> tuple[dict[str, int], frozenset[str]]:
    """The GPU map a verdict needs, read from NVML as ``[nvml]`` configures it for ``node``:
    ``(node_bus, job_bus)``: every GPU of the node (normalised PCI bus id -> index,
    slurm_ft.classify.normalise_bus_id) and the bus ids of the job's GPUs ``gpus`` (indices from
    ``SLURM_JOB_GPUS``; None or empty: the job owns none). One reading for the epilog, the hang
    watcher and ``slurm-ft run``. Raises what NVML raises (``pynvml.NVMLError``; ConfigError)."""
    from slurm_ft.classify.parse import normalise_bus_id

    nv = load(cfg.nvml.backend, cfg.nvml_inventory_path(node) if cfg.nvml.inventory else None)
    node_bus = {normalise_bus_id(b): i for i, b in gpu_bus_ids(nv).items()}
    by_index = {i: b for b, i in node_bus.items()}
    return node_bus, frozenset(by_index[g] for g in (gpus or ()) if g in by_index)


def bus_id_text(pci_info: Any) -> str:
    """``nvmlDeviceGetPciInfo(h).busId`` as text (``"00000000:3B:00.0"``), whatever the binding returns."""
    bus_id = pci_info.busId
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    return bus_id


def gpu_bus_ids(nv: Any) -> dict[int, str]:
    """Map GPU index -> PCI bus id as NVML prints it (``{0: "00000000:3B:00.0", …}``).

    Calls ``nvmlInit``/``nvmlShutdown`` around the queries. A GPU whose handle or PCI info
    cannot be read (e.g. ``NVMLError_GpuIsLost``) is left out of the map; an error from
    ``nvmlInit``/``nvmlDeviceGetCount`` propagates (``pynvml.NVMLError``). No timeout here:
    callers that must not hang run this under ``slurm_ft.health.runner.call_with_deadline``.
    """
    import pynvml

    nv.nvmlInit()
    try:
        out: dict[int, str] = {}
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                out[index] = bus_id_text(nv.nvmlDeviceGetPciInfo(handle))
            except pynvml.NVMLError:
                continue
        return out
    finally:
        try:
            nv.nvmlShutdown()
        except pynvml.NVMLError:
            pass
