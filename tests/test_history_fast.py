"""ft-history's bulk read (issue 26, a 30-day window over 1,000,000 attempts): the records of a
window read in three queries (history._Prefetched) give exactly the histories and times the
Journal's own per-job reads give, whatever the journal holds; the row-at-once terminal check
escapes exactly what the per-cell one does. Real SQLite journals, hypothesis-generated."""

from __future__ import annotations

import sqlite3

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.history import query as H
from slurm_ft.history import format as fmt
from slurm_ft.journal import open_journal
from slurm_ft.textsafe import terminal_safe

T0 = 1_700_000_000.0
_times = st.one_of(st.none(), st.floats(T0, T0 + 10_000))
_text = st.text(max_size=6)
_verdict = st.tuples(st.integers(0, 3), st.sampled_from(["n1", "n2", "n3"]),
                     st.sampled_from(["hardware", "hang", "infra", "user", "unknown", "ok", "odd"]),
                     st.sampled_from(["xid-79", "health:gpu", "exit-1"]),
                     st.lists(st.fixed_dictionaries({"xid": st.integers(1, 200)}), max_size=2),
                     st.lists(_text, max_size=2), st.floats(T0, T0 + 10_000))
_action = st.tuples(st.integers(0, 3), st.sampled_from(["drain", "requeue", "failover", "decide", "ckpt-ack", "hold"]),
                    st.sampled_from(["done", "failed", "intent", "observed", "skipped"]), _text)
_job = st.tuples(st.sampled_from(["running", "completed", "requeued", "not-configured"]),
                 st.sampled_from(["alice", "bob"]), st.sampled_from(["phys", "PHYS", "chem", "", "\u212a"]),
                 st.lists(st.tuples(st.integers(0, 3), _times, _times, st.sampled_from(["FAILED", "RUNNING"])),
                          max_size=3),
                 st.lists(_verdict, max_size=3), st.lists(_action, max_size=4))


def _build(path, jobs) -> None:
    with open_journal(path) as j:
        for job_id, (state, user, account, attempts, verdicts, actions) in enumerate(jobs, start=1):
            j.upsert_job(job_id, name=f"j{job_id}", user=user, account=account, ft_enabled=1, retries=2,
                         ft_state=state, excluded_nodes="")
            for n, start, end, slurm_state in attempts:
                j.upsert_attempt(job_id, n, nodes=None if n == 3 else "n1", start=start, end=end, state=slurm_state)
            for n, node, cls, rule, xids, evidence, created in verdicts:
                j.add_verdict(job_id, n, node, cls, rule, xids, evidence, created=created)
            for n, action, status, detail in actions:
                aid = j.intend(job_id, n, action, "n1", detail)
                if status != "intent":
                    j.finish(aid, status)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(_job, min_size=2, max_size=4))
def test_bulk_read_gives_the_journals_own_histories_and_times(tmp_path_factory, jobs):
    path = tmp_path_factory.mktemp("fast") / "j.db"
    _build(path, jobs)
    with open_journal(path, readonly=True) as j:
        rows = {r["job_id"]: r for r in j.db.query("SELECT * FROM jobs")}
        bulk = H._Prefetched(j, rows, rows)
        assert {k: tuple(v) for k, v in bulk.spans.items()} == H._spans(j, rows)
        for job_id, job in rows.items():
            assert H._chain(bulk, job_id, job) == H._chain(j, job_id, job)
        found, _ = H.select(j, H.Selection(all_users=True, start=0.0,
                                           states=frozenset({"running", "completed", "requeued", "not-configured"})),
                            now=None)
        assert [h["job_id"] for h in found] == sorted(rows)
        assert found == [H.history(j, job_id) for job_id in sorted(rows)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(_job, min_size=1, max_size=5), start=st.floats(T0 - 10, T0 + 12_000),
       user=st.sampled_from(["alice", "bob"]), accounts=st.sets(st.sampled_from(["phys", "chem", "k"]), max_size=2))
def test_a_users_or_an_accounts_jobs_are_the_windows_jobs_of_that_user_or_account(tmp_path_factory, jobs, start,
                                                                                    user, accounts):
    """-u and -A read by their own indexes (jobs_user, jobs_account) and narrow by time before
    reading the rows; they select exactly the window's jobs of that user or account."""
    path = tmp_path_factory.mktemp("who") / "j.db"
    _build(path, jobs)
    states = frozenset({"running", "completed", "requeued", "not-configured"})
    with open_journal(path, readonly=True) as j:
        everyone, _ = H.select(j, H.Selection(all_users=True, start=start, states=states), now=T0 + 20_000)
        mine, _ = H.select(j, H.Selection(users=frozenset({user}), start=start, states=states), now=T0 + 20_000)
        assert mine == [h for h in everyone if h["user"] == user]
        theirs, _ = H.select(j, H.Selection(all_users=True, accounts=frozenset(accounts), start=start, states=states),
                             now=T0 + 20_000)
        assert theirs == [h for h in everyone if (h["account"] or "").lower() in accounts
                          and (h["account"] or "").isascii()]


def test_a_value_that_is_not_utf8_still_reads(tmp_path):
    path = tmp_path / "j.db"
    _build(path, [("running", "alice", "a", [(0, T0, T0 + 5, "FAILED")], [], []),
                  ("running", "alice", "a", [(0, T0, None, "RUNNING")], [], [])])
    conn = sqlite3.connect(path)
    conn.execute("UPDATE attempts SET nodes = CAST(x'6eff31' AS TEXT) WHERE job_id = 1")   # another tool's bytes
    conn.commit()
    conn.close()
    with open_journal(path, readonly=True) as j:
        rows = {r["job_id"]: r for r in j.db.query("SELECT * FROM jobs")}
        bulk = H._Prefetched(j, rows, rows)
        assert bulk.attempts(1)[0]["nodes"] == "n\ufffd1"
        assert H._chain(bulk, 1, rows[1]) == H._chain(j, 1, rows[1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=8), min_size=1, max_size=5))
def test_row_check_escapes_exactly_what_the_cell_check_does(values):
    cols = [fmt.Column(fmt.Field(f"F{i}", "", lambda r, i=i: r.h["v"][i])) for i in range(len(values))]
    row = fmt.Row({"v": values, "attempts": []}, None, True, 0.0)
    assert fmt._cells(cols, [row]) == [[terminal_safe(v) for v in values]]
