"""The SPANK plugin builds warning-free with -Wall -Wextra, and the Lua policy files are sane."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_ft.lab import spank as lab_spank

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "spank" / "slurm_ft_spank.c"


@pytest.mark.skipif(not Path("/usr/include/slurm/spank.h").exists() or not shutil.which("gcc"),
                    reason="needs gcc and libslurm-dev (<slurm/spank.h>)")
def test_plugin_builds_without_warnings(tmp_path):
    proc = subprocess.run(["gcc", "-std=gnu99", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                           "-o", str(tmp_path / "p.so"), str(SRC)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_plugin_style():
    src = SRC.read_text()
    assert "SPANK_PLUGIN(slurm_ft" in src and "system(" not in src
    assert "spank_option_register" in src
    # every message names the plugin
    for line in src.splitlines():
        if "slurm_error(" in line:
            assert "PFX" in line, line


@pytest.mark.skipif(not shutil.which("luac5.3") and not shutil.which("luac"), reason="needs luac")
@pytest.mark.parametrize("text", [lab_spank.render_cli_filter(), lab_spank.render_job_submit()])
def test_lua_compiles(tmp_path, text):
    f = tmp_path / "x.lua"
    f.write_text(text)
    luac = shutil.which("luac5.3") or shutil.which("luac")
    proc = subprocess.run([luac, "-p", str(f)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_write_files_without_plugin(tmp_path, monkeypatch):
    monkeypatch.setattr(lab_spank, "plugin_path", lambda repo=None: tmp_path / "missing.so")
    lines = []
    assert lab_spank.write_files(tmp_path, log=lines.append) is None
    assert not (tmp_path / "plugstack.conf").exists() and (tmp_path / "job_submit.lua").exists()
    assert "not built" in lines[0]
    assert not any(l.startswith("PlugStackConfig") for l in lab_spank.slurm_conf_lines(tmp_path, None))
