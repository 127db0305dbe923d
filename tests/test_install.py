"""`slurm-ft install`: what the package ships, what lands where under a prefix, idempotence,
conflicts with files slurm-ft did not write, uninstall, the wrappers failing loudly, and the
systemd unit passing `systemd-analyze verify`."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from click.testing import CliRunner

from slurm_ft.admin import assets
from slurm_ft.admin import install
from slurm_ft.data import data_text
from slurm_ft.cli.main import main
from slurm_ft.lab import spank as lab_spank

ROOT = Path(__file__).resolve().parents[1]
CONF = "etc/slurm"
FILES = {
    "usr/local/libexec/slurm-ft/slurm-ft-prolog": 0o755,
    "usr/local/libexec/slurm-ft/slurm-ft-epilog": 0o755,
    f"{CONF}/job_submit.lua": 0o644,
    f"{CONF}/cli_filter.lua": 0o644,
    f"{CONF}/plugstack.conf": 0o644,
    f"{CONF}/plugstack.conf.d/slurm-ft.conf": 0o644,
    "usr/local/src/slurm-ft/spank/slurm_ft_spank.c": 0o644,
    "usr/local/src/slurm-ft/spank/Makefile": 0o644,
    "etc/systemd/system/slurm-ft-daemon.service": 0o644,
    "etc/slurm-ft/slurm-ft.toml": 0o644,
    "usr/local/libexec/slurm-ft/slurm-ft-ctld-event": 0o755,
    "etc/tmpfiles.d/slurm-ft.conf": 0o644,
}
#: every role at once (a single-host cluster), unless a test names --role/--only itself
ALL_ROLES = ("--role", "controller", "--role", "compute", "--role", "login")


def run(*args, prefix: Path | None = None):
    chosen = {"--role", "--only", "--uninstall"} & set(args)
    argv = ["install", *(["--prefix", str(prefix), "--slurm-conf-dir", "/etc/slurm", "--slurm-user", "slurm"]
                         if prefix else []), *(() if chosen else ALL_ROLES), *args]
    return CliRunner().invoke(main, argv, catch_exceptions=False)


def actions(output: str) -> dict[str, str]:
    out = {}
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("install", "update", "unchanged", "conflict", "replaced", "kept", "remove", "absent", "left"):
            out[rest.strip().split("  (")[0]] = word
    return out


def test_install_into_a_prefix_then_again_is_idempotent(tmp_path):
    r = run(prefix=tmp_path)
    assert r.exit_code == 0, r.output
    for rel, mode in FILES.items():
        p = tmp_path / rel
        assert p.is_file(), rel
        assert stat.S_IMODE(p.stat().st_mode) == mode, rel
    # the wrappers run this venv's Python, isolated, and say where they are installed
    prolog = (tmp_path / "usr/local/libexec/slurm-ft/slurm-ft-prolog").read_text()
    assert f"PYTHON={assets.venv_python()}\n" in prolog and '"$PYTHON" -I -m slurm_ft.node.prolog' in prolog
    assert "Prolog=/usr/local/libexec/slurm-ft/slurm-ft-prolog" in prolog and "on_internal_error" in prolog
    assert install.marker_state(prolog) == "ours"
    # the Lua scripts are the ones the lab runs (same package data), the marker aside
    job_submit = (tmp_path / CONF / "job_submit.lua").read_text()
    assert job_submit.split("\n", 1)[1] == lab_spank.render_job_submit()
    assert (tmp_path / CONF / "plugstack.conf.d/slurm-ft.conf").read_text().splitlines()[-1] == \
        f"optional {assets.SPANK_LIB}"
    unit = (tmp_path / "etc/systemd/system/slurm-ft-daemon.service").read_text()
    assert f"ExecStart={assets.slurm_ft_command()} daemon" in unit
    assert "next steps:" in r.output and "Prolog=/usr/local/libexec/slurm-ft/slurm-ft-prolog" in r.output

    again = run(prefix=tmp_path)
    assert again.exit_code == 0, again.output
    got = actions(again.output)
    assert set(got.values()) == {"unchanged", "kept"}, got
    assert got[str(tmp_path / "etc/slurm-ft/slurm-ft.toml")] == "kept"


def test_dry_run_writes_nothing(tmp_path):
    r = run("--dry-run", prefix=tmp_path)
    assert r.exit_code == 0 and "dry run: nothing written" in r.output
    assert set(actions(r.output).values()) == {"install"}
    assert list(tmp_path.iterdir()) == []
    assert not (tmp_path / "run").exists()


def test_only_components(tmp_path):
    r = run("--only", "wrappers", "--only", "config", prefix=tmp_path)
    assert r.exit_code == 0, r.output
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "etc/slurm-ft/slurm-ft.toml", "usr/local/libexec/slurm-ft/slurm-ft-epilog",
        "usr/local/libexec/slurm-ft/slurm-ft-prolog"]


def test_job_submit_gets_the_staged_config_limits(tmp_path):
    cfg = tmp_path / "etc/slurm-ft/slurm-ft.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("[failover]\nretries = 2\nmax_retries = 5\n")
    r = run("--only", "lua", prefix=tmp_path)
    assert r.exit_code == 0 and "max_retries=5 retries=2" in r.output
    text = (tmp_path / CONF / "job_submit.lua").read_text()
    assert "local MAX_RETRIES = 5 " in text and "local DEFAULT_RETRIES = 2 " in text
    # a changed limit updates slurm-ft's own unedited file
    cfg.write_text("[failover]\nretries = 2\nmax_retries = 6\n")
    r = run("--only", "lua", prefix=tmp_path)
    assert actions(r.output)[str(tmp_path / CONF / "job_submit.lua")] == "update"
    assert "local MAX_RETRIES = 6 " in (tmp_path / CONF / "job_submit.lua").read_text()


def test_foreign_and_edited_files_are_left_alone_unless_forced(tmp_path):
    site = tmp_path / CONF / "job_submit.lua"
    site.parent.mkdir(parents=True)
    site.write_text("-- the site's own job_submit.lua\n")
    assert run("--only", "lua", prefix=tmp_path).exit_code == 1
    assert site.read_text() == "-- the site's own job_submit.lua\n"
    new = site.with_name("job_submit.lua.slurm-ft-new")
    assert install.marker_state(new.read_text()) == "ours"

    # an admin edits slurm-ft's cli_filter.lua: a conflict too, never silently reverted
    cli = tmp_path / CONF / "cli_filter.lua"
    cli.write_text(cli.read_text() + "-- local tweak\n")
    assert install.marker_state(cli.read_text()) == "edited"
    r = run("--only", "lua", prefix=tmp_path)
    assert r.exit_code == 1 and "edited since slurm-ft wrote it" in r.output
    assert cli.read_text().endswith("-- local tweak\n")

    r = run("--only", "lua", "--force", prefix=tmp_path)
    assert r.exit_code == 0, r.output
    assert actions(r.output)[str(site)] == "replaced"
    assert site.with_name("job_submit.lua.slurm-ft-old").read_text() == "-- the site's own job_submit.lua\n"
    assert install.marker_state(site.read_text()) == "ours"


def test_symlink_at_a_target_is_replaced_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    target = tmp_path / "usr/local/libexec/slurm-ft/slurm-ft-prolog"
    target.parent.mkdir(parents=True)
    target.symlink_to(victim)
    assert run("--only", "wrappers", prefix=tmp_path).exit_code == 1       # a symlink is not slurm-ft's
    assert run("--only", "wrappers", "--force", prefix=tmp_path).exit_code == 0
    assert victim.read_text() == "keep me\n"
    assert not target.is_symlink() and install.marker_state(target.read_text()) == "ours"


def test_uninstall_removes_only_unedited_files_and_keeps_the_config(tmp_path):
    assert run(prefix=tmp_path).exit_code == 0
    edited = tmp_path / "etc/systemd/system/slurm-ft-daemon.service"
    edited.write_text(edited.read_text() + "# site change\n")
    r = run("--uninstall", prefix=tmp_path)
    assert r.exit_code == 0, r.output
    got = actions(r.output)
    assert got[str(edited)] == "left" and edited.exists()
    assert got[str(tmp_path / "etc/slurm-ft/slurm-ft.toml")] == "kept"
    assert not (tmp_path / "usr/local/libexec/slurm-ft/slurm-ft-prolog").exists()
    assert not (tmp_path / CONF / "job_submit.lua").exists()
    assert (tmp_path / "etc/slurm-ft/slurm-ft.toml").exists() and (tmp_path / CONF / "plugstack.conf").exists()


def test_real_install_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = run()
    assert r.exit_code == 1 and "run as root (or --dry-run, or --prefix DIR)" in r.output


def test_real_install_refuses_a_python_other_users_can_change(monkeypatch):
    monkeypatch.setattr(install, "untrusted", lambda p: f"{p} is owned by uid 1000, not root")
    r = run("--dry-run", "--only", "wrappers")
    assert r.exit_code == 1 and "would run, as root, code another user can change" in r.output


def test_untrusted_paths(tmp_path):
    good = tmp_path / "venv" / "bin"
    good.mkdir(parents=True)
    py = good / "python"
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    if install.untrusted(tmp_path):              # the suite's tmp dir itself must be root-safe for this test
        pytest.skip(f"tmp dir not root-safe: {install.untrusted(tmp_path)}")
    assert install.untrusted(py) is None
    py.chmod(0o757)
    assert "writable by group or others" in install.untrusted(py)
    py.chmod(0o755)
    os.chown(good, 65534, 65534)
    assert "owned by uid 65534" in install.untrusted(py)
    os.chown(good, 0, 0)
    link = tmp_path / "link"
    link.symlink_to(py)
    assert install.untrusted(link) is None
    os.lchown(link, 65534, 65534)                # someone else's symlink could be pointed elsewhere
    assert "owned by uid 65534" in install.untrusted(link)


# --------------------------------------------------------------------------- the wrappers run
def _fake_python(tmp_path: Path) -> Path:
    py = tmp_path / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text('#!/bin/sh\necho "ran: $*"\necho "PATH=$PATH"\n')
    py.chmod(0o755)
    return py


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_wrapper_execs_the_python_isolated_with_a_fixed_path(tmp_path, kind):
    script = tmp_path / f"slurm-ft-{kind}"
    script.write_text(assets.render_wrapper(kind, str(_fake_python(tmp_path)), str(script)))
    script.chmod(0o755)
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/home/evil/bin", "SLURM_JOB_ID": "7"})
    assert r.returncode == 0 and f"ran: -I -m slurm_ft.node.{kind}" in r.stdout
    assert "PATH=/usr/sbin:/usr/bin:/sbin:/bin" in r.stdout


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_wrapper_says_loudly_when_slurm_ft_is_missing(tmp_path, kind):
    script = tmp_path / f"slurm-ft-{kind}"
    script.write_text(assets.render_wrapper(kind, "/opt/slurm-ft/removed-venv/bin/python", str(script)))
    script.chmod(0o755)
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=30, env={})
    # a crash before slurm-ft's boundary: said loudly, then [node_state] on_internal_error decides
    # (default "pass": 0, so that one bad upgrade cannot drain a whole cluster; tests/test_boundary.py)
    assert r.returncode == 0
    assert (f"slurm-ft {kind}: /opt/slurm-ft/removed-venv/bin/python -I -m slurm_ft.node.{kind} ended with status 127"
            in r.stderr) and "on_internal_error = pass" in r.stderr
    conf = tmp_path / "slurm-ft.toml"
    conf.write_text('[node_state]\non_internal_error = "drain"\n')
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=30, env={"SLURM_FT_CONFIG": str(conf)})
    assert r.returncode == 1 and "on_internal_error = drain" in r.stderr   # Slurm drains the node


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_checkout_wrapper_says_loudly_without_a_venv(tmp_path, kind):
    copy = tmp_path / "checkout" / kind / f"slurm-ft-{kind}"
    copy.parent.mkdir(parents=True)
    shutil.copy(ROOT / kind / f"slurm-ft-{kind}", copy)
    if Path("/opt/slurm-ft/venv/bin/python").exists():
        pytest.skip("/opt/slurm-ft/venv exists here")
    r = subprocess.run([str(copy)], capture_output=True, text=True, timeout=30, env={})
    assert r.returncode == 0 and "/opt/slurm-ft/venv/bin/python -I -S" in r.stderr   # default: pass, loudly
    conf = tmp_path / "slurm-ft.toml"
    conf.write_text('[node_state]\non_internal_error = "drain"\n')
    r = subprocess.run([str(copy)], capture_output=True, text=True, timeout=30, env={"SLURM_FT_CONFIG": str(conf)})
    assert r.returncode == 1 and "ended with status 127" in r.stderr


def test_render_rejects_paths_that_would_need_quoting():
    with pytest.raises(ValueError, match="plain characters"):
        assets.render_wrapper("prolog", "/opt/my venv/bin/python", "/x")
    with pytest.raises(ValueError, match="plain characters"):
        assets.render_unit("/opt/slurm-ft/%h/bin/slurm-ft")


# ----------------------------------------------------------------------------- systemd, spank
def _analyze() -> str | None:
    return shutil.which("systemd-analyze")


@pytest.mark.skipif(not _analyze(), reason="needs systemd-analyze (apt-get install systemd)")
def test_installed_unit_passes_systemd_analyze_verify(tmp_path):
    assert run("--only", "systemd", prefix=tmp_path).exit_code == 0
    unit = tmp_path / "etc/systemd/system/slurm-ft-daemon.service"
    r = subprocess.run([_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(not _analyze() or not Path("/usr/lib/systemd/system/sysinit.target").exists(),
                    reason="needs systemd-analyze and systemd's units")
def test_contrib_unit_is_the_rendered_unit_and_passes_verify(tmp_path):
    """contrib/slurm-ft-daemon.service is the unit for a venv in /opt/slurm-ft/venv; verified in a
    root where that venv exists (on a host without it, verify only says the command is missing)."""
    contrib = (ROOT / "contrib" / "slurm-ft-daemon.service").read_text()
    assert contrib == assets.render_unit("/opt/slurm-ft/venv/bin/slurm-ft")
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    exe = root / "opt/slurm-ft/venv/bin/slurm-ft"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(ROOT / "contrib" / "slurm-ft-daemon.service", root / "etc/systemd/system")
    r = subprocess.run([_analyze(), "verify", f"--root={root}", "slurm-ft-daemon.service"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(not Path("/usr/include/slurm/spank.h").exists() or not shutil.which("gcc")
                    or not shutil.which("make"), reason="needs gcc, make and libslurm-dev")
def test_installed_spank_source_builds_and_installs(tmp_path):
    assert run("--only", "spank", prefix=tmp_path).exit_code == 0
    src = tmp_path / "usr/local/src/slurm-ft/spank"
    r = subprocess.run(["make", "-s", "-C", str(src), "install", f"DESTDIR={tmp_path}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / assets.SPANK_LIB.lstrip("/")).is_file()


def test_the_checkout_spank_dir_is_the_packaged_source():
    for name in ("slurm_ft_spank.c", "Makefile"):
        assert (ROOT / "spank" / name).read_text() == assets.spank_sources()[name]


def test_package_ships_every_install_file(tmp_path):
    """What `pip install .` installs: build_py of a copy of the source, package data included."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    shutil.copytree(ROOT / "slurm_ft", src / "slurm_ft", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py",
                        "--build-lib", str(tmp_path / "lib")], cwd=src, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = tmp_path / "lib" / "slurm_ft" / "data"
    for rel in ("install/slurm-ft-prolog.in", "install/slurm-ft-epilog.in", "install/slurm-ft-daemon.service.in",
                "install/slurm-ft.toml", "lua/job_submit.lua.in", "lua/cli_filter.lua", "spank/slurm_ft_spank.c",
                "spank/Makefile", "xid_catalog.csv", "client/slurm_ft_job.py"):
        assert (data / rel).is_file(), rel


def test_default_config_loads_as_the_built_in_defaults(tmp_path):
    from slurm_ft import config
    p = tmp_path / "slurm-ft.toml"
    p.write_text(assets.default_config())
    cfg = config.load(p)
    assert cfg == config.Config(source=str(p))


# ------------------------------------------------------------------------------- roles (issue 24)
ROLE_FILES = {
    "controller": {f"{CONF}/job_submit.lua", f"{CONF}/cli_filter.lua", f"{CONF}/plugstack.conf",
                   f"{CONF}/plugstack.conf.d/slurm-ft.conf", "usr/local/src/slurm-ft/spank/slurm_ft_spank.c",
                   "usr/local/src/slurm-ft/spank/Makefile", "usr/local/libexec/slurm-ft/slurm-ft-ctld-event",
                   "etc/tmpfiles.d/slurm-ft.conf", "etc/systemd/system/slurm-ft-daemon.service",
                   "etc/slurm-ft/slurm-ft.toml"},
    "compute": {"usr/local/libexec/slurm-ft/slurm-ft-prolog", "usr/local/libexec/slurm-ft/slurm-ft-epilog",
                f"{CONF}/cli_filter.lua", f"{CONF}/plugstack.conf", f"{CONF}/plugstack.conf.d/slurm-ft.conf",
                "usr/local/src/slurm-ft/spank/slurm_ft_spank.c", "usr/local/src/slurm-ft/spank/Makefile",
                "etc/slurm-ft/slurm-ft.toml", "usr/share/slurm-ft/python/slurm_ft_job.py"},
    "login": {f"{CONF}/cli_filter.lua", f"{CONF}/plugstack.conf", f"{CONF}/plugstack.conf.d/slurm-ft.conf",
              "usr/local/src/slurm-ft/spank/slurm_ft_spank.c", "usr/local/src/slurm-ft/spank/Makefile",
              "etc/slurm-ft/slurm-ft.toml", "usr/share/slurm-ft/python/slurm_ft_job.py"},
}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("role", sorted(ROLE_FILES))
def test_each_role_installs_its_files(tmp_path, role):
    r = run("--role", role, prefix=tmp_path)
    assert r.exit_code == 0, r.output
    assert _files(tmp_path) == ROLE_FILES[role]
    assert f"role {role}:" in r.output
    # compute nodes run srun inside batch jobs: the shared slurm.conf's CliFilterPlugins=lua needs it there
    assert (tmp_path / CONF / "cli_filter.lua").is_file()
    assert (tmp_path / "run/slurm-ft/events").is_dir() == (role == "controller")


def test_two_roles_install_the_union(tmp_path):
    assert run("--role", "controller", "--role", "compute", prefix=tmp_path).exit_code == 0
    assert _files(tmp_path) == ROLE_FILES["controller"] | ROLE_FILES["compute"]


def test_a_role_or_only_is_required(tmp_path):
    r = CliRunner().invoke(main, ["install", "--prefix", str(tmp_path), "--dry-run"])
    assert r.exit_code == 1 and "--role controller|compute|login" in r.output
    r = CliRunner().invoke(main, ["install", "--prefix", str(tmp_path), "--role", "compute", "--only", "lua"])
    assert r.exit_code == 1 and "choose" in r.output


def test_roles_table_names_only_known_components():
    table = install.roles()
    assert set(table) == {"controller", "compute", "login"}
    for comps in table.values():
        assert set(comps) <= set(install.COMPONENTS) and "config" in comps
    assert install.aliases()["lua"] == ("job_submit", "cli_filter")
    assert set(assets.roles_table()["components"]) == set(install.COMPONENTS)


def test_controller_gets_the_hook_its_tmpfiles_entry_and_events_dir(tmp_path):
    import pwd
    r = run("--role", "controller", prefix=tmp_path)
    assert r.exit_code == 0, r.output
    hook = tmp_path / "usr/local/libexec/slurm-ft/slurm-ft-ctld-event"
    text = hook.read_text()
    assert install.marker_state(text) == "ours" and text.startswith("#!/bin/sh\n")
    assert "dir=${SLURM_FT_EVENTS_DIR:-/run/slurm-ft/events}\n" in text
    tmpfiles = (tmp_path / "etc/tmpfiles.d/slurm-ft.conf").read_text()
    assert "\nd /run/slurm-ft/events 0700 slurm slurm -\n" in tmpfiles
    events = tmp_path / "run/slurm-ft/events"
    st = events.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700
    try:
        assert st.st_uid == pwd.getpwnam("slurm").pw_uid
    except KeyError:
        pass                                              # no slurm user here: the owner is not set
    assert f"PrologSlurmctld={assets.CTLD_EVENT_PATH}" in r.output
    again = run("--role", "controller", prefix=tmp_path)
    assert actions(again.output)[str(events)] == "unchanged"


def test_hook_and_tmpfiles_follow_the_configs_events_dir(tmp_path):
    cfg = tmp_path / "etc/slurm-ft/slurm-ft.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('[failover]\nevents_dir = "/var/spool/slurm-ft/events"\n')
    assert run("--role", "controller", prefix=tmp_path).exit_code == 0
    hook = (tmp_path / "usr/local/libexec/slurm-ft/slurm-ft-ctld-event").read_text()
    assert "dir=${SLURM_FT_EVENTS_DIR:-/var/spool/slurm-ft/events}\n" in hook
    assert "d /var/spool/slurm-ft/events 0700 slurm slurm -" in (tmp_path / "etc/tmpfiles.d/slurm-ft.conf").read_text()
    assert (tmp_path / "var/spool/slurm-ft/events").is_dir()
    # events off: no hook, and the next steps say why
    cfg.write_text('[failover]\nevents_dir = ""\n')
    r = run("--role", "controller", "--config", str(cfg), prefix=tmp_path / "off")
    assert r.exit_code == 0 and "no ctld event hook" in r.output
    assert not (tmp_path / "off/usr/local/libexec/slurm-ft/slurm-ft-ctld-event").exists()


def test_installed_hook_writes_an_event_into_the_rendered_dir(tmp_path):
    events = tmp_path / "events"
    events.mkdir(mode=0o700)
    hook = tmp_path / "slurm-ft-ctld-event"
    hook.write_text(assets.render_ctld_event(str(events)))
    hook.chmod(0o755)
    r = subprocess.run([str(hook)], capture_output=True, text=True, timeout=30,
                       env={"SLURM_JOB_COMMENT": "ft", "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld", "SLURM_JOB_ID": "42",
                            "SLURM_JOB_NODELIST": "n1"})
    assert r.returncode == 0, r.stderr
    (event,) = list(events.iterdir())
    assert event.name.endswith(".42.start") and event.read_text().startswith("start 42 0 n1 ")


def test_contrib_hook_is_the_packaged_hook():
    contrib = ROOT / "contrib" / "slurm-ft-ctld-event"
    assert contrib.read_text() == data_text("install/slurm-ft-ctld-event") == assets.render_ctld_event()


def test_slurm_user_comes_from_slurm_conf(tmp_path):
    conf = tmp_path / CONF / "slurm.conf"
    conf.parent.mkdir(parents=True)
    argv = ["install", "--prefix", str(tmp_path), "--slurm-conf-dir", "/etc/slurm", "--role", "controller"]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 1 and "--slurm-user" in r.output           # no slurm.conf: ask, never guess
    conf.write_text("ClusterName=c\nSlurmUser=slurm # the daemon user\n")
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 0, r.output
    assert "d /run/slurm-ft/events 0700 slurm slurm -" in (tmp_path / "etc/tmpfiles.d/slurm-ft.conf").read_text()
    conf.write_text("ClusterName=c\n")                                 # Slurm's default SlurmUser: root
    assert CliRunner().invoke(main, [*argv, "--dry-run"]).exit_code == 0
    assert install.slurm_user({}) == "root"


def test_events_dir_symlink_is_a_conflict_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    events = tmp_path / "run/slurm-ft/events"
    events.parent.mkdir(parents=True)
    events.symlink_to(victim)
    r = run("--role", "controller", prefix=tmp_path)
    assert r.exit_code == 1 and actions(r.output)[str(events)] == "conflict"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755 and events.is_symlink()


@given(st.text(max_size=40))
@settings(max_examples=200, deadline=None)
def test_tmpfiles_user_is_a_plain_name_or_refused(name):
    """The SlurmUser rendered into the tmpfiles.d line: a name useradd(8) accepts, or ValueError;
    the line always has tmpfiles.d's six fields."""
    try:
        text = assets.render_tmpfiles("/run/slurm-ft/events", name)
    except ValueError:
        return
    (line,) = [ln for ln in text.splitlines() if ln.startswith("d ")]
    assert line.split() == ["d", "/run/slurm-ft/events", "0700", name, name, "-"]


@pytest.mark.skipif(not shutil.which("systemd-tmpfiles"), reason="needs systemd-tmpfiles")
def test_tmpfiles_entry_creates_the_events_dir(tmp_path):
    entry = tmp_path / "slurm-ft.conf"
    entry.write_text(assets.render_tmpfiles("/run/slurm-ft/events", "root"))
    r = subprocess.run(["systemd-tmpfiles", f"--root={tmp_path / 'root'}", "--create", str(entry)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    made = tmp_path / "root/run/slurm-ft/events"
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o700


# --------------------------------------------------------------- uninstall: slurm.conf (issue 24)
GUIDE_CONF = """\
SlurmUser=slurm
Prolog=/usr/local/libexec/slurm-ft/slurm-ft-prolog
Epilog=/usr/local/libexec/slurm-ft/slurm-ft-epilog
PrologFlags=Alloc
JobSubmitPlugins=lua
CliFilterPlugins=lua
PrologSlurmctld=/usr/local/libexec/slurm-ft/slurm-ft-ctld-event
EpilogSlurmctld=/usr/local/libexec/slurm-ft/slurm-ft-ctld-event
"""


def test_uninstall_warns_about_slurm_conf_lines_that_name_removed_files(tmp_path):
    (tmp_path / CONF).mkdir(parents=True)
    (tmp_path / CONF / "slurm.conf").write_text(GUIDE_CONF)
    assert run(prefix=tmp_path).exit_code == 0
    (tmp_path / CONF / "plugstack.conf").write_text("required /usr/local/lib/slurm-ft/slurm_ft_spank.so\n")
    r = run("--uninstall", prefix=tmp_path)
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: ")]
    for key in ("Prolog=", "Epilog=", "PrologSlurmctld=", "EpilogSlurmctld=", "JobSubmitPlugins=lua",
                "CliFilterPlugins=lua"):
        assert sum(f"still has {key}" in w for w in warnings) == 1, (key, warnings)
    assert any("failed to initialize cli_filter plugin" in w for w in warnings)
    assert any("still loads slurm-ft's SPANK plugin" in w for w in warnings)
    assert "warning" not in r.stdout                                   # stderr only


def test_uninstall_is_quiet_when_slurm_conf_names_nothing_of_slurm_ft(tmp_path):
    (tmp_path / CONF).mkdir(parents=True)
    (tmp_path / CONF / "slurm.conf").write_text("SlurmUser=slurm\nProlog=/etc/slurm/site-prolog\n"
                                                "JobSubmitPlugins=lua\n")
    assert run(prefix=tmp_path).exit_code == 0
    site = tmp_path / CONF / "job_submit.lua"                          # the site's own script stays, so no warning
    site.write_text("-- site\n")
    r = run("--uninstall", prefix=tmp_path)
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    assert site.exists()


def test_uninstall_says_when_it_cannot_read_slurm_conf(tmp_path):
    assert run(prefix=tmp_path).exit_code == 0
    r = run("--uninstall", prefix=tmp_path)
    assert r.exit_code == 0 and "not read: check by hand" in r.stderr


_WRAPPERS = {"Prolog": "/usr/local/libexec/slurm-ft/slurm-ft-prolog",
             "Epilog": "/usr/local/libexec/slurm-ft/slurm-ft-epilog",
             "PrologSlurmctld": assets.CTLD_EVENT_PATH, "EpilogSlurmctld": assets.CTLD_EVENT_PATH}
_PLUGINS = {"JobSubmitPlugins": "/etc/slurm/job_submit.lua", "CliFilterPlugins": "/etc/slurm/cli_filter.lua"}


@given(settings_=st.dictionaries(st.sampled_from([*_WRAPPERS, *_PLUGINS]), st.booleans()),
       case=st.sampled_from([str, str.lower, str.upper]),
       plugin_value=st.sampled_from(["lua", "LUA", "{kind}/lua", "pbs,lua", "pbs"]),
       gone=st.sets(st.sampled_from([*_WRAPPERS.values(), *_PLUGINS.values()])))
@settings(max_examples=200, deadline=None)
def test_uninstall_warns_exactly_for_settings_naming_a_removed_file(tmp_path_factory, settings_, case, plugin_value,
                                                                    gone):
    """Any slurm.conf (keys in any case, slurm-ft's or another path, plugin lists with or without
    lua) and any set of removed files: one warning per setting that names a removed file, none
    else."""
    prefix = tmp_path_factory.mktemp("u")
    (prefix / CONF).mkdir(parents=True)
    lines, expect = [], set()
    for key, ours in settings_.items():
        if key in _WRAPPERS:
            value = _WRAPPERS[key] if ours else "/etc/slurm/site-script"
            named = _WRAPPERS[key] if ours else None
        else:
            value = plugin_value.format(kind=key.lower().replace("plugins", "").replace("jobsubmit", "job_submit")
                                        .replace("clifilter", "cli_filter"))
            named = _PLUGINS[key] if "lua" in [v.split("/")[-1] for v in value.lower().split(",")] else None
        lines.append(f"{case(key)}={value}")
        if named in gone:
            expect.add(key)
    (prefix / CONF / "slurm.conf").write_text("\n".join(lines) + "\n")
    outcomes = [install.Outcome(install.Item("x", p, ""), prefix / p.lstrip("/"), "remove") for p in sorted(gone)]
    warnings = install.uninstall_warnings(outcomes, prefix=str(prefix), slurm_conf_dir="/etc/slurm")
    got = {w.split(" still has ", 1)[1].split("=", 1)[0] for w in warnings if " still has " in w}
    assert {g.lower() for g in got} == {e.lower() for e in expect}, (lines, sorted(gone), warnings)


def test_unknown_role_or_component_is_refused_naming_the_choices(tmp_path):
    r = run("--role", "gateway", prefix=tmp_path)
    assert r.exit_code == 1 and "unknown role 'gateway'" in r.output and "compute" in r.output
    r = run("--only", "prolog", prefix=tmp_path)
    assert r.exit_code == 1 and "unknown component 'prolog'" in r.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("role", ["compute", "login"])
def test_role_installs_the_job_client_at_its_documented_path(tmp_path, role):
    """Issue 25: `slurm-ft install --role compute` (and login) puts the stdlib-only job client at
    /usr/share/slurm-ft/python/slurm_ft_job.py (docs/user-guide.md), 0644, managed (marker line);
    an isolated Python without site-packages imports it from there by path."""
    r = run("--role", role, prefix=tmp_path)
    assert r.exit_code == 0, r.output
    assert assets.JOB_CLIENT_PATH == "/usr/share/slurm-ft/python/slurm_ft_job.py"
    p = tmp_path / assets.JOB_CLIENT_PATH.lstrip("/")
    assert p.is_file() and stat.S_IMODE(p.stat().st_mode) == 0o644
    text = p.read_text()
    assert install.marker_state(text) == "ours"
    assert text.split("\n", 1)[1] == (ROOT / "slurm_ft/data/client/slurm_ft_job.py").read_text()
    out = subprocess.run([sys.executable, "-I", "-S", "-c",
                          f"import sys; sys.path.insert(0, {str(p.parent)!r}); import slurm_ft_job; "
                          "print(slurm_ft_job.exit_checkpoint.__name__)"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "exit_checkpoint", out.stderr
    again = run("--role", role, prefix=tmp_path)
    assert actions(again.output)[str(p)] == "unchanged"


def test_controller_role_does_not_install_the_job_client(tmp_path):
    assert "job_client" not in install.components_for(["controller"])
    assert "job_client" in install.components_for(["compute"]) and "job_client" in install.components_for(["login"])
