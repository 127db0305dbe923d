"""ft-history -N/--nodelist (issue 26): jobs that ran on, were judged on or acted on the given
nodes, and each node's drains and repair steps (slurm_ft.remediate) after the job table. Real
SQLite journals under tmp_path, the CLI through CliRunner; the terminal rule (no journal text puts
a control character on the terminal) proven by hypothesis."""

from __future__ import annotations

import json
import re
import time

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft import config as config_mod
from slurm_ft.history import query as history_mod
from slurm_ft.history import format as fmt
from slurm_ft.history import service as history_service
from slurm_ft.history.query import MAX_NODES, Selection, Viewer, node_steps, parse_nodelist, select
from slurm_ft.cli.history import command
from slurm_ft.history.protocol import BadRequest, encode_query
from slurm_ft.history.service import Access, HistoryService, parse_query
from slurm_ft.journal import open_journal
from slurm_ft.slurm.munge import Credential

NOW = time.time()
#: Any character a terminal could act on: C0/C1 controls and DEL (a line's own newline aside).
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _detail(kind, **fields):
    return json.dumps({"kind": kind, **fields}, sort_keys=True)


def _at(j, t):
    j.clock = lambda: t


def _journal(path, hostile: str = "") -> str:
    """Job 5 (alice) ran on g[001-002] (a folded hostlist), failed on g001: drained, reset (failed),
    rebooted, passed; job 6 (bob) ran on n1 and drained n[1-2] in observe mode; job 7 (bob) has
    only a verdict on g003; job 8 (alice) ran on g004 before the window; job 9 (carol) only a
    remediation row on g003 (attempt 0, as the remediator journals it)."""
    with open_journal(path) as j:
        _at(j, NOW - 7200)
        for job_id, user in ((5, "alice"), (6, "bob"), (7, "bob"), (8, "alice"), (9, "carol")):
            j.upsert_job(job_id, name=f"job{job_id}", user=user, ft_enabled=1, retries=3, ft_state="running",
                         excluded_nodes="")
        j.upsert_attempt(5, 0, nodes="g[001-002]", start=NOW - 600, end=NOW - 500, state="NODE_FAIL")
        j.upsert_attempt(5, 1, nodes="g[005-006]", start=NOW - 400, state="RUNNING")
        j.upsert_attempt(6, 0, nodes="n1", start=NOW - 600, state="RUNNING")
        j.upsert_attempt(7, 0, nodes="x9", start=NOW - 600, state="RUNNING")
        _at(j, NOW - 590)
        j.add_verdict(7, 0, "g003", "hardware", "xid-79", [], [], created=NOW - 590)
        j.upsert_attempt(8, 0, nodes="g004", start=NOW - 90000, end=NOW - 86000, state="FAILED")
        j.upsert_attempt(9, 0, nodes="x1", start=NOW - 600, state="RUNNING")
        _at(j, NOW - 500)
        j.record(5, 0, "drain", "g001", "slurm-ft: Xid 79 GPU 0000:10:00 (job 5)")
        _at(j, NOW - 450)
        aid = j.intend(5, 0, "remediate-reset", "g001", _detail("reset", reason="slurm-ft: remediate: reset GPU"))
        j.finish(aid, "failed", _detail("reset", reason="slurm-ft: remediate: reset GPU", why="scontrol: refused"))
        _at(j, NOW - 400)
        j.record(5, 0, "remediate-reboot", "g001", _detail("reboot", reason="slurm-ft: remediate: reboot (Xid 79)"
                                                             + hostile))
        _at(j, NOW - 300)
        j.record(5, 0, "remediate-pass", "g001", _detail("pass", why="the trusted checks passed"))
        j.record(5, 0, "reconcile", "g001", json.dumps({"kind": "drain-lifted", "why": "g001 resumed by slurm-ft"}))
        _at(j, NOW - 200)
        j.record(6, 0, "drain", "n[1-2]", "slurm-ft: Xid 48 (job 6)", status="observed")
        j.record(6, 0, "remediate-reboot", "n1", _detail("reboot", reason="slurm-ft: remediate: reboot"),
                 status="observed")
        _at(j, NOW - 150)
        j.record(9, 0, "remediate-rma", "g003", _detail("rma", reason="slurm-ft: rma: 3 repairs in 7 days", repairs=3))
        j.record(0, 0, "report-ack", "g003", "GPU replaced, RMA 1234 (by root)")
        j.intend(9, 0, "remediate-reboot", "g003", _detail("reboot"))     # an open intent: no step
        _at(j, NOW - 86500)
        j.record(8, 0, "drain", "g004", "slurm-ft: old drain (job 8)")
    return str(path)


@pytest.fixture
def db(tmp_path):
    return _journal(tmp_path / "j.db")


def run(db, *args, viewer: Viewer | None = None, monkeypatch=None):
    if viewer is not None:
        monkeypatch.setattr(history_mod, "current_viewer", lambda cfg: viewer)
    return CliRunner().invoke(command, [*args, "--journal", db])


def ids(output: str) -> list[str]:
    return [line for line in output.splitlines() if line]


# ------------------------------------------------------------------------------ selection
def test_parse_nodelist():
    assert parse_nodelist("g[001-004],n1") == {"g001", "g002", "g003", "g004", "n1"}
    assert parse_nodelist(" gpu[01-02]-ib ") == {"gpu01-ib", "gpu02-ib"}
    for bad in ("g[1", "n[3-1]", "n1 n2", "x[1-3]^x2", "", "@grp", "n1,,n2", f"n[1-{MAX_NODES + 1}]",
                "a[1-1000]b[1-1000]", "n\x1b[31m", "n1\nn2"):
        with pytest.raises(ValueError) as exc:
            parse_nodelist(bad)
        assert "\n" not in str(exc.value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=6) | st.sampled_from(["[", "]", ",", "-", "/", "n", "1", "0" * 30, "9" * 5000, "@",
                                                        "!", " ", "\x1b"]), max_size=10).map("".join))
def test_any_text_is_a_nodelist_or_one_line_of_error(text):
    try:
        names = parse_nodelist(text)
    except ValueError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 300
    else:
        assert 0 < len(names) <= MAX_NODES
    history_mod._NodeMatch({"n1", "n10"})(text)      # a journal's hostlist: never raises


def test_nodes_select_jobs_by_attempt_verdict_and_action(db):
    def sel(nodes, **kw):
        s = Selection(all_users=True, start=NOW - 3600, nodes=parse_nodelist(nodes), **kw)
        with open_journal(db, readonly=True) as j:
            return [h["job_id"] for h in select(j, s, now=NOW)[0]]

    assert sel("g002") == [5]                    # inside the folded g[001-002] of attempt 0
    assert sel("g[005-009]") == [5]              # attempt 1
    assert sel("g003") == [7, 9]                 # 7: a verdict on it; 9: a remediation row targets it
    assert sel("n2") == [6]                      # the folded drain target n[1-2]
    assert sel("g004") == []                     # before the window
    assert sel("zz1") == []
    s = Selection(all_users=True, start=NOW - 100000, nodes=parse_nodelist("g004"))
    with open_journal(db, readonly=True) as j:
        assert [h["job_id"] for h in select(j, s, now=NOW)[0]] == [8]


def test_nodes_combine_with_users_jobs_states_and_viewer(db, monkeypatch):
    r = run(db, "-a", "-N", "g[001-003],n1", "-X", "-P", "-n", "-o", "JobID")
    assert r.exit_code == 0, r.output
    assert ids(r.output) == ["5", "6", "7", "9"]                       # -P: no node section
    r = run(db, "-u", "bob", "-N", "g[001-003],n1", "-X", "-P", "-n", "-o", "JobID")
    assert ids(r.output) == ["6", "7"]
    r = run(db, "-u", "bob", "-N", "g001", "-X", "-P", "-n", "-o", "JobID")
    assert ids(r.output) == []
    r = run(db, "-j", "5,6", "-N", "n1", "-X", "-P", "-n", "-o", "JobID")
    assert ids(r.output) == ["6"]
    r = run(db, "-a", "-N", "g[001-003]", "-s", "NF", "-X", "-P", "-n", "-o", "JobID")
    assert ids(r.output) == ["5"]
    # an ordinary user: their own jobs only, -a or not (PrivateData=jobs)
    alice = Viewer(1001, "alice", private_jobs=True)
    r = run(db, "-a", "-N", "g[001-004],n1", "-X", "-P", "-n", "-o", "JobID", viewer=alice, monkeypatch=monkeypatch)
    assert ids(r.output) == ["5"]


# ------------------------------------------------------------------------------ the node section
def test_node_section_lists_steps_in_time_order(db):
    r = run(db, "-a", "-N", "g001,n2", "-X")
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.index("Job") < out.index("Node g001: drains and repairs") < out.index("Node n2: drains and repairs")
    g001 = out.split("Node g001: drains and repairs\n")[1].split("\n\n")[0].splitlines()
    assert g001[0].split() == ["Time", "Step", "Status", "JobID", "Reason"]
    steps = [line.split()[1:4] for line in g001[2:]]
    assert steps == [["drain", "done", "5"], ["reset", "failed", "5"], ["reboot", "done", "5"],
                     ["pass", "done", "5"], ["resume", "done", "5"]]
    assert "scontrol: refused" in g001[3]                       # a failed step: why it failed
    assert "slurm-ft: remediate: reboot (Xid 79)" in g001[4]
    assert "the trusted checks passed" in g001[5]
    times = [line.split()[0] for line in g001[2:]]
    assert times == sorted(times)
    n2 = out.split("Node n2: drains and repairs\n")[1].splitlines()
    assert n2[2].split()[1:4] == ["drain", "observed", "6"]      # observe mode: shown as observed
    assert len(n2) == 3                                          # the n1 reboot is n1's, not n2's


def test_node_section_ack_rma_and_no_intents(db):
    r = run(db, "-a", "-N", "g003")
    lines = r.output.split("Node g003: drains and repairs\n")[1].splitlines()[2:]
    assert [line.split()[1:4] for line in lines] == [["rma", "done", "9"], ["ack", "done", "-"]]
    assert "RMA 1234" in lines[1]


def test_no_steps_in_the_window_says_so(db):
    r = run(db, "-a", "-N", "g[005-006]")
    assert r.exit_code == 0, r.output
    assert "No drains or repairs of g[005-006] in the time window." in r.output
    assert "Job 5" in r.output


def test_json_has_a_nodes_key(db):
    r = run(db, "-a", "-N", "g001,n1", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [h["job_id"] for h in doc["jobs"]] == [5, 6]
    assert sorted(doc["nodes"]) == ["g001", "n1"]
    assert [x["step"] for x in doc["nodes"]["g001"]] == ["drain", "reset", "reboot", "pass", "resume"]
    n1 = doc["nodes"]["n1"]
    assert [(x["step"], x["status"], x["job_id"]) for x in n1] == [("drain", "observed", 6), ("reboot", "observed", 6)]
    assert n1[0]["target"] == "n[1-2]" and "detail" in n1[0]
    r = run(db, "-j", "5", "-N", "g001", "--json")              # one job with -N: still the object with both keys
    assert set(json.loads(r.output)) == {"jobs", "nodes"}


def test_parsable_output_has_no_node_section(db):
    for flag in ("-p", "-P"):
        r = run(db, "-a", "-N", "g001", flag)
        assert r.exit_code == 0, r.output
        assert "Node g001" not in r.output and "drains and repairs" not in r.output


def test_an_ordinary_viewer_sees_no_other_users_job_id(db, monkeypatch):
    alice = Viewer(1001, "alice", private_jobs=True)
    r = run(db, "-N", "g001,n1", viewer=alice, monkeypatch=monkeypatch)
    assert r.exit_code == 0, r.output
    g001 = r.output.split("Node g001: drains and repairs\n")[1].split("\n\n")[0].splitlines()[2:]
    assert {line.split()[3] for line in g001} == {"5"}                     # her own job
    n1 = r.output.split("Node n1: drains and repairs\n")[1].splitlines()[2:]
    assert [line.split()[1:4] for line in n1] == [["drain", "observed", "-"], ["reboot", "observed", "-"]]
    assert "job 6" not in r.output and "(job -)" in n1[0]                  # nor in the reason
    doc = json.loads(run(db, "-N", "n1", "--json", viewer=alice, monkeypatch=monkeypatch).output)
    assert doc["jobs"] == [] and all(x["job_id"] is None and "detail" not in x for x in doc["nodes"]["n1"])
    # an admin sees them all
    r = run(db, "-N", "n1", viewer=Viewer(64030, "slurm", True, slurm_user="slurm"), monkeypatch=monkeypatch)
    n1 = r.output.split("Node n1: drains and repairs\n")[1].splitlines()[2:]
    assert [line.split()[3] for line in n1] == ["6", "6"]


@pytest.mark.parametrize("bad", ["g[1", "n[3-1]", "a b", "n[1-99999999999]", "x[1-3]^x2", "@all", "n\x1b]52;c;x\x07"])
def test_bad_hostlist_is_a_usage_error_of_one_line(db, bad):
    r = run(db, "-N", bad)
    assert r.exit_code == 2
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit))
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "-N" in errors[0]
    assert not CONTROL.search(r.output)


def test_hostile_detail_is_escaped_in_the_node_section(tmp_path):
    db = _journal(tmp_path / "j.db", hostile="\x1b[31m\x1b]52;c;aGk=\x07\r\nFAKE LINE\x9b2J\u202e")
    r = run(db, "-a", "-N", "g001")
    assert r.exit_code == 0, r.output
    assert not CONTROL.search(r.output)
    assert "FAKE LINE" in r.output and not any(line.startswith("FAKE") for line in r.output.splitlines())
    assert "\\x1b[31m" in r.output


_TEXT = st.lists(st.text(max_size=8) | st.sampled_from(
    ["\x1b", "\x1b[2J", "\x1b]52;c;aGk=\x07", "\r", "\n", "\x9b", "\x07", "\u202e", "\u2028", "\x00", "\x7f",
     "\udc9b", "(job 6)"]), max_size=8).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(detail=_TEXT, reason=_TEXT, status=st.sampled_from(["done", "failed", "observed", "skipped", "\x1b[1m"]),
       action=st.sampled_from(["drain", "remediate-reboot", "remediate-pass", "report-ack", "reconcile",
                               "remediate-\x1b[2J"]),
       as_json=st.booleans(), job=st.integers(-3, 12))
def test_no_journal_text_reaches_the_terminal_raw(tmp_path_factory, detail, reason, status, action, as_json, job):
    path = tmp_path_factory.mktemp("nodes") / "j.db"
    with open_journal(path) as j:
        j.upsert_job(5, name="x", user="alice", ft_enabled=1, retries=1, ft_state="running", excluded_nodes="")
        j.upsert_attempt(5, 0, nodes="g1", start=NOW - 60, state="RUNNING")
        text = _detail("reboot", reason=reason, why=detail) if action.startswith("remediate") else \
            json.dumps({"kind": "drain-lifted", "why": detail}) if action == "reconcile" else detail
        j.record(job, 0, action, "g1", text, status=status)
        j.record(job, 0, action, "g[1-2]", reason, status=status)
    steps = node_steps(open_journal(path, readonly=True), {"g1"}, NOW - 3600, NOW + 60)
    for line in fmt.node_sections(steps, "g1").splitlines():
        assert not CONTROL.search(line)
    r = CliRunner().invoke(command, ["-a", "-N", "g1", *(["--json"] if as_json else []), "--journal", str(path)])
    assert r.exit_code == 0, r.output
    assert not CONTROL.search(r.output)
    if as_json:
        assert r.output.isascii()


# ------------------------------------------------------------------------------ the service
def test_the_query_carries_nodes_only_when_asked():
    plain = json.loads(encode_query(Selection(start=1.0)))
    assert "nodes" not in plain                          # an older service answers it as before
    names = parse_nodelist("g[001-004],n1,n3,n[10-12]")
    q = encode_query(Selection(start=1.0, nodes=names))
    pieces = json.loads(q)["nodes"]
    assert "g[001-004]" in pieces and "n[10-12]" in pieces and parse_nodelist(",".join(pieces)) == names
    assert parse_query(q).nodes == names
    assert parse_query(encode_query(Selection(start=1.0))).nodes is None
    # an older service (no "nodes" among its fields) refuses with one clear line
    old = json.loads(q)
    for bad in ([], ["g[1"], ["n1 n2"], [7], "g1", [f"n[1-{MAX_NODES}]", f"m[1-{MAX_NODES}]"]):
        with pytest.raises(BadRequest) as exc:
            parse_query(json.dumps({**old, "nodes": bad}).encode())
        assert "\n" not in str(exc.value)


def test_too_many_ranges_for_the_wire_is_a_clear_error():
    names = frozenset(f"n{i}" for i in range(1, 4000, 2))       # 2000 separate nodes
    with pytest.raises(BadRequest, match="too many separate nodes"):
        encode_query(Selection(start=1.0, nodes=names))


def test_the_service_answers_nodes_as_the_viewer_may_see_them(db, monkeypatch):
    class P:
        def __init__(self, name):
            self.pw_name = name

    real = history_service.pwd.getpwuid
    monkeypatch.setattr(history_service.pwd, "getpwuid", lambda uid: P("alice") if uid == 1001 else real(uid))
    cfg = config_mod.from_dict({"journal": {"path": db}})
    svc = HistoryService(cfg, authenticate=lambda text: Credential(int(text.split(":")[1]), 0,
                                                                    bytes.fromhex(text.split(":")[3]), int(NOW)),
                         sign=lambda payload, uid: f"MUNGE:0:{int(NOW)}:{payload.hex()}",
                         access=lambda: Access(True, "slurm"), clock=lambda: NOW)
    q = encode_query(Selection(start=NOW - 3600, nodes=parse_nodelist("g001,n1")))
    raw = svc.handle(f"MUNGE:1001:{int(NOW)}:{q.hex()}".encode())
    reply = json.loads(raw.partition(b"\n")[2])
    assert reply["ok"], reply
    assert [h["job_id"] for h in reply["jobs"]] == [5]
    assert [x["job_id"] for x in reply["nodes"]["g001"]] == [5] * 5
    assert [x["job_id"] for x in reply["nodes"]["n1"]] == [None, None]
    plain = json.loads(svc.handle(f"MUNGE:1001:{int(NOW)}:{encode_query(Selection(start=0.0)).hex()}".encode())
                       .partition(b"\n")[2])
    assert plain["ok"] and "nodes" not in plain
