"""Bisect diagnosis (issue 13): the search against simulated tests, the shipped collective test
over real sockets, the runner's srun arguments and records, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from slurm_ft.bisect import collective, runner
from slurm_ft.bisect.search import Outcome, Test, bisect, plan, split


def oracle(bad=(), together=()):
    """A simulated test: fails when it holds a bad node, or every node of a bad combination."""
    calls = []

    def run_round(number, tests):
        calls.append((number, tests))
        return [Outcome(not (set(t.nodes) & set(bad) or (together and set(together) <= set(t.nodes))),
                        job_id=100 * number + i) for i, t in enumerate(tests)]
    return run_round, calls


NODES = [f"n{i}" for i in range(1, 7)]


@pytest.mark.parametrize("bad", NODES)
def test_six_nodes_one_bad_found_in_three_rounds(bad):
    run, calls = oracle([bad])
    r = bisect(NODES, run)
    assert r.culprits == [bad] and r.combinations == []
    assert len(r.rounds) == 3
    # every test is multi-node (a collective needs 2): pairs, then suspect + a good partner
    assert all(len(t.nodes) >= 2 for _, tests in calls for t in tests)
    last = r.rounds[-1]
    for t, o in zip(last.tests, last.outcomes):
        assert len(t.suspects) == 1 and len(t.nodes) == 2
        assert o.passed == (t.suspects[0] != bad)
        assert bad not in t.nodes[1:]           # padding comes from nodes that passed


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13, 16, 64, 100])
def test_any_size_finds_each_bad_node(n):
    nodes = [f"g{i:03d}" for i in range(n)]
    for bad in {nodes[0], nodes[n // 2], nodes[-1]}:
        r = bisect(nodes, oracle([bad])[0])
        assert r.culprits == [bad], (n, bad, r)
        assert len(r.rounds) <= 5


def test_two_bad_nodes_both_found():
    r = bisect([f"n{i}" for i in range(1, 9)], oracle(["n2", "n7"])[0])
    assert r.culprits == ["n2", "n7"]
    assert len(r.rounds) == 3


def test_two_bad_nodes_in_one_pair_both_found():
    r = bisect(NODES, oracle(["n3", "n4"])[0])
    assert r.culprits == ["n3", "n4"]


def test_nothing_to_find_when_the_whole_set_passes():
    run, calls = oracle([])
    r = bisect(NODES, run)
    assert not r.reproduced and r.culprits == [] and len(r.rounds) == 1


def test_a_failure_that_needs_two_nodes_together_blames_no_single_node():
    r = bisect(NODES, oracle(together=("n1", "n6"))[0])
    assert r.culprits == []
    assert r.combinations, r
    assert set(r.combinations[0]) >= {"n1", "n6"}


def test_no_confirm_skips_the_whole_set_round():
    run, calls = oracle(["n4"])
    r = bisect(NODES, run, confirm=False)
    assert r.culprits == ["n4"] and len(r.rounds) == 2
    assert all(len(t.nodes) < 6 for _, tests in calls for t in tests)


def test_round_limit_stops_and_says_what_is_still_suspect():
    r = bisect([f"n{i}" for i in range(1, 65)], oracle(["n33"])[0], max_rounds=2)
    assert r.stopped.startswith("round limit 2") and "n33" in r.stopped


def test_plan_pads_with_distinct_good_nodes_and_split_keeps_order():
    assert split(["a", "b", "c", "d", "e"], 2) == [["a", "b", "c"], ["d", "e"]]
    tests = plan([["s1", "s2", "s3"]], ["g1", "g2", "g3"], 2, set())
    assert tests == [Test(("s1", "g1"), ("s1",)), Test(("s2", "g2"), ("s2",)), Test(("s3", "g3"), ("s3",))]
    # fewer good nodes than suspects: groups as fine as the padding allows
    tests = plan([["s1", "s2", "s3", "s4"]], ["g1"], 2, set())
    assert all(len(t.nodes) >= 2 for t in tests) and sorted(n for t in tests for n in t.suspects) == \
        ["s1", "s2", "s3", "s4"]


# ------------------------------------------------------------------------------ collective
def _lab_cfg(tmp_path, corrupt=None):
    from slurm_ft import config
    from slurm_ft.nvml import fake
    for node in ("n1", "n2"):
        gpus = [{"index": g, "pci_bus_id": f"00000000:{16 * int(node[1:]) + g:02X}:00.0"} for g in range(2)]
        if corrupt and corrupt[0] == node:
            gpus[corrupt[1]]["collective_corrupt"] = True
        fake.write_inventory(str(tmp_path / f"{node}.json"), node, gpus)
    return config.from_dict({"nvml": {"backend": "fake", "inventory": str(tmp_path / "{node}.json")},
                             "health": {"expected_gpus": 2, "isolation": "thread"}})


@pytest.mark.parametrize("corrupt", [None, ("n2", 1)])
def test_collective_over_real_sockets_detects_a_corrupting_gpu(tmp_path, corrupt, monkeypatch):
    cfg = _lab_cfg(tmp_path, corrupt)
    job = 4242 + (os.getpid() % 1000)
    answers = {}

    def rank(r, node):
        vecs, how = collective.compute(cfg, node, r, [0, 1])
        mine = {"node": node, "health": collective.health(cfg, node), "how": how,
                "vectors": {str(g): v for g, v in vecs.items()}}
        if r == 0:
            answers[r] = collective.serve(f"{job}.0", 2, mine, collective.ports(job, 0), 20)
        else:
            answers[r] = collective.join(f"{job}.0", 1, mine, "127.0.0.1", collective.ports(job, 0), 20)

    threads = [threading.Thread(target=rank, args=(r, n)) for r, n in ((0, "n1"), (1, "n2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers[0] == answers[1]
    assert answers[0]["ok"] is (corrupt is None), answers[0]
    if corrupt:
        assert "result wrong" in answers[0]["why"] and "n2" not in answers[0]["why"]  # like NCCL: not who


def test_collective_skips_a_listener_of_another_job(tmp_path):
    """A port taken by another job's rank 0 (or anything else) is skipped by tag."""
    import socket
    cfg = _lab_cfg(tmp_path)
    job = 777 + (os.getpid() % 1000)
    cands = collective.ports(job, 0)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("0.0.0.0", cands[0]))
    squatter.listen(4)
    out = {}

    def r0():
        vecs, how = collective.compute(cfg, "n1", 0, [0])
        out[0] = collective.serve(f"{job}.0", 2, {"node": "n1", "health": "", "how": how,
                                                 "vectors": {"0": vecs[0]}}, cands, 20)
    t = threading.Thread(target=r0)
    t.start()
    vecs, how = collective.compute(cfg, "n2", 1, [0])

    def squat():  # the squatter answers nothing useful
        c, _ = squatter.accept()
        c.recv(100)
        c.close()
    s = threading.Thread(target=squat, daemon=True)
    s.start()
    out[1] = collective.join(f"{job}.0", 1, {"node": "n2", "health": "", "how": how, "vectors": {"0": vecs[0]}},
                             "127.0.0.1", cands, 20)
    t.join(30)
    squatter.close()
    assert out[0]["ok"] and out[1]["ok"]


def test_collective_reports_a_failing_health_check_with_its_node(tmp_path):
    from slurm_ft.nvml import fake
    cfg = _lab_cfg(tmp_path)
    fake.set_gpu_field(str(tmp_path / "n2.json"), 0, "row_remap_pending", "true")
    every = {}
    for r, node in ((0, "n1"), (1, "n2")):
        vecs, how = collective.compute(cfg, node, r, [0, 1])
        every[r] = {"node": node, "health": collective.health(cfg, node), "how": how,
                    "vectors": {str(g): v for g, v in vecs.items()}}
    answer = collective.reduce_and_check(every)
    assert not answer["ok"] and "n2: row_remap" in answer["why"]


def test_collective_main_outside_srun_exits_2():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    p = subprocess.run([sys.executable, "-m", "slurm_ft.bisect.collective"], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "not run under srun" in p.stderr


# ------------------------------------------------------------------------------ runner and CLI
def test_srun_arguments_are_an_argv_with_whole_nodes_and_no_shell():
    spec = runner.Spec.from_cli("all_reduce_perf -b 8 -e '128M'", gpus_per_node=8, timeout_s=125, partition="gpu")
    args = spec.srun_args(("n1", "n2", "n3"), "x-r1-1")
    assert args[args.index("--") + 1:] == ["all_reduce_perf", "-b", "8", "-e", "128M"]
    assert "--nodelist=n[1-3]" in args and "--nodes=3" in args and "--exclusive" in args
    assert "--gres=gpu:8" in args and "--time=3" in args and "--partition=gpu" in args
    default = runner.Spec.from_cli(None)
    assert default.name == runner.DEFAULT_TEST
    assert default.program()[1:] == ["-m", "slurm_ft.bisect.collective"]
    with pytest.raises(runner.BisectError):
        runner.Spec.from_cli("'unbalanced")


class FakeSlurm:
    """srun answers by node set: the listed bad node fails its test."""

    def __init__(self, bad, refuse=False):
        self.bad, self.refuse, self.calls, self.drained = bad, refuse, [], []
        self.next = 10

    def nodes(self):
        from slurm_ft.slurm import Node
        return [Node(n, "IDLE", [], "", "", "", "", {"gres": "gpu:2"}) for n in NODES]

    def run(self, cmd, *args, check=True, timeout_s=None):
        assert cmd == "srun"
        nodes = [a.split("=", 1)[1] for a in args if a.startswith("--nodelist=")][0]
        from slurm_ft.slurm import split_nodes
        self.calls.append(split_nodes(nodes))
        if self.refuse:
            return subprocess.CompletedProcess([], 1, "", "srun: error: Invalid partition name specified\n")
        self.next += 1
        fail = self.bad in split_nodes(nodes)
        return subprocess.CompletedProcess([], 1 if fail else 0,
                                           "collective: FAIL: result wrong\n" if fail else "collective: PASS\n",
                                           f"srun: jobid {self.next}: nodes(2)\n")

    def show_node(self, node):
        return {"State": "IDLE", "Reason": ""}

    def drain(self, node, reason):
        self.drained.append((node, {"State": "DRAIN", "Reason": reason}))


def test_run_bisect_drains_the_culprit_naming_the_test_and_journals_every_round(tmp_path):
    from slurm_ft import config
    from slurm_ft.bisect import Spec, run_bisect
    from slurm_ft.journal import open_journal
    cfg = config.from_dict({"journal": {"path": str(tmp_path / "d.db")}})
    slurm = FakeSlurm("n4")
    lines = []
    with open_journal(tmp_path / "d.db") as j:
        rep = run_bisect(cfg, slurm, NODES, Spec.from_cli(None), journal=j, job=55, attempt=1, log=lines.append)
        acts = j.actions(55, 1)
    assert rep.result.culprits == ["n4"] and len(rep.result.rounds) == 3
    (node, fields), = slurm.drained
    assert node == "n4" and fields["State"] == "DRAIN"
    assert fields["Reason"].startswith("slurm-ft: bisect: health+collective fails with n4 (round 3 of 3)")
    assert [a["action"] for a in acts] == ["bisect-round"] * 3 + ["bisect"]
    assert json.loads(acts[0]["detail"])["tests"][0]["job"] == 11
    assert json.loads(acts[-1]["detail"])["culprits"] == ["n4"]
    assert any(line.startswith("round 3") and "n4+" in line and "FAIL" in line for line in lines)


def test_a_test_that_cannot_start_stops_the_bisect_and_blames_nobody(tmp_path):
    from slurm_ft import config
    from slurm_ft.bisect import BisectError, Spec, run_bisect
    slurm = FakeSlurm("n4", refuse=True)
    with pytest.raises(BisectError, match="could not run"):
        run_bisect(config.Config(), slurm, NODES, Spec.from_cli(None), log=lambda *_: None)
    assert slurm.drained == []


def test_a_test_failing_everywhere_drains_nothing(tmp_path):
    from slurm_ft import config
    from slurm_ft.bisect import Spec, run_bisect

    class AllBad(FakeSlurm):
        def run(self, cmd, *args, **kw):
            p = super().run(cmd, *args, **kw)
            return subprocess.CompletedProcess([], 1, "FAIL\n", p.stderr)
    slurm = AllBad("none")
    lines = []
    run_bisect(config.Config(), slurm, NODES, Spec.from_cli(None), log=lines.append)
    assert slurm.drained == [] and any("not draining" in line for line in lines)


def test_unusable_nodes_are_refused_before_any_job():
    from slurm_ft.slurm import Node

    class Drained(FakeSlurm):
        def nodes(self):
            return [Node(n, "IDLE", ["DRAIN"] if n == "n2" else [], "fan" if n == "n2" else "", "", "", "", {})
                    for n in NODES]
    s = Drained("n4")
    with pytest.raises(runner.BisectError, match="n2 .*fan"):
        runner.check_nodes(s, NODES)
    with pytest.raises(runner.BisectError, match="no such node: x9"):
        runner.check_nodes(s, ["n1", "x9"])
    assert s.calls == []


def test_auto_bisect_only_for_unblamed_infra_or_unknown_multi_node_failures():
    from slurm_ft import config
    from slurm_ft.bisect import auto_bisect_wanted
    from slurm_ft.failover.policy import Decision
    on = config.from_dict({"bisect": {"auto": True}})
    infra = Decision("failover", "infra", (), ({"node": "n1", "verdict": "infra", "rule": "x"},))
    hw = Decision("failover", "hw", ("n1",), ({"node": "n1", "verdict": "hardware", "rule": "x"},))
    user = Decision("user-error", "u", (), ({"node": "n1", "verdict": "user", "rule": "x"},))
    assert auto_bisect_wanted(on, infra, ["n1", "n2"])
    assert not auto_bisect_wanted(config.Config(), infra, ["n1", "n2"])     # off by default
    assert not auto_bisect_wanted(on, infra, ["n1"])                         # one node: nothing to bisect
    assert not auto_bisect_wanted(on, hw, ["n1", "n2"])                      # a node is already blamed
    assert not auto_bisect_wanted(on, user, ["n1", "n2"])


def test_cli_usage_errors():
    from click.testing import CliRunner

    from slurm_ft.cli import main
    r = CliRunner().invoke(main, ["bisect", "--nodes", "n[1-"])
    assert r.exit_code == 1 and "Error:" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["bisect"])
    assert r.exit_code == 2
