"""Install roles against what Slurm reads (issue 24, item 2): for every role, every file that a
slurm.conf key of the guide names, on a host where a Slurm daemon or command reads that key, is
installed by `slurm-ft install --role` of that role.

The slurm.conf is the one docs/install.md tells admins to write (its `cat >> .../slurm.conf` block,
extracted from the guide), shared by every host. Which host reads which key is Slurm's, written
here independently of slurm_ft/data/install/roles.toml (slurm.conf(5), cli_filter_plugins(5),
spank(8)): slurmd runs Prolog/Epilog; slurmctld runs PrologSlurmctld/EpilogSlurmctld and loads
JobSubmitPlugins; sbatch/srun/salloc load CliFilterPlugins and PlugStackConfig, and they run on
login nodes, on compute nodes (srun inside every batch job) and on the controller (admins); slurmd
loads PlugStackConfig too. The issue's bug (compute nodes without cli_filter.lua: every srun in a
batch job dies with "failed to initialize cli_filter plugin") is one of the mutations the checker
must catch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurm_ft.admin import install

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "install.md"
CONF_DIR = "/etc/slurm"
ROLES = ("controller", "compute", "login")
EVERYWHERE = frozenset(ROLES)


def _lua(script: str):
    return lambda v: [f"{CONF_DIR}/{script}"] if "lua" in [p.strip().split("/")[-1] for p in v.split(",")] else []


def _paths(v: str) -> list[str]:
    return [p.strip() for p in v.split(",") if p.strip().startswith("/")]


#: slurm.conf key (lower case) -> (roles whose Slurm daemons/commands read it, the files it names)
READERS = {
    "prolog": (frozenset({"compute"}), _paths),
    "epilog": (frozenset({"compute"}), _paths),
    "prologslurmctld": (frozenset({"controller"}), _paths),
    "epilogslurmctld": (frozenset({"controller"}), _paths),
    "jobsubmitplugins": (frozenset({"controller"}), _lua("job_submit.lua")),
    "clifilterplugins": (EVERYWHERE, _lua("cli_filter.lua")),
    # default PlugStackConfig: plugstack.conf beside slurm.conf, including plugstack.conf.d/*.conf
    "plugstackconfig": (EVERYWHERE, lambda v: [v or f"{CONF_DIR}/plugstack.conf",
                                                f"{CONF_DIR}/plugstack.conf.d/slurm-ft.conf"]),
}
#: keys of the guide's slurm.conf that name no file
NO_FILE = {"prologflags"}


def guide_blocks() -> list[tuple[set[str], str]]:
    """(hosts, body) of each ```sh block of the guide, from its `# on: HOSTS` line."""
    out = []
    for body in re.findall(r"^```sh\n(.*?)^```", GUIDE.read_text(), re.M | re.S):
        m = re.match(r"# on: ([\w, -]+)\n", body)
        assert m, f"an sh block of docs/install.md has no '# on:' line:\n{body}"
        out.append(({h.strip() for h in m.group(1).split(",")}, body))
    return out


def guide_slurm_conf() -> dict[str, str]:
    """The slurm.conf lines the guide appends (its `cat >> /etc/slurm/slurm.conf <<'EOF'` block)."""
    conf: dict[str, str] = {}
    for _hosts, body in guide_blocks():
        for text in re.findall(r"cat >> /etc/slurm/slurm\.conf <<'EOF'\n(.*?)^EOF$", body, re.M | re.S):
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    key, _, value = line.partition("=")
                    conf[key.strip().lower()] = value.strip()
    assert conf, "docs/install.md has no `cat >> /etc/slurm/slurm.conf <<'EOF'` block"
    return conf


def needed(role: str, conf: dict[str, str]) -> dict[str, str]:
    """path -> the setting that makes a Slurm program on a ``role`` host load it."""
    out = {}
    for key, (readers, files) in READERS.items():
        if role in readers and (key in conf or key == "plugstackconfig"):
            for path in files(conf.get(key, "")):
                out[path] = f"{key}={conf.get(key, '(default)')}"
    return out


def missing(role: str, components, conf: dict[str, str]) -> dict[str, str]:
    have = {i.path for i in install.plan(components=components, slurm_conf_dir=CONF_DIR)}
    return {p: why for p, why in needed(role, conf).items() if p not in have}


def test_guide_slurm_conf_keys_are_all_known():
    unknown = set(guide_slurm_conf()) - set(READERS) - NO_FILE
    assert not unknown, f"teach this test which hosts read {unknown} and what files they name"


@pytest.mark.parametrize("role", ROLES)
def test_every_plugin_slurm_conf_names_on_a_role_is_installed_by_it(role):
    conf = guide_slurm_conf()
    assert needed(role, conf), role
    assert missing(role, install.components_for([role]), conf) == {}


def test_the_checker_catches_a_role_missing_any_needed_component():
    """Drop each component from each role in turn: whenever that component provides a file the
    role needs, the checker reports it (so the test above is not vacuous). Includes issue 24's
    case: compute without cli_filter."""
    conf = guide_slurm_conf()
    caught = set()
    for role in ROLES:
        comps = install.components_for([role])
        for drop in comps:
            provides = {i.path for i in install.plan(components=[drop], slurm_conf_dir=CONF_DIR)}
            if provides & set(needed(role, conf)):
                assert missing(role, [c for c in comps if c != drop], conf), (role, drop)
                caught.add((role, drop))
    assert ("compute", "cli_filter") in caught and ("controller", "job_submit") in caught
    assert ("compute", "wrappers") in caught and ("controller", "ctld_event") in caught
    assert {("login", "cli_filter"), ("login", "spank")} <= caught


def test_guide_installs_each_role_on_hosts_of_that_role():
    calls = [(hosts, re.findall(r"--role (\w+)", body)) for hosts, body in guide_blocks()
             if "slurm-ft install" in body]
    assert sorted(r for _, roles in calls for r in roles) == sorted(ROLES)
    for hosts, roles in calls:
        assert hosts == set(roles), (hosts, roles)
