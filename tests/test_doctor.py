"""`slurm-ft doctor` against fake Slurm configurations (slurm.conf text, `scontrol show config`
text) and files installed by `slurm-ft install` under a temporary prefix."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_ft import config as config_mod
from slurm_ft.admin import assets
from slurm_ft.failover import daemonlock
from slurm_ft.admin import doctor
from slurm_ft.admin import install
from slurm_ft.cli.main import main
from slurm_ft.health.scope import NodeFacts
from slurm_ft.journal import open_journal
from slurm_ft.slurm import parse_config, parse_slurm_conf

SHOW_CONFIG = """\
Configuration data as of 2026-11-30T12:00:00
CliFilterPlugins        = lua
Epilog                  = {epilog}
JobSubmitPlugins        = lua
PluginDir               = {plugindir}
PlugStackConfig         = {conf_dir}/plugstack.conf
Prolog                  = {prolog}
PrologFlags             = Alloc,Contain
SlurmctldHost[0]        = ctl(10.0.0.1)
SLURM_CONF              = {conf_dir}/slurm.conf
"""


@pytest.fixture
def site(tmp_path):
    """A host set up by `slurm-ft install` (wrappers, Lua, plugstack, config), the plugin built,
    a daemon journal with a fresh heartbeat: every check passes."""
    prefix = tmp_path / "root"
    conf_dir = prefix / "etc/slurm"
    install.apply(install.plan(slurm_conf_dir="/etc/slurm"), prefix=str(prefix))
    so = prefix / assets.SPANK_LIB.lstrip("/")
    so.parent.mkdir(parents=True)
    so.write_bytes(b"\x7fELF")
    # the paths inside the files are the real ones (/etc/slurm, /usr/local/lib): point them below the prefix
    (conf_dir / "plugstack.conf").write_text(f"include {conf_dir}/plugstack.conf.d/*.conf\n")
    (conf_dir / "plugstack.conf.d/slurm-ft.conf").write_text(f"optional {so}\n")
    plugindir = tmp_path / "plugins"
    plugindir.mkdir()
    (plugindir / "job_submit_lua.so").write_bytes(b"\x7fELF")
    journal = tmp_path / "state" / "journal.db"
    cfg = tmp_path / "slurm-ft.toml"
    cfg.write_text(f'[journal]\npath = "{journal}"\nnode_path = "{tmp_path}/state/node-{{node}}.db"\n'
                   f'[node_state]\ndir = "{tmp_path}/state/jobs"\n')
    with open_journal(journal) as j:
        j.upsert_job(1, ft_enabled=1, ft_state="running")
    daemonlock.beat(journal, now=time.time())
    libexec = prefix / assets.LIBEXEC_DIR.lstrip("/")
    text = SHOW_CONFIG.format(prolog=libexec / "slurm-ft-prolog", epilog=libexec / "slurm-ft-epilog",
                              plugindir=plugindir, conf_dir=conf_dir)
    return {"tmp": tmp_path, "conf_dir": conf_dir, "cfg": cfg, "journal": journal, "show": text, "libexec": libexec}


def env_for(site, roles=("node", "controller"), conf=None, **kw) -> doctor.Env:
    cfg = config_mod.load(site["cfg"])
    base = dict(roles=frozenset(roles), cfg=cfg, cfg_error=None,
                conf=doctor.lower_keys(parse_config(site["show"])) if conf is None else conf,
                conf_source="scontrol show config", conf_dir=site["conf_dir"], host="n1",
                nvml_probe=lambda node: (True, "NVML answered in 0.01 s; 8 GPUs"),
                python_probe=lambda py, mod: None, node_facts=lambda node: NodeFacts(node, 8, ("gpu",)),
                kernel_log_probe=lambda: None)
    base.update(kw)
    return doctor.Env(**base)


def by_name(checks):
    return {c.name: c for c in checks}


def test_a_good_setup_passes_every_check(site):
    checks = doctor.run(env_for(site))
    bad = [c.line() for c in checks if c.status != "OK"]
    assert bad == [] and not doctor.failed(checks)
    names = [c.name for c in checks]
    for want in ("config", "slurm-config", "prolog", "prolog-flags", "epilog", "plugstack", "cli-filter",
                 "journal", "node-journal", "node-state", "nvml", "job-submit", "lua", "daemon"):
        assert want in names, want
    assert len(names) == len(set(names))                        # each check once for role "all"
    assert by_name(checks)["daemon"].detail.startswith("pid ")


def test_every_line_has_a_status_and_failures_a_fix(site):
    conf = {}
    checks = doctor.run(env_for(site, conf=conf, conf_source="/etc/slurm/slurm.conf: No such file or directory"))
    for c in checks:
        assert c.status in doctor.STATUSES
        if c.status in ("FAIL", "WARN"):
            assert c.fix, c.line()
    assert by_name(checks)["slurm-config"].status == "FAIL"


def test_missing_prolog_epilog_flags_and_lua_settings(site):
    conf = parse_slurm_conf("""
# a cluster before slurm-ft
ClusterName=c1
SlurmctldHost=ctl
PrologFlags=Contain
NodeName=n[1-4] CPUs=8 Prolog=/not/a/global/setting
""")
    checks = by_name(doctor.run(env_for(site, conf=conf, conf_source=str(site["conf_dir"] / "slurm.conf"))))
    assert checks["slurm-config"].status == "WARN"
    assert checks["prolog"].status == "FAIL" and "Prolog= is not set" in checks["prolog"].detail
    assert "Prolog=/usr/local/libexec/slurm-ft/slurm-ft-prolog" in checks["prolog"].fix
    assert checks["epilog"].status == "FAIL"
    assert checks["prolog-flags"].status == "FAIL" and "PrologFlags=Alloc" in checks["prolog-flags"].fix
    assert checks["job-submit"].status == "FAIL" and "JobSubmitPlugins=lua" in checks["job-submit"].fix
    assert checks["cli-filter"].status == "FAIL"


def test_parse_slurm_conf_is_case_insensitive_and_skips_node_lines():
    conf = parse_slurm_conf("prolog=/a # comment\nPROLOGFLAGS = Alloc\nNodeName=n1 Epilog=/x\n"
                                   "SlurmctldHost=ctl1(10.0.0.1)\nSlurmctldHost=ctl2\n")
    assert conf == {"prolog": "/a", "prologflags": "Alloc", "slurmctldhost": "ctl1(10.0.0.1)"}
    assert doctor.controller_hosts(doctor.lower_keys(parse_config(SHOW_CONFIG))) == ["ctl"]
    assert doctor.default_roles(doctor.lower_keys(parse_config(SHOW_CONFIG)), "ctl") == {"controller"}
    assert doctor.default_roles({}, "n7") == {"node"}


def test_wrapper_whose_python_is_gone_fails(site):
    prolog = site["libexec"] / "slurm-ft-prolog"
    prolog.write_text(assets.render_wrapper("prolog", "/opt/gone/bin/python", str(prolog)))
    checks = by_name(doctor.run(env_for(site, roles=("node",))))
    assert checks["prolog"].status == "FAIL" and "/opt/gone/bin/python (the Python it runs) is missing" \
        in checks["prolog"].detail
    assert checks["epilog"].status == "OK"


def test_wrapper_python_that_cannot_import_slurm_ft_fails(site):
    env = env_for(site, roles=("node",), python_probe=lambda py, mod: f"ModuleNotFoundError: No module named '{mod}'")
    checks = by_name(doctor.run(env))
    assert checks["prolog"].status == "FAIL" and "cannot import slurm_ft.node.prolog" in checks["prolog"].detail


def test_a_wrapper_written_before_the_node_room_fails_with_the_fix(site):
    """A wrapper an older slurm-ft wrote runs ``-m slurm_ft.prolog``; this version's hooks live in
    ``slurm_ft.node``: doctor names the move and the reinstall, instead of passing it by."""
    prolog = site["libexec"] / "slurm-ft-prolog"
    prolog.write_text(assets.render_wrapper("prolog", sys.executable, str(prolog))
                      .replace("slurm_ft.node.prolog", "slurm_ft.prolog"))
    checks = by_name(doctor.run(env_for(site, roles=("node",))))
    assert checks["prolog"].status == "FAIL" and "runs slurm_ft.prolog" in checks["prolog"].detail
    assert "slurm-ft install --only wrappers" in checks["prolog"].fix
    assert checks["epilog"].status == "OK"


def test_prolog_setting_that_runs_something_else_fails(site):
    other = site["tmp"] / "site-prolog"
    other.write_text("#!/bin/sh\nexit 0\n")
    conf = doctor.lower_keys(parse_config(site["show"]))
    conf["prolog"] = str(other)
    checks = by_name(doctor.run(env_for(site, roles=("node",), conf=conf)))
    assert checks["prolog"].status == "FAIL" and "no slurm-ft prolog there" in checks["prolog"].detail


def test_prolog_glob_directory_is_followed(site):
    d = site["tmp"] / "prolog.d"
    d.mkdir()
    (d / "00-site").write_text("#!/bin/sh\nexit 0\n")
    (d / "50-slurm-ft").symlink_to(site["libexec"] / "slurm-ft-prolog")
    conf = doctor.lower_keys(parse_config(site["show"]))
    conf["prolog"] = f"{d}/*"
    assert by_name(doctor.run(env_for(site, roles=("node",), conf=conf)))["prolog"].status == "OK"


def test_job_submit_lua_checks(site):
    jsl = site["conf_dir"] / "job_submit.lua"
    jsl.write_text("function slurm_job_submit() return slurm.SUCCESS end\n")
    assert "not slurm-ft's" in by_name(doctor.run(env_for(site, roles=("controller",))))["job-submit"].detail
    jsl.write_text(assets.render_job_submit(max_retries=20, default_retries=3))
    c = by_name(doctor.run(env_for(site, roles=("controller",))))["job-submit"]
    assert c.status == "FAIL" and "max_retries=20" in c.detail and "slurm-ft install --only lua" in c.fix
    jsl.unlink()
    assert by_name(doctor.run(env_for(site, roles=("controller",))))["job-submit"].status == "FAIL"


def test_lua_plugin_missing_from_plugindir(site, tmp_path):
    conf = doctor.lower_keys(parse_config(site["show"]))
    conf["plugindir"] = str(tmp_path / "empty")
    c = by_name(doctor.run(env_for(site, roles=("controller",), conf=conf)))["lua"]
    assert c.status == "FAIL" and "job_submit_lua.so" in c.detail and "slurm-wlm-basic-plugins" in c.fix


def test_plugstack_without_the_plugin_line_or_the_library(site):
    (site["conf_dir"] / "plugstack.conf.d/slurm-ft.conf").write_text("# nothing\n")
    c = by_name(doctor.run(env_for(site)))["plugstack"]
    assert c.status == "FAIL" and "loads no slurm_ft_spank.so" in c.detail
    (site["conf_dir"] / "plugstack.conf.d/slurm-ft.conf").write_text("optional /nowhere/slurm_ft_spank.so\n")
    c = by_name(doctor.run(env_for(site)))["plugstack"]
    assert c.status == "FAIL" and "not on this host" in c.detail and "make -C" in c.fix


def test_daemon_heartbeat_missing_stale_failing(site):
    journal = site["journal"]
    now = time.time()
    c = by_name(doctor.run(env_for(site, roles=("controller",), now=now + 500)))["daemon"]
    assert c.status == "FAIL" and c.detail.startswith("the slurm-ft daemon has not run for 500 s")
    assert "systemctl" in c.fix
    daemonlock._last.clear()
    daemonlock.beat(journal, ok=False, now=now)
    c = by_name(doctor.run(env_for(site, roles=("controller",), now=now + 1)))["daemon"]
    assert c.status == "WARN" and "cycles fail" in c.detail
    daemonlock.heartbeat_path(journal).unlink()
    c = by_name(doctor.run(env_for(site, roles=("controller",))))["daemon"]
    assert c.status == "FAIL" and "no heartbeat" in c.detail


def test_nvml_unreachable_fails_on_a_node(site):
    env = env_for(site, roles=("node",), nvml_probe=lambda node: (False, "NVML init failed: Driver Not Loaded"))
    c = by_name(doctor.run(env))["nvml"]
    assert c.status == "FAIL" and "Driver Not Loaded" in c.detail and "nvidia-smi" in c.fix
    assert "the prolog will drain this node" in c.detail
    assert "nvml" not in by_name(doctor.run(env_for(site, roles=("controller",))))


def test_a_node_without_gres_gpu_and_without_a_driver_passes(site):
    env = env_for(site, roles=("node",), nvml_probe=lambda node: (False, "NVML init failed: Driver Not Loaded"),
                  node_facts=lambda node: NodeFacts(node, 0, ("cpu",)))
    checks = doctor.run(env)
    assert not doctor.failed(checks)
    c = by_name(checks)
    assert c["nvml"].status == "SKIP" and "Slurm: no gres/gpu" in c["nvml"].detail
    assert c["health"].status == "OK" and c["health"].detail == (
        "no GPU checks on this node (Slurm: no gres/gpu): the prolog passes every job here")


def test_health_line_says_what_runs_and_what_a_fail_does(site):
    c = by_name(doctor.run(env_for(site, roles=("node",))))["health"]
    assert c.status == "OK" and "expecting 8 GPU(s) (Slurm: gres/gpu:8" in c.detail
    assert "nvml_responsive, gpu_count" in c.detail and "drains this node" in c.detail
    site["cfg"].write_text(site["cfg"].read_text() + '[health]\nexclude_nodes = "n[1-2]"\n')
    checks = by_name(doctor.run(env_for(site, roles=("node",),
                                        nvml_probe=lambda node: (False, "NVML init failed"))))
    assert "exclude_nodes" in checks["health"].detail and checks["nvml"].status == "SKIP"


FAKE_SCONTROL = """#!/bin/sh
if [ "$1 $2" = "show config" ]; then cat {show}; exit 0; fi
if [ "$1 $2 $3" = "show node -o" ]; then
  echo "NodeName=$4 Arch=x86_64 CPUTot=4 Gres={gres} Partitions=gpu State=IDLE"; exit 0
fi
exit 1
"""


@pytest.mark.parametrize("version", ["22.05", "24.11"])
@pytest.mark.parametrize("gres", ["gpu:h100:2(S:0)", "(null)"])
def test_doctor_exits_0_on_a_correct_host_of_each_slurm_version(site, monkeypatch, version, gres):
    """`scontrol show config` of 22.05 (``Prolog = …``) and 24.11 (``Prolog[0] = …``); a GPU node
    (Slurm: gres/gpu:2, NVML sees 2) and a node without gres/gpu (no NVML at all)."""
    tmp = site["tmp"]
    text = (Path(__file__).parent / "fixtures/scontrol" / f"show_config_{version}.txt").read_text()
    libexec = site["libexec"]
    (tmp / "show").write_text(text.format(prolog=libexec / "slurm-ft-prolog", epilog=libexec / "slurm-ft-epilog",
                                          plugindir=tmp / "plugins", conf_dir=site["conf_dir"]))
    bindir = tmp / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(FAKE_SCONTROL.format(show=tmp / "show", gres=gres))
    (bindir / "scontrol").chmod(0o755)
    if gres != "(null)":
        from slurm_ft.nvml.fake import write_inventory
        write_inventory(str(tmp / "nvml-n1.json"), "n1", [{}, {}])
    site["cfg"].write_text(site["cfg"].read_text() + f'[slurm]\nbin_dir = "{bindir}"\n'
                           f'[nvml]\nbackend = "fake"\ninventory = "{tmp}/nvml-{{node}}.json"\n'
                           f'[health]\nisolation = "thread"\n')
    monkeypatch.setattr(doctor, "python_probe", lambda py, mod: None)
    r = CliRunner().invoke(main, ["doctor", "--role", "all", "--node", "n1", "--config", str(site["cfg"])])
    assert r.exit_code == 0, r.output
    lines = {line.split()[1]: line for line in r.output.splitlines()[1:]}
    assert lines["prolog"].startswith("OK") and lines["epilog"].startswith("OK")
    if gres == "(null)":
        assert "no GPU checks on this node (Slurm: no gres/gpu)" in lines["health"]
        assert lines["nvml"].startswith("SKIP")
    else:
        assert "Slurm: gres/gpu:2" in lines["health"] and lines["nvml"].startswith("OK")


def test_journal_unreadable_file_fails(site):
    site["journal"].write_bytes(b"not a database at all" * 100)
    for side in ("-wal", "-shm"):
        Path(str(site["journal"]) + side).unlink(missing_ok=True)
    c = by_name(doctor.run(env_for(site, roles=("controller",))))["journal"]
    assert c.status == "FAIL" and "move the file aside" in c.fix


def test_bad_config_fails_and_other_checks_still_run(site):
    env = env_for(site, cfg=None, cfg_error="slurm-ft.toml: unknown key failover.retrys")
    checks = by_name(doctor.run(env))
    assert checks["config"].status == "FAIL" and "retrys" in checks["config"].detail
    assert checks["prolog"].status == "OK" and checks["daemon"].status == "SKIP"


def test_cli_reads_slurm_conf_and_exits_1_on_failure(site, monkeypatch):
    slurm_conf = site["conf_dir"] / "slurm.conf"
    slurm_conf.write_text(f"SlurmctldHost=ctl\nProlog={site['libexec']}/slurm-ft-prolog\n"
                          f"Epilog={site['libexec']}/slurm-ft-epilog\nPrologFlags=Alloc\nJobSubmitPlugins=lua\n"
                          f"CliFilterPlugins=lua\n")
    monkeypatch.setattr(doctor, "python_probe", lambda py, mod: None)
    r = CliRunner().invoke(main, ["doctor", "--role", "controller", "--slurm-conf", str(slurm_conf),
                                  "--config", str(site["cfg"])])
    lines = r.output.splitlines()
    assert lines[0].startswith("slurm-ft doctor on ") and "(controller)" in lines[0]
    statuses = {line.split()[1]: line.split()[0] for line in lines[1:]}
    assert statuses["slurm-config"] == "WARN" and statuses["prolog"] == "OK" and statuses["job-submit"] == "OK"
    assert statuses["daemon"] == "OK" and r.exit_code == 0, r.output
    daemonlock.heartbeat_path(site["journal"]).unlink()
    r = CliRunner().invoke(main, ["doctor", "--role", "controller", "--slurm-conf", str(slurm_conf),
                                  "--config", str(site["cfg"]), "--json"])
    assert r.exit_code == 1
    data = json.loads(r.output)
    assert data["roles"] == ["controller"]
    assert {c["name"]: c["status"] for c in data["checks"]}["daemon"] == "FAIL"


from hypothesis import given, settings, strategies as st  # noqa: E402

_path = st.from_regex(r"/[a-z0-9_./-]{1,30}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(_path, min_size=1, max_size=4), st.sampled_from(["Prolog", "Epilog", "TaskProlog"]))
def test_list_settings_read_the_same_from_22_05_and_24_11(paths, key):
    """22.05 prints ``Key = a,b``; 24.11 prints ``Key[0] = a`` ``Key[1] = b``: one value either way."""
    old = parse_config(f"{key:<24}= {','.join(paths)}\nPrologFlags = Alloc\n")
    new = parse_config("".join(f"{key}[{i}]{'':<10}= {p}\n" for i, p in enumerate(paths)) + "PrologFlags = Alloc\n")
    assert old[key] == new[key] == ",".join(paths)
    assert doctor._values(doctor.lower_keys(new)[key.lower()]) == paths


# ---------------------------------------------------------------- kernel log (issue 24, item 7)
def test_an_unreadable_kernel_log_warns_on_a_gpu_node(site, monkeypatch):
    """In a container (no /dev/kmsg for root, no dmesg) the epilog has no Xid evidence: doctor says
    so where an admin looks, with the fix, and does not fail the host for it."""
    env = env_for(site, roles=("node",), kernel_log_probe=lambda: "/dev/kmsg: Operation not permitted")
    checks = doctor.run(env)
    c = by_name(checks)["kernel-log"]
    assert c.status == "WARN" and c.fix and not doctor.failed(checks)
    assert c.detail.startswith("kernel log unreadable: GPU faults are found only by the trusted checks")
    assert "Operation not permitted" in c.detail
    assert by_name(doctor.run(env_for(site, roles=("node",))))["kernel-log"].status == "OK"
    assert "kernel-log" not in by_name(doctor.run(env_for(site, roles=("controller",))))
    # a node without GPU checks: nothing to warn about
    cpu = env_for(site, roles=("node",), kernel_log_probe=lambda: "no /dev/kmsg",
                  node_facts=lambda node: NodeFacts(node, 0, ("cpu",)))
    assert by_name(doctor.run(cpu))["kernel-log"].status == "SKIP"
    # the real probe is the epilog's own read (read_kmsg), its error text passed on
    from slurm_ft.classify import sources
    from slurm_ft.errors import EvidenceError

    def refuse(since, **kw):
        raise EvidenceError("kernel log unreadable (/dev/kmsg: Operation not permitted) and no dmesg in /usr/bin/dmesg")
    monkeypatch.setattr(sources, "read_kmsg", refuse)
    assert "Operation not permitted" in doctor.kernel_log_probe()
    monkeypatch.setattr(sources, "read_kmsg", lambda since, **kw: [])
    assert doctor.kernel_log_probe() is None


@pytest.mark.parametrize("flags,status", [
    ("Alloc,NoHold", "OK"), ("NoHold,Alloc", "OK"), ("Alloc,Contain", "OK"), ("Alloc,X11", "OK"),
    ("Alloc", "WARN"), ("Contain", "FAIL"), ("", "FAIL")])
def test_prolog_flags_want_alloc_and_say_what_the_poll_costs(site, flags, status):
    """Alloc is needed (the prolog runs at allocation); without NoHold srun polls for the prolog's
    end (issue 24's per-job cost): a WARN with the fix, unless Contain/X11 rule NoHold out."""
    conf = doctor.lower_keys(parse_config(site["show"]))
    conf["prologflags"] = flags
    check = by_name(doctor.run(env_for(site, conf=conf)))["prolog-flags"]
    assert check.status == status, check.line()
    if status == "WARN":
        assert "PrologFlags=Alloc,NoHold" in check.fix and "Contain" in check.fix


@pytest.mark.parametrize("version,params,mode,want", [
    ("22.05.8", "", "act", "no expedited requeue before 25.11"),
    ("24.11.5", "enable_expedited_requeue", "act", "no expedited requeue before 25.11"),
    ("26.05.5", "", "act", "expedited requeue is off"),
    ("26.05.5", "idle_on_node_suspend,enable_expedited_requeue", "act", "expedited requeue is on"),
    ("26.05.5", "enable_expedited_requeue_not", "observe", "expedited requeue is off"),
])
def test_doctor_names_the_slurm_version_and_the_failover_path(site, version, params, mode, want):
    conf = doctor.lower_keys(parse_config(site["show"]))
    conf.update(slurm_version=version, slurmctldparameters=params)
    env = env_for(site, roles=("controller",), conf=conf)
    if mode == "observe":
        env.cfg = config_mod.from_dict({"failover": {"mode": "observe"}})
    check = by_name(doctor.run(env))["failover-path"]
    assert check.status == "OK" and f"Slurm {version}" in check.detail and want in check.detail
    assert ("observes only" in check.detail) == (mode == "observe")
    assert ("requeues with ExcNodeList" in check.detail) == (mode == "act")


@pytest.mark.parametrize("wait,version,sched,want", [
    (0.0, "26.05.5", "requeue_delay=-1", None),                 # off: no line
    (2.0, "26.05.5", "batch_sched_delay=0,requeue_delay=-1", "OK"),
    (2.0, "25.11.7", "requeue_delay=-1", "OK"),
    (2.0, "26.05.5", "batch_sched_delay=0", "WARN"),            # the job is eligible after its delay
    (2.0, "26.05.5", "requeue_delay=0", "WARN"),
    (2.0, "26.05.5", "requeue_delay=-x", "WARN"),
    (2.0, "22.05.8", "requeue_delay=-1", "WARN"),               # 22.05 has no requeue_delay
])
def test_doctor_says_whether_the_handoff_pays_on_this_slurm(site, wait, version, sched, want):
    conf = doctor.lower_keys(parse_config(site["show"]))
    conf.update(slurm_version=version, schedulerparameters=sched)
    env = env_for(site, roles=("controller",), conf=conf)
    env.cfg = config_mod.from_dict({"failover": {"handoff_wait_s": wait}})
    check = by_name(doctor.run(env)).get("handoff")
    assert (check and check.status) == want
    if want == "WARN":
        assert "handoff_wait_s = 0" in check.fix and "requeue_delay=-1" in check.fix


def test_doctor_failover_path_without_scontrol_says_the_version_is_unknown(site):
    conf = doctor.lower_keys(parse_config(site["show"]))
    conf.pop("slurm_version", None)
    check = by_name(doctor.run(env_for(site, roles=("controller",), conf=conf)))["failover-path"]
    assert check.status == "OK" and "unknown" in check.detail
