"""ft-history and job arrays and reused job ids (issue 20, items 2 and 4): array tasks shown as
``ARRAYJOBID_TASK`` like sacct, ``-j`` takes ``50``, ``50_2``, ``50_[1-3]``, ``50_[1,3-5]``; bad
input is a clear usage error, never a traceback; an earlier job with a reused id is shown beside
the current one. Real SQLite journals, the CLI through CliRunner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from slurm_ft.history.query import JobSpec, Selection, parse_job_ids, select
from slurm_ft.cli.history import command
from slurm_ft.journal import identity, open_journal
from slurm_ft.slurm import Job

T0 = 1_800_000_000.0


def _job(job_id, submit, array=None, restarts=0):
    raw = {"job_id": job_id, "job_state": "RUNNING", "restart_cnt": restarts, "submit_time": int(submit)}
    if array:
        raw["array_job_id"], raw["array_task_id"] = array
    return Job.from_json(raw)


@pytest.fixture
def db(tmp_path):
    """Array 50 (tasks 1-3: raw ids 51, 52, 50; task 2 failed over once), plain job 60, and job
    41 whose id was reused (the old 41 failed over, then a new 41 runs)."""
    path = tmp_path / "j.db"
    with open_journal(path) as j:
        for raw, task in ((51, 1), (52, 2), (50, 3)):
            identity.observe(j, _job(raw, T0, (50, task)))
            j.upsert_job(raw, name=f"sweep-{task}", user="alice", ft_enabled=1, retries=2,
                         ft_state="requeued" if task == 2 else "running", excluded_nodes="")
            j.upsert_attempt(raw, 0, nodes=f"n{task}", start=T0 + 1, state="RUNNING")
        j.upsert_attempt(52, 0, end=T0 + 50, state="FAILED")
        j.add_verdict(52, 0, "n2", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:3b:00"}])
        j.record(52, 0, "failover", "n2", "{}")
        identity.observe(j, _job(60, T0))
        j.upsert_job(60, name="plain", user="alice", ft_enabled=1, retries=1, ft_state="running", excluded_nodes="")
        j.upsert_attempt(60, 0, nodes="n3", start=T0 + 1, state="RUNNING")
        identity.observe(j, _job(41, T0))
        j.upsert_job(41, name="old", user="alice", ft_enabled=1, retries=2, ft_state="requeued", excluded_nodes="")
        j.upsert_attempt(41, 0, nodes="n1", start=T0 + 1, end=T0 + 5, state="FAILED")
        j.record(41, 0, "failover", "n1", "{}")
        assert identity.observe(j, _job(41, T0 + 900)) == -1
        j.upsert_job(41, name="new", user="alice", ft_enabled=1, retries=2, ft_state="running", excluded_nodes="")
        j.upsert_attempt(41, 0, nodes="n2", start=T0 + 901, state="RUNNING")
    return str(path)


def run(db, *args):
    r = CliRunner().invoke(command, ["--journal", db, *args])
    assert "Traceback" not in r.output and not isinstance(r.exception, (TypeError, ValueError, KeyError)), r.output
    return r


# ------------------------------------------------------------------------------ -j grammar
@pytest.mark.parametrize("text, specs", [
    ("50", [JobSpec(50)]),
    ("50_2", [JobSpec(50, ((2, 2),))]),
    ("50_[1-3]", [JobSpec(50, ((1, 3),))]),
    ("50_[1,3-5],60", [JobSpec(50, ((1, 1), (3, 5))), JobSpec(60)]),
    (" 7 , 8_0 ", [JobSpec(7), JobSpec(8, ((0, 0),))]),
])
def test_job_id_grammar(text, specs):
    assert parse_job_ids(text) == specs


@pytest.mark.parametrize("bad, why", [
    ("50_", "not a job id"), ("50_[3-1]", "not a task range"), ("50_[1-3", "unbalanced"), ("50]", "unbalanced"),
    ("50_[[1]]", "unbalanced"), ("50_[]", "not an array task id"), ("50_[1,,2]", "not an array task id"),
    ("0_1", "1 to"), ("50.batch", "not steps"), ("50+0", "not steps"), ("50_[1-99999999]", "not a task range"),
    ("a_1", "not a job id"), ("50_1_2", "not a job id"),
])
def test_bad_job_ids_are_clear_usage_errors(db, bad, why):
    r = run(db, "-j", bad)
    assert r.exit_code == 2 and why in r.output, r.output


_ALPHABET = st.sampled_from(list("0123456789_[],-. x+%*") + ["\x1b", "é"])


@settings(max_examples=300, deadline=None)
@given(st.text(_ALPHABET, max_size=24))
def test_parse_raises_only_the_clear_error(text):
    """Whatever the text, parsing gives job specs or a ValueError naming the input, nothing else."""
    try:
        specs = parse_job_ids(text)
    except ValueError as exc:
        assert str(exc)
        return
    for spec in specs:
        assert parse_job_ids(str(spec)) == [spec]        # printed as sacct writes it, read back the same


@settings(max_examples=80, deadline=None)
@given(st.text(_ALPHABET, max_size=16))
def test_cli_never_tracebacks_on_any_job_list(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("h") / "j.db"
    open_journal(path).close()
    r = CliRunner().invoke(command, ["--journal", str(path), "-j", text])
    assert r.exit_code in (1, 2) and "Traceback" not in r.output, (text, r.output, r.exception)


specs = st.builds(JobSpec, st.integers(1, 2**32 - 1), st.none() | st.lists(
    st.tuples(st.integers(0, 100), st.integers(0, 100)).map(sorted).map(tuple), min_size=1, max_size=4).map(tuple))


@settings(max_examples=200, deadline=None)
@given(specs)
def test_every_spec_round_trips(spec):
    assert parse_job_ids(str(spec)) == [spec]


# ------------------------------------------------------------------------------ selection and display
def test_an_arrays_id_selects_every_task_shown_as_sacct_does(db):
    r = run(db, "-j", "50", "-X", "-P", "-o", "JobID,JobIDRaw,JobName,FTState")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["JobID|JobIDRaw|JobName|FTState", "50_1|51|sweep-1|running",
                                     "50_2|52|sweep-2|requeued", "50_3|50|sweep-3|running"]
    r = run(db, "-j", "50")
    assert "Job 50_2 (sweep-2): ft state requeued" in r.output and "Job 50_3 (sweep-3)" in r.output


@pytest.mark.parametrize("item, raw", [("50_2", [52]), ("50_[1-2]", [51, 52]), ("50_[1,3]", [51, 50]),
                                       ("50_[2-9]", [52, 50]), ("60", [60]), ("51", [51])])
def test_tasks_are_selected_by_array_notation(db, item, raw):
    r = run(db, "-j", item, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    data = data if isinstance(data, list) else [data]
    assert [h["job_id"] for h in data] == raw


def test_json_carries_the_array_ids(db):
    h = json.loads(run(db, "-j", "50_2", "--json").output)
    assert (h["job_id"], h["array_job_id"], h["array_task_id"]) == (52, 50, 2)
    assert h["attempts"][0]["verdict"] == "hardware" and h["failovers"] == 1
    assert json.loads(run(db, "-j", "60", "--json").output)["array_job_id"] is None


def test_a_task_not_on_record_is_named(db):
    r = run(db, "-j", "50_7,50_2")
    assert r.exit_code == 1 and "job 50_7 is not in the journal" in r.output and "Job 50_2" in r.output


def test_a_reused_id_shows_both_jobs_the_old_one_marked(db):
    r = run(db, "-j", "41")
    assert r.exit_code == 0, r.output
    old, new = r.output.split("\n\n")
    assert old.startswith("Job 41 (old): ft state lost") and "an earlier job with this id, retired" in old
    assert new.startswith("Job 41 (new): ft state running") and "retired" not in new
    data = json.loads(run(db, "-j", "41", "--json").output)
    assert [(h["name"], h["failovers"], bool(h["retired"])) for h in data] == [("old", 1, True), ("new", 0, False)]
    rows = run(db, "-a", "-S", "2020-01-01", "-X", "-P", "-o", "JobID,JobName,Retired").output.splitlines()
    assert [r.split("|")[:2] for r in rows[1:]] == [["41", "old"], ["41", "new"], ["50_1", "sweep-1"],
                                                    ["50_2", "sweep-2"], ["50_3", "sweep-3"], ["60", "plain"]]
    assert rows[1].split("|")[2] and not rows[2].split("|")[2]


def test_select_api_takes_plain_ids_and_specs(db):
    with open_journal(db, readonly=True) as j:
        found, missing = select(j, Selection(job_ids=(60, JobSpec(50, ((2, 2),)), 99, JobSpec(50, ((9, 9),)))),
                                now=T0 + 1000)
        assert [h["job_id"] for h in found] == [52, 60] and missing == ["50_9", 99]
