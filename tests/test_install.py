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
from click.testing import CliRunner

from slurm_ft import assets, install
from slurm_ft.cli import main
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
}


def run(*args, prefix: Path | None = None):
    argv = ["install", *(["--prefix", str(prefix), "--slurm-conf-dir", "/etc/slurm"] if prefix else []), *args]
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
    assert f"PYTHON={assets.venv_python()}\n" in prolog and '"$PYTHON" -I -m slurm_ft.prolog' in prolog
    assert "Prolog=/usr/local/libexec/slurm-ft/slurm-ft-prolog" in prolog and "exit 0" not in prolog
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
    assert r.returncode == 0 and f"ran: -I -m slurm_ft.{kind}" in r.stdout
    assert "PATH=/usr/sbin:/usr/bin:/sbin:/bin" in r.stdout


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_wrapper_fails_loudly_when_slurm_ft_is_missing(tmp_path, kind):
    script = tmp_path / f"slurm-ft-{kind}"
    script.write_text(assets.render_wrapper(kind, "/opt/slurm-ft/removed-venv/bin/python", str(script)))
    script.chmod(0o755)
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=30, env={})
    # non-zero: slurmd drains the node (Prolog error / Epilog error) instead of running jobs unprotected
    assert r.returncode == 1
    assert f"slurm-ft {kind}: /opt/slurm-ft/removed-venv/bin/python is missing" in r.stderr
    assert "Slurm drains the node" in r.stderr


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_checkout_wrapper_fails_loudly_without_a_venv(tmp_path, kind):
    copy = tmp_path / "checkout" / kind / f"slurm-ft-{kind}"
    copy.parent.mkdir(parents=True)
    shutil.copy(ROOT / kind / f"slurm-ft-{kind}", copy)
    if Path("/opt/slurm-ft/venv/bin/python").exists():
        pytest.skip("/opt/slurm-ft/venv exists here")
    r = subprocess.run([str(copy)], capture_output=True, text=True, timeout=30, env={})
    assert r.returncode == 1 and "no slurm-ft Python" in r.stderr


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
                "spank/Makefile", "xid_catalog.csv"):
        assert (data / rel).is_file(), rel


def test_default_config_loads_as_the_built_in_defaults(tmp_path):
    from slurm_ft import config
    p = tmp_path / "slurm-ft.toml"
    p.write_text(assets.default_config())
    cfg = config.load(p)
    assert cfg == config.Config(source=str(p))
