"""Bisect diagnosis on the real lab (issue 13): one node's fake GPU corrupts the collective test
while every health check passes; ``slurm-ft bisect`` finds it in at most 3 rounds and drains it.
Issue 27: the lab's ordinary user on the meeting ports steers no verdict and drains nothing."""

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
    p = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "bisect", "--nodes", "n[1-6]", "--json",
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
    p = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "bisect", "--nodes", "n[1-4]", "--json",
                        "--config", str(lab.lay.ft_conf)], capture_output=True, text=True, timeout=300, env=lab.env())
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    assert not out["reproduced"] and out["culprits"] == [] and len(out["rounds"]) == 1
    assert "nothing to find" in p.stdout


#: The hostile user's program (stdlib only, run as the lab's ordinary user with the system Python):
#: it squats the first candidate port of each of the next test jobs and answers every rank that
#: probes it with silence, a forged hello, garbage, an oversized line or a forged "FAIL" verdict;
#: and it watches squeue for running bisect tests (job names are public) and hammers their other
#: candidate ports with probes followed by forged joins (rank 1 claiming a failing health check
#: and a wrong vector), silence, a byte at a time, or oversized lines. It stops at EOF on stdin
#: and prints what it did as one JSON line.
HOSTILE = r"""
import json, os, random, socket, subprocess, sys, threading, time
jobs, port_base, span, tries = json.loads(sys.argv[1])
ports = lambda j: [port_base + (j * 31) % span + k for k in range(tries)]
stop = threading.Event()
count = {"squat_ports": 0, "squat_accepts": 0, "probes": 0, "hellos": 0, "forged_joins": 0, "answered": 0}
lock = threading.Lock()
def bump(k):
    with lock:
        count[k] += 1
def forged(kind):
    body = {"kind": kind, "bisect": "x", "round": 1, "test": 1, "tag": "1.0", "rank": 1, "node": "n1",
            "snonce": "0" * 32, "cnonce": "0" * 32, "ok": False, "why": "forged",
            "payload": {"node": "n1", "health": "xid: 79", "how": "cpu", "vectors": {"0": [1.0] * 256}}}
    return os.urandom(32).hex().encode() + b" " + json.dumps(body).encode() + b"\n"
def squatter(sock):
    sock.settimeout(0.1)
    n = 0
    while not stop.is_set():
        try:
            c, _ = sock.accept()
        except OSError:
            continue
        bump("squat_accepts")
        n += 1
        mode = n % 5
        def serve(c=c, mode=mode):
            try:
                c.settimeout(2)
                if mode == 0:
                    stop.wait(10)
                elif mode == 1:
                    c.sendall(forged("hello"))
                elif mode == 2:
                    c.sendall(os.urandom(300) + b"\n")
                elif mode == 3:
                    c.sendall(b"x" * 20000)
                else:
                    c.recv(100)
                    c.sendall(forged("hello") + forged("answer") + b'{"ok": false, "why": "forged"}\n')
                stop.wait(3)
            except OSError:
                pass
            finally:
                c.close()
        threading.Thread(target=serve, daemon=True).start()
for j in jobs:
    for port in ports(j)[:1]:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            s.close()
            continue
        s.listen(64)
        count["squat_ports"] += 1
        threading.Thread(target=squatter, args=(s,), daemon=True).start()
def attack_once(port, mode):
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=0.5)
    except OSError:
        return
    try:
        c.settimeout(2)
        if mode == 0:
            stop.wait(5)
            return
        if mode == 1:
            for b in b"0123456789abcdef0123456789abcdef\n":
                c.sendall(bytes([b]))
                if stop.wait(0.2):
                    return
            return
        if mode == 2:
            c.sendall(b"0" * 2000000)
            return
        bump("probes")
        c.sendall(os.urandom(16).hex().encode() + b"\n")
        hello = c.makefile("rb").readline(8192)
        if hello:
            bump("hellos")
            c.sendall(forged("join"))
            bump("forged_joins")
            if c.recv(100):
                bump("answered")
    except OSError:
        pass
    finally:
        c.close()
def client():
    seen = set()
    n = 0
    while not stop.is_set():
        try:
            out = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i %j"], capture_output=True, text=True,
                                 timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        live = [int(line.split()[0]) for line in out.splitlines() if "slurm-ft-bisect-" in line]
        seen.update(live)
        for j in live:
            for port in ports(j)[1:5]:
                n += 1
                threading.Thread(target=attack_once, args=(port, n % 5), daemon=True).start()
        stop.wait(0.05)
    count["bisect_jobs_seen"] = len(seen)
threading.Thread(target=client, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
stop.set()
time.sleep(0.5)
print(json.dumps(count), flush=True)
"""


def test_a_hostile_user_on_the_meeting_ports_steers_no_verdict(lab6, slurm6):
    """The lab's ordinary user squats and floods the meeting ports of every bisect test job while
    bisect searches 6 nodes, one of them (n5) really corrupting: the verdict is exactly n5, only
    n5 is drained, and the squatted ports were really probed by the tests' ranks."""
    from slurm_ft.bisect import collective
    from slurm_ft.lab.users import LAB_USER, ensure_user
    lab, slurm = lab6, slurm6
    ensure_user()
    env = {**lab.env()}
    first = slurm.run("sbatch", "--parsable", "--hold", "--wrap=true", f"--output={lab.lay.jobs_dir}/%j.out")
    job0 = int(first.stdout.strip().split(";")[0])
    slurm.run("scancel", str(job0))
    jobs = list(range(job0 + 1, job0 + 17))           # a 6-node bisect runs 1 + 3 + 2 test jobs
    arg = json.dumps([jobs, collective.PORT_BASE, collective.PORT_SPAN, collective.PORT_TRIES])
    hostile = subprocess.Popen(["/usr/sbin/runuser", "-u", LAB_USER, "--", "/usr/bin/python3", "-I", "-c", HOSTILE,
                                arg],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C.UTF-8",
                                             "SLURM_CONF": env["SLURM_CONF"]})
    try:
        assert hostile.stdout.readline().strip() == "ready", hostile.stderr.read()
        fake.set_gpu_field(str(lab.lay.inventory("n5")), 1, "collective_corrupt", "true")
        p = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "bisect", "--nodes", "n[1-6]", "--json",
                            "--config", str(lab.lay.ft_conf)], capture_output=True, text=True, timeout=600, env=env)
    finally:
        out, err = hostile.communicate("", timeout=60)
    report = json.loads(out.strip().splitlines()[-1])
    print(f"hostile user: {report}")
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.loads(p.stdout.splitlines()[-1])
    assert result["culprits"] == ["n5"], p.stdout
    assert result["drained"] == {"n5": "drained"}, p.stdout
    for n in [f"n{i}" for i in range(1, 7) if i != 5]:
        assert "DRAIN" not in slurm.show_node(n)["State"], n
    assert report["answered"] == 0                     # no forged join ever got an answer
    assert report["squat_ports"] >= 6 and report["squat_accepts"] >= 1, report   # the ranks met the squatter


def slurm_nodes(expr):
    from slurm_ft.slurm import split_nodes
    return split_nodes(expr)
