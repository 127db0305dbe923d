"""A node that crashes job after job, of several users, is the suspect (issue 22): the epilog
feeds the ``node-crash-recurring`` rule (slurm_ft.classify.recurrence) from the node journal,
whose verdict rows now carry the job's owner (``verdicts.uid``, migration 008, from slurmd's
``SLURM_JOB_UID``). A suspect node gets the trusted checks: only a failing one drains; otherwise
the job is ``unknown`` (retried elsewhere, unblamed). One user alone never makes a node suspect.

Real parts: the epilog's ``run`` with slurmd's environment, a real node journal (SQLite), the
job's real output file, fake NVML (the trusted checks), a fake Slurm (drain/mailbox)."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from slurm_ft.node import epilog
from slurm_ft.journal import migrations, open_journal
from slurm_ft.node.job import NodeJob
from slurm_ft.nvml import fake
from fake_slurm import FakeSlurm

SEGV = "srun: error: cn125: task 0: Segmentation fault (core dumped)\n"   # ai4d-iasc/trixie#35
RULE = "node-crash-recurring"
ME = os.getuid()      # the current job's owner: its output file is read as this uid


@pytest.fixture
def node(tmp_path, monkeypatch):
    """Node n1 (GPUs 0, 1; fake NVML), no kernel-log record; ``run`` ends one job there as slurmd
    would (``uid`` in ``SLURM_JOB_UID``) and returns its node-journal row."""
    conf = tmp_path / "slurm-ft.toml"
    conf.write_text(f'[journal]\npath = "{tmp_path}/d.db"\nnode_path = "{tmp_path}/node-{{node}}.db"\n'
                    f'[node_state]\ndir = "{tmp_path}/state"\nlog = "{tmp_path}/node.log"\n'
                    f'[nvml]\nbackend = "fake"\ninventory = "{tmp_path}/{{node}}.json"\n'
                    f'[health]\nisolation = "thread"\n')
    slurm = FakeSlurm(4)
    monkeypatch.setattr("slurm_ft.slurm.Slurm.from_config", classmethod(lambda cls, c: slurm))
    monkeypatch.setattr("slurm_ft.classify.sources.read_kmsg", lambda since, **kw: [])
    out = tmp_path / "job.err"

    def run(job_id, text=SEGV, exit_status=139 << 8, uid=ME, lost=(), user=None):
        fake.write_inventory(str(tmp_path / "n1.json"), "n1", [{"index": i, "lost": i in lost} for i in (0, 1)])
        out.write_text(text)
        env = {"SLURM_FT_CONFIG": str(conf), "SLURM_JOB_ID": str(job_id), "SLURMD_NODENAME": "n1",
               "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_EXIT_CODE": str(exit_status), "SLURM_JOB_GPUS": "0",
               "SLURM_JOB_STDERR": str(out), "PATH": "/usr/bin:/bin"}
        if uid is not None:
            env["SLURM_JOB_UID"] = str(uid)
        if user is not None:
            env["SLURM_JOB_USER"] = user
        assert epilog.run(env) == 0
        with open_journal(tmp_path / "node-n1.db") as j:
            (row,) = [r for r in j.verdicts(job_id, 0) if r["node"] == "n1"]
        return row

    def reset():
        """A new, empty node journal (hypothesis examples share the fixture)."""
        for side in ("", "-wal", "-shm", ".spool"):
            if os.path.exists(f"{tmp_path}/node-n1.db{side}"):
                os.unlink(f"{tmp_path}/node-n1.db{side}")

    return {"run": run, "slurm": slurm, "db": tmp_path / "node-n1.db", "log": tmp_path / "node.log", "reset": reset}


def crashed(db, job_id, uid, *, rule="segfault", age_s=600.0):
    """An earlier job's verdict on this node, as its epilog recorded it."""
    with open_journal(db) as j:
        j.add_verdict(job_id, 0, "n1", "user", rule, evidence=[SEGV.strip()], exit_code=139,
                      created=time.time() - age_s, uid=uid)


def test_one_crash_is_the_jobs_own_and_its_owner_is_journaled(node):
    row = node["run"](10, uid=ME)
    assert (row["verdict"], row["rule"], row["uid"]) == ("user", "segfault", ME)


def test_crashes_of_several_users_make_the_node_suspect_not_the_job(node):
    crashed(node["db"], 10, 1001)
    crashed(node["db"], 11, 1002, rule="signal-other")
    row = node["run"](12)
    assert (row["verdict"], row["rule"], row["action"]) == ("unknown", f"unverified:{RULE}", "retry")
    assert any(line.startswith(f"{RULE}: 3 jobs of 3 users on this node ended by segfault") for line in row["evidence"])
    assert any(line.startswith("trusted GPU checks") and "found no fault" in line for line in row["evidence"])
    assert not node["slurm"].node_recs["n1"].drain          # suspect, never drained on that alone
    assert row["uid"] == ME


def test_a_failing_trusted_check_drains_the_suspect_node(node):
    crashed(node["db"], 10, 1001)
    crashed(node["db"], 11, 1002)
    row = node["run"](12, lost=(0,))
    assert (row["verdict"], row["rule"], row["action"]) == ("hardware", f"verified:{RULE}", "drain_node")
    assert row["evidence"][0].startswith("trusted check ")
    n1 = node["slurm"].node_recs["n1"]
    assert n1.drain and n1.reason.startswith("slurm-ft:")


def test_old_crashes_other_kinds_and_the_same_job_do_not_count(node):
    crashed(node["db"], 10, 1001, age_s=2 * 86400)           # outside the 24 h window
    crashed(node["db"], 11, 1002, rule="cuda-oom")            # not a crash kind
    with open_journal(node["db"]) as j:                      # the current job's own rows (another node)
        j.add_verdict(12, 0, "n2", "user", "segfault", created=time.time() - 60, uid=1003)
        j.add_verdict(12, 1, "n2", "user", "segfault", created=time.time() - 30, uid=1004)
    row = node["run"](12)
    assert row["rule"] == "segfault"


def test_a_user_name_without_uid_is_resolved_to_its_uid():
    import pwd

    me = pwd.getpwuid(ME).pw_name
    job = NodeJob(job_id=1, node="n1", attempt=0, uid=None, gpus=None, exit_code=0, signal=None, stdout=None,
                  stderr=None, work_dir=None, user=me)
    assert epilog.job_uid(job) == ME
    assert epilog.job_uid(dataclasses.replace(job, user="no-such-user-xyz")) is None
    assert epilog.job_uid(dataclasses.replace(job, user=None)) is None
    assert epilog.job_uid(dataclasses.replace(job, uid=4242)) == 4242


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.integers(0, 12), claims=st.sampled_from(["", "SLURM_JOB_UID=1001\n", "user bob uid=1002\n"]),
       kind=st.sampled_from(["segfault", "signal-other", "unverified:segfault", "illegal-memory-access"]))
def test_one_user_crashing_many_jobs_never_makes_the_node_suspect(node, jobs, claims, kind):
    """However many crashes one user's jobs leave on a node (and whatever their output claims
    about users), the owners come from slurmd: one uid is one user, and one user is never
    enough."""
    node["reset"]()
    start = 1000
    for n in range(jobs):
        crashed(node["db"], start + n, ME, rule=kind, age_s=60.0 + n)
    row = node["run"](start + jobs, text=claims + SEGV, uid=ME)
    assert row["rule"] == "segfault" and row["verdict"] == "user"
    assert not node["slurm"].node_recs["n1"].drain


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prior=st.lists(st.tuples(st.integers(1, 6), st.sampled_from([ME, ME + 1, ME + 2, None]),
                                st.sampled_from(["segfault", "signal-other", "cuda-oom", f"unverified:{RULE}"]),
                                st.sampled_from([60.0, 3600.0, 90000.0])), max_size=8))
def test_the_node_is_suspect_exactly_when_three_jobs_of_two_owners_crashed(node, prior):
    """The structural rule through the real epilog and journal: suspect exactly when at least 3
    distinct jobs (the current one included) of at least 2 distinct known owners ended on a
    counted crash within 24 h; never a drain while the trusted checks pass."""
    node["reset"]()
    start = 5000
    # one verdict per job, attempt and node: a second one is not recorded
    with open_journal(node["db"]) as j:
        recorded = [p for p in prior if j.add_verdict(start + p[0], 0, "n1", "user", p[2], uid=p[1],
                                                      created=time.time() - p[3])]
    row = node["run"](start + 9, uid=ME)
    counted = [(job, uid) for job, uid, rule, age in recorded if rule in ("segfault", "signal-other") and age < 86400]
    jobs = {job for job, _ in counted} | {9}
    users = {uid for _, uid in counted if uid is not None} | {ME}
    suspect = len(jobs) >= 3 and len(users) >= 2
    assert (row["rule"] == f"unverified:{RULE}") == suspect, (prior, row["rule"])
    assert row["rule"] in ("segfault", f"unverified:{RULE}")
    assert not node["slurm"].node_recs["n1"].drain


def test_a_journal_from_before_the_owner_column_is_migrated_and_its_rows_count_no_owner(tmp_path):
    """A node journal written before migration 008: opened, it gains ``verdicts.uid``; its old
    rows have no owner (they count as jobs, never as users)."""
    import sqlite_utils

    path = tmp_path / "node-n1.db"
    db = sqlite_utils.Database(sqlite3.connect(str(path), isolation_level=None))
    db.conn.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied REAL)")
    for name, fn in migrations.MIGRATIONS:
        if name == "008_verdict_uid":
            break
        fn(db)
        db.conn.execute("INSERT INTO _migrations VALUES (?, ?)", (name, 0.0))
    db["verdicts"].insert({"job_id": 5, "attempt": 0, "node": "n1", "verdict": "user", "rule": "segfault",
                           "created": time.time() - 60})
    db.conn.close()
    with open_journal(path) as j:
        j.add_verdict(6, 0, "n1", "user", "segfault", created=time.time() - 30, uid=1001)
        rows = j.recent_rule_verdicts(time.time() - 3600, ["segfault"])
    assert [(r["job_id"], r["uid"]) for r in rows] == [(6, 1001), (5, None)]


def test_the_owner_query_is_bounded_and_exact(tmp_path):
    with open_journal(tmp_path / "n.db") as j:
        now = time.time()
        for i in range(30):
            j.add_verdict(i, 0, "n1", "user", "segfault" if i % 2 else "unverified:segfault", created=now - i, uid=i)
        j.add_verdict(99, 0, "n1", "user", "segfault-like", created=now, uid=1)
        got = j.recent_rule_verdicts(now - 10.5, ["segfault"], limit=100)
        assert [r["job_id"] for r in got] == [9, 7, 5, 3, 1]              # in window, exact rule, newest first
        assert len(j.recent_rule_verdicts(now - 100, ["segfault", "unverified:segfault"], limit=4)) == 4
        assert [r["job_id"] for r in j.recent_rule_verdicts(now - 100, ["segfault"], scan=5)] == [29, 27]
