"""Break-fix remediation on the Docker lab (issue 26), with a real container restart as the reboot:
Xid 79 -> the job fails over, the node is drained -> the daemon's ``scontrol reboot`` -> slurmd
runs the lab's RebootProgram, which cuts the container's power (docker_engine.REBOOT_NODE) ->
Docker starts the container again by its restart policy -> the entry heals the fake GPUs and
starts ``slurmd -b`` -> ``slurm-ft health --act`` (HealthCheckProgram) passes -> resumed; a fault
that survives the reboot (``DockerLab.sticky_fault``) -> RMA after N reboots.

The daemon runs with ``[remediate] enabled`` for the module (the lab's slurm-ft.toml, read by the
daemon at start and by ``health --act`` on the nodes); it is put back in a finally.

Run: ``SLURM_FT_LAB_SLURM=24.11 flock /tmp/slurm-ft-docker.lock .venv/bin/python -m pytest -m docker
tests/test_docker_remediate.py`` (root, dockerd running).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from slurm_ft.errors import JournalError
from slurm_ft.journal import open_journal
from slurm_ft.lab import docker_engine as D
from slurm_ft.lab import layout as L
from slurm_ft.lab.demo import job_gpu_index, wait_for, wait_started
from slurm_ft.nvml import inventory
from slurm_ft.remediate.actions import ACTIONS

#: The versions these cases run on in `make test` (which runs the Docker suite once per version and
#: must stay under 60 minutes): 24.11 and 26.05 (26.05's RMA case once timed out: its slurmd runs
#: the RebootProgram in a PID namespace of its own, and the program's detached power cut died with
#: it; the node's power switch is now a child of the entry: docker_engine.POWER_SWITCH). Slurm
#: 22.05's side of the same flow (RebootProgram, ``slurmd -b``, HealthCheckProgram at slurmd
#: start) runs end to end in the native lab (tests/test_lab_remediate.py, Debian bookworm's
#: 22.05). SLURM_FT_REMEDIATE_ALL_VERSIONS=1 runs them on the version under test whatever it is.
REMEDIATE_VERSIONS = ("24.11", "26.05")
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(os.environ.get("SLURM_FT_LAB_SLURM", D.DEFAULT_VERSION) not in REMEDIATE_VERSIONS
                       and not os.environ.get("SLURM_FT_REMEDIATE_ALL_VERSIONS"),
                       reason=f"the Docker lab's remediation cases run on Slurm {' and '.join(REMEDIATE_VERSIONS)} "
                              "in make test (time budget); 22.05 is covered by the native lab's "
                              "tests/test_lab_remediate.py"),
]
N = 2
REMEDIATE = f"\n[remediate]\nenabled = true\nmax_repairs = {N}\nrepair_timeout_s = 90.0\n"


@pytest.fixture(scope="module")
def remediating(docker_lab):
    lab = docker_lab
    conf = lab.dir / "conf" / "slurm-ft.toml"
    original = conf.read_text()
    assert "[remediate]" not in original
    try:
        conf.write_text(original + REMEDIATE)
        lab.daemon_start()                      # the daemon reads [remediate] at start
        yield lab
    finally:
        conf.write_text(original)
        for n in lab.nodes():
            lab.sticky_fault(n, False)
        lab.daemon_start()


def steps_all(lab) -> list[dict]:
    """Every remediate-* row of the daemon journal ([] before the daemon made the journal)."""
    try:
        with open_journal(str(lab.daemon_journal()), readonly=True) as j:
            return j.actions_named(ACTIONS)
    except JournalError:
        return []


def steps(lab, node: str) -> list[dict]:
    return [r for r in steps_all(lab) if r["target"] == node]


def node(slurm, name):
    return next(n for n in slurm.nodes() if n.name == name)


def not_rebooting(slurm):
    return all(not {"REBOOT_REQUESTED", "REBOOT_ISSUED"} & set(n.flags) for n in slurm.nodes())


def reboot_log(lab, name: str) -> str:
    path = lab.log(name, "reboot.log")
    return path.read_text() if path.exists() else ""


def test_xid79_drain_container_reboot_checks_pass_resumed(remediating, dslurm):
    lab, slurm = remediating, dslurm
    job = lab.submit_training(steps=400)
    try:
        first = wait_started(slurm, job)
        where = first.nodes
        gpu = job_gpu_index(slurm, job.job_id)
        before = len(steps(lab, where))
        started, restarts = lab.boots(where)
        logged = reboot_log(lab, where)
        # a mark the reboot must clear (the entry puts the power-on inventory back)
        inventory.set_gpu_field(str(lab.inventory(where)), gpu, "temperature_c", "77")
        t0 = time.monotonic()
        assert lab.inject_xid(where, 79, gpu)["killed"], "the job's processes in the node's container were not found"
        again = wait_started(slurm, job, 1, timeout_s=90)
        assert again.nodes != where
        wait_for(lambda: [r for r in steps(lab, where)[before:] if r["action"] == "remediate-reboot"], 60,
                 "the daemon's scontrol reboot after the Xid 79 drain", 0.3)
        wait_for(lambda: [r for r in steps(lab, where)[before:] if r["action"] == "remediate-pass"], 90,
                 "the repaired node back in service", 0.3)
        took = time.monotonic() - t0
        wait_for(lambda: node(slurm, where).state.lower() == "idle" and not node(slurm, where).drained, 30,
                 "the repaired node idle and resumed", 0.3)
        # the container really restarted, once, by Docker's restart policy
        now_started, now_restarts = lab.boots(where)
        assert now_started != started and now_restarts == restarts + 1, (started, now_started, restarts, now_restarts)
        assert lab.container(where).status == "running"
        assert inventory.read(str(lab.inventory(where)))["gpus"][gpu]["temperature_c"] != 77   # healed
        assert f"lab reboot of {where}: container restarted, GPUs healed" in reboot_log(lab, where)[len(logged):]
        mine = steps(lab, where)[before:]
        assert [r["action"] for r in mine[:2]] == ["remediate-reboot", "remediate-pass"], mine
        reboot = json.loads(mine[0]["detail"])
        assert reboot["xids"] == [79] and reboot["reason"].startswith("slurm-ft: remediate: reboot 1/"), reboot
        assert mine[0]["job_id"] == job.job_id
        print(f"docker {lab.version}: xid79 -> container rebooted -> resumed in {took:.1f} s")
    finally:
        slurm.run("scancel", str(job.job_id), check=False)
        wait_for(lambda: not_rebooting(slurm), 60, "no reboot under way", 0.5)


def test_fault_that_survives_the_container_reboot_is_rma_after_n(remediating, dslurm):
    lab, slurm = remediating, dslurm
    names = lab.nodes()
    sick = next((n for n in names if not steps(lab, n)), names[-1])
    prior = sum(1 for r in steps(lab, sick) if r["action"] in ("remediate-reboot", "remediate-reset")
                and r["status"] == "done")
    before = len(steps(lab, sick))
    started, restarts = lab.boots(sick)
    try:
        lab.sticky_fault(sick, True)
        inventory.set_gpu_field(str(lab.inventory(sick)), 0, "lost", "true")
        bus = D.bus_id(lab.version, L.node_number(sick), 0)
        slurm.drain(sick, f"slurm-ft: Xid 79 GPU {bus[4:-2]} (job 999999)")
        t0 = time.monotonic()
        wait_for(lambda: node(slurm, sick).reason.startswith("slurm-ft: rma:"), 150, "the RMA reason", 0.5)
        took = time.monotonic() - t0
        mine = [r["action"] for r in steps(lab, sick)[before:]]
        reboots = max(N - prior, 0)
        assert mine.count("remediate-reboot") == reboots, mine
        assert mine[-1] == "remediate-rma" and mine.count("remediate-fail") == reboots, mine
        assert node(slurm, sick).drained
        assert lab.boots(sick)[1] == restarts + reboots and (reboots == 0 or lab.boots(sick)[0] != started)
        assert inventory.read(str(lab.inventory(sick)))["gpus"][0]["lost"] is True     # never healed
        assert reboot_log(lab, sick).count("GPUs left faulty (fault survives reboot)") >= reboots
        print(f"docker {lab.version}: sticky fault -> RMA after {reboots} container reboots in {took:.1f} s")
    finally:
        lab.sticky_fault(sick, False)
        wait_for(lambda: not_rebooting(slurm), 60, "no reboot under way", 0.5)
