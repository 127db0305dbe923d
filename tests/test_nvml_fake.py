"""The NVML seam: load(), gpu_bus_ids(), the fake NVML and its inventory file."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings, strategies as st

from slurm_ft import nvml
from slurm_ft.errors import ConfigError
from slurm_ft.nvml import fake
from slurm_ft.nvml.inventory import GPU_FIELD, read

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"


@pytest.fixture
def inv(tmp_path: Path) -> str:
    path = tmp_path / "n1.json"
    shutil.copy(FIXTURES / "healthy-8gpu.json", path)
    return str(path)


def test_load_real_is_pynvml_itself():
    assert nvml.load("real") is pynvml


@pytest.mark.parametrize("backend, path, word", [("bogus", None, "nvml.backend"), ("fake", None, "nvml.inventory"),
                                                 ("fake", "", "nvml.inventory")])
def test_load_rejects_bad_backend_or_missing_inventory(backend, path, word):
    with pytest.raises(ConfigError, match=word):
        nvml.load(backend, path)


def test_gpu_bus_ids_from_fixture(inv):
    ids = nvml.gpu_bus_ids(nvml.load("fake", inv))
    assert ids == {i: f"00000000:{0x10 + i:02X}:00.0" for i in range(8)}


def test_gpu_bus_ids_skips_a_lost_gpu(inv):
    fake.set_gpu_field(inv, 3, "lost", "true")
    assert 3 not in nvml.gpu_bus_ids(nvml.load("fake", inv))
    assert len(nvml.gpu_bus_ids(nvml.load("fake", inv))) == 7


def test_gpu_bus_ids_decodes_bytes():
    class Info:
        busId = b"00000000:3B:00.0"

    assert nvml.bus_id_text(Info()) == "00000000:3B:00.0"


def test_fake_answers_like_pynvml(inv):
    nv = nvml.load("fake", inv)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nv.nvmlDeviceGetCount()
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(2)
    assert nv.nvmlSystemGetDriverVersion() == "550.54.15"
    assert nv.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    assert nv.nvmlDeviceGetUUID(h).startswith("GPU-")
    assert nv.nvmlDeviceGetPciInfo(h).busId == "00000000:12:00.0"
    assert nv.nvmlDeviceGetPciInfo(h).bus == 0x12
    assert nv.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 35
    assert nv.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) == 0
    assert nv.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    assert nv.nvmlDeviceGetNvLinkState(h, 17) == pynvml.NVML_FEATURE_ENABLED
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetNvLinkState(h, 18)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(8)
    assert nv.NVML_TEMPERATURE_GPU == pynvml.NVML_TEMPERATURE_GPU  # constants fall through
    with pytest.raises(AttributeError):
        nv.nvmlDeviceGetPowerUsage  # a function the fake lacks is a test bug, not a silent pass
    nv.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nv.nvmlShutdown()


def test_fake_lost_and_not_supported(inv):
    fake.set_gpu_field(inv, 1, "lost", "yes")
    fake.set_gpu_field(inv, 2, "not_supported", "nvmlDeviceGetRemappedRows,nvmlDeviceGetNvLinkState")
    nv = nvml.load("fake", inv)
    nv.nvmlInit()
    assert nv.nvmlDeviceGetCount() == 8  # a lost GPU is still counted, as by the real driver
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetHandleByIndex(1)
    h = nv.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetRemappedRows(h)
    with pytest.raises(pynvml.NVMLError):  # the base class catches it, as with the real binding
        nv.nvmlDeviceGetNvLinkState(h, 0)


def test_fake_missing_inventory_is_driver_not_loaded(tmp_path):
    nv = nvml.load("fake", str(tmp_path / "absent.json"))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        nv.nvmlInit()


def test_fake_hang_applies_to_named_calls_only(inv):
    fake.set_gpu_field(inv, 0, "nvml_hang_s", "0.2")
    fake.set_gpu_field(inv, 0, "hang_calls", "nvmlDeviceGetTemperature")
    nv = nvml.load("fake", inv)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    t0 = time.monotonic()
    nv.nvmlDeviceGetName(h)
    assert time.monotonic() - t0 < 0.1
    nv.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert time.monotonic() - t0 >= 0.2


def test_fake_node_hang_in_init(inv):
    fake.set_node_field(inv, "nvml_hang_s", "0.2")
    t0 = time.monotonic()
    nvml.load("fake", inv).nvmlInit()
    assert time.monotonic() - t0 >= 0.2


def test_fake_event_set_delivers_xids_then_times_out(inv):
    fake.set_gpu_field(inv, 4, "xid_events", "79,48")
    nv = nvml.load("fake", inv)
    nv.nvmlInit()
    es = nv.nvmlEventSetCreate()
    for i in range(8):
        nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, es)
    got = []
    with pytest.raises(pynvml.NVMLError_Timeout):
        while True:
            data = nv.nvmlEventSetWait(es, 0)
            got.append((nv.nvmlDeviceGetIndex(data.device), data.eventData))
    assert got == [(4, 79), (4, 48)]
    nv.nvmlEventSetFree(es)


def test_write_inventory_fills_defaults_and_rejects_unknown_keys(tmp_path):
    path = str(tmp_path / "n9.json")
    fake.write_inventory(path, "n9", [{"index": 0}, {"index": 1, "temperature_c": 50}])
    doc = read(path)
    assert doc["node"] == "n9"
    assert [g["pci_bus_id"] for g in doc["gpus"]] == ["00000000:10:00.0", "00000000:11:00.0"]
    assert doc["gpus"][1]["temperature_c"] == 50
    assert doc["gpus"][0]["persistence_mode"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["n9.json"]  # no temp or lock files left
    with pytest.raises(ConfigError, match="temprature"):
        fake.write_inventory(path, "n9", [{"index": 0, "temprature": 1}])
    with pytest.raises(ConfigError, match="duplicate"):
        fake.write_inventory(path, "n9", [{"index": 0}, {"index": 0}])
    with pytest.raises(ConfigError, match="expected int"):
        fake.write_inventory(path, "n9", [{"index": 0, "temperature_c": "hot"}])
    assert read(path)["gpus"][1]["temperature_c"] == 50  # failed writes left the file alone


def test_read_rejects_unknown_top_level_key_and_bad_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"node": "x", "colour": "red", "gpus": []}))
    with pytest.raises(ConfigError, match="colour"):
        read(str(p))
    p.write_text("{nope")
    with pytest.raises(ConfigError, match="invalid JSON"):
        read(str(p))


@pytest.mark.parametrize("key, text, want", [
    ("lost", "true", True), ("persistence_mode", "off", False), ("throttle_reasons", "0x48", 0x48),
    ("temperature_c", "91", 91), ("nvml_hang_s", "2.5", 2.5), ("nvlink_links", "1,0,1", [1, 0, 1]),
    ("nvlink_links", "", []), ("name", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
])
def test_set_gpu_field_parses_by_type(inv, key, text, want):
    fake.set_gpu_field(inv, 5, key, text)
    assert read(inv)["gpus"][5][key] == want


@pytest.mark.parametrize("gpu, key, text, word", [
    (0, "temprature_c", "1", "unknown GPU key"), (0, "index", "3", "unknown GPU key"),
    (0, "temperature_c", "hot", "expected int"), (0, "lost", "maybe", "expected bool"),
    (42, "lost", "true", "no GPU with index 42"),
])
def test_set_gpu_field_rejects(inv, gpu, key, text, word):
    with pytest.raises(ConfigError, match=word):
        fake.set_gpu_field(inv, gpu, key, text)


def test_set_gpu_field_missing_inventory(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        fake.set_gpu_field(str(tmp_path / "none.json"), 0, "lost", "true")


def test_set_node_field_rejects_unknown(inv):
    with pytest.raises(ConfigError, match="unknown node key"):
        fake.set_node_field(inv, "gpus", "[]")


@settings(max_examples=40, deadline=None)
@given(key=st.sampled_from([k for k, f in GPU_FIELD.items() if f.kind == "int" and k != "index"]),
       value=st.integers(min_value=0, max_value=2**40))
def test_set_gpu_field_int_roundtrip(tmp_path_factory, key, value):
    path = str(tmp_path_factory.mktemp("inv") / "n.json")
    fake.write_inventory(path, "n", [{"index": 0}])
    fake.set_gpu_field(path, 0, key, hex(value) if value % 2 else str(value))
    assert read(path)["gpus"][0][key] == value
