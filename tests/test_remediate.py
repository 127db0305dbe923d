"""Break-fix remediation (issue 26): the pure policy (generative), the daemon-side I/O against a
real journal and a recording Slurm, the node-side reset and checks, the catalog's repair column."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from slurm_ft import config as config_mod
from slurm_ft.errors import SlurmCommandError
from slurm_ft.remediate import actions as A, policy as P

CAT = {79: P.CatalogRow("reboot"), 95: P.CatalogRow("reset"), 48: P.CatalogRow("reset"),
       94: P.CatalogRow("none"), 162: P.CatalogRow("none", frozenset({163})),
       163: P.CatalogRow("none", frozenset({162}))}
FAST = settings(max_examples=200, deadline=None)

OURS = ["slurm-ft: Xid 79 GPU 0000:10:00 (job 3)", "slurm-ft: Xid 95 GPU 0000:11:00 (job 4)",
        "slurm-ft: Xid 48,95 GPU 0000:11:00 (job 5)", "slurm-ft: Xid 94 GPU 0000:12:00 (job 6)",
        "slurm-ft: device: GPU0 lost", "slurm-ft: Xid 163 GPU 0000:10:00 (job 7)",
        "slurm-ft: remediate: reboot 1/3 after Xid 79 GPU 0000:10:00 (job 3) : reboot issued",
        "slurm-ft: remediate: reset GPU 0000:11:00 1/3 after Xid 95 GPU 0000:11:00 (job 4)",
        "slurm-ft: remediate: failed: device: GPU0 lost", "slurm-ft: rma: 3 repairs in 30 days, still failing: x"]
admin_reasons = st.text(min_size=0, max_size=40).filter(lambda r: not r.startswith("slurm-ft:"))
steps = st.lists(st.builds(P.Step, st.sampled_from(P.STEP_KINDS), st.floats(0, 2000),
                           st.sampled_from([(), (79,), (95,), (162,)]), st.sampled_from(["", "0000:10:00"]),
                           st.integers(0, 9), st.sampled_from(["", "Xid 79 GPU 0000:10:00 (job 3)"])), max_size=6)
limits = st.builds(P.Limits, st.integers(1, 4), st.sampled_from([100.0, 2592000.0]), st.sampled_from([10.0, 900.0]),
                   st.booleans(), st.booleans(), st.booleans())


def facts(reason, drained=True, idle=True, rebooting=False, steps_=(), later=()):
    return P.NodeFacts("n1", drained, idle, rebooting, reason, tuple(sorted(steps_, key=lambda s: s.at)), tuple(later))


@FAST
@given(admin_reasons, st.booleans(), st.booleans(), steps, limits, st.floats(0, 5000))
def test_an_admins_drain_is_never_touched(reason, idle, rebooting, steps_, lim, now):
    out = P.decide(facts(reason, True, idle, rebooting, steps_), lim, CAT, now)
    assert out == []


@FAST
@given(st.sampled_from(OURS) | admin_reasons, st.booleans(), st.booleans(), st.booleans(), steps, limits,
       st.lists(st.sampled_from([162, 163, 79]), max_size=2), st.floats(0, 5000))
def test_never_more_than_one_repair_in_flight(reason, drained, idle, rebooting, steps_, lim, later, now):
    f = facts(reason, drained, idle, rebooting, steps_, later)
    out = P.decide(f, lim, CAT, now)
    repairs = [a for a in out if isinstance(a, P.Repair)]
    assert len(repairs) <= 1
    open_ = bool(f.steps) and f.steps[-1].kind in P.REPAIR_KINDS
    if repairs and open_:                       # only by closing the open one first
        assert isinstance(out[0], P.Fail) and out.index(repairs[0]) > 0
    if repairs:
        assert f.drained and f.idle and not f.rebooting and lim.may_start and not lim.observe or \
            (lim.observe and not f.steps)
        assert repairs[0].reason.startswith(P.REMEDIATE)
    for a in out:                               # an RMA candidate or an admin's reason: nothing but a Pass
        if not f.reason.startswith(P.LEADER) or f.reason.startswith(P.RMA):
            assert isinstance(a, P.Pass) and not f.drained


def run_world(reason, lim, heal_after: int | None, gaps, max_ticks=60):
    """A node drained with ``reason`` whose fault heals after ``heal_after`` repairs (None: never),
    driven through the policy the way Slurm and the node's HealthCheckProgram answer."""
    world = {"reason": reason, "drained": True, "rebooting": False, "steps": [], "repairs": 0}
    now, trace = 1000.0, []
    for tick in range(max_ticks):
        now += gaps[tick % len(gaps)]
        if world["rebooting"]:                  # the reboot completes; the checks run at boot
            world["rebooting"] = False
            if heal_after is not None and world["repairs"] >= heal_after:
                world["drained"], world["reason"] = False, ""
            else:
                world["reason"] = "slurm-ft: remediate: failed: device: GPU0 lost"
        f = facts(world["reason"], world["drained"], True, world["rebooting"], world["steps"])
        for a in P.decide(f, lim, CAT, now):
            trace.append(a)
            kind = {P.Repair: getattr(a, "kind", ""), P.Pass: "pass", P.Fail: "fail", P.Rma: "rma",
                    P.Cancel: "cancel"}[type(a)]
            world["steps"].append(P.Step(kind, now, getattr(a, "xids", ()), getattr(a, "bus", ""), 3,
                                         getattr(a, "what", "")))
            if isinstance(a, P.Repair):
                world["repairs"] += 1
                world["reason"], world["rebooting"] = a.reason, True
            elif isinstance(a, P.Rma):
                world["reason"] = a.reason
    return world, trace


@FAST
@given(st.integers(1, 5), st.sampled_from(OURS[:5]), st.booleans(),
       st.lists(st.sampled_from([1.0, 5.0, 30.0]), min_size=1, max_size=4))
def test_a_fault_that_survives_every_repair_is_an_rma_after_exactly_n(n, reason, reset, gaps):
    lim = P.Limits(max_repairs=n, window_s=1e9, repair_timeout_s=900.0, reset=reset)
    world, trace = run_world(reason, lim, None, gaps)
    repairs = [a for a in trace if isinstance(a, P.Repair)]
    if reason.startswith("slurm-ft: Xid 94"):   # the catalog lists no repair for it: left to an admin
        assert trace == [] and world["drained"]
        return
    assert len(repairs) == n
    assert isinstance(trace[-1], P.Rma) and world["reason"].startswith(P.RMA) and world["drained"]
    assert [a.n for a in repairs] == list(range(1, n + 1))
    # a failed reset falls back to a reboot
    for prev, nxt in zip(repairs, repairs[1:]):
        if prev.kind == "reset":
            assert nxt.kind == "reboot"


@FAST
@given(st.integers(1, 4), st.sampled_from(OURS[:3]), st.lists(st.sampled_from([1.0, 5.0]), min_size=1, max_size=3))
def test_a_repair_that_heals_resumes_and_is_journaled_pass(n, reason, gaps):
    lim = P.Limits(max_repairs=n, window_s=1e9, repair_timeout_s=900.0)
    world, trace = run_world(reason, lim, 1, gaps)
    assert [type(a) for a in trace] == [P.Repair, P.Pass]
    assert not world["drained"]


def test_the_catalog_picks_the_repair_and_a_cancelling_xid_makes_it_unnecessary():
    lim = P.Limits()
    (r,) = P.decide(facts(OURS[0]), lim, CAT, 0)
    assert r.kind == "reboot" and r.xids == (79,) and r.job_id == 3 and "Xid 79" in r.reason
    (r,) = P.decide(facts(OURS[1]), lim, CAT, 0)
    assert r.kind == "reset" and r.bus == "0000:11:00" and r.reason.startswith("slurm-ft: remediate: reset GPU 0000:11:00")
    (r,) = P.decide(facts(OURS[1]), P.Limits(reset=False), CAT, 0)
    assert r.kind == "reboot"
    assert P.decide(facts(OURS[0], idle=False), lim, CAT, 0) == []          # a job still runs there
    assert P.decide(facts(OURS[0]), P.Limits(may_start=False), CAT, 0) == []  # the breaker
    (c,) = P.decide(facts(OURS[5], later=(162,)), lim, CAT, 0)
    assert isinstance(c, P.Cancel) and "162" in c.why
    assert P.decide(facts(OURS[5], later=(162,), steps_=[P.Step("cancel", 1.0)]), lim, CAT, 5) == []
    # the repair times out without a check result
    open_ = [P.Step("reboot", 0.0, (79,), "", 3, "Xid 79 (job 3)")]
    assert P.decide(facts(OURS[6].split(" : ")[0], steps_=open_), lim, CAT, 100) == []
    out = P.decide(facts(OURS[6].split(" : ")[0], steps_=open_), lim, CAT, 1000)
    assert isinstance(out[0], P.Fail) and "no trusted check result" in out[0].why and isinstance(out[1], P.Repair)
    # observe mode: one step, then nothing
    assert P.decide(facts(OURS[0], steps_=open_), P.Limits(observe=True), CAT, 10 ** 6) == []


def test_shipped_catalog_has_a_repair_for_every_draining_xid_it_names():
    cat = A.catalog()
    assert cat[79].repair == "reboot" and cat[95].repair == "reset" and cat[48].repair == "reset"
    assert cat[162].cancels == {163} and cat[163].cancels == {162}
    assert {r.repair for r in cat.values()} <= {"reset", "reboot", "none"}


# ----------------------------------------------------------------------- daemon side, real journal
class RecordingSlurm:
    def __init__(self, observe=False):
        self.calls, self.observe = [], observe

    def run(self, cmd, *args, **kw):
        self.calls.append([cmd, *args])
        return subprocess.CompletedProcess([cmd, *args], 0, "", "")

    def drain(self, node, reason):
        self.calls.append(["drain", node, reason])


class Node:
    def __init__(self, name, state, flags, reason, reason_time=None):
        self.name, self.state, self.flags, self.reason = name, state, flags, reason
        self.reason_time = reason_time

    @property
    def drained(self):
        return "DRAIN" in self.flags


class World:
    def __init__(self, tmp_path, **remediate):
        from slurm_ft.journal import open_journal

        self.cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db")},
                                         "remediate": {"enabled": True, **remediate}})
        self.journal = open_journal(self.cfg.journal.path)
        self.journal.clock = lambda: self.now
        self.slurm = RecordingSlurm()
        self.clock = lambda: self.now
        self.now = 1000.0
        self.breaker_latched = None


def rows(w, node):
    return [r for r in w.journal.actions_named(A.ACTIONS + ("reconcile",)) if r["target"] == node]


def test_daemon_side_reboots_once_then_passes_and_journals_each_step(tmp_path):
    w = World(tmp_path, max_repairs=2)
    r = A.Remediator(w)
    n = Node("n1", "IDLE", ["DRAIN"], "slurm-ft: Xid 79 GPU 0000:10:00 (job 12)")
    admin = Node("n2", "IDLE", ["DRAIN"], "bad DIMM, ticket 42")
    r.scan([n, admin])
    assert w.slurm.calls == [["scontrol", "reboot", "reason=slurm-ft: remediate: reboot 1/2 after Xid 79 GPU 0000:10:00 "
                                                    "(job 12)", "n1"]]
    (row,) = rows(w, "n1")
    assert row["action"] == "remediate-reboot" and row["status"] == "done" and row["job_id"] == 12
    assert json.loads(row["detail"])["xids"] == [79]
    n.flags, n.reason = ["DRAIN", "REBOOT_ISSUED"], w.slurm.calls[0][2][len("reason="):] + " : reboot issued"
    w.now += 5
    r.scan([n, admin])                            # in flight: nothing more
    assert len(w.slurm.calls) == 1
    n.flags, n.reason = [], ""                     # the checks passed at boot: resumed
    w.now += 5
    r.scan([n, admin])
    assert [x["action"] for x in rows(w, "n1")] == ["remediate-reboot", "remediate-pass", "reconcile"]
    assert rows(w, "n2") == [] and len(w.slurm.calls) == 1


def test_daemon_side_rma_after_n_and_a_refused_reboot_is_no_step(tmp_path):
    w = World(tmp_path, max_repairs=1)
    r = A.Remediator(w)
    n = Node("n1", "IDLE", ["DRAIN"], "slurm-ft: device: GPU0 lost (job 4)")

    def refuse(cmd, *args, **kw):
        raise SlurmCommandError("scontrol: rc=1: Invalid node state")
    w.slurm.run = refuse
    r.scan([n])
    assert [x["status"] for x in rows(w, "n1")] == ["failed"]
    w.slurm = RecordingSlurm()
    r.scan([n])                                   # refused just now: not asked again at every poll
    assert w.slurm.calls == []
    w.now += A.RETRY_AFTER_REFUSAL_S + 1
    r.scan([n])
    assert w.slurm.calls[0][:2] == ["scontrol", "reboot"]
    n.reason = "slurm-ft: remediate: failed: device: GPU0 lost"
    w.now += 5
    r.scan([n])
    assert [x["action"] for x in rows(w, "n1")][-2:] == ["remediate-fail", "remediate-rma"]
    assert w.slurm.calls[-1][:2] == ["drain", "n1"] and w.slurm.calls[-1][2].startswith("slurm-ft: rma: 1 repairs")


# ----------------------------------------------------------------------- node side
class Smi:
    def __init__(self, persistent=True, reset_rc=0):
        self.calls, self.persistent, self.reset_rc = [], persistent, reset_rc

    def __call__(self, *args):
        self.calls.append(list(args))
        if "--query-gpu=persistence_mode" in args:
            return subprocess.CompletedProcess(args, 0, "Enabled\n" if self.persistent else "Disabled\n", "")
        if args[0] == "-r":
            return subprocess.CompletedProcess(args, self.reset_rc, "", "" if not self.reset_rc else "GPU is in use")
        return subprocess.CompletedProcess(args, 0, "", "")


def test_reset_turns_persistence_off_first_and_restores_it_even_when_the_reset_fails():
    cfg = config_mod.from_dict({"remediate": {"enabled": True}})
    smi = Smi(persistent=True)
    out = A.reset_gpu(cfg, "n1", "0000:10:00", smi=smi, bug_report=lambda c, n: "")
    assert out.ok
    assert [c[2:] if c[0] == "-i" else c[:1] for c in smi.calls] == [
        ["--query-gpu=persistence_mode", "--format=csv,noheader"], ["-pm", "0"], ["-r"], ["-pm", "1"]]
    smi = Smi(persistent=True, reset_rc=3)
    got = []
    out = A.reset_gpu(cfg, "n1", "0000:10:00", smi=smi, bug_report=lambda c, n: got.append(n) or "/r.log.gz")
    assert not out.ok and "GPU is in use" in out.why and out.bug_report == "/r.log.gz" and got == ["n1"]
    assert smi.calls[-1][-2:] == ["-pm", "1"]
    smi = Smi(persistent=False)
    A.reset_gpu(cfg, "n1", "0000:10:00", smi=smi, bug_report=lambda c, n: "")
    assert not any("-pm" in c for c in smi.calls)


def test_bug_report_is_skipped_cleanly_when_the_script_is_absent(tmp_path):
    cfg = config_mod.from_dict({"remediate": {"bug_report": str(tmp_path / "none.sh"),
                                              "bug_report_dir": str(tmp_path / "reports")}})
    assert A.collect_bug_report(cfg, "n1") == ""
    script = tmp_path / "bug.sh"
    script.write_text('#!/bin/sh\n[ "$1" = --output-file ] && echo report > "$2"\n')
    script.chmod(0o755)
    cfg = config_mod.from_dict({"remediate": {"bug_report": str(script), "bug_report_dir": str(tmp_path / "reports")}})
    path = A.collect_bug_report(cfg, "n1")
    assert path.startswith(str(tmp_path / "reports" / "nvidia-bug-report-n1-")) and open(path).read() == "report\n"


class NodeSlurm(RecordingSlurm):
    def __init__(self, reason, state="IDLE+DRAIN"):
        super().__init__()
        self.info = {"Reason": reason, "State": state}

    def show_node(self, node):
        return dict(self.info)

    def resume(self, node):
        self.calls.append(["resume", node])


def _result(status):
    from slurm_ft.health.result import CheckResult
    return CheckResult("device", status, 0, "GPU0 lost" if status == "fail" else "ok")


def test_after_checks_resumes_only_on_a_pass_and_leaves_other_reasons_alone(tmp_path):
    cfg = config_mod.from_dict({"remediate": {"enabled": True}})
    s = NodeSlurm("slurm-ft: remediate: reboot 1/3 after Xid 79 (job 1) : reboot issued [root@x]")
    assert A.after_checks(cfg, "n1", [_result("pass")], s, print) == "resumed" and s.calls == [["resume", "n1"]]
    s = NodeSlurm("slurm-ft: remediate: reboot 1/3 after Xid 79 (job 1)")
    assert A.after_checks(cfg, "n1", [_result("fail")], s, print) == "remediate-failed"
    assert s.calls[0][0] == "drain" and s.calls[0][2].startswith("slurm-ft: remediate: failed: device: GPU0")
    s = NodeSlurm("slurm-ft: remediate: reboot 1/3 after Xid 79 (job 1)", state="IDLE+DRAIN+REBOOT_REQUESTED")
    assert A.after_checks(cfg, "n1", [_result("pass")], s, print) == "still-drained" and s.calls == []
    for other in ("slurm-ft: Xid 79 (job 1)", "admin: bad fan", "slurm-ft: remediate: failed: x", "slurm-ft: rma: x"):
        s = NodeSlurm(other)
        assert A.after_checks(cfg, "n1", [_result("pass")], s, print) is None and s.calls == []


def test_after_checks_resets_the_fake_gpu_then_checks_again(tmp_path):
    from slurm_ft.nvml import inventory

    inv = tmp_path / "n1.json"
    inventory.write_inventory(str(inv), "n1", [{"index": 0, "pci_bus_id": "00000000:10:00.0"}])
    cfg = config_mod.from_dict({"remediate": {"enabled": True},
                                "nvml": {"backend": "fake", "inventory": str(tmp_path / "{node}.json")}})
    s = NodeSlurm("slurm-ft: remediate: reset GPU 0000:10:00 1/3 after Xid 95 GPU 0000:10:00 (job 2)")
    reran = []
    out = A.after_checks(cfg, "n1", [_result("fail")], s, print, rerun=lambda: reran.append(1) or [_result("pass")])
    assert out == "resumed" and reran == [1]
    inventory.set_gpu_field(str(inv), 0, "lost", "true")       # a lost GPU: the reset fails -> the daemon reboots
    s = NodeSlurm("slurm-ft: remediate: reset GPU 0000:10:00 1/3 after Xid 95 GPU 0000:10:00 (job 2)")
    assert A.after_checks(cfg, "n1", [_result("fail")], s, print, rerun=lambda: 1 / 0) == "remediate-failed"
    assert s.calls[0][2].startswith("slurm-ft: remediate: failed: reset: GPU 0000:10:00 reset failed")


def test_config_rejects_bad_remediate_values():
    with pytest.raises(Exception, match="remediate.max_repairs"):
        config_mod.from_dict({"remediate": {"max_repairs": 0}})
    with pytest.raises(Exception, match="absolute"):
        config_mod.from_dict({"remediate": {"nvidia_smi": "nvidia-smi"}})
    with pytest.raises(Exception, match="unknown key remediate.typo"):
        config_mod.from_dict({"remediate": {"typo": 1}})


def test_report_lists_repairs_and_rma_candidates_escaped(tmp_path):
    from slurm_ft.journal import open_journal
    from slurm_ft.report import collect, render
    from slurm_ft.slurm import Node as SNode

    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db")}})
    with open_journal(cfg.journal.path) as j:
        for kind in ("reboot", "fail", "reboot", "fail"):
            j.record(9, 0, f"remediate-{kind}", "n2", json.dumps({"kind": kind}))
        j.record(9, 0, "remediate-rma", "n2", json.dumps({"kind": "rma", "reason": "slurm-ft: rma: 2 repairs <b>"}))
        j.record(7, 0, "remediate-reboot", "n1", "{}")
        j.record(7, 0, "remediate-pass", "n1", "{}")
    nodes = [SNode.from_json({"name": "n2", "state": "idle", "state_flags": ["DRAIN"],
                              "reason": "slurm-ft: rma: 2 repairs <b>"})]
    data = collect(cfg, _ReportSlurm(nodes))
    assert [(r.node, r.repairs, r.passed, r.failed, bool(r.rma)) for r in data.repairs] == [
        ("n2", 2, 0, 2, True), ("n1", 1, 1, 0, False)]
    html = render(data, "html")
    assert "Break-fix remediation" in html and "<b>" not in html and "&lt;b&gt;" in html
    text = render(data, "text")
    assert "RMA candidate: slurm-ft: rma: 2 repairs" in text and "reboot, fail, reboot, fail, rma" in text
    js = json.loads(render(data, "json"))
    assert js["repairs"][0]["rma_candidate"] and js["repairs"][1]["steps"] == ["reboot", "pass"]


class _ReportSlurm:
    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def test_ft_history_names_the_repair_steps(tmp_path):
    from slurm_ft.history.query import _summarise

    rows = [{"action": "remediate-reboot", "target": "n1", "status": "done", "detail": "{}"},
            {"action": "remediate-pass", "target": "n1", "status": "done", "detail": "{}"},
            {"action": "remediate-reboot", "target": "n2", "status": "observed", "detail": "{}"}]
    assert _summarise(rows) == "remediate-reboot n1, remediate-pass n1, observed: would remediate-reboot n2"


def test_metrics_count_the_repair_steps(tmp_path):
    from slurm_ft.journal import open_journal
    from slurm_ft.admin.metrics import journal_counts

    with open_journal(tmp_path / "d.db") as j:
        for kind in ("reboot", "fail", "reboot", "pass"):
            j.record(1, 0, f"remediate-{kind}", "n1", "{}")
        j.intend(1, 0, "remediate-reboot", "n2", "{}")          # an intent is no step
        assert journal_counts(j)["remediations"] == {"reboot": 2, "fail": 1, "pass": 1}


def test_daemon_side_a_later_cancelling_xid_makes_the_repair_unnecessary(tmp_path):
    import time as _t

    w = World(tmp_path)
    w.now = _t.time()
    w.journal.add_verdict(5, 0, "n1", "unknown", "xid-162", [{"xid": 162, "bus_id": "0000:10:00"}], [])
    n = Node("n1", "IDLE", ["DRAIN"], "slurm-ft: Xid 163 GPU 0000:10:00 (job 4)", reason_time=int(w.now) - 60)
    A.Remediator(w).scan([n])
    assert [x["action"] for x in rows(w, "n1")] == ["remediate-cancel"] and w.slurm.calls == []
    A.Remediator(w).scan([n])                         # journaled once
    assert len(rows(w, "n1")) == 1
