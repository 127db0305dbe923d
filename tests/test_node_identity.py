"""Node-side job identity (issue 20): the node journal files a verdict under (job id, attempt),
and Slurm hands a job id out again after a state loss. The epilog tells a reused id by the
attempt's start, which only slurmd (``SLURM_JOB_START_TIME``, 23.02+) or slurm-ft's own prolog
(the root-written start marker, 22.05) sets, never the job (slurm_ft.node.job.node_key,
slurm_ft.journal.identity.observe_node)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_ft.node import epilog
from slurm_ft import slurm as slurm_mod
from slurm_ft.classify.model import Verdict
from slurm_ft.journal import identity, open_node_journal
from slurm_ft.node.job import NodeJob, node_key, pop_start_marker, write_start_marker
from daemon_world import World

#: What slurmd sets in the Prolog/Epilog environment from the job's record (the job picks the
#: value, slurmd the name): a job controls these values, and all of its SPANK environment, which
#: slurmd prefixes ``SPANK_`` (22.05 src/common/slurm_protocol_defs.c valid_spank_job_env).
USER_CHOSEN = ("SLURM_JOB_COMMENT", "SLURM_JOB_NAME", "SLURM_JOB_STDOUT", "SLURM_JOB_STDERR", "SLURM_JOB_STDIN",
               "SLURM_JOB_WORK_DIR", "SLURM_JOB_CONSTRAINTS", "SLURM_JOB_ACCOUNT", "SLURM_JOB_RESERVATION",
               "SLURM_JOB_PARTITION", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")


def _slurmd_env(job_id: int, attempt: int, start: int | None, spank: dict, chosen: dict) -> dict:
    """The environment as slurmd builds it: the job's SPANK environment first (every name made
    ``SPANK_...``), then slurmd's own variables over it (22.05/24.11 prep_script_slurmd.c)."""
    env = {(k if k.startswith("SPANK_") else f"SPANK_{k}"): v for k, v in spank.items()}
    env.update(chosen)
    env.update({"SLURM_JOB_ID": str(job_id), "SLURMD_NODENAME": "n1", "SLURM_JOB_RESTART_COUNT": str(attempt),
                "SLURM_JOB_UID": "1000", "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"})
    if start is not None:
        env["SLURM_JOB_START_TIME"] = str(start)
    return env


names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters="="), min_size=1,
                max_size=30)
values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=30)


@settings(max_examples=300, deadline=None)
@given(job_id=st.integers(1, 2**31), attempt=st.integers(0, 20), start=st.none() | st.integers(1, 2**32),
       marker=st.none() | st.floats(1.0, 4e9), spank=st.dictionaries(names, values, max_size=6),
       forged=st.sampled_from(["SLURM_JOB_START_TIME", "SPANK_SLURM_JOB_START_TIME", "SLURM_JOB_ID",
                               "SLURM_JOB_RESTART_COUNT"]),
       forged_value=values, chosen=st.dictionaries(st.sampled_from(USER_CHOSEN), values, max_size=6))
def test_nothing_the_job_sets_changes_the_node_key(job_id, attempt, start, marker, spank, forged, forged_value, chosen):
    """Whatever the job puts in its SPANK environment (including names such as
    ``SLURM_JOB_START_TIME``) and whatever values it picks for the fields slurmd copies from its
    record, the node key is the one slurmd's own variables and the prolog's marker give."""
    clean = NodeJob.from_env(_slurmd_env(job_id, attempt, start, {}, {}))
    dirty = NodeJob.from_env(_slurmd_env(job_id, attempt, start, {**spank, forged: forged_value}, chosen))
    m = None if marker is None else {"time": marker}
    assert node_key(dirty, m) == node_key(clean, m)
    assert node_key(clean, m) == (job_id, attempt, float(start) if start else marker)


@pytest.mark.parametrize("bad", [{"time": True}, {"time": "1.0"}, {"time": -3.0}, {}, None, {"time": None}])
def test_a_marker_without_a_usable_time_gives_no_start(bad):
    job = NodeJob.from_env(_slurmd_env(5, 0, None, {}, {}))
    assert node_key(job, bad) == (5, 0, None)


class FieldSlurm:
    def __init__(self):
        self.field = ""

    def show_node(self, node):
        return {"Extra": self.field}

    def update_node(self, node, **kw):
        self.field = kw.get("Extra", self.field)


@pytest.fixture
def w(tmp_path, monkeypatch):
    world = World(tmp_path, nodes=2, monkeypatch=monkeypatch)
    fake = FieldSlurm()
    monkeypatch.setattr(slurm_mod.Slurm, "from_config", classmethod(lambda cls, cfg: fake))
    return world


def _epilog(w, job_id: int, attempt: int, start: float | None, verdict: str = "user"):
    """The epilog's journaling of one verdict on n1 (slurm_ft.node.epilog.record_verdict), for an
    attempt the prolog marked at ``start``."""
    rule = {"user": "python-traceback", "ok": "clean-exit"}[verdict]
    job = NodeJob(job_id, "n1", attempt, 1000, None, 1 if verdict != "ok" else 0, None, None, None, None)
    lines = []
    epilog.record_verdict(w.cfg, job, Verdict(verdict, rule, (), (f"{verdict} line",), "none"), start=start,
                          log=lines.append)
    return lines


def test_a_reused_job_id_on_the_same_node_is_a_new_record(w):
    t0 = time.time()
    _epilog(w, 41, 0, t0)                                   # the old job 41
    w.clock.advance(600)
    lines = _epilog(w, 41, 0, t0 + 590)                     # Slurm gave id 41 to a new job
    assert any("reused on this node" in line for line in lines)
    with open_node_journal(w.cfg, "n1", readonly=True) as j:
        assert [(v["attempt"], v["evidence"]) for v in j.verdicts(41)] == [(0, ["user line"])]
        old = identity.retired(j)
        assert len(old) == 1 and next(iter(old.values()))["job_id"] == 41
        key = next(iter(old))
        assert [v["attempt"] for v in j.verdicts(key)] == [0]           # the old verdict kept, apart
        assert any(a["action"] == identity.RETIRE_ACTION for a in j.actions(key))


@pytest.mark.parametrize("again", ["same start", "no start", "later attempt", "epilog twice"])
def test_the_same_job_is_never_split(w, again):
    t0 = time.time()
    _epilog(w, 7, 0, t0)
    w.clock.advance(120)
    attempt, start = {"same start": (0, t0), "no start": (0, None), "later attempt": (1, t0 + 100),
                      "epilog twice": (0, t0 - 0.5)}[again]
    _epilog(w, 7, attempt, start)
    with open_node_journal(w.cfg, "n1", readonly=True) as j:
        assert identity.retired(j) == {}
        assert sorted({v["attempt"] for v in j.verdicts(7)}) == sorted({0, attempt})


def test_the_prolog_marker_gives_the_start_on_22_05(w):
    """22.05's slurmd exports no start time: the epilog's key takes the root-written marker's."""
    state = w.cfg.node_state.dir
    job = NodeJob.from_env(_slurmd_env(9, 0, None, {"SLURM_JOB_START_TIME": "1"}, {}))
    assert job.start_time is None
    write_start_marker(state, job)
    marker = pop_start_marker(state, job)
    assert node_key(job, marker)[2] == marker["time"]
    assert node_key(NodeJob.from_env(_slurmd_env(9, 0, 1_800_000_000, {}, {})), marker)[2] == 1_800_000_000.0
