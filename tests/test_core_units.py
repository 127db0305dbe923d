"""Unit tests of the pure parts: config, job options, mailbox codec, policy, env parsing, Slurm JSON."""

from __future__ import annotations

import pytest

from slurm_ft import config as config_mod
from slurm_ft.errors import ConfigError
from slurm_ft.failover import jobspec, mailbox, policy
from slurm_ft.drain import drain_reason
from slurm_ft.slurm import split_nodes as _split_nodes
from slurm_ft.node.job import BadEnvironment, NodeJob, parse_gpu_list
from slurm_ft.slurm import Job, Node, parse_kv_line


# -- config ---------------------------------------------------------------------------------
def test_config_defaults_and_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[failover]\nretries = 2\npoll_interval_s = 1\n[journal]\npath = "/x.db"\n')
    cfg = config_mod.load(p)
    assert cfg.failover.retries == 2 and cfg.failover.poll_interval_s == 1.0 and cfg.journal.path == "/x.db"
    assert config_mod.Config().failover.retries == 3


@pytest.mark.parametrize("text, key", [
    ("[failover]\nretrys = 2\n", "failover.retrys"),
    ("[failover]\nretries = -1\n", "failover.retries"),
    ("[failover]\nretries = '3'\n", "failover.retries"),
    ("[bogus]\n", "bogus"),
    ("[nvml]\nbackend = 'fake'\n", "nvml.inventory"),
    ("not toml [", "invalid TOML"),
])
def test_config_errors_name_the_key(tmp_path, text, key):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_mod.load(p)


def test_config_lookup_beside_slurm_conf(tmp_path):
    (tmp_path / "slurm.conf").write_text("")
    (tmp_path / "slurm-ft.toml").write_text("[failover]\nretries = 5\n")
    cfg = config_mod.load(env={"SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert cfg.failover.retries == 5


# -- job options ----------------------------------------------------------------------------
@pytest.mark.parametrize("comment, enabled, retries", [
    ("ft", True, 3), ("ft:retries=0", True, 0), ("my run, ft:retries=7", True, 7),
    ("", False, 3), ("draft", False, 3), ("ftx", False, 3),
])
def test_jobspec_from_comment(comment, enabled, retries):
    opts = jobspec.from_comment(comment, 3)
    assert (opts.enabled, opts.retries) == (enabled, retries)


@pytest.mark.parametrize("comment", ["ft:retries=-1", "ft:retries=two", "ft:retries=101", "ft:colour=red"])
def test_jobspec_rejects_bad_values(comment):
    with pytest.raises(ConfigError):
        jobspec.from_comment(comment, 3)


# -- mailbox --------------------------------------------------------------------------------
def test_mailbox_roundtrip_and_bound():
    recs = [mailbox.Record(10 + i, i % 2, "hardware", "xid-79", ((79, "0000:10:00"),), None, 1.5 + i) for i in range(20)]
    field = mailbox.render(recs, keep=16)
    back = mailbox.parse(field)
    assert len(back) == 16 and back[-1] == recs[-1] and back[0] == recs[4]
    assert mailbox.Record(1, 0, "user", "exit nonzero,odd;rule", (), 3, 1.0).encode().count(",") == 5


@pytest.mark.parametrize("field", ["", "admin note", "slurm-ft/1;garbage;1.x,a,b,,,", "slurm-ft/2;1.0,ok,r,,,1"])
def test_mailbox_ignores_foreign_or_malformed(field):
    assert mailbox.parse(field) == []


# -- policy ---------------------------------------------------------------------------------
def _v(node, verdict, rule="r"):
    return {"node": node, "verdict": verdict, "rule": rule, "xids": []}


def test_policy_hardware_fails_over_within_budget():
    d = policy.decide(slurm_state="FAILED", failovers_done=0, retries=3, verdicts=[_v("n1", "hardware", "xid-79")],
                      job_nodes=["n1"], seconds_since_end=0)
    assert d.kind == "failover" and d.blamed_nodes == ("n1",)


def test_policy_budget_exhausted_and_zero():
    hw = [_v("n1", "hardware")]
    assert policy.decide(slurm_state="FAILED", failovers_done=3, retries=3, verdicts=hw, job_nodes=["n1"],
                         seconds_since_end=0).kind == policy.MAX_RETRIES
    assert policy.decide(slurm_state="FAILED", failovers_done=0, retries=0, verdicts=hw, job_nodes=["n1"],
                         seconds_since_end=0).kind == policy.MAX_RETRIES


def test_policy_user_fault_is_user_error_and_waits_for_verdicts():
    assert policy.decide(slurm_state="FAILED", failovers_done=0, retries=3, verdicts=[_v("n1", "user")], job_nodes=["n1"],
                         seconds_since_end=0).kind == policy.USER_ERROR
    assert policy.decide(slurm_state="FAILED", failovers_done=0, retries=3, verdicts=[], job_nodes=["n1"],
                         seconds_since_end=0.5).kind == "wait"
    assert policy.decide(slurm_state="FAILED", failovers_done=0, retries=3, verdicts=[], job_nodes=["n1"],
                         seconds_since_end=60).kind == policy.FAILED


def test_policy_node_fail_blames_the_job_nodes():
    d = policy.decide(slurm_state="NODE_FAIL", failovers_done=0, retries=3, verdicts=[], job_nodes=["n2"],
                      seconds_since_end=0)
    assert d.kind == "failover" and d.blamed_nodes == ("n2",)


def test_policy_completed_and_infra():
    assert policy.decide(slurm_state="COMPLETED", failovers_done=0, retries=3, verdicts=[], job_nodes=[],
                         seconds_since_end=0).kind == policy.COMPLETED
    d = policy.decide(slurm_state="FAILED", failovers_done=0, retries=3, verdicts=[_v("n1", "infra")], job_nodes=["n1"],
                      seconds_since_end=0)
    assert d.kind == "failover" and d.blamed_nodes == ()


def test_drain_reason_and_hostlists():
    v = {"rule": "xid-79", "xids": [{"xid": 79, "bus_id": "0000:3b:00"}]}
    assert drain_reason(12, v) == "slurm-ft: Xid 79 GPU 0000:3b:00 (job 12)"
    assert drain_reason(12, v)[:20] == "slurm-ft: Xid 79 GPU"           # what `sinfo -R` shows
    assert drain_reason(12, {"rule": "slurm-node-fail", "xids": []}) == "slurm-ft: slurm-node-fail (job 12)"
    two = {"rule": "xid-79", "xids": [{"xid": 79, "bus_id": None}, {"xid": 48, "bus_id": "0000:3b:00"},
                                      {"xid": 79, "bus_id": "0000:3b:00"}]}
    assert drain_reason(5, two) == "slurm-ft: Xid 79,48 GPU 0000:3b:00 (job 5)"
    assert drain_reason(3, {"rule": "verified:cuda-ecc-uncorrectable", "xids": []}) == \
        "slurm-ft: cuda-ecc-uncorrectable, verified (job 3)"
    assert _split_nodes("n[1-3],gpu07") == ["gpu07", "n1", "n2", "n3"]  # ClusterShell order
    assert _split_nodes("gpu[08-10]") == ["gpu08", "gpu09", "gpu10"]
    assert _split_nodes("") == []


# -- epilog environment ---------------------------------------------------------------------
def test_nodejob_from_env():
    job = NodeJob.from_env({"SLURM_JOB_ID": "12", "SLURMD_NODENAME": "n1", "SLURM_JOB_RESTART_COUNT": "1",
                            "SLURM_JOB_EXIT_CODE": "768", "SLURM_JOB_GPUS": "0,2-3", "SLURM_JOB_UID": "0"})
    assert (job.job_id, job.attempt, job.exit_code, job.signal, job.gpus) == (12, 1, 3, None, (0, 2, 3))
    killed = NodeJob.from_env({"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1", "SLURM_JOB_EXIT_CODE": "9"})
    assert (killed.exit_code, killed.signal) == (None, 9)


@pytest.mark.parametrize("env", [
    {}, {"SLURM_JOB_ID": "x", "SLURMD_NODENAME": "n1"}, {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "../etc"},
    {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0;rm"},
])
def test_nodejob_rejects_bad_env(env):
    with pytest.raises(BadEnvironment):
        NodeJob.from_env(env)


def test_parse_gpu_list_empty():
    assert parse_gpu_list("") is None and parse_gpu_list(None) is None


# -- Slurm JSON shapes (22.05 and 24.11) ----------------------------------------------------
def test_job_from_json_2205_and_2411():
    old = Job.from_json({"job_id": 5, "job_state": "FAILED", "exit_code": 768, "restart_cnt": 1,
                         "start_time": 10, "end_time": 20, "priority": 7, "comment": "ft", "nodes": "n1"})
    assert (old.state, old.exit_code, old.exit_signal, old.restart_count, old.ended) == ("FAILED", 3, None, 1, True)
    new = Job.from_json({"job_id": 5, "job_state": ["FAILED", "COMPLETING"], "restart_cnt": 0,
                         "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "number": 0},
                                       "signal": {"id": {"set": True, "number": 9}, "name": "KILL"}},
                         "start_time": {"set": True, "infinite": False, "number": 10}, "nodes": "n2"})
    assert new.completing and not new.ended and new.exit_signal == 9 and new.start_time == 10


def test_node_from_json_and_kv():
    n = Node.from_json({"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": "r", "extra": "x"})
    assert n.drained and n.extra == "x"
    n2 = Node.from_json({"name": "n1", "state": ["IDLE", "DRAIN"], "reason": ""})
    assert n2.drained
    kv = parse_kv_line("NodeName=n1 State=IDLE+DRAIN Extra=slurm-ft/1;1.0,a,b,,,1.0 Reason=bad gpu [root@t]")
    assert kv["Extra"].startswith("slurm-ft/1") and kv["Reason"] == "bad gpu [root@t]"


# -- prolog/epilog never fail the node on our own errors -------------------------------------
@pytest.mark.parametrize("module", ["prolog", "epilog"])
def test_scripts_exit_0_on_bad_env_or_config(module, tmp_path, capsys):
    import importlib
    run = importlib.import_module(f"slurm_ft.node.{module}").run
    assert run({}) == 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[failover]\nretries = -5\n")
    env = {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "n1", "SLURM_FT_CONFIG": str(bad)}
    assert run(env) == 0
    assert "failover.retries" in capsys.readouterr().err


def test_expand_output_pattern():
    from slurm_ft.node.output_pattern import expand_output_pattern
    job = NodeJob.from_env({"SLURM_JOB_ID": "12", "SLURMD_NODENAME": "n1", "SLURM_JOB_UID": "0",
                            "SLURM_JOB_WORK_DIR": "/home/u"})
    assert expand_output_pattern("/out/%j.out", job) == "/out/12.out"
    assert expand_output_pattern("slurm-%4j-%N.out", job) == f"/home/u/slurm-0012-{job.host}.out"  # host, not node
    assert expand_output_pattern("/o/%u/%%j", job) == "/o/root/%j"
    assert expand_output_pattern("/o/%x.out", job) is None      # job name unknown here: never guess
    assert expand_output_pattern("/o/%q.out", job) is None


def test_nodes_fall_back_to_scontrol_json_on_newer_slurm():
    """23.02+ ``sinfo --json`` groups nodes by partition/state; ``scontrol show nodes --json`` lists them."""
    import json
    import subprocess

    from slurm_ft.slurm import Slurm

    class Canned(Slurm):
        def run(self, cmd, *args, **kw):
            if cmd == "sinfo":
                out = {"sinfo": [{"nodes": {"nodes": ["n1"]}, "node": {"state": ["IDLE", "DRAIN"]}}]}
            else:
                out = {"nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"], "reason": "slurm-ft: x",
                                  "extra": "slurm-ft/1;", "partitions": ["gpu"]}]}
            return subprocess.CompletedProcess([cmd], 0, json.dumps(out), "")

    (n,) = Canned().nodes()
    assert n.name == "n1" and n.drained and n.reason == "slurm-ft: x" and n.extra == "slurm-ft/1;"
