"""Can a failed-over job still run with the blamed nodes excluded? (issue 15, item 1)

Job, node and reservation records are real ``squeue --json`` / ``sinfo --json`` /
``scontrol show reservation -o`` output captured on the lab (Slurm 22.05.8,
tests/fixtures/constraints/); 24.11 shapes are derived from them as Slurm's v0.0.42 data parser
prints them. :func:`steps.exclude_and_boost` runs against a recording fake of the Slurm runner and
a real journal file.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from pathlib import Path

import pytest

from slurm_ft.errors import SlurmCommandError
from slurm_ft.failover import constraints, jobspec, policy, steps
from slurm_ft.failover.constraints import check, fault_cause, parse_features, reservation_nodes
from slurm_ft.journal import open_journal
from slurm_ft.slurm import Job, Node, parse_kv_line

FIX = Path(__file__).parent / "fixtures" / "constraints"
SQUEUE = json.loads((FIX / "squeue-22.05.json").read_text())
JOBS = SQUEUE["jobs"]
NODES = [Node.from_json(n) for n in json.loads((FIX / "sinfo-22.05.json").read_text())["nodes"]]
RESV = {r["ReservationName"]: r for r in map(parse_kv_line, (FIX / "reservations-22.05.txt").read_text().splitlines())}
TOKEN = "ft:retries=2,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0"


def job(label: str, **changes) -> dict:
    raw = copy.deepcopy(JOBS[label])
    raw.update(changes)
    return raw


def xid79(excluded=("n1",), label="pinned_w_n1", **kw):
    return check(job(label), NODES, set(excluded), blamed=kw.pop("blamed", ["n1"]), cause="Xid 79", **kw)


# ----------------------------------------------------------------------------- the captured records
def test_fixtures_are_2205_with_the_fields_read():
    assert SQUEUE["meta"]["Slurm"]["release"] == "22.05.8"
    for raw in JOBS.values():
        assert {"required_nodes", "excluded_nodes", "features", "node_count", "partition", "resv_name",
                "shared"} <= set(raw)
    assert JOBS["pinned_w_n1"]["required_nodes"] == "n1"
    assert JOBS["nodelist_n1_n2_N2"]["required_nodes"] == "n[1-2]"
    assert JOBS["exclusive"]["shared"] == "none" and JOBS["oversubscribe"]["shared"] == "shared"
    assert JOBS["partitions_gpu_small"]["partition"] == "gpu,small"
    # the stuck state: requeued, still pinned to the node it now excludes
    stuck = JOBS["ft_pinned_requeued"]
    assert (stuck["required_nodes"], stuck["excluded_nodes"], stuck["restart_cnt"]) == ("n1", "n1", 1)
    assert {n.name: n.raw["features"] for n in NODES} == {"n1": "a100,nvlink", "n2": "a100", "n3": "h100"}
    assert "reservation" not in NODES[0].raw  # 22.05 nodes do not name reservations
    assert sorted(RESV) == ["r1", "r2", "rflex"]


# ----------------------------------------------------------------------------- node lists
@pytest.mark.parametrize("label", ["pinned_w_n1", "ft_pinned_running", "ft_pinned_requeued"])
def test_pinned_job_cannot_run_without_its_node(label):
    fit = xid79(label=label)
    assert not fit.runnable and fit.constraint == "nodelist"
    assert fit.reason == "n1 excluded after Xid 79; the job requires it (--nodelist=n1)"
    assert fit.relaxed_nodelist == "" and fit.dropped == ("n1",)   # relax: clear the pin


def test_pinned_job_is_fine_when_another_node_is_excluded():
    assert xid79(excluded=["n2"], blamed=["n2"]).runnable


def test_partial_node_list_relaxes_to_the_rest():
    fit = xid79(label="nodelist_n1_n2_N2")
    assert fit.reason == "n1 excluded after Xid 79; the job requires it (--nodelist=n[1-2])"
    assert fit.relaxed_nodelist == "n2"          # n2 plus one more of gpu: n3
    assert "ReqNodeList -> n2 (dropped n1: n1 excluded after Xid 79" in fit.relax_detail


def test_relaxing_does_not_help_when_too_few_nodes_remain():
    fit = xid79(excluded=["n1", "n2"], blamed=["n2"], label="nodelist_n1_n2_N2")
    assert fit.reason == ("n2 excluded after Xid 79, n1 excluded earlier; the job requires them "
                          "(--nodelist=n[1-2])")
    assert fit.relaxed_nodelist is None           # only n3 is left, the job needs 2


# ----------------------------------------------------------------------------- node count, partitions
def test_nodes_equal_to_the_partition_size():
    fit = xid79(label="nodes_3")
    assert not fit.runnable and fit.constraint == "nodes" and fit.relaxed_nodelist is None
    assert fit.reason == ("n1 excluded after Xid 79; 2 usable node(s) left in partition gpu, the job needs 3 "
                          "(--nodes=3)")


def test_exclusive_job_on_a_small_partition():
    assert xid79(label="exclusive").runnable
    fit = check(job("exclusive", node_count=3), NODES, {"n1"}, blamed=["n1"], cause="Xid 79")
    assert fit.reason.endswith("the job needs 3 (--nodes=3, --exclusive)")
    fit = check(job("exclusive_user", node_count=3), NODES, {"n1"}, blamed=["n1"])
    assert fit.reason.endswith("(--nodes=3, --exclusive=user)")
    assert "exclusive" not in check(job("oversubscribe", node_count=3), NODES, {"n1"}).reason


def test_partition_of_one_node():
    fit = xid79(label="partition_small")
    assert fit.constraint == "nodes"
    assert fit.reason == ("n1 excluded after Xid 79; 0 usable node(s) left in partition small, the job needs 1 "
                          "(--nodes=1)")
    assert xid79(label="partitions_gpu_small").runnable   # pending in gpu too


def test_drained_nodes_still_count():
    drained = [Node.from_json({**n.raw, "state_flags": ["DRAIN"]}) for n in NODES]
    assert check(job("nodes_3"), drained, set()).runnable


# ----------------------------------------------------------------------------- features
def test_feature_only_the_excluded_node_has():
    fit = xid79(label="constraint_a100_and_nvlink")
    assert fit.constraint == "features" and fit.relaxed_nodelist is None
    assert fit.reason == ("n1 excluded after Xid 79; no other node in partition gpu has the features the job "
                          "requires, it needs 1 (--constraint=a100&nvlink)")


@pytest.mark.parametrize("label", ["constraint_a100", "constraint_a100_or_h100", "constraint_counts"])
def test_features_other_nodes_have(label):
    assert xid79(label=label).runnable


def test_counted_features():
    fit = check(job("constraint_counts"), NODES, {"n1", "n2"}, blamed=["n2"], cause="Xid 79")
    assert fit.constraint == "features"            # [a100*1&h100*1]: no a100 node left
    assert fit.reason.startswith("n2 excluded after Xid 79, n1 excluded earlier; no other node")
    assert "(--constraint=[a100*1&h100*1])" in fit.reason


def test_comma_is_and():
    assert not check(job("constraint_a100", features="a100,nvlink"), NODES, {"n1"}).runnable


@pytest.mark.parametrize("expr, ok", [
    ("(a100|h100)&nvlink", False),          # n1 only
    ("[a100|h100]", True),
    ("a100*1", True),
    ("nvlink*1&a100*1", False),
])
def test_feature_expressions(expr, ok):
    assert check(job("constraint_a100", features=expr), NODES, {"n1"}).runnable is ok


def test_parse_features_shapes():
    g = parse_features("[a100*2&h100*1]")
    assert g.items[0][0].bracket and g.items[0][0].items == (("a100", 2), ("h100", 1))
    assert parse_features("a,b").ops == ("&",)


# ----------------------------------------------------------------------------- reservations
def test_reservation_record_parsed():
    assert reservation_nodes(RESV["r1"]) == {"n1", "n2"}
    assert reservation_nodes(RESV["rflex"]) is None      # FLEX: may use nodes outside it
    assert reservation_nodes(None) is None
    assert reservation_nodes({"Nodes": "(null)"}) is None


def test_reservation_with_other_nodes_left():
    assert xid79(label="reservation_r1", reservation=RESV["r1"]).runnable


def test_reservation_without_other_nodes():
    fit = xid79(label="reservation_r2_badconstraints", reservation=RESV["r2"])
    assert fit.constraint == "reservation"
    assert fit.reason == ("n1 excluded after Xid 79; 0 node(s) left in reservation r2, the job needs 1 "
                          "(--reservation=r2)")
    fit = check(job("reservation_r1"), NODES, {"n1", "n2"}, blamed=["n1", "n2"], reservation=RESV["r1"])
    assert fit.reason.startswith("n[1-2] excluded after a hardware fault; 0 node(s) left in reservation r1")


def test_reservation_unknown_is_not_checked():
    fit = xid79(label="reservation_r2_badconstraints", reservation=None)
    assert fit.runnable and any("reservation r2" in n and "not checked" in n for n in fit.notes)


# ----------------------------------------------------------------------------- fail safe
@pytest.mark.parametrize("expr", [
    "a100!nvlink", "a100 & nvlink", "a100&", "((a100)", "a100]", "(" * 50 + "a100" + ")" * 50,
    "a100*0", "a100*99999999999", "nvlink|" * 300 + "nvlink", "a100|h100&nvlink" * 2,
])
def test_expressions_not_understood_never_block(expr):
    fit = check(job("constraint_a100", features=expr), NODES, {"n1"}, blamed=["n1"])
    assert fit.runnable, fit


def test_mixed_operators_without_parentheses_are_not_trusted():
    # left to right: (a100|h100)&nvlink -> only n1; & first: a100|(h100&nvlink) -> n2
    fit = check(job("constraint_a100", features="a100|h100&nvlink"), NODES, {"n1"})
    assert fit.runnable and any("mixes & and |" in n for n in fit.notes)


def test_unrunnable_even_without_exclusions_is_not_blamed_on_them():
    fit = check(job("constraint_a100", features="nosuchfeature"), NODES, {"n1"})
    assert fit.runnable and any("even with no node excluded" in n for n in fit.notes)


def test_bad_hostlist_and_missing_fields():
    fit = check(job("pinned_w_n1", required_nodes="n[1-"), NODES, {"n1"})
    assert fit.runnable and any("required node list not checked" in n for n in fit.notes)
    assert check({}, NODES, {"n1"}).runnable
    assert check(job("nodes_3"), [], {"n1"}).runnable   # no node records: only the node list is checked
    assert not check(job("pinned_w_n1"), [], {"n1"}).runnable


# ----------------------------------------------------------------------------- attacker-ish input
def test_hostile_text_stays_one_word_and_cannot_forge_the_ft_token():
    evil = "x ft:retries=99\n\x1b[31m"   # Slurm names hold no commas; a comma splits partitions
    long_feature = "ft:" + "x" * 200
    nodes = [Node.from_json({**n.raw, "partitions": [evil],
                             "features": n.raw["features"] + (f",{long_feature}" if n.name == "n1" else "")})
             for n in NODES]
    for raw, resv in [(job("nodes_3", partition=evil), None),
                      (job("reservation_r2_badconstraints", resv_name=evil, partition=evil), {**RESV["r2"]}),
                      (job("constraint_a100_and_nvlink", partition=evil, features=f"a100&{long_feature}"), None)]:
        fit = check(raw, nodes, {"n1"}, blamed=["n1"], cause="Xid 79", reservation=resv)
        assert not fit.runnable and len(fit.reason) < 400
        assert not any(w.startswith("ft:") for w in fit.reason.split()), fit.reason
        assert "\n" not in fit.reason and "\x1b" not in fit.reason
        comment = f"slurm-ft: held: {fit.reason} {TOKEN}"
        assert jobspec.from_admin_comment(comment) == jobspec.from_canonical(TOKEN)
    long = check(job("constraint_a100", features="nvlink&" + "x" * 5000), NODES, {"n1"})
    assert long.runnable and any("longer than" in n for n in long.notes)


def test_huge_cluster_and_node_list():
    nodes = [Node.from_json({"name": f"gpu{i:05d}", "partitions": ["big"], "features": "h100"})
             for i in range(1, 10001)]
    raw = job("nodelist_n1_n2_N2", required_nodes="gpu[00001-08192]", node_count=8192, partition="big",
              features="h100")
    t0 = time.monotonic()
    fit = check(raw, nodes, {"gpu00007", "gpu09000"}, blamed=["gpu00007"], cause="Xid 79")
    assert time.monotonic() - t0 < 5
    assert fit.constraint == "nodelist" and len(fit.reason) < 300
    assert fit.reason == "gpu00007 excluded after Xid 79; the job requires it (--nodelist=gpu[00001-08192])"
    assert fit.relaxed_nodelist == "gpu[00001-00006,00008-08192]"
    blamed = {f"gpu{i:05d}" for i in range(1, 8193, 2)}
    fit = check(raw, nodes, blamed, blamed=blamed)
    assert len(fit.reason) < 300 and fit.reason.count("...") >= 1


# ----------------------------------------------------------------------------- 24.11 shapes
def _as_2411(raw: dict) -> dict:
    out = dict(raw)
    out["node_count"] = {"set": True, "infinite": False, "number": raw["node_count"]}
    shared = raw.get("shared")
    out["shared"] = [] if shared is None else ["oversubscribe" if shared == "shared" else shared]
    return out


def test_2411_shapes():
    nodes = [Node.from_json({**n.raw, "features": n.raw["features"].split(","),
                             "active_features": n.raw["active_features"].split(","), "reservation": ""})
             for n in NODES]
    assert not check(_as_2411(job("pinned_w_n1")), nodes, {"n1"}).runnable
    fit = check(_as_2411(job("exclusive", node_count=3)), nodes, {"n1"})
    assert fit.constraint == "nodes" and "--exclusive" in fit.reason
    assert check(_as_2411(job("constraint_a100_and_nvlink")), nodes, {"n1"}).constraint == "features"
    assert check(_as_2411(job("constraint_a100")), nodes, {"n1"}).runnable


# ----------------------------------------------------------------------------- fault_cause
def test_fault_cause():
    rows = [{"node": "n1", "rule": "xid-79", "xids": [{"xid": 79, "bus_id": "0000:3b:00"}]},
            {"node": "n2", "rule": "xid-48", "xids": [{"xid": 48}]}]
    assert fault_cause(rows, ["n1"]) == "Xid 79"
    assert fault_cause(rows, ["n1", "n2"]) == "Xids 48, 79"
    assert fault_cause([{"node": "n1", "rule": "health:gpu-count", "xids": []}], ["n1"]) == \
        "a failed health check (gpu-count)"
    assert fault_cause([{"node": "n1", "rule": "slurm-node-fail", "xids": []}], ["n1"]) == "a hardware fault"
    assert fault_cause([{"node": "n1", "rule": "x", "xids": [{"xid": "79; rm"}, "junk"]}], ["n1"]) == \
        "a hardware fault"
    assert fault_cause(rows, ["n3"]) == fault_cause([], ["n1"]) == "a drain"   # an evacuation


# ----------------------------------------------------------------------------- exclude_and_boost
class FakeSlurm:
    """Records what exclude_and_boost asks of Slurm; answers from a captured job record."""

    def __init__(self, raw: dict, refuse: str = ""):
        self.raw, self.refuse, self.calls = raw, refuse, []

    def job(self, job_id):
        return Job.from_json(self.raw)

    def run(self, cmd, *args, check=True, **_):
        self.calls.append((cmd, *args))
        if args[:2] == ("show", "reservation"):
            name = args[-1]
            line = next((ln for ln in (FIX / "reservations-22.05.txt").read_text().splitlines()
                         if ln.startswith(f"ReservationName={name} ")), "")
            return subprocess.CompletedProcess([cmd, *args], 0 if line else 1, line,
                                               "" if line else f"Reservation {name} not found")
        return subprocess.CompletedProcess([cmd, *args], 0, "", "")

    def update_job(self, job_id, **fields):
        self.calls.append(("update", job_id, fields))
        if self.refuse and self.refuse in fields:
            raise SlurmCommandError(f"scontrol update: {self.refuse} refused")


@pytest.fixture
def journal(tmp_path):
    with open_journal(tmp_path / "j.db") as j:
        yield j


def _failover(journal, raw, mode="hold", refuse=""):
    jid = raw["job_id"]
    journal.upsert_job(jid, name="wrap", user="root", ft_enabled=1, retries=2, ft_state=policy.FAILOVER,
                       excluded_nodes="", ft_options=TOKEN)
    journal.add_verdict(jid, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:3b:00"}])
    slurm = FakeSlurm(raw, refuse)
    out = steps.exclude_and_boost(slurm, journal, jid, 0, ["n1"], nodes=NODES, top=10, priority_boost=1000,
                                  unsatisfiable=mode)
    return out, slurm


def test_exclude_and_boost_holds_a_pinned_job(journal, caplog):
    raw = job("ft_pinned_requeued")
    with caplog.at_level("WARNING"):
        out, slurm = _failover(journal, raw)
    reason = "n1 excluded after Xid 79; the job requires it (--nodelist=n1)"
    assert out == "held"
    assert ("scontrol", "hold", "17") in slurm.calls
    update = [c for c in slurm.calls if c[0] == "update"]
    assert update == [("update", 17, {"AdminComment": f"slurm-ft: held: {reason} {TOKEN}"})]  # no ExcNodeList
    hold = [a for a in journal.actions(17) if a["action"] == "hold"]
    assert [(h["detail"], h["status"]) for h in hold] == [(reason, "done")]
    assert journal.job(17)["ft_state"] == policy.HELD
    assert reason in caplog.text
    assert jobspec.from_admin_comment(update[0][2]["AdminComment"]) == jobspec.from_canonical(TOKEN)


def test_exclude_and_boost_relaxes_the_pin(journal):
    out, slurm = _failover(journal, job("ft_pinned_requeued"), mode="relax")
    assert out == "requeued"
    updates = [c[2] for c in slurm.calls if c[0] == "update"]
    assert updates[0] == {"ReqNodeList": ""}
    assert updates[1]["ExcNodeList"] == "n1" and updates[1]["AdminComment"].startswith("slurm-ft:failover")
    relax = [a for a in journal.actions(17) if a["action"] == "relax"]
    assert relax[0]["status"] == "done" and relax[0]["detail"].startswith("ReqNodeList -> (none) (dropped n1:")
    assert ("scontrol", "hold", "17") not in slurm.calls


def test_exclude_and_boost_relax_that_cannot_help_holds(journal):
    out, slurm = _failover(journal, job("nodes_3", admin_comment=""), mode="relax")
    assert out == "held" and not [a for a in journal.actions(3) if a["action"] == "relax"]


def test_exclude_and_boost_relax_refused_holds(journal):
    out, slurm = _failover(journal, job("ft_pinned_requeued"), mode="relax", refuse="ReqNodeList")
    assert out == "held"
    relax = [a for a in journal.actions(17) if a["action"] == "relax"]
    assert relax[0]["status"] == "failed" and "refused" in relax[0]["detail"]


def test_exclude_and_boost_runnable_job_is_failed_over(journal):
    out, slurm = _failover(journal, job("constraint_a100"))
    assert out == "requeued"
    assert [c[2]["ExcNodeList"] for c in slurm.calls if c[0] == "update"] == ["n1"]
    assert not [a for a in journal.actions(4) if a["action"] == "hold"]


def test_exclude_and_boost_reads_the_reservation(journal):
    out, slurm = _failover(journal, job("reservation_r2_badconstraints"))
    assert ("scontrol", "show", "reservation", "-o", "r2") in slurm.calls
    assert out == "held" and journal.job(12)["ft_state"] == policy.HELD
    assert "0 node(s) left in reservation r2" in [a for a in journal.actions(12) if a["action"] == "hold"][0]["detail"]


def test_modes_match_the_config_key():
    from slurm_ft.config import FailoverConfig
    assert FailoverConfig().unsatisfiable == constraints.HOLD and set(constraints.MODES) == {"hold", "relax"}


# ----------------------------------------------------------------------------- prolog refusal (issue 24, item 4)
def _refused(tmp_path, monkeypatch, required, mode="hold"):
    from daemon_world import WIDE_BREAKER, World

    w = World(tmp_path, nodes=4, breaker=f'unsatisfiable = "{mode}"\n{WIDE_BREAKER}', monkeypatch=monkeypatch)
    jid = w.start(required=required)
    node = w.job(jid).nodes[0]
    w.step()
    w.slurm.prolog_fail(jid)          # the prolog's health check refused the node: Slurm requeued it held
    w.step(n=8)
    return w, jid, node


def test_prolog_refusal_of_a_pinned_job_holds_it_with_a_reason(tmp_path, monkeypatch):
    """Before: released with the node excluded, so Slurm left it pending with BadConstraints forever
    and ft-history said ``running``."""
    from slurm_ft.history.query import history, render_table

    w, jid, node = _refused(tmp_path, monkeypatch, ["n1"])
    reason = "n1 excluded after a failed health check (gpu-count); the job requires it (--nodelist=n1)"
    job = w.job(jid)
    assert job.state == "PENDING" and job.held == "admin" and job.priority == 0
    assert job.excluded == set() and job.required == ["n1"]          # still pinned, not excluded
    assert job.admin_comment.startswith(f"slurm-ft: held: {reason} ft:retries=3,")
    assert w.ft_state(jid) == policy.HELD
    with w.journal() as j:
        acts = j.actions(jid)
        h = history(j, jid)
    assert [(a["detail"], a["status"]) for a in acts if a["action"] == "hold"] == [(reason, "done")]
    assert [a["status"] for a in acts if a["action"] == "release"] == ["skipped"]
    assert f"ft state held: {reason}" in render_table(h)
    w.step(n=20)                                                   # no retry loop, still held
    assert w.job(jid).held == "admin" and w.ft_state(jid) == policy.HELD
    with w.journal() as j:
        assert len([a for a in j.actions(jid) if a["action"] == "hold"]) == 1


def test_prolog_refusal_of_a_pinned_job_relaxed_runs_elsewhere(tmp_path, monkeypatch):
    w, jid, node = _refused(tmp_path, monkeypatch, ["n1", "n2"], mode="relax")
    w.step(n=4)
    job = w.job(jid)
    assert job.state == "RUNNING" and job.nodes == ["n2"] and job.required == ["n2"]
    with w.journal() as j:
        assert [a["status"] for a in j.actions(jid) if a["action"] == "relax"] == ["done"]


def test_prolog_refusal_of_an_unpinned_job_is_released_elsewhere(tmp_path, monkeypatch):
    w, jid, node = _refused(tmp_path, monkeypatch, [])
    w.step(n=4)
    job = w.job(jid)
    assert job.state == "RUNNING" and node not in job.nodes and node in job.excluded
    with w.journal() as j:
        assert not [a for a in j.actions(jid) if a["action"] == "hold"]
