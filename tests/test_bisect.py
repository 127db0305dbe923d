"""Bisect diagnosis (issue 13): the search against simulated tests, the shipped collective test
over real sockets, the runner's srun arguments and records, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.bisect import collective, meeting, runner
from slurm_ft.bisect.meeting import Meeting, MeetingError, Ticket, unseal
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


def _ticket(nodes=("n1", "n2"), key=None, **kw):
    return Ticket(key or os.urandom(32), kw.pop("bisect", "b1"), kw.pop("round", 1), kw.pop("test", 1), tuple(nodes),
                  kw.pop("tasks_per_node", 1))


def _payload(cfg, node, rank, gpus=(0,)):
    vecs, how = collective.compute(cfg, node, rank, list(gpus))
    return {"node": node, "health": collective.health(cfg, node) if cfg is not _Plain else "", "how": how,
            "vectors": {str(g): v for g, v in vecs.items()}}


class _Plain:
    """A config whose GPUs are computed on the CPU (no fake inventory)."""
    class nvml:
        backend = "none"


def _job():
    """A job id whose 16 candidate ports no other test of this run shares."""
    global _JOB
    _JOB += 1
    return _JOB


_JOB = 1000 + (os.getpid() % 300) * 40


def _meet(ticket, job, payloads, *, serve_kw=None, join_kw=None, before_ranks=None, timeout_s=20.0):
    """Rank 0 and ranks 1.. of one meeting in threads; ``before_ranks(port)`` runs once rank 0
    listens and before any other rank starts. Returns ({rank: answer or exception}, seconds)."""
    size = len(payloads)
    cands = collective.ports(job, 0)
    out, listening = {}, threading.Event()
    port = []

    def run(rank):
        m = Meeting(ticket, f"{job}.0", size)
        try:
            if rank == 0:
                out[0] = m.serve(payloads[0], cands, timeout_s, collective.reduce_and_check,
                                 on_listen=lambda p: (port.append(p), listening.set()), **(serve_kw or {}))
            else:
                out[rank] = m.join(rank, payloads[rank]["node"], payloads[rank], "127.0.0.1", cands, timeout_s,
                                   **(join_kw or {}))
        except OSError as exc:
            out[rank] = exc

    t0 = time.monotonic()
    r0 = threading.Thread(target=run, args=(0,))
    r0.start()
    assert listening.wait(10)
    if before_ranks:
        before_ranks(port[0])
    others = [threading.Thread(target=run, args=(r,)) for r in range(1, size)]
    for t in others:
        t.start()
    for t in [r0, *others]:
        t.join(timeout_s + 10)
    return out, time.monotonic() - t0


@pytest.mark.parametrize("corrupt", [None, ("n2", 1)])
def test_collective_over_real_sockets_detects_a_corrupting_gpu(tmp_path, corrupt):
    cfg = _lab_cfg(tmp_path, corrupt)
    answers, _ = _meet(_ticket(), _job(), [_payload(cfg, "n1", 0, (0, 1)), _payload(cfg, "n2", 1, (0, 1))])
    assert answers[0] == answers[1]
    assert answers[0]["ok"] is (corrupt is None), answers[0]
    if corrupt:
        assert "result wrong" in answers[0]["why"] and "n2" not in answers[0]["why"]  # like NCCL: not who


def test_collective_skips_a_listener_of_another_job(tmp_path):
    """A squatter that accepts and never answers, and another test's real rank 0 (its own ticket),
    on the candidate ports before this test's rank 0: both are skipped at once (every port is
    probed concurrently; only a hello MAC'd with this test's ticket counts), not after a deadline."""
    job = _job()
    cands = collective.ports(job, 0)
    squatter, _ = _squat(cands)
    held = []
    stop = threading.Event()

    def squat():                       # accepts, reads nothing, answers nothing, closes nothing
        squatter.settimeout(0.05)
        while not stop.is_set():
            try:
                held.append(squatter.accept()[0])
            except OSError:
                pass
    threading.Thread(target=squat, daemon=True).start()
    other = Meeting(_ticket(test=2), f"{job}.0", 2)     # another test of the same bisect and step tag
    other_out = {}
    other_t = threading.Thread(target=lambda: other_out.setdefault(0, _catch(
        other.serve, _payload(_Plain, "n1", 0), cands, 0.8, collective.reduce_and_check)))
    other_t.start()
    try:
        answers, took = _meet(_ticket(), job, [_payload(_Plain, "n1", 0), _payload(_Plain, "n2", 1)],
                              join_kw={"hello_timeout_s": 5.0})
    finally:
        stop.set()
        other_t.join(10)
        squatter.close()
        for c in held:
            c.close()
    assert answers[0]["ok"] and answers[1] == answers[0], answers
    assert held, "the rank never tried the squatter's port"
    assert took < 1.5, f"{took:.2f} s: a silent listener stalled the meeting"
    assert isinstance(other_out[0], MeetingError)        # the other test's rank 0 got no join from us


def _squat(cands, skip=()):
    """A listening socket on the first free candidate port not in ``skip`` (any process on the
    host may hold one, as an ephemeral port), and its port."""
    import socket
    for port in cands:
        if port in skip:
            continue
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            s.close()
            continue
        s.listen(16)
        return s, port
    raise AssertionError("no free candidate port")


def _catch(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except OSError as exc:
        return exc


# ---- hostile peers (hypothesis): what arrives on the meeting's ports without this test's ticket
HOSTILE_TO_RANK0 = ["wrong_mac", "no_mac", "garbage", "oversized", "silent", "slow_loris", "other_round",
                    "other_bisect", "other_tag", "other_conn_nonce", "other_probe_nonce", "rank_out_of_range",
                    "node_not_in_test", "hello_as_join", "half_line_then_close", "garbage_probe",
                    "oversized_probe", "slow_loris_probe"]


def _hostile_rank0(kind, port, ticket, tag, size, rng, ready, stop, log, errors):
    """One hostile client of rank 0's port. Key holders' forgeries (other round, bisect, tag,
    connection, a rank or node outside the test) model replays and misdirected ranks."""
    import socket
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        log.append(kind)
        probe = os.urandom(16).hex().encode() + b"\n"
        if kind in ("silent", "slow_loris_probe", "garbage_probe", "oversized_probe"):
            data = {"silent": b"", "slow_loris_probe": probe, "garbage_probe": rng.randbytes(40) + b"\n",
                    "oversized_probe": b"a" * (meeting.MAX_SHORT_LINE + 1)}[kind]
            if kind == "silent" or kind == "slow_loris_probe":
                ready.set()
            for b in data if kind == "slow_loris_probe" else [data] if data else []:
                if stop.wait(0.01 if kind == "slow_loris_probe" else 0):
                    return
                try:
                    s.sendall(bytes([b]) if isinstance(b, int) else b)
                except OSError:
                    return
            stop.wait(30) if kind == "silent" else None
            return
        s.sendall(probe)
        hello = unseal(ticket.key, s.makefile("rb").readline(meeting.MAX_SHORT_LINE))
        assert hello["cnonce"] == probe[:-1].decode()
        snonce = hello["snonce"]
        corrupt = {"node": "n1", "health": "fake: failing", "how": "cpu",
                   "vectors": {"0": [rng.random() for _ in range(collective.LENGTH)]}}
        body = {"kind": "join", "bisect": ticket.bisect, "round": ticket.round, "test": ticket.test, "tag": tag,
                "rank": rng.randrange(1, size), "node": rng.choice(ticket.nodes), "snonce": snonce,
                "cnonce": hello["cnonce"], "payload": corrupt}
        key = ticket.key
        if kind == "wrong_mac":
            key = os.urandom(32)
        elif kind == "other_round":
            body["round"] += 1
        elif kind == "other_bisect":
            body["bisect"] += "x"
        elif kind == "other_tag":
            body["tag"] = "1.0"
        elif kind == "other_conn_nonce":
            body["snonce"] = "0" * 32
        elif kind == "other_probe_nonce":
            body["cnonce"] = "0" * 32
        elif kind == "rank_out_of_range":
            body["rank"] = rng.choice([0, -1, size, size + 7, True, "1", 1.0])
        elif kind == "node_not_in_test":
            body["node"] = rng.choice(["n9", "", "n1 ", None, 1])
        elif kind == "hello_as_join":
            body["kind"] = "hello"
        line = meeting.seal(key, body)
        if kind == "no_mac":
            s.sendall(json.dumps(body).encode() + b"\n")
        elif kind == "garbage":
            s.sendall(rng.randbytes(rng.randrange(0, 300)) + b"\n")
        elif kind == "oversized":
            try:
                s.sendall(b"0" * (meeting.MAX_LINE + 10) + b"\n")
            except OSError:
                pass
        elif kind == "half_line_then_close":
            s.sendall(line[: len(line) // 2])
            return
        elif kind == "slow_loris":
            ready.set()
            for b in line:
                if stop.wait(0.01):
                    return
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    return
            return
        else:
            s.sendall(line)
        s.settimeout(5)
        try:
            reply = s.recv(4096)
        except ConnectionResetError:
            reply = b""
        if reply != b"":
            errors.append(f"{kind}: rank 0 answered a hostile join: {reply!r}")
    except Exception as exc:       # noqa: BLE001 - reported by the test, not lost in a thread
        errors.append(f"{kind}: {type(exc).__name__}: {exc}")
    finally:
        ready.set()
        s.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(HOSTILE_TO_RANK0), min_size=1, max_size=6),
       corrupt=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_hostile_peers_never_steer_rank_0s_verdict_nor_stall_it(kinds, corrupt, seed, monkeypatch_module):
    """Hostile clients connect to rank 0 first and stay (silent, a byte at a time) or send forged,
    replayed, misdirected, oversized or broken joins; the 3 genuine ranks then meet: the verdict
    is exactly the genuine one, and nobody waits for a stalled peer's deadline."""
    import random
    rng = random.Random(seed)
    ticket = _ticket(("n1", "n2", "n3"))
    job = _job()
    tag = f"{job}.0"
    payloads = [_payload(_Plain, f"n{r + 1}", r) for r in range(3)]
    if corrupt:
        payloads[2]["vectors"]["0"][collective.CORRUPT_INDEX] += 1.0
    stop, log, threads, errors = threading.Event(), [], [], []

    def attack(port):
        for kind in kinds:
            ready = threading.Event()
            t = threading.Thread(target=_hostile_rank0, daemon=True,
                                 args=(kind, port, ticket, tag, 3, rng, ready, stop, log, errors))
            t.start()
            threads.append(t)
            assert ready.wait(10)
    conn_timeout = 4.0
    try:
        answers, took = _meet(ticket, job, payloads, before_ranks=attack, serve_kw={"conn_timeout_s": conn_timeout})
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert sorted(log) == sorted(kinds) and errors == [], errors     # every attack reached rank 0
    assert all(isinstance(a, dict) for a in answers.values()), answers
    assert answers[0]["ok"] is (not corrupt) and answers[1] == answers[2] == answers[0]
    assert "over 3 ranks, 3 GPUs" in answers[0]["why"]
    assert took < conn_timeout, f"{took:.2f} s: the meeting waited for a stalled peer"


@pytest.fixture(scope="module")
def monkeypatch_module():
    """A smaller :data:`meeting.MAX_LINE` for the module (an oversized line is quick to send)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(meeting, "MAX_LINE", 1 << 16)
    yield mp
    mp.undo()


HOSTILE_LISTENER = ["silent", "forged_hello", "no_mac", "garbage", "oversized", "slow_loris", "other_test_hello",
                    "replayed_hello_then_forged_answer", "close_at_once"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(HOSTILE_LISTENER), min_size=1, max_size=4), corrupt=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_hostile_listeners_on_the_candidate_ports_never_steer_a_rank(kinds, corrupt, seed):
    """Listeners squat the candidate ports before rank 0's and answer a probing rank with silence,
    forged, replayed or oversized hellos, or a forged verdict: the rank joins the real rank 0 and
    returns exactly its verdict, without waiting for any listener's deadline."""
    import random
    rng = random.Random(seed)
    ticket = _ticket()
    job = _job()
    tag = f"{job}.0"
    cands = collective.ports(job, 0)
    stop, held, socks = threading.Event(), [], []

    def listener(kind, sock):
        sock.settimeout(0.05)
        while not stop.is_set():
            try:
                c, _ = sock.accept()
            except OSError:
                continue
            held.append(c)
            other = dict(kind="hello", bisect=ticket.bisect, round=ticket.round, test=ticket.test + 1, tag=tag,
                         snonce="s")
            try:
                if kind == "forged_hello":
                    c.sendall(meeting.seal(os.urandom(32), {**other, "test": ticket.test}))
                elif kind == "no_mac":
                    c.sendall(json.dumps({**other, "test": ticket.test}).encode() + b"\n")
                elif kind == "garbage":
                    c.sendall(rng.randbytes(200) + b"\n")
                elif kind == "oversized":
                    c.sendall(b"x" * (meeting.MAX_SHORT_LINE + 5))
                elif kind == "slow_loris":
                    c.sendall(b"a")
                elif kind == "other_test_hello":
                    c.sendall(meeting.seal(ticket.key, other))           # a real hello of another test
                elif kind == "replayed_hello_then_forged_answer":
                    c.sendall(meeting.seal(ticket.key, {**other, "test": ticket.test}))  # replayed, old nonce
                    c.sendall(json.dumps({"ok": False, "why": "forged"}).encode() + b"\n")
                elif kind == "close_at_once":
                    c.close()
            except OSError:
                pass

    taken = []
    for kind in kinds:
        s, port = _squat(cands, taken)
        taken.append(port)
        socks.append(s)
        threading.Thread(target=listener, args=(kind, s), daemon=True).start()
    payloads = [_payload(_Plain, "n1", 0), _payload(_Plain, "n2", 1)]
    if corrupt:
        payloads[1]["vectors"]["0"][collective.CORRUPT_INDEX] += 1.0
    try:
        answers, took = _meet(ticket, job, payloads, join_kw={"hello_timeout_s": 3.0})
    finally:
        stop.set()
        for c in held + socks:
            c.close()
    assert answers[0]["ok"] is (not corrupt) and answers[1] == answers[0], answers
    assert took < 1.5, f"{took:.2f} s: a listener stalled the rank"


def test_a_relay_that_forges_rank_0s_answer_makes_the_test_not_run(tmp_path):
    """A relay between a rank and the real rank 0 passes the genuine hello and join, then forges
    the answer: the rank rejects it (MeetingError, NOT RUN), it never takes it as a verdict."""
    import socket
    ticket, job = _ticket(), _job()
    cands = collective.ports(job, 0)
    relay, relay_port = _squat(cands)
    listening = []
    r0 = Meeting(ticket, f"{job}.0", 2)
    threading.Thread(target=_catch, args=(r0.serve, _payload(_Plain, "n1", 0), [p for p in cands if p != relay_port],
                                          5, collective.reduce_and_check), kwargs={"on_listen": listening.append},
                     daemon=True).start()
    while not listening:
        time.sleep(0.01)

    def run_relay():
        c, _ = relay.accept()
        up = socket.create_connection(("127.0.0.1", listening[0]), timeout=5)
        down_r, up_r = c.makefile("rb"), up.makefile("rb")
        up.sendall(down_r.readline())                                 # the rank's probe
        c.sendall(up_r.readline())                                    # the genuine hello
        up.sendall(down_r.readline())                                 # the genuine join
        c.sendall(meeting.seal(os.urandom(32), {"kind": "answer", "ok": False}))   # a forged verdict
        up.close()
    threading.Thread(target=run_relay, daemon=True).start()
    with pytest.raises(MeetingError, match="answer is not valid"):
        Meeting(ticket, f"{job}.0", 2).join(1, "n2", _payload(_Plain, "n2", 1), "127.0.0.1", [relay_port], 5)
    relay.close()


def test_a_missing_rank_fails_the_meeting_at_its_deadline_and_says_what_was_refused():
    """Only a silent peer connects: rank 0 drops it at its per-connection deadline and, with no
    genuine rank, gives up at the meeting's deadline: a MeetingError (NOT RUN), never a verdict."""
    import socket
    ticket, job = _ticket(), _job()
    cands = collective.ports(job, 0)
    port, held = [], []
    m = Meeting(ticket, f"{job}.0", 2)
    got = {}

    def serve():
        got["r"] = _catch(m.serve, _payload(_Plain, "n1", 0), cands, 1.5, collective.reduce_and_check,
                          conn_timeout_s=0.5, on_listen=port.append)
    t = threading.Thread(target=serve)
    t0 = time.monotonic()
    t.start()
    while not port:
        time.sleep(0.01)
    held.append(socket.create_connection(("127.0.0.1", port[0])))
    t.join(10)
    took = time.monotonic() - t0
    assert isinstance(got["r"], MeetingError), got
    assert "1 of 2 ranks joined" in str(got["r"]) and "no valid join in time: 1" in str(got["r"])
    assert 1.4 < took < 3.0
    for c in held:
        c.close()


def test_more_pending_connections_than_the_cap_evict_the_oldest_not_the_meeting():
    import socket
    ticket, job = _ticket(), _job()
    held = []

    def flood(port):
        for _ in range(12):
            held.append(socket.create_connection(("127.0.0.1", port)))
    answers, took = _meet(ticket, job, [_payload(_Plain, "n1", 0), _payload(_Plain, "n2", 1)],
                          before_ranks=flood, serve_kw={"max_pending": 4})
    for c in held:
        c.close()
    assert answers[0]["ok"] and answers[1] == answers[0]


# ---- the structural rules, each over generated input
@settings(max_examples=300, deadline=None)
@given(body=st.dictionaries(st.sampled_from(["kind", "bisect", "round", "test", "tag", "rank", "node", "snonce",
                                             "cnonce", "payload"]),
                            st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.text(max_size=6),
                                      st.sampled_from(["join", "b1", "7.0", "n1", "n2", "n3", "s", "c"]))),
       base=st.booleans())
def test_rank_0_counts_only_the_tests_ranks_and_nodes_each_once(body, base):
    """Whatever a (MAC-valid) join holds, rank 0 counts it only when every field is this test's
    and the rank and node are free; a second claim of a counted rank is always refused."""
    from collections import Counter
    ticket = _ticket(("n1", "n2", "n3"))
    m = Meeting(ticket, "7.0", 3)
    if base:
        body = {"kind": "join", "bisect": "b1", "round": 1, "test": 1, "tag": "7.0", "rank": 1, "node": "n2",
                "snonce": "s", "cnonce": "c", **body}
    conn = meeting._Conn(None, 0.0, 0, snonce="s", cnonce="c")
    joined, per_node = {}, Counter({"n1": 1})
    why = m.accept_join(body, conn, joined, per_node)
    valid = (body.get("kind") == "join" and body.get("bisect") == "b1" and type(body.get("round")) is int
             and body.get("round") == 1 and type(body.get("test")) is int and body.get("test") == 1
             and body.get("tag") == "7.0" and body.get("snonce") == "s" and body.get("cnonce") == "c"
             and type(body.get("rank")) is int and body.get("rank") in (1, 2) and body.get("node") in ("n2", "n3"))
    assert (why == "") is valid, (why, body)
    if valid:
        assert m.accept_join(dict(body), conn, joined, per_node) == f"rank {body['rank']} claimed twice"
        other = {**body, "rank": 3 - body["rank"]}
        assert m.accept_join(other, conn, joined, per_node) == f"more ranks from {body['node']} than tasks per node"


@settings(max_examples=300, deadline=None)
@given(body=st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=10)), max_size=5),
       flip=st.integers(0, 10_000), byte=st.integers(1, 255))
def test_a_sealed_line_changed_anywhere_is_refused_before_parsing(body, flip, byte):
    key = os.urandom(32)
    line = meeting.seal(key, body)
    assert meeting.unseal(key, line) == body
    assert meeting.unseal(os.urandom(32), line) is None
    i = flip % (len(line) - 1)
    changed = line[:i] + bytes([line[i] ^ byte]) + line[i + 1:]
    assert meeting.unseal(key, changed) is None


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(st.binary(max_size=200), st.builds(
    lambda d: json.dumps(d).encode(),
    st.dictionaries(st.sampled_from(["key", "bisect", "round", "test", "nodes", "tasks_per_node"]),
                    st.one_of(st.none(), st.integers(-2, 3), st.text(max_size=70), st.lists(st.text(max_size=3)),
                              st.just("ab" * 32))))))
def test_a_ticket_is_parsed_or_refused_never_half_read(data):
    try:
        t = Ticket.parse(data)
    except MeetingError:
        return
    assert len(t.key) == 32 and t.nodes and t.round >= 1 and t.test >= 1 and t.tasks_per_node >= 1
    assert Ticket.parse(t.line()) == t


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
    p = subprocess.run([sys.executable, "-I", "-m", "slurm_ft.bisect.collective"], env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and "not run under srun" in p.stderr


@pytest.mark.parametrize("stdin", [b"", b"not json\n", b'{"key": "00"}\n'])
def test_collective_without_a_valid_ticket_does_not_run(stdin):
    import io
    env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURMD_NODENAME": "n2"}
    out = io.StringIO()
    import contextlib
    with contextlib.redirect_stdout(out):
        rc = collective.main(env, io.BytesIO(stdin))
    assert rc == 2 and out.getvalue().startswith(collective.NOT_RUN), out.getvalue()


def test_collective_on_a_node_the_ticket_does_not_name_does_not_run():
    import contextlib
    import io
    env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURMD_NODENAME": "n9"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = collective.main(env, io.BytesIO(_ticket().line()))
    assert rc == 2 and "n9 is not one of the test's nodes" in out.getvalue()


def test_every_python_the_package_starts_is_isolated():
    """Root runs ``python -I`` only: no ``sys.executable, "-m"`` argv anywhere in the package (the
    lab's own harness aside), so a ``slurm_ft/`` in a working directory or a ``PYTHON*`` variable
    never runs as root."""
    import pathlib
    import re
    import slurm_ft
    root = pathlib.Path(slurm_ft.__file__).parent
    bad = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py") if "lab" not in p.relative_to(root).parts
           for n, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"sys\.executable\s*,\s*[\"'](?!-I)", line)]
    assert bad == []


# ------------------------------------------------------------------------------ runner and CLI
def test_srun_arguments_are_an_argv_with_whole_nodes_and_no_shell():
    spec = runner.Spec.from_cli("all_reduce_perf -b 8 -e '128M'", gpus_per_node=8, timeout_s=125, partition="gpu")
    args = spec.srun_args(("n1", "n2", "n3"), "x-r1-1")
    assert args[args.index("--") + 1:] == ["all_reduce_perf", "-b", "8", "-e", "128M"]
    assert "--nodelist=n[1-3]" in args and "--nodes=3" in args and "--exclusive" in args
    assert "--gres=gpu:8" in args and "--time=3" in args and "--partition=gpu" in args
    assert "--chdir=/" in args and "--export=PATH,LC_ALL,SLURM_CONF" in args
    assert not [a for a in args if a.startswith("--input")]
    default = runner.Spec.from_cli(None)
    assert default.name == runner.DEFAULT_TEST
    assert default.program()[1:] == ["-I", "-m", "slurm_ft.bisect.collective"]
    assert "--input=/t/r1-1" in default.srun_args(("n1", "n2"), "x", "/t/r1-1")


def test_tickets_are_root_only_files_gone_when_the_bisect_ends():
    import stat
    with runner.Tickets() as tickets:
        path = tickets.write(2, 3, Test(("n1", "n4"), ("n4",)), 1)
        assert stat.S_IMODE(os.stat(tickets.dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with open(path, "rb") as fh:
            t = Ticket.read(fh)
        assert (t.key, t.bisect, t.round, t.test, t.nodes) == (tickets.key, tickets.bisect, 2, 3, ("n1", "n4"))
        where = tickets.dir
    assert not os.path.exists(where)
    assert runner.Tickets().key != runner.Tickets().key
    with pytest.raises(runner.BisectError):
        runner.Spec.from_cli("'unbalanced")


class FakeSlurm:
    """srun answers by node set: the listed bad node fails its test."""

    def __init__(self, bad, refuse=False):
        self.bad, self.refuse, self.calls, self.drained = bad, refuse, [], []
        self.next = 10
        self.tickets = []

    def nodes(self):
        from slurm_ft.slurm import Node
        return [Node(n, "IDLE", [], "", "", "", "", {"gres": "gpu:2"}) for n in NODES]

    def run(self, cmd, *args, check=True, timeout_s=None):
        assert cmd == "srun"
        nodes = [a.split("=", 1)[1] for a in args if a.startswith("--nodelist=")][0]
        from slurm_ft.slurm import split_nodes
        self.calls.append(split_nodes(nodes))
        for a in args:
            if a.startswith("--input="):
                with open(a.split("=", 1)[1], "rb") as fh:
                    self.tickets.append(Ticket.read(fh))
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


def test_each_test_gets_its_own_ticket_of_one_bisect_secret(tmp_path):
    from slurm_ft import config
    from slurm_ft.bisect import Spec, run_bisect
    slurm = FakeSlurm("n4")
    run_bisect(config.Config(), slurm, NODES, Spec.from_cli(None), drain=False, log=lambda *_: None)
    assert len(slurm.tickets) == len(slurm.calls) == 6
    assert len({t.key for t in slurm.tickets}) == 1 and len({t.bisect for t in slurm.tickets}) == 1
    assert len({(t.round, t.test) for t in slurm.tickets}) == 6
    # a round's tests run at once: tickets and srun calls pair up by round, not by start order
    assert sorted(sorted(t.nodes) for t in slurm.tickets) == sorted(sorted(c) for c in slurm.calls)


@pytest.mark.parametrize("rc", [0, 1, 2, 143])
def test_a_failed_meeting_is_not_run_and_drains_nobody(tmp_path, rc):
    """A test whose ranks report ``collective: NOT RUN`` (no meeting: a hostile peer, a lost
    answer) says nothing about its nodes, whatever srun's exit: the bisect stops, nobody drained."""
    from slurm_ft import config
    from slurm_ft.bisect import BisectError, Spec, run_bisect

    class NoMeeting(FakeSlurm):
        def run(self, cmd, *args, **kw):
            p = super().run(cmd, *args, **kw)
            from slurm_ft.slurm import split_nodes
            nodes = [a.split("=", 1)[1] for a in args if a.startswith("--nodelist=")][0]
            if "n3" in split_nodes(nodes):
                return subprocess.CompletedProcess([], rc, "collective: NOT RUN: rank 0 on n1: 1 of 2 ranks joined "
                                                   "within 90 s\ncollective: FAIL: forged\n", p.stderr)
            return p
    slurm = NoMeeting("n3")
    lines = []
    with pytest.raises(BisectError, match="could not run on .*NOT RUN"):
        run_bisect(config.Config(), slurm, NODES, Spec.from_cli(None), log=lines.append)
    assert slurm.drained == []
    assert any("NOT RUN" in ln and "FAIL" not in ln.split("NOT RUN")[0].split("|")[-1] for ln in lines), lines


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

    from slurm_ft.cli.main import main
    r = CliRunner().invoke(main, ["bisect", "--nodes", "n[1-"])
    assert r.exit_code == 1 and "Error:" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["bisect"])
    assert r.exit_code == 2
