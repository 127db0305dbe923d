"""Typed values instead of text parsed back (issue 21): a health drain's check and GPU on the node
record (slurm_ft.drain.reason, slurm_ft.slurm.records.Node.failed_check), and the journal's
typed action columns of migration 011 (failover ``kind``, in-place ``restart``/``restart_of``),
back-filled once from old rows' text."""

from __future__ import annotations

import json
import re
import sqlite3

from hypothesis import assume, example, given, strategies as st

from slurm_ft.drain.reason import LEADER, FailedCheck, health_reason, read_health_reason
from slurm_ft.failover import machine as m
from slurm_ft.health.result import CHECK_NAMES, CheckResult
from slurm_ft.job import inplace
from slurm_ft.job.inplace import Record
from slurm_ft.journal import migrations, open_journal
from slurm_ft.slurm import Job, Node

#: A GPU as a health reason names it (``GPU<n>``, a word of its own).
GPU_WORD = r"\bGPU\d+\b"


def node(reason: str, flags=("DRAIN",)) -> Node:
    return Node.from_json({"name": "n1", "state": "mixed", "state_flags": list(flags), "reason": reason})


# --------------------------------------------------------------------------- (1) health drains
measurements = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=250)


@given(st.sampled_from(CHECK_NAMES), st.one_of(st.none(), st.integers(0, 4096)), measurements)
@example("temperature", 5, "GPU51 at 91 C")           # names GPU5 only as part of another word
@example("xid_events", 2, "Xid 79 on nvGPU2")
@example("nvlink", 5, "GPU3 link to GPU5 down")        # names another GPU first
@example("row_remap", 1, "GPU1 row remap pending")     # names it first: written once
def test_a_health_reason_reads_back_as_its_check_and_gpu(check, gpu, measurement):
    """What :func:`health_reason` writes, :func:`read_health_reason` reads back: the check, and the
    GPU (None for a node-level result whose measurement names no GPU)."""
    assume(gpu is not None or not re.search(GPU_WORD, measurement))   # else the GPU it names is read
    reason = health_reason([CheckResult("gpu_count", "pass", None, "ok"), CheckResult(check, "fail", gpu, measurement)])
    assert reason is not None and reason.startswith(f"{LEADER} {check}: ") and len(reason) <= 200
    assert read_health_reason(reason, CHECK_NAMES) == FailedCheck(check, gpu)
    assert node(reason).failed_check == (check, gpu)
    if gpu is not None and re.match(rf"GPU{gpu}\b", measurement):
        assert reason == f"{LEADER} {check}: {measurement}"[:200]


def test_other_reasons_name_no_failed_check():
    for reason in ("", "bad DIMM, ticket 42", "slurm-ft: Xid 79 GPU 0000:10:00 (job 12)",
                   "slurm-ft: cuda-ecc-uncorrectable, verified (job 12)",
                   "slurm-ft: bisect: nccl fails with n5 (round 3 of 3)", "slurm-ft: nvml_responsive: GPU0 hung",
                   "temperature: GPU1 91 C", "slurm-ft temperature: GPU1 91 C"):
        assert read_health_reason(reason, CHECK_NAMES) is None and node(reason).failed_check is None
    assert read_health_reason("slurm-ft: temperature: GPU1 91 C", ("throttle",)) is None
    assert read_health_reason("slurm-ft:  temperature : GPU12 at 91 C", CHECK_NAMES) is None   # not its shape
    assert read_health_reason("slurm-ft: temperature: GPU12 at 91 C (GPU3 too)", CHECK_NAMES) == ("temperature", 12)
    assert read_health_reason("slurm-ft: xid_events: Xid 79 on nvGPU2", CHECK_NAMES) == ("xid_events", None)


def test_the_machine_reads_the_node_records_typed_check():
    """health_drain reads ``Node.failed_check`` (set from the reason when the record is made), and
    only while the node is drained."""
    drained = node("slurm-ft: temperature: GPU1 91 C")
    assert drained.failed_check == FailedCheck("temperature", 1)
    assert m.health_drain(drained) == ("temperature", 1)
    assert m.health_drain(node("slurm-ft: temperature: GPU1 91 C", flags=())) is None      # resumed
    assert m.health_drain(None) is None
    drained.failed_check = FailedCheck("row_remap", 3)      # the typed field is what is read
    assert m.health_drain(drained) == ("row_remap", 3)
    drained.failed_check = None
    assert m.health_drain(drained) is None
    built = Node("n2", "IDLE", ["DRAIN"], "slurm-ft: pcie_link: link gen 3 < 4", "root", "", "", {})
    assert m.health_drain(built) == ("pcie_link", None)          # any construction reads it once


# --------------------------------------------------------------------------- migration 011
def _journal_before_011(path) -> sqlite3.Connection:
    """A journal as slurm-ft left it before migration 011 (migrations 001-010 applied)."""
    import sqlite_utils

    conn = sqlite3.connect(str(path), isolation_level=None)
    db = sqlite_utils.Database(conn)
    conn.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied REAL)")
    for name, fn in migrations.MIGRATIONS:
        if name == "011_action_typed_columns":
            break
        fn(db)
        conn.execute("INSERT INTO _migrations VALUES (?, 0)", (name,))
    return conn


#: Old rows' text -> the typed columns 011 fills: (action, detail, status, kind, restart, restart_of).
OLD_ROWS = [
    ("failover", json.dumps({"reason": "xid-79", "blamed": ["n1"]}), "done", "blamed", None, None),
    ("failover", json.dumps({"reason": "ib", "blamed": [], "avoid": ["n2"]}), "done", "unblamed", None, None),
    ("failover", "{}", "done", "unblamed", None, None),
    ("failover", "", "done", "unblamed", None, None),
    ("failover", None, "done", "unblamed", None, None),
    ("failover", "[1]", "done", "blamed", None, None),
    ("failover", "requeue refused: Job is pending", "failed", "evacuation", None, None),
    ("inplace-restart", "restart 2/3 in place: infra (ib-completion-error), reported by the job", "done", None, 2, 3),
    ("inplace-restart", "restart 10/12", "done", None, 10, 12),
    ("inplace-restart", "restarted twice", "done", None, None, None),
    ("drain", "slurm-ft: Xid 79 GPU 0000:10:00 (job 5)", "done", None, None, None),
    ("evacuation", "requeued by an admin or Slurm", "done", None, None, None),
]


def test_migration_011_fills_the_typed_columns_of_old_rows_from_their_text(tmp_path):
    path = tmp_path / "old.db"
    conn = _journal_before_011(path)
    for i, (action, detail, status, *_) in enumerate(OLD_ROWS):
        conn.execute("INSERT INTO actions (job_id, attempt, action, target, detail, status, created, uid) "
                     "VALUES (5, ?, ?, '', ?, ?, ?, ?)", (i, action, detail, status, 100.0 + i, f"u{i}"))
    conn.close()
    with open_journal(path) as j:
        assert "011_action_typed_columns" in {r[0] for r in j.db.execute("SELECT name FROM _migrations")}
        raw = j.db.execute("SELECT action, detail, status, kind, restart, restart_of FROM actions ORDER BY id").fetchall()
        assert [tuple(r) for r in raw] == OLD_ROWS
        read = [(a["action"], a["detail"], a["status"], a["kind"], a["restart"], a["restart_of"]) for a in j.actions(5)]
        assert read == OLD_ROWS
    with open_journal(path) as j:                                     # once: nothing applied again
        assert j.db.execute("SELECT count(*) FROM _migrations WHERE name = '011_action_typed_columns'").fetchone()[0] == 1


def test_an_old_journal_keeps_the_machine_and_the_restart_count_working(tmp_path):
    """After 011, an old journal's rows read as the text read before: the failover kinds the state
    machine counts, and the in-place restarts already journaled (none journaled twice)."""
    path = tmp_path / "old.db"
    conn = _journal_before_011(path)
    rows = [(0, "failover", json.dumps({"reason": "ib", "blamed": []})),
            (1, "failover", json.dumps({"reason": "x", "blamed": ["n1"]})),
            (2, "inplace-restart", "restart 1/2 in place: infra (ib-completion-error), reported by the job")]
    for attempt, action, detail in rows:
        conn.execute("INSERT INTO actions (job_id, attempt, action, target, detail, status, created, uid) "
                     "VALUES (12, ?, ?, '', ?, 'done', 1.0, ?)", (attempt, action, detail, f"u{attempt}"))
    conn.close()
    with open_journal(path) as j:
        assert m.Facts(12, actions=tuple(j.actions(12))).failover_kinds() == ["unblamed", "blamed"]
        r2 = Record(2, 2, 2, "restarted", "infra", "ib-completion-error", 2.0)
        assert inplace.record_restarts(j, _job(r2.encode(), 2)) == 1           # 2/2 only: 1/2 is on record
        assert [(a["restart"], a["restart_of"]) for a in j.actions(12, 2)] == [(1, 2), (2, 2)]


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.text(max_size=40))
def test_restart_text_reads_back_as_its_numbers(k, of, why):
    """What record_restarts writes as text, the migration reads back as the typed columns."""
    detail = f"restart {k}/{of} in place: {why}, reported by the job"
    assert migrations.typed_from_text("inplace-restart", detail) == {"restart": k, "restart_of": of}


@given(st.lists(st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=5), max_size=3),
       st.text(max_size=20))
def test_failover_detail_reads_back_as_the_kind_its_writer_gives(blamed, reason):
    """The daemon's failover detail (JSON with ``blamed``) reads back, from text, as the kind it
    now writes typed (blamed iff a node is blamed)."""
    detail = json.dumps({"reason": reason, "blamed": blamed})
    assert migrations.typed_from_text("failover", detail) == {"kind": "blamed" if blamed else "unblamed"}


# --------------------------------------------------------------------------- the readers
def test_failover_kinds_reads_the_kind_column_not_the_text():
    rows = ({"action": "failover", "kind": "unblamed", "detail": json.dumps({"blamed": ["n1"]})},
            {"action": "evacuation", "kind": None, "detail": "x"},
            {"action": "failover", "kind": "blamed", "detail": "requeue refused: x"},
            {"action": "failover", "kind": "evacuation", "detail": "{}"})
    assert m.Facts(7, actions=rows).failover_kinds() == ["unblamed", "blamed", "evacuation"]


def test_the_daemon_writes_the_failover_kind(tmp_path):
    """A failover's kind is written with its row and kept when the row's detail is replaced (a
    refused requeue); a row written without one (an older writer's spool) reads as its text."""
    with open_journal(tmp_path / "d.db") as j:
        aid = j.intend(7, 0, "failover", "", json.dumps({"reason": "ib", "blamed": []}), kind="unblamed")
        j.finish(aid, "failed", "requeue refused: Job is pending")
        j.record(7, 1, "failover", "n1", json.dumps({"reason": "x", "blamed": ["n1"]}), kind="blamed")
        j.record(7, 2, "failover", "", "{}")
        assert [a["kind"] for a in j.actions(7)] == ["unblamed", "blamed", "unblamed"]
        assert [a["kind"] for a in j.actions_named(["failover"])] == ["unblamed", "blamed", "unblamed"]
        raw = [r[0] for r in j.db.execute("SELECT kind FROM actions ORDER BY id").fetchall()]
        assert raw == ["unblamed", "blamed", None]


def test_record_restarts_reads_the_restart_columns_not_the_text(tmp_path):
    """Restarts already journaled are known by their ``restart``/``restart_of`` columns: a row whose
    text was edited still counts, and the rows it writes carry them."""
    with open_journal(tmp_path / "d.db") as j:
        j.record(12, 0, "inplace-restart", "n1", "edited by hand", restart=1, restart_of=2)
        r2 = Record(0, 2, 2, "restarted", "infra", "ib-completion-error", 2.0)
        assert inplace.record_restarts(j, _job(r2.encode())) == 1
        acts = j.actions(12, 0)
        assert [(a["restart"], a["restart_of"]) for a in acts] == [(1, 2), (2, 2)]
        assert acts[1]["detail"] == "restart 2/2 in place: infra (ib-completion-error), reported by the job"
        assert inplace.record_restarts(j, _job(r2.encode())) == 0
        assert j.db.execute("SELECT restart, restart_of FROM actions WHERE id = ?", [acts[1]["id"]]).fetchone() == (2, 2)


def _job(comment, restart_count=0) -> Job:
    return Job.from_json({"job_id": 12, "job_state": "RUNNING", "comment": comment, "restart_cnt": restart_count,
                          "nodes": "n[1-2]"})
