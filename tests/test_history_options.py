"""ft-history -A/--accounts, --delimiter and --detail (issue 26), and the account the daemon
records (migration 006_job_account, from Slurm's own job record). Real SQLite journals under
tmp_path, the CLI through CliRunner; the structural rules (a record is one line, a value never adds
a field, nothing a job or Slurm recorded reaches the terminal raw) proven by hypothesis."""

from __future__ import annotations

import re
import time
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft import config as config_mod
from slurm_ft.history import format as fmt
from slurm_ft.failover.options import trusted_options
from slurm_ft.cli.history import command
from slurm_ft.slurm.jobinfo import parse_show_job
from slurm_ft.journal import open_journal
from slurm_ft.slurm import Job

NOW = time.time()
FIXTURES = Path(__file__).parent / "fixtures" / "scontrol"
#: Any character a terminal could act on: C0/C1 controls and DEL.
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def _journal(path, jobs):
    """``jobs``: (job_id, user, account, name, evidence lines) each: one failed attempt with a
    hardware verdict, then a running one."""
    with open_journal(path) as j:
        for job_id, user, account, name, evidence in jobs:
            j.upsert_job(job_id, name=name, user=user, account=account, ft_enabled=1, retries=3,
                         ft_state="running", excluded_nodes="")
            j.upsert_attempt(job_id, 0, nodes="n1", start=NOW - 600, end=NOW - 500, state="NODE_FAIL",
                             exit_code=0, signal=9)
            j.add_verdict(job_id, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:10:00"}],
                          list(evidence), created=NOW - 500)
            j.upsert_attempt(job_id, 1, nodes="n2", start=NOW - 400, state="RUNNING")
    return str(path)


def run(db, *args):
    return CliRunner().invoke(command, [*args, "--journal", db])


SIMPLE = [(5, "alice", "physics", "train", ["NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen off the bus."]),
          (6, "bob", "Chem", "eval", []),
          (7, "carol", "", "old", [])]


# ------------------------------------------------------------------------------------ -A
def test_accounts_select_jobs_case_insensitively_and_combine_with_users(tmp_path):
    db = _journal(tmp_path / "j.db", SIMPLE)
    r = run(db, "-a", "-A", "physics,chem", "-X", "-P", "-n", "-o", "JobID,Account")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["5|physics", "6|Chem"]
    r = run(db, "-a", "--accounts", "PHYSICS", "-A", "nope", "-X", "-P", "-n", "-o", "JobID")
    assert r.output.splitlines() == ["5"]
    r = run(db, "-u", "bob", "-A", "physics", "-X", "-P", "-n", "-o", "JobID")
    assert r.exit_code == 0 and r.output == ""
    r = run(db, "-j", "5,6", "-A", "chem", "-X", "-P", "-n", "-o", "JobID")
    assert r.output.splitlines() == ["6"]


def test_bad_account_names_are_usage_errors_without_raw_controls(tmp_path):
    db = _journal(tmp_path / "j.db", SIMPLE)
    for bad in ("a b", "acct\n", "\x1b[31mred", "", "a,,b", "x" * 65):
        r = run(db, "-a", "-A", bad)
        assert r.exit_code == 2, (bad, r.output)
        assert "Traceback" not in r.output and not CONTROL.search(r.output.replace("\n", "")), r.output


def test_the_daemon_records_the_account_from_slurms_job_record(tmp_path):
    text = (FIXTURES / "running_exclusive.txt").read_text()
    job_id = int(re.match(r"JobId=(\d+)", text).group(1))
    raw = parse_show_job(text, job_id)
    assert raw is not None and raw["account"] == "root"
    job = Job.from_json({**raw, "comment": "ft:retries=2"})
    assert job.account == "root"
    assert Job.from_json({"job_id": 3, "account": "proj"}).account == "proj"
    assert Job.from_json({"job_id": 3}).account == ""
    with open_journal(tmp_path / "d.db") as j:
        trusted_options(job, j, config_mod.FailoverConfig())
        assert j.job(job_id)["account"] == "root"


def test_an_old_journal_gains_the_account_column(tmp_path):
    import sqlite3

    from slurm_ft.journal import migrations

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied REAL)")
    import sqlite_utils
    db = sqlite_utils.Database(conn)
    for name, fn in migrations.MIGRATIONS:
        if name.startswith("006"):
            break
        fn(db)
        conn.execute("INSERT INTO _migrations VALUES (?, 0)", (name,))
    conn.execute("INSERT INTO jobs (job_id, name, user, ft_state) VALUES (4, 'j', 'alice', 'running')")
    conn.commit()
    conn.close()
    with open_journal(path) as j:
        assert j.job(4)["account"] is None
        names = {r[0] for r in j.db.execute("SELECT name FROM sqlite_master WHERE type = 'index'").fetchall()}
        assert {"jobs_account", "attempts_last_job", "verdicts_created_job", "actions_last_job"} <= names
        assert not {"attempts_last", "verdicts_created", "actions_last"} & names
    r = run(str(path), "-a", "-A", "x", "-S", "2000-01-01")
    assert r.exit_code == 0 and r.output == ""


# ----------------------------------------------------------------------------- --delimiter
def test_delimiter_separates_parsable_output_and_is_ignored_without_it(tmp_path):
    db = _journal(tmp_path / "j.db", [(5, "alice", "a;b", "x;y|z", [])])
    r = run(db, "-a", "-X", "-P", "--delimiter", ";", "-o", "JobID,JobName,Account")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["JobID;JobName;Account", "5;x\\x3by|z;a\\x3bb"]
    r = run(db, "-a", "-X", "-p", "--delimiter", "::", "-n", "-o", "JobID,JobName")
    assert r.output.splitlines() == ["5::x;y|z::"]
    r = run(db, "-a", "-X", "--delimiter", ";", "-n", "-o", "JobID,JobName")     # no -p/-P: a table
    assert r.output.split() == ["5", "x;y|z"]


def test_bad_delimiters_are_usage_errors(tmp_path):
    db = _journal(tmp_path / "j.db", SIMPLE)
    for bad in ("\n", "a", "1", "\\", "", "|\x1b", "\u00a6", ";" * 17, "\x00"):
        r = run(db, "-a", "-P", "--delimiter", bad)
        assert r.exit_code == 2, (bad, r.output)
        assert "Traceback" not in r.output and not CONTROL.search(r.output.replace("\n", "")), r.output


# ------------------------------------------------------------------------------- --detail
def test_detail_shows_each_attempts_evidence_terminal_safe(tmp_path):
    db = _journal(tmp_path / "j.db", [(5, "alice", "p", "train", ["NVRM: Xid 79", "\x1b]52;c;evil\x07 fell"])])
    r = run(db, "-j", "5", "--detail")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    row0 = next(i for i, line in enumerate(lines) if line.lstrip().startswith("0 "))
    assert lines[row0 + 1] == "    n1 hardware (xid-79): NVRM: Xid 79"
    assert lines[row0 + 2] == "    n1 hardware (xid-79): \\x1b]52;c;evil\\x07 fell"
    assert lines[row0 + 3].lstrip().startswith("1 ")
    assert "NVRM" not in run(db, "-j", "5").output
    r = run(db, "-j", "5", "--detail", "-P", "-n", "-o", "JobID,Attempt")
    lines0 = ["n1 hardware (xid-79): NVRM: Xid 79", "n1 hardware (xid-79): \\x1b]52;c;evil\\x07 fell"]
    assert r.output.splitlines() == ["5||" + "\\x0a".join(f"attempt 0: {e}" for e in lines0),
                                     "5|0|" + "\\x0a".join(lines0), "5|1|"]


# ----------------------------------------------------------------------------- the rules
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_DELIMS = st.text(st.sampled_from("|;,:\t -_#!/@[]{}~^`'\"()*+<=>?.$%&"), min_size=1, max_size=4)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(st.tuples(_TEXT, _TEXT, st.lists(_TEXT, max_size=3)), min_size=1, max_size=3),
       delimiter=_DELIMS, trailing=st.booleans())
def test_parsable_output_is_one_record_per_line_whatever_the_values(tmp_path_factory, jobs, delimiter, trailing):
    """Accounts, job names and evidence with any characters (delimiters, newlines, escapes):
    every record is one line with exactly one field per column, and no control character but
    a tab delimiter reaches the output."""
    db = _journal(tmp_path_factory.mktemp("h") / "j.db",
                  [(10 + i, "alice", account, name, ev) for i, (account, name, ev) in enumerate(jobs)])
    cols = "JobID,Attempt,JobName,Account,Evidence"
    r = run(db, "-a", "-p" if trailing else "-P", "--delimiter", delimiter, "-o", cols)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert len(lines) == 1 + 3 * len(jobs)           # header, then per job: its row and two attempts
    for line in lines:
        assert not CONTROL.search(line)
        fields = line.split(delimiter)
        assert len(fields) == 5 + trailing, (line, delimiter)
        assert not trailing or fields[-1] == ""
    rows = [line.split(delimiter) for line in lines[1:]]
    assert [int(f[0]) for f in rows] == [10 + i for i in range(len(jobs)) for _ in range(3)]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20))
def test_a_delimiter_is_accepted_only_when_no_value_can_hold_it(text):
    try:
        fmt.check_delimiter(text)
    except ValueError as exc:
        assert not CONTROL.search(str(exc))
        return
    assert 1 <= len(text) <= 16 and text.isascii()
    # the escapes values are written with (\xNN, \uNNNN) never contain a delimiter character
    assert not set(text) & set("\\xu0123456789abcdefABCDEF\n\r")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=20))
def test_any_account_option_is_a_usage_error_or_a_clean_name(text):
    r = CliRunner().invoke(command, ["-a", "-A", text, "--journal", "/nonexistent/j.db"])
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)
    if r.exit_code == 2:
        assert not CONTROL.search(r.output.replace("\n", ""))


# -------------------------------------------------------------------------- waiting rows
def test_waiting_rows_counts_a_readers_spool_and_a_writers_own_rows(tmp_path):
    path = tmp_path / "j.db"
    with open_journal(path) as j:
        assert j.waiting_rows == 0
    (tmp_path / "j.db.spool").write_text('{"uid": "a", "op": "upsert"}\n\n{"uid": "b", "op": "upsert"}\n')
    with open_journal(path, readonly=True) as j:
        assert j.waiting_rows == 2
    r = run(str(path), "-a")
    assert "2 row(s) wait in its spool" in r.output
