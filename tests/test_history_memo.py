"""``ft-history``'s pre-rendered text of finished jobs (slurm_ft/history/memo.py, issue 26): what it
prints from the memo is byte for byte what it renders without it, for journals hypothesis makes
(hostile names and evidence, arrays, retired records, observed actions, uids as users, every ft
state), every option that uses the memo, and after any later change to a job's rows."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.history import query as history_mod
from slurm_ft.history import memo as history_memo
from slurm_ft.failover import policy
from slurm_ft.history.query import FT_STATES
from slurm_ft.cli.history import command
from slurm_ft.journal import open_journal

NOW = time.time()
#: Option sets that print from the memo, and some that never do (rendered now either way).
ARGS = (["-a"], ["-a", "-P"], ["-a", "-p", "-n"], ["-u", "alice"], ["-u", "alice", "-P"], ["-a", "-X"],
        ["-a", "-X", "-P"], ["-u", "alice", "-X", "-p", "-n"], ["-a", "-X", "-D", "-P"],
        ["-a", "-o", "JobID,Verdict"], ["-a", "--detail"], ["-a", "-n"], ["-a", "-P", "--delimiter", ";"])
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
ATTEMPT = st.fixed_dictionaries({
    "state": st.sampled_from(["COMPLETED", "FAILED", "RUNNING", "NODE_FAIL", "CANCELLED"]),
    "ended": st.booleans(),
    "verdict": st.none() | st.sampled_from(["hardware", "hang", "infra", "user", "unknown", "ok"]),
    "evidence": st.lists(TEXT, max_size=2),
    "actions": st.lists(st.tuples(st.sampled_from(["drain", "requeue", "decide", "hold", "failover", "ckpt-ack",
                                                   "reconcile", "remediate-reboot"]),
                                  st.sampled_from(["done", "observed", "failed", "skipped"]), TEXT), max_size=3),
})
JOB = st.fixed_dictionaries({
    "name": st.none() | TEXT,
    "user": st.sampled_from(["alice", "bob", "0", "4242", None]),
    "ft_state": st.sampled_from(FT_STATES),
    "attempts": st.lists(ATTEMPT, max_size=3),
    "array": st.none() | st.tuples(st.integers(1, 50), st.integers(0, 9)),
})



#: A finished job of alice's whose one attempt failed over on an Xid 79.
FAILED_OVER = {"name": "train", "user": "alice", "ft_state": "completed", "array": None,
               "attempts": [{"state": "FAILED", "ended": True, "verdict": "hardware", "evidence": ["Xid 79"],
                             "actions": [("failover", "done", "")]}]}

def _write(path, jobs: list[dict], retire_first: bool) -> None:
    with open_journal(path) as j:
        for i, spec in enumerate(jobs):
            jid = 100 + i
            j.upsert_job(jid, name=spec["name"], user=spec["user"], ft_enabled=1, retries=3,
                         ft_state=spec["ft_state"], excluded_nodes="")
            for n, a in enumerate(spec["attempts"]):
                start = NOW - 86400 * 3 + 600 * n
                j.upsert_attempt(jid, n, nodes=f"n{n + 1}", start=start, end=start + 300 if a["ended"] else None,
                                 state=a["state"], exit_code=1)
                if a["verdict"]:
                    j.add_verdict(jid, n, f"n{n + 1}", a["verdict"], f"rule-{a['verdict']}",
                                  [{"xid": 79, "bus_id": "0000:10:00"}] if a["verdict"] == "hardware" else [],
                                  a["evidence"], action="retry")
                for action, status, detail in a["actions"]:
                    j.record(jid, n, action, f"n{n + 1}", detail, status=status)
    conn = sqlite3.connect(path)
    with conn:
        for i, spec in enumerate(jobs):
            if spec["array"]:
                conn.execute("INSERT INTO job_identity (job_id, array_job_id, array_task_id, seen, first_seen, "
                             "updated) VALUES (?, ?, ?, '[]', ?, ?)", [100 + i, *spec["array"], NOW, NOW])
        if retire_first and jobs:    # the first job is an earlier job with id 100, retired
            for table in ("jobs", "attempts", "verdicts", "actions"):
                conn.execute(f"UPDATE {table} SET job_id = -1 WHERE job_id = 100")
            conn.execute("INSERT INTO retired_jobs (key, job_id, seen, retired, reason) VALUES (-1, 100, '[]', ?, ?)",
                         [NOW - 3600, "id 100 | handed out again"])
    conn.close()


def _run(path, args, since: str = "now-30days") -> str:
    r = CliRunner().invoke(command, ["--journal", str(path), "-S", since, *args])
    assert r.exit_code == 0, (args, r.output, r.exception)
    return r.output


def _fill(path, now: float | None = None) -> int:
    with open_journal(path) as j:
        return history_memo.fill(j, limit=10 ** 6, now=now)


def _memo_rows(path) -> dict[int, str]:
    with open_journal(path, readonly=True) as j:
        return {r[0]: r[1] for r in j.db.conn.execute(f"SELECT job_id, key FROM {history_memo.TABLE}")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(JOB, min_size=1, max_size=6), retire_first=st.booleans())
def test_memo_prints_exactly_what_ft_history_renders(tmp_path_factory, jobs, retire_first):
    path = tmp_path_factory.mktemp("memo") / "daemon.db"
    _write(path, jobs, retire_first)
    before = {tuple(a): _run(path, a) for a in ARGS}
    stored = _fill(path)
    finished = {100 + i for i, s in enumerate(jobs) if s["ft_state"] in policy.FINAL_STATES}
    if retire_first and 100 in finished:
        finished = (finished - {100}) | {-1}
    assert set(_memo_rows(path)) == finished and stored == len(finished)
    for a in ARGS:
        assert _run(path, a) == before[tuple(a)], a


def test_a_change_to_a_finished_job_drops_its_memo_row(tmp_path):
    path = tmp_path / "daemon.db"
    job = FAILED_OVER
    _write(path, [job, {**job, "name": "other"}], False)
    assert _fill(path) == 2
    with open_journal(path) as j:       # a late verdict (a node's mailbox read after the job ended)
        j.add_verdict(100, 0, "n2", "hang", "no-progress", [], ["hang on n2: no progress"], action="retry")
    assert set(_memo_rows(path)) == {101}
    shown = _run(path, ["-a"])
    assert "n2" in shown or "hang" in shown
    assert _fill(path) == 1 and _run(path, ["-a"]) == shown


def test_another_time_zone_renders_afresh(tmp_path, monkeypatch):
    path = tmp_path / "daemon.db"
    job = {"name": "train", "user": "alice", "ft_state": "completed", "array": None,
           "attempts": [{"state": "COMPLETED", "ended": True, "verdict": None, "evidence": [], "actions": []}]}
    _write(path, [job], False)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert _fill(path) == 1
        utc = _run(path, ["-a", "-P"])
        monkeypatch.setenv("TZ", "Asia/Tokyo")
        time.tzset()
        with open_journal(path, readonly=True) as j:
            assert history_mod.lookup(j, [100], "list") == {}       # rendered in UTC: not used here
        tokyo = _run(path, ["-a", "-P"])
        assert tokyo != utc and _fill(path) == 1 and _run(path, ["-a", "-P"]) == tokyo
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_no_memo_is_written_without_room(tmp_path, monkeypatch):
    path = tmp_path / "daemon.db"
    job = {"name": "t", "user": "alice", "ft_state": "completed", "array": None, "attempts": []}
    _write(path, [job], False)
    monkeypatch.setattr(history_memo, "MIN_FREE_BYTES", 2 ** 62)
    assert _fill(path) == 0 and _memo_rows(path) == {}


def test_old_journals_and_read_only_readers_do_without(tmp_path):
    """A journal opened read-only before migration 009 has no memo table: ft-history renders."""
    path = tmp_path / "daemon.db"
    _write(path, [{"name": "t", "user": "alice", "ft_state": "completed", "array": None, "attempts": []}], False)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(f"DROP TABLE {history_memo.TABLE}")
    conn.close()
    with open_journal(path, readonly=True) as j:
        assert history_mod.lookup(j, [100], "chain") == {}


def test_the_service_fills_in_the_background(tmp_path):
    import logging
    import threading
    path = tmp_path / "daemon.db"
    job = {"name": "t", "user": "alice", "ft_state": "completed", "array": None, "attempts": []}
    _write(path, [job], False)
    stop = threading.Event()
    f = history_memo.Filler(str(path), stop, logging.getLogger("test")).start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _memo_rows(path):
        time.sleep(0.05)
    stop.set()
    f.thread.join(5)
    assert set(_memo_rows(path)) == {100} and not f.thread.is_alive()


def test_eligible_options_print_from_the_memo_and_the_others_never_do(tmp_path):
    path = tmp_path / "daemon.db"
    job = {"name": "t", "user": "alice", "ft_state": "completed", "array": None,
           "attempts": [{"state": "COMPLETED", "ended": True, "verdict": None, "evidence": [], "actions": []}]}
    _write(path, [job, {**job, "ft_state": "running"}], False)
    assert _fill(path) == 1
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(f"UPDATE {history_memo.TABLE} SET list = 'MEMO-LIST' || char(10) || 'MEMO-ATTEMPT', "
                     f"chain = 'MEMO-CHAIN'")
    conn.close()
    used = {"-a": "MEMO-CHAIN", "-a -P": "MEMO-LIST\nMEMO-ATTEMPT\n", "-a -p -n": "MEMO-LIST|\nMEMO-ATTEMPT|\n",
            "-u alice": "MEMO-CHAIN", "-a -X -P": "MEMO-LIST\n", "-u alice -X -p": "MEMO-LIST|\n"}
    for args, marker in used.items():
        out = _run(path, args.split())
        assert marker in out and ("Job 101 (t): ft state running" in out or "101|" in out), (args, out)
        assert "-X" not in args or "MEMO-ATTEMPT" not in out, (args, out)
    for args in ("-a -X", "-a -n", "-a --detail", "-a -P --delimiter ;", "-a -o JobID", "-j 100", "-a -s CD",
                 "-a -X -D -P"):
        assert "MEMO" not in _run(path, args.split()), args


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(JOB, min_size=1, max_size=6), retire_first=st.booleans(),
       back=st.lists(st.floats(0, 10 * 86400), min_size=1, max_size=4))
def test_the_window_finds_the_same_records_through_record_last(tmp_path_factory, jobs, retire_first, back):
    """Migration 010's ``record_last`` (kept by triggers) finds every record each table's own
    time range finds, whatever rows were written, moved (a retired record) or updated later."""
    from slurm_ft.history import query as history
    path = tmp_path_factory.mktemp("last") / "daemon.db"
    _write(path, jobs, retire_first)
    with open_journal(path) as j:        # later updates: an attempt's end, an action finished
        j.upsert_attempt(101, 0, end=NOW + 5)
        j.record(102, 0, "requeue", "n1", "")
    with open_journal(path, readonly=True) as j:
        for b in back:
            start = NOW - b
            legacy = {r[0] for table, _, t1 in history._TIMES
                      for r in j.db.conn.execute(f"SELECT job_id FROM {table} WHERE {t1} >= ?", [start])}
            legacy |= {r[0] for r in j.db.conn.execute("SELECT job_id FROM jobs WHERE created >= ?", [start])}
            assert legacy - {None} <= history._candidates(j, start), start


#: The memo's options whose output is the job row alone (printed from a cut row too).
ROW_ARGS = (["-u", "alice", "-X", "-P"], ["-a", "-X", "-P"], ["-u", "alice", "-X", "-p", "-n"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(JOB, min_size=1, max_size=5), retire_first=st.booleans(),
       age_days=st.floats(history_memo.MEMO_DAYS + 1, history_memo.ROW_DAYS - 2))
def test_jobs_older_than_the_whole_rows_keep_their_job_row(tmp_path_factory, monkeypatch, jobs, retire_first,
                                                           age_days):
    """A finished job last updated between MEMO_DAYS and ROW_DAYS ago is memoised as its job row
    alone: ``-X -P``/``-X -p`` print it byte for byte as rendering does; every other output still
    renders (nothing else is held for it)."""
    path = tmp_path_factory.mktemp("rows") / "daemon.db"
    then = NOW - age_days * 86400
    with monkeypatch.context() as m:     # the journal written age_days ago (its own clock)
        m.setattr(time, "time", lambda: then)
        m.setattr(sys.modules[__name__], "NOW", then)
        _write(path, jobs, retire_first)
    since = f"now-{int(age_days) + 5}days"
    before = {tuple(a): _run(path, a, since) for a in ARGS + ROW_ARGS}
    stored = _fill(path)
    finished = {100 + i for i, s in enumerate(jobs) if s["ft_state"] in policy.FINAL_STATES}
    if retire_first and 100 in finished:
        finished = (finished - {100}) | {-1}
    rows = _memo_rows(path)
    assert set(rows) == finished and stored == len(finished)
    assert set(rows.values()) <= {history_mod.row_key()}
    with open_journal(path, readonly=True) as j:
        assert all("\n" not in text and chain == "" for text, chain in
                   j.db.conn.execute(f"SELECT list, chain FROM {history_memo.TABLE}"))
    for a in ARGS + ROW_ARGS:
        assert _run(path, a, since) == before[tuple(a)], a


def test_whole_rows_age_into_job_rows_then_out(tmp_path):
    path = tmp_path / "daemon.db"
    job = FAILED_OVER
    _write(path, [job, {**job, "user": "bob"}], False)
    assert _fill(path) == 2 and set(_memo_rows(path).values()) == {history_mod.render_key()}
    xp = _run(path, ["-u", "alice", "-X", "-P", "-n"])
    later = NOW + (history_memo.MEMO_DAYS + 2) * 86400
    assert _fill(path, now=later) == 0          # nothing missing: the pass ages the memo
    assert set(_memo_rows(path).values()) == {history_mod.row_key()}
    with open_journal(path, readonly=True) as j:
        assert history_mod.lookup(j, [100], "list") == {} and history_mod.lookup(j, [100], "chain") == {}
        (t0, t1, text), = history_mod.lookup(j, [100], "jobrow").values()
    assert xp == text + "\n" and _run(path, ["-u", "alice", "-X", "-P", "-n"]) == xp
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(f"UPDATE {history_memo.TABLE} SET list = 'MEMO-ROW'")
    conn.close()
    assert _run(path, ["-u", "alice", "-X", "-P", "-n"]) == "MEMO-ROW\n"       # printed from the cut row
    assert all("MEMO" not in _run(path, a) for a in (["-u", "alice", "-P"], ["-a"], ["-a", "-X"]))
    assert _fill(path, now=NOW + (history_memo.ROW_DAYS + 2) * 86400) == 0 and _memo_rows(path) == {}


def test_rows_of_another_rendering_code_are_deleted(tmp_path, monkeypatch):
    path = tmp_path / "daemon.db"
    job = {"name": "t", "user": "alice", "ft_state": "completed", "array": None, "attempts": []}
    _write(path, [job], False)
    assert _fill(path) == 1
    monkeypatch.setattr(history_mod, "_code_hash", lambda: "another version")
    assert _fill(path) == 1 and _fill(path) == 0
    assert list(_memo_rows(path).values()) == [history_mod.render_key()]


def test_the_render_key_hashes_the_code_that_renders_and_is_the_same_in_every_process():
    """The key names the modules whose code decides the memo's text; each must be a file of the
    package (a missing one gives a random key, so no process would ever use the memo: what the
    move into rooms did to it, unnoticed by the output tests)."""
    package = Path(history_mod.__file__).resolve().parent.parent
    assert all((package / name).is_file() for name in history_mod._CODE)
    assert {"history/query.py", "history/format.py", "history/memo.py"} <= set(history_mod._CODE)
    other = subprocess.run([sys.executable, "-c", "from slurm_ft.history import query; print(query.render_key())"],
                           capture_output=True, text=True, timeout=60, check=True,
                           cwd=str(package.parent)).stdout.strip()
    assert other == history_mod.render_key()
