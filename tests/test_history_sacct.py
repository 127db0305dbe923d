"""ft-history speaks sacct: -j lists, -u/-a, -S/-E (Slurm time formats), -s, -o with widths,
--helpformat, -p/-P/-n, -X, -D, --json; bad values are usage errors (exit 2), never tracebacks.
Real SQLite journals under tmp_path, the CLI through CliRunner."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from slurm_ft.history import query as history_mod
from slurm_ft.history.query import Selection, Viewer, parse_states, select
from slurm_ft.cli import history as history_cli
from slurm_ft.cli.history import command
from slurm_ft.history.format import parse_format
from slurm_ft.journal import open_journal
from slurm_ft.slurm.timespec import parse_time

NOW = time.time()
DAY = 86400.0


def _journal(path):
    """Job 5 (alice, today, failed over once, running again), 6 (bob, today, completed),
    7 (carol, 3 days ago, max-retries-exceeded), 8 (alice, started 3 days ago, still running),
    9 (uid 65534 on record, today, not ft-enabled: not-configured)."""
    with open_journal(path) as j:
        j.upsert_job(5, name="train", user="alice", ft_enabled=1, retries=3, ft_state="running",
                     excluded_nodes="n1")
        j.upsert_attempt(5, 0, nodes="n1", start=NOW - 600, end=NOW - 500, state="NODE_FAIL", exit_code=0, signal=9)
        j.add_verdict(5, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:10:00"}], [], created=NOW - 500)
        j.record(5, 0, "drain", "n1", "slurm-ft: Xid 79 on 0000:10:00 (job 5)")
        j.record(5, 0, "failover", "n1", "{}")
        j.record(5, 0, "requeue", "5")
        j.upsert_attempt(5, 1, nodes="n[2-3]", start=NOW - 400, state="RUNNING")
        j.upsert_job(6, name="eval", user="bob", ft_enabled=1, retries=1, ft_state="completed", excluded_nodes="")
        j.upsert_attempt(6, 0, nodes="n4", start=NOW - 300, end=NOW - 200, state="COMPLETED", exit_code=0, signal=0)
        j.upsert_job(7, name="old", user="carol", ft_enabled=1, retries=1, ft_state="max-retries-exceeded",
                     excluded_nodes="n5", created=NOW - 3 * DAY, updated=NOW - 3 * DAY + 200)
        j.upsert_attempt(7, 0, nodes="n5", start=NOW - 3 * DAY, end=NOW - 3 * DAY + 100, state="FAILED",
                         exit_code=1, signal=0)
        j.upsert_attempt(7, 1, nodes="n6", start=NOW - 3 * DAY + 150, end=NOW - 3 * DAY + 200, state="FAILED",
                         exit_code=1, signal=0)
        j.add_verdict(7, 0, "n5", "hardware", "xid-48", [{"xid": 48, "bus_id": "0000:20:00"}], [],
                      created=NOW - 3 * DAY + 100)
        j.upsert_job(8, name="long", user="alice", ft_enabled=1, retries=2, ft_state="running", excluded_nodes="",
                     created=NOW - 3 * DAY, updated=NOW - 3 * DAY)
        j.upsert_attempt(8, 0, nodes="n7", start=NOW - 3 * DAY, state="RUNNING")
        j.upsert_job(9, name="plain", user="65534", ft_enabled=0, ft_state="not-configured")
    return path


@pytest.fixture
def db(tmp_path):
    return str(_journal(tmp_path / "j.db"))


def run(db, *args, viewer: Viewer | None = None, monkeypatch=None):
    if viewer is not None:
        monkeypatch.setattr(history_mod, "current_viewer", lambda cfg: viewer)
    return CliRunner().invoke(command, [*args, "--journal", db])


def _ids(output: str) -> list[str]:
    """Job ids of the job rows in -P output (Attempt empty)."""
    rows = [line.split("|") for line in output.splitlines()[1:]]
    return [r[0] for r in rows if r[1] == ""]


# ------------------------------------------------------------------------------------ -j
def test_job_lists_are_comma_separated_and_repeatable(db):
    for args in (["-j", "5,6"], ["-j", "5", "-j", "6"], ["--jobs=6,5"]):
        r = run(db, *args)
        assert r.exit_code == 0, r.output
        assert "Job 5 (train)" in r.output and "Job 6 (eval)" in r.output
    r = run(db, "-j", "7")                          # with -j there is no default time window
    assert r.exit_code == 0 and "Job 7 (old)" in r.output


@pytest.mark.parametrize("bad, why", [("5.0", "not steps"), ("5,x", "'x' is not a job id"), ("0", "not a job id"),
                                      ("5,,6", "'' is not a job id"), ("-3", "not a job id"),
                                      ("5_[2-1]", "not a task range")])
def test_bad_job_ids_are_usage_errors(db, bad, why):
    r = run(db, f"--jobs={bad}")
    assert r.exit_code == 2 and why in r.output and "Traceback" not in r.output


def test_unknown_jobs_are_named_after_the_ones_found(db):
    r = run(db, "-j", "5,99,98")
    assert r.exit_code == 1
    assert "Job 5 (train)" in r.output
    assert "jobs 98, 99 are not in the journal" in r.output


# ------------------------------------------------------------------------- time window
def test_without_jobs_lists_todays_jobs_and_jobs_still_active(db, monkeypatch):
    midnight = history_cli._midnight(NOW)
    assert time.localtime(midnight)[:6] == (*time.localtime(NOW)[:3], 0, 0, 0)
    monkeypatch.setattr(history_cli, "_midnight", lambda now: NOW - 3600)    # the same just after 00:00
    r = run(db, "-a", "-P")
    assert r.exit_code == 0, r.output
    assert _ids(r.output) == ["5", "6", "8"]         # 7 ended 3 days ago; 8 still running; 9 not ft
    r = run(db, "-a", "-P", "-S", "now-4days")
    assert _ids(r.output) == ["5", "6", "7", "8"]
    r = run(db, "-a", "-P", "-S", "now-4days", "-E", "now-2days")
    assert _ids(r.output) == ["7", "8"]
    day = time.strftime("%Y-%m-%d", time.localtime(NOW - 3 * DAY))
    r = run(db, "-a", "-P", "-S", day, "-E", f"{day}T23:59:59")
    assert _ids(r.output) == ["7", "8"]


@pytest.mark.parametrize("spec", ["yesterday", "now-3d", "2025-02-30", "25:00", "now-", "13:00pm", "1:2"])
def test_bad_times_are_usage_errors(db, spec):
    r = run(db, "-a", "-S", spec)
    assert r.exit_code == 2 and "-S" in r.output and "Traceback" not in r.output


def test_start_after_end_is_a_usage_error(db):
    r = run(db, "-a", "-S", "now", "-E", "now-1hours")
    assert r.exit_code == 2 and "is after end time" in r.output


def test_slurm_time_formats():
    now = time.mktime((2025, 3, 10, 14, 30, 0, 0, 0, -1))

    def at(spec):
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(parse_time(spec, now)))

    assert at("now") == "2025-03-10T14:30:00" and at("now-3days") == "2025-03-07T14:30:00"
    assert at("now-90minutes") == "2025-03-10T13:00:00" and at("now-5") == "2025-03-10T14:29:55"
    assert at("now+1week") == "2025-03-17T14:30:00" and at("NOW-2HOURS") == "2025-03-10T12:30:00"
    assert at("today") == at("midnight") == "2025-03-10T00:00:00"
    assert at("noon") == "2025-03-10T12:00:00" and at("fika") == "2025-03-10T15:00:00"
    assert at("teatime") == "2025-03-10T16:00:00" and at("elevenses") == "2025-03-10T11:00:00"
    assert at("16:45") == "2025-03-10T16:45:00"                      # today, even when later (sacct: past)
    assert at("2:15pm") == "2025-03-10T14:15:00" and at("12:00am") == "2025-03-10T00:00:00"
    assert at("0105") == "2025-01-05T00:00:00" and at("1225") == "2024-12-25T00:00:00"   # later month: last year
    assert at("122523") == "2023-12-25T00:00:00" and at("12.25.23") == "2023-12-25T00:00:00"
    assert at("03/01/24-10:30") == "2024-03-01T10:30:00" and at("01/05-10:00:05") == "2025-01-05T10:00:05"
    assert at("2025-01-05") == "2025-01-05T00:00:00" and at("2025-01-05T10:00:05") == "2025-01-05T10:00:05"
    assert at("today 15:00") == "2025-03-10T15:00:00" and at("tomorrow") == "2025-03-11T00:00:00"
    assert parse_time("uts1700000000", now) == 1700000000.0
    for bad in ("", "soon", "02/30", "2025-13-01", "24:00", "10:00x", "todayx", "now-3d", "now+-3"):
        with pytest.raises(ValueError):
            parse_time(bad, now)


# ----------------------------------------------------------------------------- users
def test_root_sees_everyone_by_default_and_u_filters(db):
    r = run(db, "-P", "-S", "now-4days")
    assert _ids(r.output) == ["5", "6", "7", "8"]                     # CliRunner runs as root here
    r = run(db, "-P", "-S", "now-4days", "-u", "alice")
    assert _ids(r.output) == ["5", "8"]
    r = run(db, "-P", "-S", "now-4days", "-u", "carol,bob")
    assert _ids(r.output) == ["6", "7"]
    r = run(db, "-P", "-S", "now-4days", "--user=bob", "--uid=carol")
    assert _ids(r.output) == ["6", "7"]
    for bad in ("al ice", "x;rm", "\x1b[31m"):
        r = run(db, "-u", bad)
        assert r.exit_code == 2 and "is not a user name or uid" in r.output and "\x1b" not in r.output


def test_users_see_their_own_jobs_unless_allusers(db, monkeypatch):
    alice = Viewer(1000, "alice", private_jobs=False)
    r = run(db, "-P", "-S", "now-4days", viewer=alice, monkeypatch=monkeypatch)
    assert _ids(r.output) == ["5", "8"]                              # sacct: your own jobs by default
    r = run(db, "-P", "-S", "now-4days", "-a", viewer=alice, monkeypatch=monkeypatch)
    assert _ids(r.output) == ["5", "6", "7", "8"]
    r = run(db, "-P", "-S", "now-4days", "-u", "bob", viewer=alice, monkeypatch=monkeypatch)
    assert _ids(r.output) == ["6"]


def test_private_data_jobs_still_hides_other_users_jobs_from_every_option(db, monkeypatch):
    alice = Viewer(1000, "alice", private_jobs=True)
    for args in (["-a"], ["-u", "bob,carol"], ["-s", "completed,max-retries-exceeded"], ["-a", "-s", "not-configured"]):
        r = run(db, "-P", "-S", "now-4days", *args, viewer=alice, monkeypatch=monkeypatch)
        assert r.exit_code == 0 and set(_ids(r.output)) <= {"5", "8"}, (args, r.output)
        assert "eval" not in r.output and "old" not in r.output and "plain" not in r.output
    r = run(db, "-j", "5,6", "-P", viewer=alice, monkeypatch=monkeypatch)
    assert r.exit_code == 1 and _ids(r.output.split("Error")[0]) == ["5"]
    assert "job 6 is not in the journal" in r.output and "PrivateData=jobs" in r.output and "eval" not in r.output


def test_user_and_uid_columns_come_from_the_user_name_or_uid_on_record(db):
    r = run(db, "-j", "5,9", "-P", "-X", "-o", "JobID,User,UID")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "JobID|User|UID"
    assert lines[1].startswith("5|alice|")                           # alice may not exist on this host
    assert lines[2] == "9|nobody|65534"                              # uid on record shown as its name
    r = run(db, "-a", "-s", "not-configured", "-P", "-X", "-o", "jobid,user", "-u", "65534")
    assert r.output.splitlines()[1:] == ["9|nobody"]


def test_chain_heading_shows_the_user(db):
    r = run(db, "-j", "5")
    assert r.output.splitlines()[0] == "Job 5 (train): ft state running, retries 3, user alice"


# ---------------------------------------------------------------------------- states
def test_states_select_ft_states_and_slurm_states(db):
    base = ("-P", "-S", "now-4days")
    assert _ids(run(db, *base, "-s", "max-retries-exceeded").output) == ["7"]
    assert _ids(run(db, *base, "-s", "NF").output) == ["5"]           # an attempt ended NODE_FAIL
    assert _ids(run(db, *base, "--state=f,cd").output) == ["6", "7"]  # short forms, any case
    assert _ids(run(db, *base, "-s", "running").output) == ["5", "8"]  # ft state running or RUNNING attempt
    assert _ids(run(db, *base, "-s", "completed").output) == ["6"]
    assert _ids(run(db, *base, "-s", "not-configured").output) == ["9"]   # only on request
    r = run(db, *base, "-s", "FAILED,bogus")
    assert r.exit_code == 2 and "'bogus': not a state" in r.output
    assert parse_states("rq,Requeued") == {"REQUEUED", "requeued"}


# ---------------------------------------------------------------------------- layout
def test_default_is_the_retry_chain_with_attempts_under_each_job(db):
    r = run(db, "-j", "5,6")
    lines = r.output.splitlines()
    assert lines[0].startswith("Job 5 (train)")
    assert lines[1].split() == ["Attempt", "NodeList", "Start", "End", "State", "Verdict", "Xids", "Checkpoint",
                                "Action"]
    assert set(lines[2]) == {"-", " "}
    assert lines[3].split()[:2] == ["0", "n1"] and "hardware (xid-79)" in lines[3] and "drain n1" in lines[3]
    assert lines[4].split()[:2] == ["1", "n[2-3]"] and "RUNNING" in lines[4]
    assert lines[5] == "" and lines[6].startswith("Job 6 (eval)")
    r = run(db, "-j", "5", "-n")
    assert [line.split()[0] for line in r.output.splitlines()] == ["Job", "0", "1"]


def test_allocations_one_row_per_job_and_duplicates_one_row_per_attempt(db):
    r = run(db, "-j", "5,6", "-X")
    lines = r.output.splitlines()
    assert lines[0].split()[:4] == ["JobID", "JobName", "User", "FTState"] and len(lines) == 4
    assert lines[2].split()[:5] == ["5", "train", "alice", "running", "2"]
    r = run(db, "-j", "5,6", "-X", "-D", "-P", "-o", "jobid,attempt,state,nodelist")
    assert r.output.splitlines() == ["JobID|Attempt|State|NodeList", "5|0|NODE_FAIL|n1", "5|1|RUNNING|n[2-3]",
                                     "6|0|COMPLETED|n4"]
    r = run(db, "-j", "5,6", "-P", "-o", "jobid,attempt,state")          # job row, then its attempts
    assert r.output.splitlines()[1:] == ["5||RUNNING", "5|0|NODE_FAIL", "5|1|RUNNING", "6||COMPLETED",
                                         "6|0|COMPLETED"]
    # -D: attempts stand alone, so -s picks attempts, not whole chains
    r = run(db, "-j", "5", "-X", "-D", "-P", "-s", "NF", "-o", "jobid,attempt,state")
    assert r.output.splitlines()[1:] == ["5|0|NODE_FAIL"]
    r = run(db, "-j", "5", "-X", "-P", "-s", "NF", "-o", "jobid,attempt,state")
    assert r.output.splitlines()[1:] == ["5||RUNNING"]


def test_parsable_outputs_and_noheader(db):
    r = run(db, "-j", "6", "-P", "-o", "JobID,State,ExitCode")
    assert r.output.splitlines() == ["JobID|State|ExitCode", "6|COMPLETED|0:0", "6|COMPLETED|0:0"]
    r = run(db, "-j", "6", "-p", "-n", "-X", "-o", "JobID,State")
    assert r.output.splitlines() == ["6|COMPLETED|"]
    r = run(db, "-j", "6", "-p", "-P")
    assert r.exit_code == 2 and "not both" in r.output


def test_format_widths_like_sacct(db):
    r = run(db, "-j", "5", "-X", "-o", "JobID%6,JobName%-8,FTState%5,Elapsed")
    lines = r.output.splitlines()
    assert lines[0] == " JobID JobName  FTSta Elapsed"
    assert lines[1] == "------ -------- ----- --------"
    assert lines[2].startswith("     5 train    runn+ 00:")          # right, left, truncated with '+'
    assert [c.field.name for c in parse_format("all")][:3] == ["JobID", "JobName", "User"]
    for bad, why in (("jobid,bogus", "'bogus': no such field"), ("jobid%0", "must not be 0"),
                     ("jobid%x", "expected FIELD or FIELD%WIDTH"), ("jobid,", "expected FIELD")):
        r = run(db, "-j", "5", "-o", bad)
        assert r.exit_code == 2 and why in r.output, r.output


def test_helpformat_lists_every_field_without_a_journal():
    r = CliRunner().invoke(command, ["--helpformat"])
    assert r.exit_code == 0
    names = [line.split()[0] for line in r.output.splitlines()]
    assert {"JobID", "JobName", "User", "UID", "FTState", "Attempt", "State", "NodeList", "Start", "End",
            "Verdict", "Xids", "Checkpoint", "Action"} <= set(names)
    assert CliRunner().invoke(command, ["-e"]).output == r.output


def test_json_one_job_is_an_object_several_are_a_list(db):
    r = run(db, "-j", "5", "--json", "-X", "-P")                  # formatting options ignored, as sacct
    assert json.loads(r.output)["attempts"][1]["state"] == "RUNNING"
    r = run(db, "-j", "5,6", "--json")
    data = json.loads(r.output)
    assert [h["job_id"] for h in data] == [5, 6] and data[0]["user"] == "alice" and data[0]["failovers"] == 1
    r = run(db, "-a", "-S", "now-4days", "--json")
    assert [h["job_id"] for h in json.loads(r.output)] == [5, 6, 7, 8]


def test_select_api(tmp_path):
    with open_journal(_journal(tmp_path / "j.db"), readonly=True) as j:
        found, missing = select(j, Selection(start=NOW - 4 * DAY, states=frozenset({"FAILED"})), now=NOW)
        assert [h["job_id"] for h in found] == [7] and missing == []
        found, missing = select(j, Selection(job_ids=(5, 42)), viewer=Viewer(1000, "bob", True), now=NOW)
        assert found == [] and missing == [5, 42]


# --------------------------------------------------------------------------- attacker
HOSTILE = "<b>x</b>|\x1b[31mred\r\x07|\x9b"


def _raw_controls(text: str) -> set[str]:
    return {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f}


def test_hostile_names_users_and_reasons_cannot_forge_columns_or_escapes(tmp_path):
    db = tmp_path / "j.db"
    with open_journal(db) as j:
        j.upsert_job(5, name=f"job{HOSTILE}", user=f"mallory{HOSTILE}", ft_enabled=1, retries=1,
                     ft_state="internal-error", excluded_nodes=f"n1{HOSTILE}")
        j.upsert_attempt(5, 0, nodes="n1", start=NOW - 60, end=NOW - 30, state="FAILED", exit_code=1, signal=0)
        j.add_verdict(5, 0, "n1", "user", f"rule{HOSTILE}", [], [f"evidence {HOSTILE}"])
        j.record(5, 0, "ckpt-ack", "n1", f"saved step=3 path=/ckpt/{HOSTILE}")
        j.record(5, 0, "decide", "", f"internal-error: {HOSTILE}")
    outputs = {}
    for name, args in {"chain": ["-j", "5"], "alloc": ["-j", "5", "-X", "-o", "all"],
                       "p2": ["-j", "5", "-P", "-o", "all"], "p": ["-j", "5", "-p", "-o", "all"],
                       "list": ["-a", "-P", "-o", "all"]}.items():
        r = CliRunner().invoke(command, [*args, "--journal", str(db)])
        assert r.exit_code == 0, r.output
        assert not _raw_controls(r.output), name
        assert "\\x1b[31mred\\x0d\\x07" in r.output and "\\x9b" in r.output
        outputs[name] = r.output
    for name in ("p2", "p", "list"):          # '|' in a value never adds a column
        lines = outputs[name].splitlines()
        assert len({line.count("|") for line in lines}) == 1, outputs[name]
        assert "\\x7c" in outputs[name]
    fields = outputs["p2"].splitlines()[0].split("|")
    row = dict(zip(fields, outputs["p2"].splitlines()[1].split("|")))
    assert row["JobName"] == "job<b>x</b>\\x7c\\x1b[31mred\\x0d\\x07\\x7c\\x9b"
    assert row["User"].startswith("mallory<b>x</b>\\x7c")
    r = CliRunner().invoke(command, ["-j", "5", "--json", "--journal", str(db)])
    assert r.output.isascii() and json.loads(r.output)["user"] == f"mallory{HOSTILE}"
