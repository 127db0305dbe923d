"""Slurm hostlists and index lists, parsed and folded by ClusterShell (issue 14)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from slurm_ft.errors import HostlistError, SlurmCommandError
from slurm_ft.history.query import history
from slurm_ft.journal import open_journal
from slurm_ft.node.job import BadEnvironment, parse_gpu_list
from slurm_ft.slurm import Job, Slurm, compress_nodes, split_indices, split_nodes


@pytest.mark.parametrize("expr, names", [
    ("gpu[01-02]-ib", ["gpu01-ib", "gpu02-ib"]),                  # the case: suffix after the range
    ("n[1-3],gpu[07-08]", ["gpu07", "gpu08", "n1", "n2", "n3"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),           # two ranges in one name
    ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),                  # zero padding kept across a carry
    ("n[001-003]", ["n001", "n002", "n003"]),
    ("n[9-11]", ["n9", "n10", "n11"]),                            # no padding: widths grow
    ("n[1-2,5,7-8]", ["n1", "n2", "n5", "n7", "n8"]),             # comma list inside the brackets
    ("node-[1-2].ib", ["node-1.ib", "node-2.ib"]),
    ("n1", ["n1"]),
    ("gpu07", ["gpu07"]),
    ("login", ["login"]),
    ("n1,n3,gpu07", ["gpu07", "n1", "n3"]),
    ("n[1-3],n2", ["n1", "n2", "n3"]),                            # each name once
    ("", []), ("(null)", []), ("None", []), (None, []),
    (["n1", "n[2-3]"], ["n1", "n2", "n3"]),                       # 24.11 JSON arrays of names
    ([], []),
])
def test_split_nodes(expr, names):
    assert split_nodes(expr) == names


@pytest.mark.parametrize("bad", ["gpu[1", "gpu]", "n[3-1]", "n[a-b]", "n[1-2],,n3", "n[1-3]!n2", "n1&n2",
                                 "n1 n2", "n[1-2]]", ["n1", "gpu[1"]])
def test_malformed_hostlist_is_a_clear_slurm_ft_error(bad):
    with pytest.raises(HostlistError, match="not a Slurm hostlist") as err:
        split_nodes(bad)
    assert isinstance(err.value, SlurmCommandError)   # daemon loops and the CLI already handle these
    assert "'" in str(err.value)                       # the message quotes what was given


@pytest.mark.parametrize("names, expr", [
    (["n1", "n2", "n3", "gpu07"], "gpu07,n[1-3]"),
    (["gpu01-ib", "gpu02-ib"], "gpu[01-02]-ib"),
    (["a1b3", "a1b4", "a2b3", "a2b4"], "a[1-2]b[3-4]"),
    (["n08", "n09", "n10"], "n[08-10]"),
    (["n1", "n1", "n3"], "n[1,3]"),
    ("n5", "n5"),                                      # one name as a string, not its characters
    ([], ""),
])
def test_compress_nodes(names, expr):
    assert compress_nodes(names) == expr


def test_compress_nodes_rejects_non_names():
    with pytest.raises(HostlistError):
        compress_nodes(["n1", "n1 n2"])


@pytest.mark.parametrize("expr, out", [("0", [0]), ("0,1", [0, 1]), ("0-1,3", [0, 1, 3]), ("2-3,0", [0, 2, 3]),
                                       ("", [])])
def test_split_indices(expr, out):
    assert split_indices(expr) == out


@pytest.mark.parametrize("bad", ["0;rm", "3-1", "-1", "1-", "0,", "a", " ", "0 1"])
def test_split_indices_rejects(bad):
    with pytest.raises(HostlistError, match="not an index list"):
        split_indices(bad)


def test_gpu_list_env_uses_the_same_parser():
    assert parse_gpu_list("0,2-3") == (0, 2, 3)
    with pytest.raises(BadEnvironment):
        parse_gpu_list("0-")


def test_job_gpus_from_scontrol_detail(monkeypatch):
    out = ("JobId=7 JobName=t\n   UserId=u(1000) GroupId=u(1000) MCS_label=N/A\n   JobState=RUNNING Reason=None\n"
           "   JOB_GRES=gpu:4\n     Nodes=gpu[01-02]-ib CPU_IDs=0-3 Mem=0 GRES=gpu:2(IDX:0-1)\n"
           "     Nodes=n3 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:1,3)\n   MinCPUsNode=1\n")
    slurm = Slurm()
    monkeypatch.setattr(slurm, "run", lambda *a, **k: type("P", (), {"stdout": out})())
    assert slurm.job_gpus(7) == {"gpu01-ib": {0, 1}, "gpu02-ib": {0, 1}, "n3": {1, 3}}


def test_job_nodes_as_24_11_array_fold_into_a_hostlist():
    job = Job.from_json({"job_id": 1, "job_state": ["RUNNING"], "nodes": ["n2", "n1", "n3"],
                         "excluded_nodes": "gpu[01-02]-ib"})
    assert job.nodes == "n[1-3]" and split_nodes(job.excluded_nodes) == ["gpu01-ib", "gpu02-ib"]
    assert Job.from_json({"job_id": 2, "job_state": "PENDING"}).nodes == ""


def test_history_folds_verdict_nodes(tmp_path):
    with open_journal(tmp_path / "j.db") as j:   # an attempt known only from its nodes' verdicts
        j.upsert_job(5, name="t", user="u", ft_enabled=1, retries=1, ft_state="running", excluded_nodes="")
        for node in ("gpu02-ib", "gpu01-ib"):
            j.add_verdict(5, 0, node, "hardware", "xid-79")
        assert history(j, 5)["attempts"][0]["nodes"] == "gpu[01-02]-ib"


# -- round trip -----------------------------------------------------------------------------------------
_name = st.builds(
    lambda pfx, num, width, sfx: f"{pfx}{num:0{width}d}{sfx}",
    st.sampled_from(["n", "gpu", "node-", "r1n", "a"]),
    st.integers(0, 130),
    st.integers(1, 4),
    st.sampled_from(["", "-ib", ".ib", "b7"]),
) | st.sampled_from(["login", "head", "gpu-ib"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_name, max_size=40))
def test_compress_then_split_round_trips(names):
    expr = compress_nodes(names)
    assert sorted(split_nodes(expr)) == sorted(set(names))
    assert compress_nodes(split_nodes(expr)) == expr           # folding is canonical
    assert split_nodes(expr) == split_nodes(",".join(names))   # same set as the plain comma list
