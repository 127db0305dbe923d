"""A node that crashes jobs of several users, through the real epilog and daemon on the lab (issue 22).

Every node's journal first gets two earlier crashed jobs (``segfault``) of two other owners, as
their epilogs would have recorded them (``verdicts.uid``). The lab's ordinary user then submits
an ft job that crashes (``srun: error: ...: Segmentation fault (core dumped)``, ai4d-iasc/trixie#35,
exit 139). The real epilog, run by slurmd, counts 3 jobs of 3 owners within 24 h on that node:
the node is suspect, the trusted GPU checks (the lab's healthy fake GPUs) find nothing, so the job
is ``unknown`` / ``unverified:node-crash-recurring`` (not blamed) and the daemon retries it
elsewhere as an unblamed retry; the node is neither drained nor excluded. The owner journaled is
slurmd's ``SLURM_JOB_UID``. The seeded rows and this job's rows are removed from the node
journals afterwards (no leftover crash history for later tests).
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import wait_for
from slurm_ft.lab.users import LAB_USER, ensure_user, run_as

pytestmark = pytest.mark.lab

SEGV = "srun: error: n1: task 0: Segmentation fault (core dumped)"     # ai4d-iasc/trixie#35 wording
RULE = "unverified:node-crash-recurring"


@pytest.fixture(scope="module")
def user(lab):
    return ensure_user()


def _node_journals(lab, slurm) -> dict[str, str]:
    cfg = config_mod.load(lab.lay.ft_conf)
    return {n.name: cfg.node_journal_path(n.name) for n in slurm.nodes()}


def _forget(paths: dict[str, str], job_ids: list[int]) -> None:
    """Remove these jobs' verdict rows from the node journals (the lab as it was)."""
    for path in paths.values():
        if not os.path.exists(path):
            continue
        with open_journal(path) as j:
            j.db.conn.execute("DELETE FROM verdicts WHERE job_id IN (SELECT value FROM json_each(?))",
                              [json.dumps(job_ids)])


def test_a_node_crashing_jobs_of_several_users_is_suspect_not_the_job(lab, slurm, user, ft_history):
    journals = _node_journals(lab, slurm)
    base = 2_000_000_000 + (time.time_ns() // 1000) % 100_000_000 * 2   # ids no lab job gets
    seeded = [base, base + 1]
    job_id = None
    try:
        for node, path in journals.items():
            with open_journal(path) as j:
                for k, jid in enumerate(seeded):
                    j.add_verdict(jid, 0, node, "user", "segfault", evidence=[SEGV], exit_code=139,
                                  created=time.time() - 120 + k, uid=user.pw_uid + 1001 + k)
        jobs = lab.lay.jobs_dir
        script = jobs / f"recurrence-{time.time_ns()}.sh"
        script.write_text(f"#!/bin/sh\necho '{SEGV}' >&2\nexit 139\n")
        os.chmod(script, 0o755)
        proc = run_as(LAB_USER, ["/usr/bin/sbatch", "--parsable", f"--output={jobs}/%j.out", "--ft",
                                 "--ft-retries=3", str(script)], lab.env(), cwd=str(jobs))
        assert proc.returncode == 0, proc.stderr
        job_id = int(proc.stdout.strip().split(";")[0])
        h = ft_history(job_id, lambda h: h["attempts"] and h["attempts"][0]["verdict"] and h["failovers"] >= 1,
                       timeout_s=150)
        first = h["attempts"][0]
        assert (first["verdict"], first["rule"]) == ("unknown", RULE), h
        rows = []
        for path in journals.values():
            with open_journal(path, readonly=True) as j:
                rows += [r for r in j.verdicts(job_id, 0)]
        assert rows, "no node journal holds the job's verdict"
        for r in rows:
            assert (r["verdict"], r["rule"], r["action"]) == ("unknown", RULE, "retry"), r
            assert r["uid"] == user.pw_uid, r                                   # slurmd's SLURM_JOB_UID
            # the two seeded crashes of two other users, the job's own, and any crash an earlier
            # lab test left on this node within the window
            counts = [re.match(r"node-crash-recurring: (\d+) jobs of (\d+) users", e) for e in r["evidence"]]
            assert any(m and int(m[1]) >= 3 and int(m[2]) >= 3 for m in counts), r
            assert any(e.startswith("trusted GPU checks") for e in r["evidence"]), r
        for n in slurm.nodes():                                                 # suspect, never drained
            assert not (n.drained and n.reason.startswith("slurm-ft:")), (n.name, n.reason)
        daemon_journal = config_mod.load(lab.lay.ft_conf).journal.path

        def excluded():
            with open_journal(daemon_journal, readonly=True) as j:
                assert not [a for a in j.actions(job_id) if a["action"] == "drain"]
                return (j.job(job_id) or {}).get("excluded_nodes")
        # retried elsewhere: the suspect node is excluded for this job only (policy.avoided_by)
        assert wait_for(excluded, 30, "the suspect node excluded for the retry") == first["nodes"]
    finally:
        if job_id is not None:
            slurm.run("scancel", str(job_id), check=False)
            slurm.wait_job(job_id, lambda j: j.state not in ("RUNNING", "COMPLETING", "CONFIGURING"), 60)
        _forget(journals, seeded + ([job_id] if job_id is not None else []))
