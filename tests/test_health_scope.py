"""Which health checks run where (slurm_ft.health.scope, issue 24): GPU checks only on nodes whose
Slurm record has gres/gpu, for the GPU count Slurm says, within the admin's [health] scope; a node
without gres/gpu is never drained for a GPU reason, whatever NVML says (hypothesis, through the real
prolog entry with a fake ``scontrol`` and the fake NVML). Also Slurm's gres and config shapes."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from slurm_ft.node import prolog
from slurm_ft.errors import ConfigError, SlurmCommandError
from slurm_ft.health.config import CHECK_NAMES, from_config
from slurm_ft.health.scope import NodeFacts, decide, node_facts, read_cache, write_cache
from slurm_ft.nvml.fake import write_inventory
from slurm_ft.slurm import parse_config, parse_gres

FIXTURES = Path(__file__).parent / "fixtures" / "scontrol"


# ------------------------------------------------------------------------------------ gres shapes
@pytest.mark.parametrize("text, want", [
    ("gpu:h100:8(S:0-1)", {"gpu": 8}),
    ("gpu:a100:4(S:0),gpu:v100:2,mps:200", {"gpu": 6, "mps": 200}),
    ("gpu:tesla:2(S:0,1)", {"gpu": 2}),
    ("gpu:4", {"gpu": 4}),
    ("gpu", {"gpu": 1}),
    ("shard:8", {"shard": 8}),
    ("(null)", {}), ("", {}), (None, {}),
])
def test_parse_gres(text, want):
    assert parse_gres(text) == want


@pytest.mark.parametrize("text", ["gpu:", "gpu:4(S:0", "gpu:4)(", ":4", "gpu 4", "gpu:4;rm"])
def test_parse_gres_refuses_what_slurm_does_not_print(text):
    with pytest.raises(SlurmCommandError):
        parse_gres(text)


_name = st.sampled_from(["gpu", "mps", "shard", "nic"])
_type = st.one_of(st.none(), st.sampled_from(["h100", "a100", "tesla_t4", "l40s"]))
_item = st.tuples(_name, _type, st.integers(0, 10_000), st.one_of(st.none(), st.sampled_from(["S:0", "S:0-1", "S:0,1"])))


@settings(max_examples=200, deadline=None)
@given(st.lists(_item, max_size=5))
def test_parse_gres_adds_up_every_shape_slurm_prints(items):
    text = ",".join(f"{n}{':' + t if t else ''}:{c}{'(' + s + ')' if s else ''}" for n, t, c, s in items)
    want: dict[str, int] = {}
    for n, _, c, _ in items:
        want[n] = want.get(n, 0) + c
    assert parse_gres(text) == want


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_parse_gres_on_any_text_returns_counts_or_says_unreadable(text):
    try:
        out = parse_gres(text)
    except SlurmCommandError:
        return
    assert all(isinstance(v, int) and v >= 0 for v in out.values())


# --------------------------------------------------------------------------------- config shapes
def test_scontrol_show_config_list_settings_in_both_shapes():
    old = parse_config((FIXTURES / "show_config_22.05.txt").read_text())
    new = parse_config((FIXTURES / "show_config_24.11.txt").read_text())
    assert old["Prolog"] == "{prolog}" and new["Prolog"] == "{prolog}"
    assert old["Epilog"] == "{epilog}" and new["Epilog"] == "{epilog}"
    assert new["Prolog[0]"] == "{prolog}"
    two = parse_config("Prolog[1] = /b\nProlog[0] = /a\nEpilog = (null)\nTaskProlog[0] = (null)\n")
    assert two["Prolog"] == "/a,/b" and two["Epilog"] == "(null)" and two["TaskProlog"] == ""


# ---------------------------------------------------------------------------------- the decision
def hcfg(**kw):
    return from_config(kw)


def test_no_gres_gpu_no_checks():
    s = decide(NodeFacts("cpu1", 0, ("cpu",)), hcfg())
    assert s.checks == () and s.why == "no GPU checks on this node (Slurm: no gres/gpu)"


def test_gres_gpu_runs_every_enabled_check_for_slurms_count():
    s = decide(NodeFacts("gpu1", 4, ("gpu",)), hcfg(expected_gpus=8))
    assert s.checks == CHECK_NAMES and s.expected_gpus == 4 and "gres/gpu:4" in s.why
    assert decide(NodeFacts("gpu1", 4), hcfg(expected_gpus_by_node={"gpu1": 2})).expected_gpus == 2


def test_empty_check_list_runs_nothing():
    assert decide(NodeFacts("gpu1", 8), hcfg(checks=[])).checks == ()
    assert decide(NodeFacts("gpu1", 8), hcfg(skip=list(CHECK_NAMES))).checks == ()


def test_admin_scope_by_hostlist_and_partition():
    cfg = hcfg(nodes="gpu[01-04]", exclude_nodes="gpu03")
    assert decide(NodeFacts("gpu02", 8), cfg).checks
    assert decide(NodeFacts("gpu03", 8), cfg).checks == ()
    assert "exclude_nodes" in decide(NodeFacts("gpu03", 8), cfg).why
    assert decide(NodeFacts("gpu05", 8), cfg).checks == ()
    part = hcfg(partitions=["train"])
    assert decide(NodeFacts("g1", 8, ("train", "debug")), part).checks
    assert decide(NodeFacts("g1", 8, ("debug",)), part).checks == ()


def test_unknown_record_checks_only_when_the_job_holds_gpus_here():
    assert decide(NodeFacts("g1", None, (), 0, "unknown: x"), hcfg()).checks == ()
    s = decide(NodeFacts("g1", None, (), 2, "unknown: x"), hcfg(expected_gpus=8))
    assert s.checks == CHECK_NAMES and s.expected_gpus == 8


def test_bad_scope_hostlist_is_a_config_error():
    with pytest.raises(ConfigError, match="health.nodes"):
        hcfg(nodes="gpu[1")
    with pytest.raises(ConfigError, match="health.scope_cache_s"):
        hcfg(scope_cache_s=-1)


_hostlist = st.sampled_from(["", "n[1-4]", "n1", "cpu[01-10]", "n[2-3],gpu01"])


@settings(max_examples=300, deadline=None)
@given(node=st.sampled_from(["n1", "n3", "cpu05", "gpu01", "x"]), nodes=_hostlist, exclude=_hostlist,
       parts=st.lists(st.sampled_from(["gpu", "cpu", "debug"]), max_size=2),
       node_parts=st.lists(st.sampled_from(["gpu", "cpu", "debug"]), max_size=2),
       checks=st.lists(st.sampled_from(CHECK_NAMES), max_size=4, unique=True) | st.just(list(CHECK_NAMES)),
       job_gpus=st.integers(0, 8), by_node=st.dictionaries(st.sampled_from(["n1", "x"]), st.integers(0, 8)))
def test_a_node_without_gres_gpu_never_gets_a_check(node, nodes, exclude, parts, node_parts, checks, job_gpus, by_node):
    cfg = hcfg(nodes=nodes, exclude_nodes=exclude, partitions=parts, checks=checks, expected_gpus_by_node=by_node)
    assert decide(NodeFacts(node, 0, tuple(node_parts), job_gpus), cfg).checks == ()
    with_gpus = decide(NodeFacts(node, 8, tuple(node_parts), job_gpus), cfg)
    assert set(with_gpus.checks) <= set(checks)
    if with_gpus.checks:  # in scope: only what Slurm says (or the admin's per-node count)
        assert with_gpus.expected_gpus == by_node.get(node, 8)


# ------------------------------------------------------------------------------ the node record
def test_node_facts_cache_and_fallbacks(tmp_path):
    calls = []

    def lookup(node):
        calls.append(node)
        return {"NodeName": node, "Gres": "gpu:h100:4(S:0-1)", "Partitions": "gpu,debug"}

    f = node_facts(str(tmp_path), "n1", ttl_s=300, lookup=lookup, now=1000.0)
    assert (f.gpus, f.partitions, f.source) == (4, ("gpu", "debug"), "scontrol")
    assert stat.S_IMODE(os.stat(tmp_path / "slurm-node-n1.json").st_mode) == 0o600
    f = node_facts(str(tmp_path), "n1", ttl_s=300, lookup=lookup, now=1200.0)
    assert f.source == "cache" and calls == ["n1"]

    def down(node):
        raise SlurmCommandError("scontrol: timed out")
    logs = []
    f = node_facts(str(tmp_path), "n1", ttl_s=300, lookup=down, now=2000.0, log=logs.append)
    assert (f.gpus, f.source) == (4, "stale cache") and "timed out" in logs[0]
    f = node_facts(str(tmp_path), "n2", ttl_s=300, lookup=down, job_partition="cpu", now=2000.0)
    assert f.gpus is None and f.partitions == ("cpu",)
    f = node_facts(str(tmp_path), "n3", ttl_s=300, lookup=lambda n: {"NodeName": "other", "Gres": "gpu:1"})
    assert f.gpus is None


def test_cache_is_never_read_through_a_symlink_nor_in_a_foreign_shape(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text('{"at": 1e12, "gpus": 0, "partitions": []}')
    os.symlink(target, tmp_path / "slurm-node-n1.json")
    assert read_cache(str(tmp_path), "n1") is None
    (tmp_path / "slurm-node-n2.json").write_text('{"at": 1, "gpus": true, "partitions": []}')
    assert read_cache(str(tmp_path), "n2") is None
    write_cache(str(tmp_path), "n3", 2, ("gpu",), 5.0)
    assert read_cache(str(tmp_path), "n3") == (5.0, 2, ("gpu",))


# ---------------------------------------------------- the real prolog, a fake scontrol, fake NVML
def _site(root: Path, gres: str, partitions: str = "cpu", isolation: str = "thread") -> dict[str, str]:
    """A node ``n1`` whose ``scontrol show node`` record says ``gres``; every other scontrol/sinfo
    call (a drain, the breaker's listing) is recorded in ``calls`` and fails."""
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    (root / "gres").write_text(gres)
    script = (f"#!/bin/sh\necho \"$0 $*\" >> {root}/calls\n"
              f"if [ \"$1 $2 $3\" = 'show node -o' ]; then\n"
              f"  echo \"NodeName=$4 Arch=x86_64 CPUTot=4 Gres=$(cat {root}/gres) Partitions={partitions} State=IDLE\"\n"
              f"  exit 0\nfi\nexit 1\n")
    for cmd in ("scontrol", "sinfo", "squeue"):
        (bindir / cmd).write_text(script)
        (bindir / cmd).chmod(0o755)
    cfg = root / "slurm-ft.toml"
    cfg.write_text(f'[journal]\npath = "{root}/journal.db"\nnode_path = "{root}/node-{{node}}.db"\n'
                   f'[slurm]\nbin_dir = "{bindir}"\n[nvml]\nbackend = "fake"\ninventory = "{root}/nvml-{{node}}.json"\n'
                   f'[node_state]\ndir = "{root}/state"\nlog = "{root}/log/node.log"\n'
                   f'[health]\nisolation = "{isolation}"\nscope_cache_s = 0\nnvml_timeout_s = 5\n')
    return {"SLURM_FT_CONFIG": str(cfg), "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1",
            "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_PARTITION": "cpu", "PATH": "/usr/bin:/bin"}


_gpu = st.fixed_dictionaries({}, optional={
    "lost": st.booleans(), "temperature_c": st.integers(0, 120),
    "ecc_volatile_uncorrected": st.integers(0, 5), "row_remap_pending": st.booleans(),
    "retired_pages_dbe": st.integers(0, 100), "retired_pages_pending": st.booleans()})
#: None: no inventory file (the fake NVML then fails like a node without a loaded driver).
_inventory = st.one_of(st.none(), st.lists(_gpu, max_size=4))


@settings(max_examples=60, deadline=None)
@given(gres=st.sampled_from(["(null)", "mps:100", "shard:8", "nic:2(S:0)"]), inventory=_inventory,
       job_gpus=st.sampled_from([None, "", "0"]), checks=st.sampled_from([None, [], ["gpu_count"]]))
def test_the_prolog_never_refuses_a_job_on_a_node_without_gres_gpu(gres, inventory, job_gpus, checks):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = _site(root, gres)
        if checks is not None:
            with open(env["SLURM_FT_CONFIG"], "a") as fh:
                fh.write(f"checks = {checks!r}\n".replace("'", '"'))
        if job_gpus is not None:
            env["SLURM_JOB_GPUS"] = job_gpus
        if inventory is not None:
            write_inventory(str(root / "nvml-n1.json"), "n1", inventory)
        assert prolog.run(env) == 0
        calls = (root / "calls").read_text()
        assert "update" not in calls and "requeue" not in calls
        assert "no GPU checks on this node (Slurm: no gres/gpu)" in (root / "log/node.log").read_text() \
            or checks == []


def test_the_prolog_still_refuses_a_job_on_a_gpu_node_without_a_driver(tmp_path):
    env = _site(tmp_path, "gpu:h100:2(S:0)")   # no inventory: NVML init fails like a missing driver
    assert prolog.run(env) == 1
    log = (tmp_path / "log/node.log").read_text()
    assert "nvml_responsive" in log or "NVML" in log


def test_the_prolog_checks_the_gpu_count_slurm_says(tmp_path):
    env = _site(tmp_path, "gpu:h100:2(S:0)")
    write_inventory(str(tmp_path / "nvml-n1.json"), "n1", [{}, {}])
    assert prolog.run(env) == 0
    write_inventory(str(tmp_path / "nvml-n1.json"), "n1", [{}])   # one GPU gone: Slurm says 2
    assert prolog.run(env) == 1


def test_healthcheckprogram_act_on_a_node_without_gres_gpu_runs_nothing(tmp_path):
    """`slurm-ft health --act` (HealthCheckProgram) follows the prolog's scope: nothing run, nothing drained."""
    from click.testing import CliRunner
    from slurm_ft.cli.health import health_command

    env = _site(tmp_path, "(null)")
    r = CliRunner().invoke(health_command, ["--config", env["SLURM_FT_CONFIG"], "--node", "n1", "--act"])
    assert r.exit_code == 0 and "n1: no GPU checks on this node (Slurm: no gres/gpu)" in r.output
    assert "update" not in (tmp_path / "calls").read_text()
    _site(tmp_path, "gpu:2")   # a GPU node without a driver: fails (and would drain)
    r = CliRunner().invoke(health_command, ["--config", env["SLURM_FT_CONFIG"], "--node", "n1", "--act"])
    assert r.exit_code == 1 and "nvml_responsive" in r.output
