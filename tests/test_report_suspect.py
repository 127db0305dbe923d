"""The drain report's "suspect nodes (recurring crashes)" table (issue 22, slurm_ft/report/suspect.py):
nodes the ``node-crash-recurring`` rule made suspect, from the daemon journal and node journals,
each job attempt counted once, in text, HTML and JSON, hostile node names escaped."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings, strategies as st

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.report import collect, render
from slurm_ft.report.suspect import table
from slurm_ft.slurm import Node

RULE = "node-crash-recurring"
HOSTILE = "n9<script>alert(1)</script>\x1b[2J"


class _Slurm:
    def __init__(self, nodes=()):
        self._nodes = list(nodes)

    def nodes(self):
        return self._nodes


def _site(tmp_path):
    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db")}})
    now = time.time()
    with open_journal(cfg.journal.path) as j:          # the daemon's copies (through the mailbox)
        j.add_verdict(20, 0, "n1", "unknown", f"unverified:{RULE}", created=now - 300, source="mailbox")
        j.add_verdict(21, 0, "n1", "hardware", f"verified:{RULE}", created=now - 200, source="mailbox")
        j.add_verdict(22, 0, HOSTILE, "unknown", f"unverified:{RULE}", created=now - 100, source="mailbox")
        j.add_verdict(23, 0, "n2", "user", "segfault", created=now - 100)                   # not suspect
        j.add_verdict(24, 0, "n3", "unknown", f"unverified:{RULE}", created=now - 30 * 86400)  # before the window
    with open_journal(tmp_path / "node-n1.db") as nj:    # n1's own journal: the same jobs, with owners
        nj.add_verdict(20, 0, "n1", "unknown", f"unverified:{RULE}", created=now - 300, uid=1001)
        nj.add_verdict(21, 0, "n1", "hardware", f"verified:{RULE}", created=now - 200, uid=1002)
        nj.add_verdict(25, 0, "n1", "unknown", f"unverified:{RULE}", created=now - 50, uid=1001)
    return cfg


def test_suspect_nodes_in_every_format(tmp_path):
    cfg = _site(tmp_path)
    data = collect(cfg, _Slurm(), node_journals=str(tmp_path / "node-*.db"))
    by = {n.node: n for n in data.suspect_nodes}
    assert set(by) == {"n1", HOSTILE}
    n1 = by["n1"]
    assert (n1.jobs, n1.confirmed, n1.not_confirmed, n1.users) == (3, 1, 2, 2)
    assert n1.job_ids == [25, 21, 20] and n1.first < n1.last
    assert [n.node for n in data.suspect_nodes] == ["n1", HOSTILE]          # most jobs first

    doc = json.loads(render(data, "json"))
    assert [(s["node"], s["jobs"], s["confirmed"], s["not_confirmed"], s["users"]) for s in doc["suspect_nodes"]] == \
        [("n1", 3, 1, 2, 2), (HOSTILE, 1, 0, 1, 0)]
    assert "\x1b" not in render(data, "json")

    html = render(data, "html")
    assert "Suspect nodes (recurring crashes)" in html
    assert "<script>alert" not in html and "&lt;script&gt;" in html and "\x1b" not in html

    text = render(data, "text")
    assert "Suspect nodes (recurring crashes" in text and "\x1b" not in text
    line = next(x for x in text.splitlines() if x.strip().startswith("n1 ") and " jobs: " in x)
    assert "3 jobs: 1 confirmed (drained), 2 not confirmed (retried elsewhere); users 2" in line


def test_without_node_journals_the_daemon_journal_alone_gives_the_table(tmp_path):
    data = collect(_site(tmp_path), _Slurm())
    by = {n.node: (n.jobs, n.confirmed, n.users) for n in data.suspect_nodes}
    assert by == {"n1": (2, 1, 0), HOSTILE: (1, 0, 0)}                        # owners unknown there


def test_no_suspect_node_says_none(tmp_path):
    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db")}})
    with open_journal(cfg.journal.path) as j:
        j.add_verdict(1, 0, "n1", "user", "segfault")
    data = collect(cfg, _Slurm([Node.from_json({"name": "n1", "state": "idle", "state_flags": []})]))
    assert data.suspect_nodes == []
    assert "Suspect nodes (recurring crashes of several users' jobs; jobs not blamed, the trusted checks decide): 0" \
        in render(data, "text")
    assert json.loads(render(data, "json"))["suspect_nodes"] == []


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["n1", "n2"]), st.integers(1, 5), st.integers(0, 1),
                               st.sampled_from([f"verified:{RULE}", f"unverified:{RULE}"]),
                               st.sampled_from([1001, 1002, None]), st.floats(0, 1000)), max_size=20))
def test_each_job_attempt_counts_once_and_the_parts_add_up(rows):
    """Whatever the journals hold (the same attempt in the daemon's and the node's journal, with
    or without owner): a node's jobs are its distinct attempts, confirmed + not confirmed = jobs,
    and an attempt is confirmed when any copy says a trusted check confirmed it."""
    verdicts = [{"node": n, "job_id": job, "attempt": a, "rule": r, "uid": u, "created": t}
                for n, job, a, r, u, t in rows]
    got = {s.node: s for s in table(verdicts)}
    for node in {r[0] for r in rows}:
        attempts = {(job, a) for n, job, a, *_ in rows if n == node}
        confirmed = {(job, a) for n, job, a, r, *_ in rows if n == node and r.startswith("verified:")}
        s = got[node]
        assert s.jobs == len(attempts) and s.confirmed == len(confirmed)
        assert s.confirmed + s.not_confirmed == s.jobs
        assert s.users <= len({u for n, *_, u, _ in rows if n == node and u is not None})
    assert set(got) == {r[0] for r in rows}
