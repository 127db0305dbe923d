"""Every check: pass, warn, fail and timeout, on a 2-GPU fake node (GPU1 gets the fault)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_ft.config import from_dict
from slurm_ft.health import CheckResult, run_checks, unhealthy
from slurm_ft.health import thermal
from slurm_ft.nvml import fake


def node(tmp_path: Path, gpu1: dict | None = None, health: dict | None = None, n: int = 2):
    """Write a fake node ``n1`` with ``n`` healthy GPUs, GPU1 overridden; return its Config."""
    gpus = [{"index": i} for i in range(n)]
    if gpu1:
        gpus[1].update(gpu1)
    fake.write_inventory(str(tmp_path / "n1.json"), "n1", gpus)
    table = {"isolation": "thread", "nvml_timeout_s": 5.0, **(health or {})}
    return from_dict({"nvml": {"backend": "fake", "inventory": str(tmp_path / "{node}.json")}, "health": table})


def results_for(results: list[CheckResult], check: str, gpu: int | None = 1) -> CheckResult:
    hits = [r for r in results if r.check == check and r.gpu == gpu]
    assert len(hits) == 1, results
    return hits[0]


# (check, GPU1 inventory overrides, [health] overrides, gpu the verdict is on, status, words in measurement)
CASES = [
    ("gpu_count", {}, {"expected_gpus": 2}, None, "pass", "2 GPUs, expected 2"),
    ("gpu_count", {}, {"expected_gpus": 1}, None, "warn", "2 GPUs, expected 1"),
    ("gpu_count", {}, {"expected_gpus": 4}, None, "fail", "2 GPUs, expected 4"),
    ("gpu_count", {"lost": True}, {"expected_gpus": 2}, None, "fail", "1 GPUs, expected 2 (2 seen by NVML)"),
    ("gpu_count", {}, {"expected_gpus_by_node": {"n1": 3}}, None, "fail", "expected 3"),
    ("persistence", {}, {}, 1, "pass", "persistence mode on"),
    ("persistence", {"persistence_mode": False}, {}, 1, "warn", "persistence mode off"),
    ("persistence", {"persistence_mode": False}, {"persistence_severity": "fail"}, 1, "fail", "off"),
    ("ecc_volatile_uncorrected", {}, {}, 1, "pass", "0 volatile uncorrectable"),
    ("ecc_volatile_uncorrected", {"ecc_volatile_uncorrected": 1}, {"ecc_volatile_uncorrected_max": 2}, 1, "warn", "1 volatile"),
    ("ecc_volatile_uncorrected", {"ecc_volatile_uncorrected": 3}, {}, 1, "fail", "3 volatile uncorrectable ECC errors (max 0)"),
    ("ecc_volatile_uncorrected", {"not_supported": ["nvmlDeviceGetTotalEccErrors"]}, {}, 1, "pass", "not supported"),
    ("retired_pages", {}, {}, 1, "pass", "0 retired pages"),
    ("retired_pages", {"retired_pages_sbe": 20, "retired_pages_dbe": 12}, {}, 1, "warn", "32 retired pages"),
    ("retired_pages", {"retired_pages_dbe": 60}, {}, 1, "fail", "60 retired pages (RMA at 60)"),
    ("retired_pages", {"retired_pages_pending": True}, {}, 1, "fail", "page retirement pending"),
    ("row_remap", {}, {}, 1, "pass", "0 remapped rows"),
    ("row_remap", {"remapped_rows_uncorrectable": 2}, {}, 1, "warn", "2 remapped rows (2 uncorrectable)"),
    ("row_remap", {"row_remap_pending": True}, {}, 1, "fail", "row remap pending"),
    ("row_remap", {"row_remap_failure": True}, {}, 1, "fail", "row remap failed"),
    ("row_remap", {"not_supported": ["nvmlDeviceGetRemappedRows"]}, {}, 1, "pass", "not supported"),
    ("temperature", {}, {}, 1, "pass", "GPU1 35 C"),
    ("temperature", {"temperature_c": 83}, {}, 1, "warn", "83 C (warn at 82 C)"),
    ("temperature", {"temperature_c": 87}, {}, 1, "fail", "87 C (fail at 87 C)"),
    ("temperature", {"temperature_c": 70}, {"temperature_fail_c": 70}, 1, "fail", "fail at 70 C"),
    ("temperature", {"temperature_c": 84, "not_supported": ["nvmlDeviceGetTemperatureThreshold"]}, {}, 1,
     "warn", "warn at 80 C"),
    ("throttle", {}, {}, 1, "pass", "clock reasons: gpu_idle"),
    ("throttle", {"throttle_reasons": 0x20}, {}, 1, "warn", "sw_thermal_slowdown"),
    ("throttle", {"throttle_reasons": 0x41}, {}, 1, "fail", "hw_thermal_slowdown"),
    ("throttle", {"throttle_reasons": 0x80}, {}, 1, "fail", "hw_power_brake_slowdown"),
    ("throttle", {"throttle_reasons": 0x80}, {"throttle_fail": [], "throttle_warn": []}, 1, "pass", "hw_power_brake"),
    ("pcie_link", {}, {}, 1, "pass", "PCIe gen5 x16"),
    ("pcie_link", {"pcie_gen_current": 1}, {}, 1, "warn", "gen1 of gen5"),
    ("pcie_link", {"pcie_width_current": 8}, {}, 1, "fail", "x8 of x16"),
    ("pcie_link", {"pcie_width_current": 8, "pcie_gen_current": 3}, {"pcie_width_severity": "ignore"}, 1,
     "warn", "x8 of x16, gen3 of gen5"),
    ("nvlink", {}, {}, 1, "pass", "18 NVLink links up"),
    ("nvlink", {"nvlink_links": [1, 1, 0, 1]}, {"nvlink_max_down": 1}, 1, "warn", "1 NVLink links down (2)"),
    ("nvlink", {"nvlink_links": [0, 1, 0, 1]}, {}, 1, "fail", "2 NVLink links down (0,2)"),
    ("nvlink", {"nvlink_links": []}, {}, 1, "pass", "not supported"),
    ("xid_events", {}, {}, None, "pass", "no Xid events"),
    ("xid_events", {"xid_events": [13]}, {}, 1, "pass", "Xid 13"),
    ("xid_events", {"xid_events": [13, 999]}, {}, 1, "warn", "Xid 13,999"),
    ("xid_events", {"xid_events": [79, 13]}, {}, 1, "fail", "Xid 13,79"),
]


@pytest.mark.parametrize("check, gpu1, health, gpu, status, words", CASES,
                         ids=[f"{c[0]}-{c[4]}-{i}" for i, c in enumerate(CASES)])
def test_check_verdict(tmp_path, check, gpu1, health, gpu, status, words):
    results = run_checks(node(tmp_path, gpu1, health), "n1", only=[check])
    assert results[0].check == "nvml_responsive" and results[0].status == "pass"
    r = results_for(results, check, gpu)
    assert r.status == status, r
    assert words in r.measurement
    if gpu is not None and check != "xid_events":  # xid_events reports only GPUs with events
        assert results_for(results, check, 0).status == "pass"  # the healthy neighbour stays healthy


#: The NVML function each check's first per-GPU call makes (a hang there hangs that check).
HANG_AT = {
    "persistence": "nvmlDeviceGetPersistenceMode",
    "ecc_volatile_uncorrected": "nvmlDeviceGetTotalEccErrors",
    "retired_pages": "nvmlDeviceGetRetiredPagesPendingStatus",
    "row_remap": "nvmlDeviceGetRemappedRows",
    "temperature": "nvmlDeviceGetTemperature",
    "throttle": "nvmlDeviceGetCurrentClocksEventReasons",
    "pcie_link": "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvlink": "nvmlDeviceGetNvLinkState",
    "xid_events": "nvmlDeviceGetSupportedEventTypes",
    "gpu_count": "nvmlDeviceGetHandleByIndex",
}


@pytest.mark.parametrize("check", sorted(HANG_AT))
def test_check_timeout_is_nvml_responsive_fail(tmp_path, check):
    cfg = node(tmp_path, {"nvml_hang_s": 3.0, "hang_calls": [HANG_AT[check]]}, {"nvml_timeout_s": 0.3})
    results = run_checks(cfg, "n1", only=[check])
    last = results[-1] if results[0].check != "nvml_responsive" else results[0]
    assert last.check == "nvml_responsive" and last.status == "fail"
    assert last.gpu == 1
    assert "within 0.3 s" in last.measurement
    if check != "gpu_count":
        assert f"(in {check} on GPU1)" in last.measurement
    if check not in ("gpu_count", "xid_events"):  # per-GPU verdicts: GPU0's, made before the hang, is kept
        assert results_for(results, check, 0).status == "pass"
    assert unhealthy(results) == [last]


def test_lost_gpu_fails_every_per_gpu_check(tmp_path):
    results = run_checks(node(tmp_path, {"lost": True}), "n1")
    lost = [r for r in results if r.gpu == 1]
    assert lost and all(r.status == "fail" and r.measurement == "GPU1 GPU is lost" for r in lost)
    assert {r.check for r in lost} >= {"temperature", "row_remap", "pcie_link", "nvlink", "persistence"}


def test_crashing_check_is_fail_with_traceback(tmp_path, monkeypatch):
    def boom(ctx, handle):
        raise RuntimeError("sensor table corrupt")

    monkeypatch.setattr(thermal, "fail_temperature", boom)
    results = run_checks(node(tmp_path), "n1", only=["temperature"])
    r = results_for(results, "temperature", 1)
    assert r.status == "fail" and r.measurement == "GPU1 temperature check crashed"
    assert "Traceback" in r.detail and "sensor table corrupt" in r.detail


def test_crash_outside_the_per_gpu_loop_is_node_fail(tmp_path, monkeypatch):
    from slurm_ft.health import registry

    def boom(ctx):
        raise KeyError("oops")

    monkeypatch.setitem(registry.CHECKS, "nvlink", boom)
    results = run_checks(node(tmp_path), "n1", only=["nvlink", "temperature"])
    r = results_for(results, "nvlink", None)
    assert r.status == "fail" and "KeyError" in r.detail
    assert results_for(results, "temperature", 1).status == "pass"  # later checks still run


def test_other_nvml_error_is_fail_not_pass(tmp_path, monkeypatch):
    import pynvml

    def unknown(self, handle, sensor):
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(fake.FakeNvml, "nvmlDeviceGetTemperature", unknown)
    r = results_for(run_checks(node(tmp_path), "n1", only=["temperature"]), "temperature", 1)
    assert r.status == "fail" and "Unknown Error" in r.measurement


def test_healthy_node_all_checks_pass(tmp_path):
    results = run_checks(node(tmp_path, n=8, health={"expected_gpus": 8}), "n1")
    assert unhealthy(results) == []
    assert {r.status for r in results} == {"pass"}
    assert [r.check for r in results][:2] == ["nvml_responsive", "gpu_count"]
    assert len(results) == 2 + 9 * 8 + 1  # responsive, count, 9 per-GPU checks x 8 GPUs, xid


def test_faulty_fixture_blames_each_gpu(tmp_path):
    import shutil

    shutil.copy(Path(__file__).parent / "fixtures" / "nvml" / "faulty-8gpu.json", tmp_path / "n2.json")
    cfg = from_dict({"nvml": {"backend": "fake", "inventory": str(tmp_path / "{node}.json")},
                     "health": {"isolation": "thread", "expected_gpus": 8}})
    bad = {(r.check, r.gpu) for r in unhealthy(run_checks(cfg, "n2"))}
    assert {("row_remap", 1), ("ecc_volatile_uncorrected", 2), ("xid_events", 2), ("temperature", 3),
            ("pcie_link", 4), ("nvlink", 5), ("throttle", 6), ("gpu_count", None)} <= bad
    assert all(gpu in (None, 1, 2, 3, 4, 5, 6, 7) for _, gpu in bad)
    assert ("persistence", 6) not in bad  # persistence off is a warning by default


def test_skip_and_checks_select(tmp_path):
    cfg = node(tmp_path, health={"checks": ["temperature", "nvlink", "gpu_count"], "skip": ["nvlink"]})
    assert {r.check for r in run_checks(cfg, "n1")} == {"nvml_responsive", "gpu_count", "temperature"}


def test_expected_gpus_argument_overrides_config(tmp_path):
    cfg = node(tmp_path, health={"expected_gpus": 2})
    r = results_for(run_checks(cfg, "n1", only=["gpu_count"], expected_gpus=8), "gpu_count", None)
    assert r.status == "fail" and "expected 8" in r.measurement


KMSG = [  # /dev/kmsg record bodies, as read_kmsg returns them
    "NVRM: Xid (PCI:0000:11:00): 79, pid=2231, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:10:00): 13, pid=2231, Graphics SM Warp Exception",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 0",
    "eth0: link up",
    # text a process or file name put into a record: never an Xid of this node's GPUs
    "NVRM: Xid: 79, (4242): /proc/4242/oom_adj is deprecated, please use /proc/4242/oom_score_adj instead.",
    "process '/home/u/NVRM: Xid (PCI:0000:11:00): 79, x' started with executable stack",
    "NVRM: Xid (PCI:0000:99:00): 79, pid=1, name=x, GPU has fallen off the bus.",  # no GPU of this node
]


def test_kmsg_lines_map_to_gpu_indexes():
    from slurm_ft.health.xid import kmsg_events

    assert kmsg_events(KMSG, {0: "00000000:10:00.0", 1: "00000000:11:00.0"}) == [(1, 79), (0, 13)]
    assert kmsg_events(KMSG[:1], {}) == []  # no GPU map places it: not this node's evidence
    assert kmsg_events(["NVRM: Xid: 79, GPU has fallen off the bus."], {0: "00000000:10:00.0"}) == []


def test_kernel_log_xids_when_window_set(tmp_path, monkeypatch):
    from slurm_ft.classify import sources

    seen = {}

    def fake_read_kmsg(since, **kw):
        seen["since"] = since
        return KMSG

    monkeypatch.setattr(sources, "read_kmsg", fake_read_kmsg)
    results = run_checks(node(tmp_path, health={"xid_kmsg_window_s": 600.0}), "n1", only=["xid_events"])
    assert results_for(results, "xid_events", 1).status == "fail"
    assert results_for(results, "xid_events", 0).status == "pass"  # Xid 13 is an application error
    assert "since" in seen


def test_unreadable_kernel_log_is_fail(tmp_path, monkeypatch):
    from slurm_ft.classify import sources
    from slurm_ft.errors import EvidenceError

    def broken(since, **kw):
        raise EvidenceError("/dev/kmsg: Permission denied")

    monkeypatch.setattr(sources, "read_kmsg", broken)
    r = results_for(run_checks(node(tmp_path, health={"xid_kmsg_window_s": 60}), "n1", only=["xid_events"]),
                    "xid_events", None)
    assert r.status == "fail" and "Permission denied" in r.measurement


def test_compute_mode_prohibited_fails_exclusive_process_passes(tmp_path):
    """A GPU left in compute mode Prohibited gives every job cudaErrorDevicesUnavailable:
    the trusted check that confirms the classifier's cuda-device-busy (issue 11 input 5)."""
    results = run_checks(node(tmp_path, gpu1={"compute_mode": 2}), "n1")
    bad = results_for(results, "compute_mode")
    assert bad.status == "fail" and "Prohibited" in bad.measurement
    assert results_for(run_checks(node(tmp_path, gpu1={"compute_mode": 3}), "n1"), "compute_mode").status == "pass"
