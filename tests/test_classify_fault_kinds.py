"""Fault kinds, not strings (issue 11): the five failing inputs from public reports, each given
as the evidence kind it is, plus the kinds they stand for and the job-level verdict across nodes.
"""

from __future__ import annotations

import pytest

from slurm_ft import config as config_mod
from slurm_ft.classify.engine import classify
from slurm_ft.classify.model import Evidence
from slurm_ft.epilog import verify_untrusted
from slurm_ft.failover import policy
from slurm_ft.health.result import CheckResult
from slurm_ft.nodejob import NodeJob


def kernel(*lines: str, **kw):
    return classify(Evidence(kernel_lines=list(lines), exit_code=1, **kw))


def output(text: str, **kw):
    return classify(Evidence(stderr_tail=text, exit_code=1, **kw))


# ---------------------------------------------------------------- 1. firmware/memory, no Xid number
@pytest.mark.parametrize("line", [
    "NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout **********************************",
    "NVRM: GPU6 kgmmuCheckMemSubsysError_IMPL: Memory Subsystem Error detected. kbusSendSysmembarSingle failed.",
    # the same families in other words (other driver versions)
    "NVRM: GPU0 _kgspRpcRecvPoll: Timeout waiting for RPC from GSP!",
    "NVRM: GPU1 kgspInitRm_IMPL: Cannot initialize GSP firmware RM",
    "NVRM: GPU3 kgspHealthCheck_TU102: GSP-RM crash detected",
    "NVRM: GPU2 gpuHandleSanityCheckRegReadError_GH100: row remapper failure on this GPU",
])
def test_gpu_firmware_and_memory_faults_without_an_xid_are_hardware(line):
    v = kernel(line)
    assert v.verdict == "hardware" and v.action == "drain_node", v


def test_gsp_line_of_another_jobs_gpu_drains_nothing():
    line = "NVRM: GPU at PCI:0000:3b:00: _kgspLogRpcTimeout: GSP Timeout"
    assert kernel(line, job_bus_ids=frozenset({"0000:07:00"})).verdict != "hardware"
    assert kernel(line, job_bus_ids=frozenset({"0000:3b:00"})).verdict == "hardware"


def test_gsp_words_in_a_process_name_are_not_hardware():
    # a user-named process in a kernel record (the classifier masks name= and comm fields)
    line = "traps: GSP_Timeout[4242] general protection fault ip:0 sp:0 error:0 in libc.so.6"
    assert kernel(line).verdict != "hardware"


# ---------------------------------------------------------------- 2. node software: reboot or admin
@pytest.mark.parametrize("text", [
    "Failed to initialize NVML: Driver/library version mismatch",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
    "RuntimeError: CUDA error: system not yet initialized",
    "Failed to initialize NVML: Unknown Error",
])
def test_node_driver_stack_from_output_is_verified_by_trusted_checks(text):
    v = output(text)
    assert v.verdict == "hardware" and v.action == "verify", v


def test_driver_mismatch_in_the_kernel_log_drains():
    v = kernel("NVRM: API mismatch: the client has the version 550.54.15, but this kernel module has the version 535.161.08.")
    assert v.verdict == "hardware" and v.action == "drain_node"


def _cfg(tmp_path):
    return config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db"),
                                             "node_path": str(tmp_path / "node-{node}.db")}})


def _job():
    return NodeJob(job_id=7, node="n1", attempt=0, uid=1000, gpus=(0,), exit_code=1, signal=None,
                   stdout=None, stderr=None, work_dir=None)


def test_verified_driver_mismatch_drains_unverified_does_not(tmp_path):
    v = output("Failed to initialize NVML: Driver/library version mismatch")
    broken = verify_untrusted(_cfg(tmp_path), _job(), v, lambda *_: None, run_checks=lambda cfg, node: [
        CheckResult("nvml_responsive", "fail", None, "NVML init failed: Driver/library version mismatch", None)])
    assert broken.verdict == "hardware" and broken.rule.startswith("verified:") and broken.action == "drain_node"
    healthy = verify_untrusted(_cfg(tmp_path), _job(), v, lambda *_: None, run_checks=lambda cfg, node: [
        CheckResult("nvml_responsive", "pass", None, "ok", None)])
    assert healthy.verdict == "unknown" and healthy.action == "retry"


# ---------------------------------------------------------------- 3. Slurm launch/credential/munge
@pytest.mark.parametrize("text", [
    "srun: error: Task launch for 36.0 failed on node cnX: Job credential expired",
    "srun: error: Task launch for 912.0 failed on node node07: Invalid job credential",
    "slurmd[node03]: error: Munge decode failed: Expired credential",
    "srun: error: Munge decode failed: Rewound credential",
    "slurmstepd: error: auth/munge: _decode_cred: Munge decode failed: Invalid credential",
])
def test_slurm_launch_and_credential_failures_are_infra(text):
    v = output(text)
    assert v.verdict == "infra" and v.rule == "slurm-launch-failure", v


# ---------------------------------------------------------------- 4. preemption and requeue: no fault
@pytest.mark.parametrize("text", [
    "Caught signal SIGUSR2 on hostX: this job is preempted.",
    "slurmstepd: error: *** JOB 608 ON hostX CANCELLED AT 2022-08-12T02:06:12 DUE TO JOB REQUEUE ***",
    "slurmstepd: error: *** JOB 32391783 ON node01 CANCELLED AT 2021-06-18T13:05:36 DUE TO PREEMPTION ***",
])
def test_preemption_and_requeue_blame_nothing_and_are_not_retried(text):
    v = output(text)
    assert v.rule == "preempted" and v.action == "none", v
    d = policy.decide(slurm_state="FAILED", failovers_done=0, retries=3, job_nodes=["n1"], seconds_since_end=60,
                      verdicts=[{"node": "n1", "verdict": v.verdict, "rule": v.rule, "xids": []}])
    assert d.kind == policy.FAILED and not d.blamed_nodes


# ---------------------------------------------------------------- 5. device busy: the checks decide
def test_devices_unavailable_is_not_the_users_fault_without_evidence(tmp_path):
    v = output("cudaSetDevice(cuda_device_id) error( cudaErrorDevicesUnavailable): CUDA-capable device(s) "
               "is/are busy or unavailable")
    assert v.verdict == "hardware" and v.action == "verify"
    healthy = verify_untrusted(_cfg(tmp_path), _job(), v, lambda *_: None, run_checks=lambda cfg, node: [])
    assert healthy.verdict == "unknown" and healthy.rule == "unverified:cuda-device-busy"
    held = verify_untrusted(_cfg(tmp_path), _job(), v, lambda *_: None, run_checks=lambda cfg, node: [
        CheckResult("compute_mode", "fail", 0, "GPU0 compute mode Prohibited", 2)])
    assert held.verdict == "hardware" and held.action == "drain_node"


def test_a_real_user_error_beside_device_busy_stays_the_users():
    v = output("CUDA-capable device(s) is/are busy or unavailable\ntorch.OutOfMemoryError: CUDA out of memory. "
               "Tried to allocate 20.00 MiB")
    assert v.verdict == "user"


# ---------------------------------------------------------------- CPU-side noise is not a GPU fault
@pytest.mark.parametrize("line", [
    "CPU12: Core temperature above threshold, cpu clock throttled (total events = 3)",
    "CPU0: Package temperature above threshold, cpu clock throttled (total events = 1)",
    "mce: [Hardware Error]: Machine check events logged",
    "pcieport 0000:00:03.1: AER: Corrected error received: 0000:00:00.0",
])
def test_cpu_side_noise_alone_is_not_hardware(line):
    assert kernel(line).verdict != "hardware"


def test_unreachable_gpu_decides_whatever_the_noise():
    v = kernel("CPU12: Core temperature above threshold, cpu clock throttled (total events = 3)",
               "pcieport 0000:00:03.1: AER: Corrected error received: 0000:00:00.0",
               "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.")
    assert v.verdict == "hardware" and v.rule == "gpu-fallen-off-bus"


# ---------------------------------------------------------------- a lost peer is a consequence
@pytest.mark.parametrize("text", [
    "torch.distributed.DistNetworkError: Connection reset by peer",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Write error [10.0.0.2]:62093: Broken pipe",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error",
])
def test_a_rank_that_only_lost_its_peer_is_unknown(text):
    v = output(text)
    assert v.verdict == "unknown" and v.action == "none", v


def _node(node, verdict, rule):
    return {"node": node, "verdict": verdict, "rule": rule, "xids": []}


def test_job_level_root_cause_on_one_node_decides():
    verdicts = [_node("n1", "unknown", "rank-connection-lost"), _node("n2", "hardware", "xid-79"),
                _node("n3", "unknown", "nccl-remote-error")]
    d = policy.decide(slurm_state="FAILED", failovers_done=0, retries=3, verdicts=verdicts,
                      job_nodes=["n1", "n2", "n3"], seconds_since_end=60)
    assert d.kind == "failover" and d.blamed_nodes == ("n2",)


def test_job_level_no_root_cause_anywhere_is_site_policy():
    verdicts = [_node("n1", "unknown", "rank-connection-lost"), _node("n2", "unknown", "nccl-remote-error")]
    kw = dict(slurm_state="FAILED", failovers_done=0, retries=3, verdicts=verdicts, job_nodes=["n1", "n2"],
              seconds_since_end=60)
    assert policy.decide(**kw).kind == policy.FAILED
    d = policy.decide(**kw, site=policy.SitePolicy(retry_unknown=True))
    assert d.kind == "failover" and not d.blamed_nodes
