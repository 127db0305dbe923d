"""Bisect diagnosis on the real lab (issue 13): one node's fake GPU corrupts the collective test
while every health check passes; ``slurm-ft bisect`` finds it in at most 3 rounds and drains it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.nvml import fake

LAB_NODES = int(os.environ.get("SLURM_FT_LAB_NODES", "3"))

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab6(lab):
    """A lab of at least 6 nodes: the session's lab when it has them (SLURM_FT_LAB_NODES=6), else
    a second lab beside it (``<lab dir>-6n``, ports 1000 above the session lab's), taken down at
    the end of this module."""
    if LAB_NODES >= 6:
        yield lab
        return
    from slurm_ft.lab.cluster import Lab
    extra = Lab(f"{lab.lay.dir}-6n", lab.lay.port_base + 1000)
    extra.up(nodes=6, daemon=True, log=lambda *_: None)
    extra.daemon_start()
    try:
        yield extra
    finally:
        extra.down(log=lambda *_: None)


@pytest.fixture
def slurm6(lab6):
    from slurm_ft.lab.demo import reset_nodes
    from slurm_ft.slurm import Slurm
    from slurm_ft.lab.demo import wait_for
    s = Slurm(conf=str(lab6.lay.slurm_conf))
    reset_nodes(lab6, s)
    # bisect refuses nodes Slurm does not hear from (a slurmd another test restarted)
    wait_for(lambda: not any("NOT_RESPONDING" in n.flags for n in s.nodes()), 60, "every node responding", 0.5)
    yield s
    reset_nodes(lab6, s)


def test_bisect_finds_the_node_whose_gpu_fails_the_collective_and_drains_it(lab6, slurm6):
    lab, slurm = lab6, slurm6
    nodes = [f"n{i}" for i in range(1, 7)]
    bad = "n5"
    fake.set_gpu_field(str(lab.lay.inventory(bad)), 1, "collective_corrupt", "true")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "bisect", "--nodes", "n[1-6]", "--json",
                        "--config", str(lab.lay.ft_conf)], capture_output=True, text=True, timeout=600, env=lab.env())
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    out = json.loads(lines[-1])
    assert out["culprits"] == [bad], p.stdout
    assert len(out["rounds"]) <= 3, p.stdout
    # the rounds are printed as they run, each test with its nodes and verdict
    assert [ln.split(" ", 2)[1] for ln in lines if ln.startswith("round ")] == \
        [str(r["round"]) for r in out["rounds"]]
    assert out["rounds"][0]["tests"][0]["nodes"] == "n[1-6]" and not out["rounds"][0]["tests"][0]["passed"]
    # every test ran as a real Slurm job on two or more nodes (a collective)
    for r in out["rounds"]:
        for t in r["tests"]:
            assert t["job"] is not None
            assert len(slurm_nodes(t["nodes"])) >= 2
    # the culprit is drained with a reason naming the test; nobody else is
    reason = slurm.show_node(bad)["Reason"]
    assert reason.startswith(f"slurm-ft: bisect: health+collective fails with {bad}"), reason
    assert out["drained"] == {bad: "drained"}
    for n in nodes:
        if n != bad:
            assert "DRAIN" not in slurm.show_node(n)["State"], n
    # every round is in the daemon journal, under the first test job
    cfg = config_mod.load(lab.lay.ft_conf)
    with open_journal(cfg.journal.path) as j:
        acts = j.actions(out["journal_job"])
    assert [a["action"] for a in acts] == ["bisect-round"] * len(out["rounds"]) + ["bisect"]
    assert json.loads(acts[-1]["detail"])["culprits"] == [bad]
    print(f"bisect: {len(out['rounds'])} rounds, {took:.1f} s, culprit {out['culprits']}")


def test_bisect_with_nothing_wrong_says_so_in_one_round(lab6, slurm6):
    lab = lab6
    p = subprocess.run([sys.executable, "-m", "slurm_ft.cli", "bisect", "--nodes", "n[1-4]", "--json",
                        "--config", str(lab.lay.ft_conf)], capture_output=True, text=True, timeout=300, env=lab.env())
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    assert not out["reproduced"] and out["culprits"] == [] and len(out["rounds"]) == 1
    assert "nothing to find" in p.stdout


def slurm_nodes(expr):
    from slurm_ft.slurm import split_nodes
    return split_nodes(expr)
