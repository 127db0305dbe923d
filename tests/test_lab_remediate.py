"""Break-fix remediation on the real lab (issue 26): Xid 79 -> drain -> ``scontrol reboot`` (the lab's
RebootProgram restarts that node's slurmd and heals its fake GPU) -> ``slurm-ft health --act`` as
HealthCheckProgram at boot -> resumed; a fault that survives the reboot -> RMA after N (N = 2
here); an admin's drain never touched; observe mode journals without acting.

The daemon runs with ``[remediate] enabled`` for the whole module and the lab's HealthCheckProgram
is switched on (``Lab.health_check``); both are put back in a finally."""

from __future__ import annotations

import json
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.errors import JournalError
from slurm_ft.journal import open_journal
from slurm_ft.lab import layout as L
from slurm_ft.lab.demo import job_gpu_index, submit_training, wait_for, wait_started
from slurm_ft.lab.inject import inject_xid
from slurm_ft.nvml import inventory
from slurm_ft.remediate.actions import ACTIONS

pytestmark = pytest.mark.lab
N = 2
REMEDIATE = f"\n[remediate]\nenabled = true\nmax_repairs = {N}\nrepair_timeout_s = 90.0\n"


@pytest.fixture(scope="module")
def remediating(lab):
    conf = lab.lay.ft_conf
    original = conf.read_text()
    assert "[remediate]" not in original
    try:
        conf.write_text(original + REMEDIATE)
        lab.health_check(True)
        lab.daemon_start()                      # the daemon reads [remediate] at start
        yield lab
    finally:
        conf.write_text(original)
        for n in lab.nodes():
            lab.sticky_fault(n, False)
        lab.health_check(False)
        lab.daemon_start()


def steps(lab, node: str) -> list[dict]:
    return [r for r in steps_all(lab) if r["target"] == node]


def node(slurm, name):
    return next(n for n in slurm.nodes() if n.name == name)


def not_rebooting(slurm):
    return all(not {"REBOOT_REQUESTED", "REBOOT_ISSUED"} & set(n.flags) for n in slurm.nodes())


def drain(slurm, name: str, reason: str) -> None:
    slurm.run("scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")


def lose_gpu(lab, name: str, gpu: int = 0) -> str:
    """Mark GPU ``gpu`` of ``name`` lost (NVML: GPU is lost); returns its bus id."""
    inventory.set_gpu_field(str(lab.lay.inventory(name)), gpu, "lost", "true")
    return L.bus_id(L.node_number(name), gpu)


def test_xid79_drain_reboot_checks_pass_resumed(remediating, slurm, ft_history):
    lab = remediating
    rma = {r["target"] for r in steps_all(lab) if r["action"] == "remediate-rma"}
    job = submit_training(lab, steps=400, extra=[f"--exclude={','.join(sorted(rma))}"] if rma else [])
    try:
        first = wait_started(slurm, job)
        where = first.nodes
        before = len(steps(lab, where))
        gpu = job_gpu_index(slurm, job.job_id)
        # a mark the reboot must clear (a lost GPU before the Xid would change the verdict: the
        # epilog could not place the Xid on the job's GPU); the RMA test below loses one for real
        inventory.set_gpu_field(str(lab.lay.inventory(where)), gpu, "temperature_c", "77")
        t0 = time.monotonic()
        inject_xid(where, 79, gpu)
        wait_for(lambda: [r for r in steps(lab, where)[before:] if r["action"] == "remediate-reboot"], 60,
                 "the daemon's scontrol reboot after the Xid 79 drain")
        wait_for(lambda: [r for r in steps(lab, where)[before:] if r["action"] == "remediate-pass"], 90,
                 "the repaired node back in service")
        took = time.monotonic() - t0
        n = node(slurm, where)
        assert not n.drained, (n.state, n.flags, n.reason)
        assert inventory.read(str(lab.lay.inventory(where)))["gpus"][gpu]["temperature_c"] != 77  # healed
        mine = steps(lab, where)[before:]
        assert [r["action"] for r in mine[:2]] == ["remediate-reboot", "remediate-pass"], mine
        reboot = json.loads(mine[0]["detail"])
        assert reboot["xids"] == [79] and reboot["reason"].startswith("slurm-ft: remediate: reboot 1/"), reboot
        assert mine[0]["job_id"] == job.job_id
        print(f"xid79 -> resumed after reboot: {took:.1f} s")
        # the job's history names the repair
        ft_history(job.job_id, lambda h: "remediate" in json.dumps(h), 30)
    finally:
        slurm.run("scancel", str(job.job_id), check=False)
        wait_for(lambda: not_rebooting(slurm), 60, "no reboot under way")


def steps_all(lab) -> list[dict]:
    """Every remediate-* row of the daemon journal ([] before the daemon made the journal)."""
    try:
        with open_journal(config_mod.load(lab.lay.ft_conf).journal.path, readonly=True) as j:
            return j.actions_named(ACTIONS)
    except JournalError:
        return []


def test_fault_that_survives_reboot_is_rma_after_n_and_an_admins_drain_is_never_touched(remediating, slurm):
    lab = remediating
    names = lab.nodes()
    fresh = [n for n in names if not steps(lab, n)] or names
    sick, admin = fresh[0], next(n for n in names if n != fresh[0])
    prior = sum(1 for r in steps(lab, sick) if r["action"] in ("remediate-reboot", "remediate-reset")
                and r["status"] == "done")
    admin_boot = node(slurm, admin).raw.get("boot_time")
    before, admin_before = len(steps(lab, sick)), len(steps(lab, admin))
    try:
        lab.sticky_fault(sick, True)
        bus = lose_gpu(lab, sick)
        lose_gpu(lab, admin)
        drain(slurm, admin, "admin: fan replaced, do not touch")
        drain(slurm, sick, f"slurm-ft: Xid 79 GPU {bus[4:-2]} (job 999999)")
        t0 = time.monotonic()
        wait_for(lambda: node(slurm, sick).reason.startswith("slurm-ft: rma:"), 150, "the RMA reason")
        took = time.monotonic() - t0
        mine = [r["action"] for r in steps(lab, sick)[before:]]
        assert mine.count("remediate-reboot") == max(N - prior, 0), mine
        assert mine[-1] == "remediate-rma" and mine.count("remediate-fail") == max(N - prior, 0), mine
        assert node(slurm, sick).drained
        # the admin's node: same broken GPU, never rebooted, reason untouched, nothing journaled
        a = node(slurm, admin)
        assert a.drained and a.reason.startswith("admin: fan replaced"), a.reason
        assert a.raw.get("boot_time") == admin_boot and steps(lab, admin)[admin_before:] == []
        print(f"sticky fault -> RMA after {N} reboots: {took:.1f} s")
    finally:
        lab.sticky_fault(sick, False)
        wait_for(lambda: not_rebooting(slurm), 60, "no reboot under way")


def test_observe_mode_journals_the_repair_without_acting(remediating, slurm):
    lab = remediating
    conf = lab.lay.ft_conf
    text = conf.read_text()
    names = lab.nodes()
    target = next((n for n in names if not any(r["action"] == "remediate-rma" for r in steps(lab, n))), names[-1])
    before = len(steps(lab, target))
    reboots = lab.lay.log("reboot")
    seen = reboots.read_text() if reboots.exists() else ""
    try:
        conf.write_text(text.replace("\n[failover]\n", '\n[failover]\nmode = "observe"\n', 1))
        lab.daemon_start()
        reason = f"slurm-ft: Xid 79 GPU {L.bus_id(L.node_number(target), 0)[4:-2]} (job 999998)"
        drain(slurm, target, reason)
        rows = wait_for(lambda: [r for r in steps(lab, target)[before:] if r["status"] == "observed"], 60,
                        "the would-be reboot, journaled as observed")
        assert rows[0]["action"] == "remediate-reboot"
        for _ in range(8):                       # nothing happens in Slurm, now or a few polls later
            n = node(slurm, target)
            assert n.drained and n.reason == reason and not {"REBOOT_REQUESTED", "REBOOT_ISSUED"} & set(n.flags)
            time.sleep(1)
        now = reboots.read_text() if reboots.exists() else ""
        assert f"lab reboot of {target}:" not in now[len(seen):]   # the RebootProgram never ran
        assert len(steps(lab, target)[before:]) == 1       # journaled once, not once per poll
    finally:
        conf.write_text(text)
        lab.daemon_start()
