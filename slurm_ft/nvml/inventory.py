"""The fake-NVML inventory file: one JSON document per node, its schema, and safe writes.

Shape::

    {"node": "n1", "driver_version": "550.54.15", "nvml_hang_s": 0.0,
     "gpus": [{"index": 0, "pci_bus_id": "00000000:10:00.0", "uuid": "GPU-…",
               "name": "NVIDIA H100 80GB HBM3", "temperature_c": 35, …}, …]}

Every key except ``gpus`` may be left out; :data:`GPU_FIELDS` / :data:`NODE_FIELDS` give the
defaults (a healthy, idle H100 SXM). Unknown keys are :class:`ConfigError` (strict, like the
TOML config). Writers replace the file atomically (temp file + ``os.replace``) so a reader
never sees half a document.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from slurm_ft.errors import ConfigError


@dataclass(frozen=True)
class Field:
    """One inventory key: its type (``bool``/``int``/``float``/``str``/``list[int]``/``list[str]``), default and meaning."""

    key: str
    kind: str
    default: Any
    doc: str


#: Per-GPU keys. Units are in the key name (``_c`` °C, ``_s`` seconds). Defaults: healthy idle H100 SXM.
GPU_FIELDS: tuple[Field, ...] = (
    Field("index", "int", 0, "NVML index (position in the list when absent)"),
    Field("pci_bus_id", "str", "", "PCI bus id as NVML prints it; derived from the index when absent"),
    Field("uuid", "str", "", "GPU UUID; derived from node and index when absent"),
    Field("name", "str", "NVIDIA H100 80GB HBM3", "product name (nvmlDeviceGetName)"),
    Field("lost", "bool", False, "GPU fell off the bus: every call on it raises NVMLError_GpuIsLost"),
    Field("nvml_hang_s", "float", 0.0, "NVML calls on this GPU sleep this long first (hung driver)"),
    Field("hang_calls", "list[str]", [], "NVML function names nvml_hang_s applies to; empty = every call"),
    Field("not_supported", "list[str]", [], "NVML function names that raise NVMLError_NotSupported on this GPU"),
    Field("temperature_c", "int", 35, "core temperature (nvmlDeviceGetTemperature, NVML_TEMPERATURE_GPU)"),
    Field("temperature_slowdown_c", "int", 87, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
    Field("temperature_shutdown_c", "int", 92, "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
    Field("ecc_volatile_corrected", "int", 0, "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)"),
    Field("ecc_volatile_uncorrected", "int", 0, "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)"),
    Field("ecc_aggregate_corrected", "int", 0, "nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE)"),
    Field("ecc_aggregate_uncorrected", "int", 0, "nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE)"),
    Field("retired_pages_sbe", "int", 0, "pages retired for multiple single-bit errors (nvmlDeviceGetRetiredPages)"),
    Field("retired_pages_dbe", "int", 0, "pages retired for double-bit errors (nvmlDeviceGetRetiredPages)"),
    Field("retired_pages_pending", "bool", False, "nvmlDeviceGetRetiredPagesPendingStatus"),
    Field("remapped_rows_correctable", "int", 0, "nvmlDeviceGetRemappedRows()[0]"),
    Field("remapped_rows_uncorrectable", "int", 0, "nvmlDeviceGetRemappedRows()[1]"),
    Field("row_remap_pending", "bool", False, "nvmlDeviceGetRemappedRows()[2]"),
    Field("row_remap_failure", "bool", False, "nvmlDeviceGetRemappedRows()[3]"),
    Field("throttle_reasons", "int", 1, "clocks event/throttle reason bitmask (1 = GpuIdle); accepts 0x.."),
    Field("pcie_gen_current", "int", 5, "nvmlDeviceGetCurrPcieLinkGeneration"),
    Field("pcie_gen_max", "int", 5, "nvmlDeviceGetMaxPcieLinkGeneration"),
    Field("pcie_width_current", "int", 16, "nvmlDeviceGetCurrPcieLinkWidth (lanes)"),
    Field("pcie_width_max", "int", 16, "nvmlDeviceGetMaxPcieLinkWidth (lanes)"),
    Field("nvlink_links", "list[int]", [1] * 18, "state per NVLink link (1 up, 0 down); empty = no NVLink"),
    Field("persistence_mode", "bool", True, "nvmlDeviceGetPersistenceMode"),
    Field("compute_mode", "int", 0, "nvmlDeviceGetComputeMode (0 default, 2 prohibited, 3 exclusive process)"),
    Field("xid_events", "list[int]", [], "Xid codes delivered by nvmlEventSetWait (on every check until cleared)"),
    Field("utilization_gpu", "int", 0, "percent of time a kernel ran (nvmlDeviceGetUtilizationRates().gpu); "
          "read by the hang watcher, no health check"),
    Field("collective_corrupt", "bool", False, "the GPU returns wrong results to the lab's collective test "
          "(slurm_ft.bisect.collective) while every health check passes: silent corruption only bisect finds"),
)

#: Node-level keys (beside ``gpus``).
NODE_FIELDS: tuple[Field, ...] = (
    Field("node", "str", "", "Slurm node name"),
    Field("driver_version", "str", "550.54.15", "nvmlSystemGetDriverVersion"),
    Field("nvml_hang_s", "float", 0.0, "nvmlInit sleeps this long first (driver hung for every GPU)"),
)

GPU_FIELD = {f.key: f for f in GPU_FIELDS}
NODE_FIELD = {f.key: f for f in NODE_FIELDS}


def default_bus_id(index: int) -> str:
    """Bus id given to a GPU without one: ``00000000:{0x10+index:02X}:00.0``."""
    return f"00000000:{0x10 + index:02X}:00.0"


def _check_type(where: str, field: Field, value: Any) -> Any:
    kind = field.kind
    ok = {
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "list[int]": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
        "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    }[kind]
    if not ok(value):
        raise ConfigError(f"{where}: expected {kind}, got {value!r}")
    return float(value) if kind == "float" else value


def parse_value(where: str, field: Field, text: str) -> Any:
    """Parse command-line text (``"true"``, ``"0x48"``, ``"1,1,0"``) to ``field``'s type. Raises ConfigError."""
    kind = field.kind
    try:
        if kind == "bool":
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind == "int":
            return int(text.strip(), 0)
        if kind == "float":
            return float(text)
        if kind == "str":
            return text
        items = [x.strip() for x in text.split(",") if x.strip()]
        if kind == "list[int]":
            return [int(x, 0) for x in items]
        return items
    except ValueError:
        raise ConfigError(f"{where}: expected {kind}, got {text!r}") from None


def normalise(doc: Any, source: str = "inventory") -> dict[str, Any]:
    """Validate an inventory document and fill every default. Returns a new dict.

    Raises :class:`ConfigError` naming the key for unknown keys or wrong types.
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: must be a JSON object")
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "gpus":
            continue
        field = NODE_FIELD.get(key)
        if field is None:
            raise ConfigError(f"{source}: unknown key {key!r} (known: gpus, {', '.join(NODE_FIELD)})")
        out[key] = _check_type(f"{source}: {key}", field, value)
    for field in NODE_FIELDS:
        out.setdefault(field.key, field.default)
    gpus = doc.get("gpus", [])
    if not isinstance(gpus, list):
        raise ConfigError(f"{source}: gpus must be a list")
    out["gpus"] = []
    for pos, gpu in enumerate(gpus):
        where = f"{source}: gpus[{pos}]"
        if not isinstance(gpu, dict):
            raise ConfigError(f"{where}: must be an object")
        g: dict[str, Any] = {}
        for key, value in gpu.items():
            field = GPU_FIELD.get(key)
            if field is None:
                raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(GPU_FIELD)})")
            g[key] = _check_type(f"{where}.{key}", field, value)
        g.setdefault("index", pos)
        for field in GPU_FIELDS:
            g.setdefault(field.key, list(field.default) if isinstance(field.default, list) else field.default)
        if not g["pci_bus_id"]:
            g["pci_bus_id"] = default_bus_id(g["index"])
        if not g["uuid"]:
            g["uuid"] = f"GPU-fake-{out['node'] or 'node'}-{g['index']:04d}"
        out["gpus"].append(g)
    indexes = [g["index"] for g in out["gpus"]]
    if len(set(indexes)) != len(indexes):
        raise ConfigError(f"{source}: duplicate GPU index in {indexes}")
    out["gpus"].sort(key=lambda g: g["index"])
    return out


def read(path: str) -> dict[str, Any]:
    """Read and :func:`normalise` the inventory at ``path``.

    Raises ``FileNotFoundError`` when it is missing (the fake turns that into "driver not
    loaded"), :class:`ConfigError` when it is not valid JSON or not a valid inventory.
    """
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from None
    return normalise(doc, source=path)


def _load_for_update(path: str) -> dict[str, Any]:
    """The inventory as stored (validated, not normalised), for a read-modify-write.
    Raises :class:`ConfigError` when it is missing, not JSON or not a valid inventory."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: inventory not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from None
    normalise(doc, source=path)
    return doc


def _atomic_write(path: str, doc: dict[str, Any]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".inventory-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: str):
    """Serialise read-modify-write cycles on inventories: ``flock`` on their directory
    (no lock files left beside the inventories)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_inventory(path: str, node: str, gpus: list[dict], *, driver_version: str | None = None) -> None:
    """Write a fresh inventory for ``node`` with ``gpus`` (keys from :data:`GPU_FIELDS`; others default).

    Validated first (:class:`ConfigError` on unknown keys / wrong types), then written
    atomically. Only the keys given are stored; defaults are applied when read.
    """
    doc: dict[str, Any] = {"node": node}
    if driver_version is not None:
        doc["driver_version"] = driver_version
    doc["gpus"] = [dict(g) for g in gpus]
    normalise(doc, source=path)
    with _locked(path):
        _atomic_write(path, doc)


def set_gpu_field(path: str, gpu_index: int, key: str, value: str) -> None:
    """Set one per-GPU key from text (``lab set-gpu NODE GPU key=value``), atomically.

    ``value`` is parsed to the key's type (:func:`parse_value`). Raises :class:`ConfigError`
    for an unknown key, ``index``, a bad value, a GPU index not in the file, or a missing /
    invalid inventory.
    """
    field = GPU_FIELD.get(key)
    if field is None or key == "index":
        known = ", ".join(k for k in GPU_FIELD if k != "index")
        raise ConfigError(f"unknown GPU key {key!r} (known: {known})")
    parsed = parse_value(key, field, value)
    with _locked(path):
        doc = _load_for_update(path)
        for pos, gpu in enumerate(doc.get("gpus", [])):
            if gpu.get("index", pos) == gpu_index:
                gpu[key] = parsed
                break
        else:
            raise ConfigError(f"{path}: no GPU with index {gpu_index}")
        _atomic_write(path, doc)


def set_node_field(path: str, key: str, value: str) -> None:
    """Set one node-level key (``driver_version``, ``nvml_hang_s``) from text, atomically.

    Raises :class:`ConfigError` for an unknown key (``node`` and ``gpus`` included), a bad
    value, or a missing / invalid inventory.
    """
    field = NODE_FIELD.get(key)
    if field is None or key == "node":
        raise ConfigError(f"unknown node key {key!r} (known: {', '.join(k for k in NODE_FIELD if k != 'node')})")
    parsed = parse_value(key, field, value)
    with _locked(path):
        doc = _load_for_update(path)
        doc[key] = parsed
        _atomic_write(path, doc)
