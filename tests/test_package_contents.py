"""What the built wheel holds (issue 24, item 6): every file the docs tell admins and users to
use comes with the package, not from a checkout.

One wheel is built offline from a copy of the source (`pip wheel --no-deps --no-build-isolation
--no-index`; a few seconds), unpacked, and used as the only slurm_ft on the path:
``slurm-ft install`` of every role runs from it into a prefix and writes every file
docs/install.md names; the example jobs README.md and docs/*.md point at are in its data
(``<venv>/share/slurm-ft/examples/``); the guide sends nobody to a checkout's ``contrib/``."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES_DATA = "share/slurm-ft/examples"


def _can_build_wheels() -> bool:
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return importlib.util.find_spec("wheel") is not None or (major, minor) >= (70, 1)


pytestmark = pytest.mark.skipif(not _can_build_wheels(),
                                reason="bdist_wheel needs the `wheel` package with setuptools < 70.1 (make setup)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    for name in ("slurm_ft", "examples"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (tmp / "dist").glob("slurm_ft-*.whl")
    return whl


@pytest.fixture(scope="module")
def unpacked(wheel, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out)
    return out


def _data_names(wheel: Path) -> set[str]:
    """Names under the wheel's ``*.data/data/`` (what pip installs below the venv's prefix)."""
    with zipfile.ZipFile(wheel) as z:
        return {n.split(".data/data/", 1)[1] for n in z.namelist() if ".data/data/" in n}


def _doc_texts() -> str:
    return "\n".join(p.read_text() for p in DOCS)


def test_every_example_the_docs_name_is_in_the_wheel(wheel):
    named = set(re.findall(r"(?<![\w/.-])examples/([\w.-]+\.(?:py|sbatch))", _doc_texts()))
    named |= set(re.findall(rf"{EXAMPLES_DATA}/([\w.-]+)", _doc_texts()))
    assert {"train.py", "train-ft.sbatch", "train-srun.sbatch"} <= named
    data = _data_names(wheel)
    for name in named:
        assert f"{EXAMPLES_DATA}/{name}" in data, name
    # and every example of the checkout ships (a new one is not forgotten in setup.cfg)
    for p in (ROOT / "examples").iterdir():
        assert f"{EXAMPLES_DATA}/{p.name}" in data, p.name


def test_installed_package_installs_every_file_the_guide_names(unpacked, tmp_path):
    """`slurm-ft install` of every role, run from the unpacked wheel alone, writes each slurm-ft
    file docs/install.md names (libexec scripts and the ctld hook, the SPANK source, the Lua
    scripts, the unit, the tmpfiles.d entry, the config)."""
    prefix = tmp_path / "root"
    code = (f"import sys; sys.path.insert(0, {str(unpacked)!r}); import slurm_ft; "
            f"assert slurm_ft.__file__.startswith({str(unpacked)!r}), slurm_ft.__file__; "
            "from slurm_ft.cli.main import main; main()")
    argv = ["install", "--prefix", str(prefix), "--slurm-conf-dir", "/etc/slurm", "--slurm-user", "root",
            "--role", "controller", "--role", "compute", "--role", "login"]
    r = subprocess.run([sys.executable, "-I", "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    guide = (ROOT / "docs" / "install.md").read_text()
    named = set(re.findall(r"/usr/local/(?:libexec|src)/slurm-ft/[\w./-]*\w", guide))
    named |= set(re.findall(r"/etc/(?:tmpfiles\.d|systemd/system|slurm-ft)/[\w.-]+\.(?:conf|service|toml)", guide))
    named |= {f"/etc/slurm/{n}" for n in re.findall(r"\b(job_submit\.lua|cli_filter\.lua)\b", guide)}
    assert "/usr/local/libexec/slurm-ft/slurm-ft-ctld-event" in named and "/etc/tmpfiles.d/slurm-ft.conf" in named
    for path in sorted(named):
        target = prefix / path.lstrip("/")
        if path.endswith("/spank"):                        # the directory of the SPANK source
            assert target.is_dir(), path
        else:
            assert target.is_file(), path


def test_install_data_ships_in_the_wheel(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for rel in ("install/roles.toml", "install/slurm-ft-ctld-event", "install/slurm-ft.tmpfiles.in",
                "install/slurm-ft-prolog.in", "install/slurm-ft-epilog.in", "install/slurm-ft-daemon.service.in",
                "install/slurm-ft.toml", "lua/job_submit.lua.in", "lua/cli_filter.lua", "spank/slurm_ft_spank.c",
                "spank/Makefile"):
        assert f"slurm_ft/data/{rel}" in names, rel


def test_the_guide_never_sends_an_admin_to_a_checkout():
    guide = (ROOT / "docs" / "install.md").read_text()
    assert "contrib/" not in guide
    assert (ROOT / "contrib" / "slurm-ft-ctld-event").resolve() == \
        (ROOT / "slurm_ft" / "data" / "install" / "slurm-ft-ctld-event").resolve()
