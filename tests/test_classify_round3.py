"""Classifier round 3 (issue 22): the kinds fresh field reports still missed, each with at least
three real examples in different wordings (the source is named beside each), the traps next to
them, per-node recurrence across jobs, and the policy for a non-zero exit nothing explains.

Every rule is over the kind's structure (checked with generated inputs), not over these strings.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_ft.classify import Evidence, PriorCrash, classify
from slurm_ft.classify.history import crash_lookback_s, needs_crash_history, prior_crashes
from slurm_ft.classify.policy import default_policy, from_config
from slurm_ft.classify.recurrence import recurrence_rules, rule_from_dict
from slurm_ft.errors import ConfigError
from slurm_ft.failover import policy as failover_policy


def output(text: str, **kw):
    return classify(Evidence(stderr_tail=text, exit_code=1, **kw))


# ---------------------------------------------------------------- InfiniBand port events (NCCL, rdma-core)
@pytest.mark.parametrize("line", [
    # Lightning-AI/lit-llama#380 (NCCL 2.14-era wording, one line per rank of the node)
    "...-48:34050:34121 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error",
    # current NCCL net_ib.cc: WARN("NET/IB : %s:%d Got async error event: %s", dev, port, str)
    "node01:1234:1300 [0] transport/net_ib.cc:139 NCCL WARN NET/IB : mlx5_0:1 Got async error event: port error",
    # the port coming back is the other half of a flap (ibv_event_type_str: IBV_EVENT_PORT_ACTIVE)
    "[rank0]:node01:99:120 [0] NCCL WARN NET/IB : rocep13s0f1:1 Got async error event: port active",
])
def test_ib_port_events_in_every_nccl_wording_are_infra(line):
    v = output(line)
    assert (v.verdict, v.rule, v.action) == ("infra", "ib-port-error", "retry")


@pytest.mark.parametrize("text", [
    # ROCm/rccl#1423: rdma link show while the port flapped (DOWN POLLING, DOWN LINK_UP)
    "link mlx5_7/1 subnet_prefix fe80:0000:0000:0000 lid 3403 sm_lid 1 lmc 0 state DOWN physical_state POLLING",
    "link mlx5_7/1 subnet_prefix fe80:0000:0000:0000 lid 3403 sm_lid 1 lmc 0 state DOWN physical_state LINK_UP",
    # openucx/ucx#3787: ibv_devinfo of the port the job used
    "\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_DOWN (1)\n\t\t\tmax_mtu:\t\t4096 (5)",
    # ibstat wording of the same state
    "CA 'mlx5_2'\n\tPort 1:\n\t\tState: Down\n\t\tPhysical state: Polling",
])
def test_an_ib_port_not_active_as_rdma_core_prints_it_is_infra(text):
    v = output(text)
    assert (v.verdict, v.rule) == ("infra", "rdma-link-down")


@pytest.mark.parametrize("text", [
    # deepseek-ai/3FS#263: a healthy port in rdma link show is no fault
    "link rxe_0/1 state ACTIVE physical_state LINK_UP netdev p1p1",
    "\t\t\tstate:\t\t\tPORT_ACTIVE (4)",
    "\t\tPhysical state: LinkUp",
])
def test_an_active_ib_port_is_no_evidence(text):
    assert output(text).rule == "exit-nonzero"


# ---------------------------------------------------------------- Slurm's own launch failure
@pytest.mark.parametrize("text", [
    # burrmill/burrmill#15 (squeue, then scontrol show job)
    "       80520_36 n2        get_phone_alignments.sh  PENDING         0:00      1 (launch failed requeued held)",
    "   JobState=PENDING Reason=launch_failed_requeued_held Dependency=(null)",
    # tgen/phoenix#33 (squeue with a custom format)
    " 2142164\tdefq js01D4KNXVHHREXTZ034JYTQ user PD\t0:00\t  1 (launch failed requeued held) 8 40",
])
def test_launch_failed_requeued_held_is_slurms_own_failure(text):
    v = output(text)
    assert (v.verdict, v.rule, v.action) == ("infra", "slurm-launch-failed-held", "retry")


@pytest.mark.parametrize("state", ["LAUNCH_FAILED", "PENDING launch_failed_requeued_held", "launch_failed_requeued_held"])
def test_launch_failed_as_slurms_state_is_infra(state):
    v = classify(Evidence(slurm_state=state))
    assert (v.verdict, v.rule) == ("infra", "slurm-state-launch-failed")


# ---------------------------------------------------------------- a stuck NCCL watchdog is a hang
WATCHDOG_TIMEOUT = ("[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
                    "operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, "
                    "Timeout(ms)=600000) ran for 600020 milliseconds before timing out.")


@pytest.mark.parametrize("line", [
    # om-ai-lab/VLM-R1#257 (PG ID/GUID prefix, 480 s)
    "[rank6]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) Rank 6] "
    "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives.",
    # sgl-project/sglang#1691 ([PG 3 Rank 6], 600 s)
    "[rank6]:[F1019 01:14:03.358291284 ProcessGroupNCCL.cpp:1224] [PG 3 Rank 6] [PG 3 Rank 6] ProcessGroupNCCL's "
    "watchdog got stuck for 600 seconds without making progress in monitoring enqueued collectives.",
    # Intellindust-AI-Lab/DEIM#105: the monitor's own line
    "[rank1]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed out! Process will be terminated "
    "after dumping debug info. workMetaList_.size()=103",
    # pytorch/pytorch#115888: the older wording of the same monitor
    "NCCL monitor thread timeout. Basically, this could be due to CUDA or NCCL calls being unexpectedly blocking",
])
def test_a_stuck_nccl_watchdog_is_a_hang_even_beside_a_watchdog_timeout(line):
    v = output(line + "\n" + WATCHDOG_TIMEOUT)
    assert (v.verdict, v.rule, v.action) == ("hang", "nccl-watchdog-stuck", "retry")
    assert output(WATCHDOG_TIMEOUT).rule == "nccl-watchdog-timeout"  # the timeout alone stays infra


# ---------------------------------------------------------------- a GPU gone from PCI config space
@pytest.mark.parametrize("line", [
    # lyulyul/shine-cluster#172 ("lspci | grep -i nvidia ... rev ff means it is down")
    "1c:00.0 3D controller: NVIDIA Corporation Device 2330 (rev ff)",
    # the lspci -nn form (vendor id 10de), NVIDIA/kubevirt-gpu-device-plugin#93 skips such cards
    "b1:00.0 3D controller [0302]: NVIDIA Corporation GA100 [A100 SXM4 80GB] [10de:20b2] (rev ff)",
    "41:00.0 VGA compatible controller [0300]: Device [10de:1e89] (rev ff) (prog-if ff)",
])
def test_an_nvidia_device_reading_all_ones_is_fallen_off_the_bus_for_the_trusted_checks(line):
    v = output(line)
    assert (v.verdict, v.rule, v.action) == ("hardware", "gpu-config-space-lost", "verify")


@pytest.mark.parametrize("line", [
    # real lspci lines of other devices that stopped answering (card readers, NICs): not a GPU
    "05:07.0 Class ffff: CMD Technology Inc PCI0646 (rev ff)",
    "15:00.3 System peripheral: Ricoh Co Ltd R5C843 MMC Host Controller (rev ff) (prog-if ff)",
    "01:00.0 Ethernet controller [0200]: Intel Corporation I350 Gigabit Network Connection [8086:1521] (rev ff)",
    # a healthy NVIDIA GPU
    "06:00.0 3D controller: NVIDIA Corporation GP108M [GeForce MX250] (rev a1)",
])
def test_rev_ff_of_another_device_or_a_healthy_gpu_is_not_hardware(line):
    assert output(line).verdict != "hardware"


_bdf = st.from_regex(r"[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", fullmatch=True)
_rev = st.integers(0, 0xFE).map(lambda r: f"{r:02x}")
_vendor = st.sampled_from(["Intel Corporation", "Broadcom Inc. and subsidiaries", "Mellanox Technologies",
                           "Advanced Micro Devices, Inc. [AMD/ATI]", "Ricoh Co Ltd", "Samsung Electronics Co Ltd"])
_cls = st.sampled_from(["VGA compatible controller", "3D controller", "Ethernet controller",
                        "Infiniband controller", "Non-Volatile memory controller", "System peripheral"])


@settings(max_examples=200, deadline=None)
@given(bdf=_bdf, cls=_cls, vendor=_vendor, rev=_rev, nvidia=st.booleans(), nn=st.booleans(), lost=st.booleans())
def test_rev_ff_is_hardware_exactly_for_an_nvidia_device(bdf, cls, vendor, rev, nvidia, nn, lost):
    who = "NVIDIA Corporation Device 2330" if nvidia else f"{vendor} Device 1234"
    ids = (" [10de:2330]" if nvidia else " [8086:1521]") if nn else ""
    line = f"{bdf} {cls}: {who}{ids} (rev {'ff' if lost else rev})"
    v = output(line)
    assert (v.rule == "gpu-config-space-lost") == (nvidia and lost), line
    assert v.action != "drain_node"  # job output never drains by itself


# ---------------------------------------------------------------- container image import (pyxis/enroot)
@pytest.mark.parametrize("text, rule, cls", [
    # NVIDIA/pyxis#39: the registry host written with '/', looked up on Docker Hub: 401 on the manifest
    ("0: slurmstepd: error: pyxis:     [ERROR] URL https://registry-1.docker.io/v2/nvcr.io/nvidia/pytorch/"
     "manifests/20.12-py3 returned error code: 401 Unauthorized", "image-pull-rejected", "user"),
    # NVIDIA/pyxis#118: a local registry answering 400
    ("slurmstepd: error: pyxis:     [ERROR] URL http://master:5000/v2/custom-pytorch-3-1/manifests/latest "
     "returned error code: 400 Bad Request", "image-pull-rejected", "user"),
    # NVIDIA/enroot#8: 403 from the registry's token endpoint, and a malformed argument
    ("[ERROR] URL https://my-registry.com/jwt/auth returned error code: 403 ", "image-pull-rejected", "user"),
    ("error: pyxis:     [ERROR] Invalid image reference: docker://dockerd://mlperf-nvidia:minigo",
     "image-pull-rejected", "user"),
    # NVIDIA/pyxis#53: the node's runtime path is full while creating the squashfs
    ("slurmstepd: error: pyxis:     Write failed because No space left on device\n"
     "slurmstepd: error: pyxis:     FATAL ERROR:Failed to write to output filesystem", "image-pull-transient", "infra"),
    # Golob-Minot/geneshot#79 (singularity): Docker Hub's pull rate limit
    ("FATAL:   While making image from oci registry: error fetching image to cache: failed to get checksum for "
     "docker://ubuntu:18.04: Error reading manifest 18.04 in docker.io/library/ubuntu: toomanyrequests: You have "
     "reached your pull rate limit.", "image-pull-transient", "infra"),
    # a registry server error, as enroot prints it
    ("slurmstepd: error: pyxis:     [ERROR] URL https://nvcr.io/v2/nvidia/pytorch/manifests/24.01-py3 returned "
     "error code: 503 Service Unavailable", "image-pull-transient", "infra"),
    # NVIDIA/pyxis#62: the import failed, no known cause printed
    ("pyxis: importing docker image ...\nslurmstepd: error: pyxis: child 3851 failed with error code: 1\n"
     "slurmstepd: error: pyxis: failed to import docker image", "image-pull-failed", "unknown"),
])
def test_image_import_failures_have_their_own_kind_never_hardware(text, rule, cls):
    v = output(text)
    assert (v.rule, v.verdict) == (rule, cls)
    assert v.action in ("retry", "none")


@settings(max_examples=150, deadline=None)
@given(code=st.integers(100, 599), host=st.from_regex(r"[a-z]{3,10}\.(?:io|com)", fullmatch=True))
def test_enroot_http_errors_are_retried_exactly_when_transient(code, host):
    v = output(f"slurmstepd: error: pyxis:     [ERROR] URL https://{host}/v2/x/manifests/1 returned error code: {code} X")
    if code == 429 or 500 <= code <= 599:
        assert v.rule == "image-pull-transient" and v.action == "retry"
    elif code in (400, 401, 403, 404):
        assert v.rule == "image-pull-rejected" and v.action == "none"
    assert v.verdict != "hardware"


# ---------------------------------------------------------------- per-node recurrence across jobs
SEGV = "srun: error: cn125: task 0: Segmentation fault (core dumped)"   # ai4d-iasc/trixie#35


def crash_ev(prior, user="carol", now=10_000.0, **kw):
    return Evidence(stderr_tail=SEGV, exit_code=139, prior_crashes=tuple(prior), now=now, job_id="30", user=user, **kw)


def test_one_segfault_is_the_jobs_own():
    v = classify(crash_ev(()))
    assert (v.verdict, v.rule) == ("user", "segfault")


def test_segfaults_of_several_users_on_one_node_make_the_node_suspect_not_guilty():
    prior = [PriorCrash(9_000.0, "segfault", "10", "alice"), PriorCrash(9_500.0, "signal-other", "20", "bob")]
    v = classify(crash_ev(prior))
    assert (v.verdict, v.rule, v.action) == ("hardware", "node-crash-recurring", "verify")
    assert v.evidence[0].startswith("node-crash-recurring: 3 jobs of 3 users") and SEGV in v.evidence
    # the daemon: unverified (the trusted checks passed) is retried elsewhere, unblamed
    assert failover_policy.retry_class({"verdict": "unknown", "rule": "unverified:node-crash-recurring"}) == "unknown"


def test_old_or_foreign_crashes_do_not_count():
    prior = [PriorCrash(9_000.0, "segfault", "10", "alice"), PriorCrash(100.0, "segfault", "20", "bob"),
             PriorCrash(199_600.0, "cuda-oom", "21", "dave"), PriorCrash(199_700.0, "segfault", "30", "erin")]
    prior[0] = PriorCrash(199_000.0, "segfault", "10", "alice")
    assert classify(crash_ev(prior, now=200_000.0)).rule == "segfault"   # 100.0 is > 24 h old, job 30 is this one


def test_a_deterministic_user_error_is_never_made_suspect():
    prior = [PriorCrash(9_000.0, "segfault", "10", "alice"), PriorCrash(9_500.0, "segfault", "20", "bob")]
    v = classify(Evidence(stderr_tail="torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                          exit_code=1, prior_crashes=tuple(prior), now=10_000.0, job_id="30", user="carol"))
    assert (v.verdict, v.rule) == ("user", "cuda-oom")


@settings(max_examples=200, deadline=None)
@given(crashes=st.lists(st.tuples(st.floats(0, 200_000), st.sampled_from(["segfault", "signal-other", "cuda-oom"]),
                                  st.sampled_from([str(i) for i in range(1, 12)] + ["30"]), st.sampled_from(["alice", "bob", "eve", None])),
                        max_size=12),
       user=st.sampled_from(["alice", "bob", "eve", None]))
def test_recurrence_never_drains_and_needs_other_users(crashes, user):
    """Whatever the earlier jobs were: the verdict's action is never a drain (the job output is
    the only evidence); it is suspect exactly when >= 3 distinct jobs and >= 2 distinct known users
    ended on a counted crash within 24 h (the current job included), and never when every job is
    one user's."""
    now = 200_000.0
    v = classify(crash_ev([PriorCrash(*c) for c in crashes], user=user, now=now))
    counted = [c for c in crashes if c[1] in ("segfault", "signal-other") and now - 86400 <= c[0] <= now and c[2] != "30"]
    jobs = {c[2] for c in counted} | {"30"}
    users = {c[3] for c in counted if c[3]} | ({user} if user else set())
    assert v.action not in ("drain_node", "reset_gpu")
    assert (v.rule == "node-crash-recurring") == (len(jobs) >= 3 and len(users) >= 2)
    if len(users) <= 1:
        assert v.rule == "segfault"


def test_the_recurrence_rule_can_be_switched_off():
    prior = [PriorCrash(9_000.0, "segfault", "10", "alice"), PriorCrash(9_500.0, "segfault", "20", "bob")]
    assert classify(crash_ev(prior), from_config({"disable": ["node-crash-recurring"]})).rule == "segfault"


def test_prior_crashes_from_journal_rows():
    pol = default_policy()
    rows = [{"job_id": 10, "created": 5.0, "rule": "segfault", "user": "alice"},
            {"job_id": 11, "created": 6.0, "rule": "unverified:node-crash-recurring", "user": "bob"},
            {"job_id": 12, "created": 7.0, "rule": "verified:signal-other"},
            {"job_id": 30, "created": 8.0, "rule": "segfault", "user": "carol"},      # the current job: left out
            {"job_id": 13, "created": "x", "rule": "segfault"},                      # unreadable: skipped
            {"job_id": 14, "created": 9.0, "rule": "cuda-oom", "user": "dave"}]      # not a counted crash
    got = prior_crashes(rows, pol, exclude=30)
    assert got == (PriorCrash(5.0, "segfault", "10", "alice"), PriorCrash(7.0, "signal-other", "12", None))
    assert needs_crash_history("segfault", pol) and not needs_crash_history("cuda-oom", pol)
    assert crash_lookback_s(pol) == 86400


@pytest.mark.parametrize("change, msg", [
    ({"users": 1}, "users: at least 2"),
    ({"action": "drain_node"}, "never drains"),
    ({"window_s": 0}, "window_s"),
    ({"rules": []}, "rules"),
    ({"extra": 1}, "unknown key"),
])
def test_bad_recurrence_rules_are_refused(change, msg):
    rec = {"id": "r", "rules": ["segfault"], "jobs": 3, "users": 2, "window_s": 60, "class": "hardware",
           "action": "verify", "priority": 800, "ref": "x"}
    rec.update(change)
    with pytest.raises(ConfigError, match=msg):
        rule_from_dict(rec, "r")


def test_shipped_recurrence_rules_count_only_known_rows():
    ids = {s.id for s in default_policy().signatures}
    for rule in recurrence_rules():
        assert rule.rules <= ids and rule.action == "verify" and rule.users >= 2


# ---------------------------------------------------------------- a non-zero exit nothing explains
def test_an_unexplained_exit_is_the_users_by_default_and_unknown_by_site_choice():
    assert classify(Evidence(exit_code=1)).verdict == "user"                      # the seed's rule
    pol = from_config({"unexplained_exit": "unknown"})
    v = classify(Evidence(exit_code=1), pol)
    assert (v.verdict, v.rule, v.action) == ("unknown", "exit-unexplained", "none")
    site = failover_policy.SitePolicy(unblamed_retries=1, unblamed_max_runtime_s=0, max_evacuations=0,
                                      max_continuations=0, retry_unknown=True)
    assert failover_policy.retry_class(v.to_dict(), site) == "unknown"          # retried, unblamed
    assert failover_policy.retry_class(v.to_dict()) is None                     # not without the site's word


@pytest.mark.parametrize("text", [
    "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: bad shape",
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "srun: error: node01: task 0: Segmentation fault (core dumped)",
])
def test_evidence_pointing_at_the_users_code_stays_the_users(text):
    v = classify(Evidence(stderr_tail=text, exit_code=1), from_config({"unexplained_exit": "unknown"}))
    assert v.verdict == "user" and v.rule != "exit-unexplained"


def test_a_bad_unexplained_exit_value_is_refused():
    with pytest.raises(ConfigError, match="unexplained_exit"):
        from_config({"unexplained_exit": "hardware"})
