"""The checkout's prolog/epilog wrappers start Python with ``-I -S`` (no ``site`` module: ~15 ms of
CPU per job, issue 24) and put ``sys.path`` together themselves. That start must give the hook the
same ``sys.path`` that ``site`` gives (the checkout first, then the interpreter's, then the venv's
site-packages), and hand back to ``site`` whenever the venv is not a plain one: system
site-packages included, or a ``.pth`` file that ``site`` would run.

Each case builds a real venv (``python -m venv --without-pip``) in a fake checkout whose
``slurm_ft/node/<kind>.py`` prints what the hook's process sees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = getattr(sys, "_base_executable", "") or sys.executable

#: The stand-in hook: its ``main()`` prints the process's view as JSON.
PROBE = ("import json, sys\n"
         "def main():\n"
         "    print(json.dumps({'site': 'site' in sys.modules, 'path': sys.path, 'file': __file__}))\n")


def _checkout(tmp: Path, kind: str, cfg: str = "", pth: dict[str, str] | None = None) -> Path:
    """A checkout under ``tmp`` with the real ``kind`` wrapper, a venv ``.venv`` and a stand-in
    ``slurm_ft``; ``cfg``: lines added to the venv's pyvenv.cfg; ``pth``: .pth files to add."""
    subprocess.run([BASE, "-m", "venv", "--without-pip", str(tmp / ".venv")], check=True, timeout=120)
    if cfg:
        with open(tmp / ".venv" / "pyvenv.cfg", "a") as fh:
            fh.write(cfg)
    site = _site_packages(tmp)
    for name, text in (pth or {}).items():
        (site / name).write_text(text)
    (tmp / "slurm_ft" / "node").mkdir(parents=True)
    (tmp / "slurm_ft" / "__init__.py").write_text("")
    (tmp / "slurm_ft" / "node" / "__init__.py").write_text("")
    (tmp / "slurm_ft" / "node" / f"{kind}.py").write_text(PROBE)
    wrapper = tmp / kind / f"slurm-ft-{kind}"
    wrapper.parent.mkdir()
    wrapper.write_text((ROOT / kind / f"slurm-ft-{kind}").read_text())
    wrapper.chmod(0o755)
    return wrapper


def _site_packages(tmp: Path) -> Path:
    return tmp / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def _run(wrapper: Path) -> dict:
    p = subprocess.run([str(wrapper)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60,
                       cwd="/")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _site_path(tmp: Path) -> list[str]:
    """``sys.path`` of the venv's Python started the ordinary way (``-I``, with ``site``)."""
    p = subprocess.run([str(tmp / ".venv" / "bin" / "python"), "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
                       capture_output=True, text=True, timeout=60, check=True, cwd="/")
    return json.loads(p.stdout)


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_a_plain_venv_starts_without_site_and_the_same_path(tmp_path, kind):
    wrapper = _checkout(tmp_path, kind, pth={"distutils-precedence.pth": "", "__editable__.slurm_ft-0.1.0.pth": ""})
    seen = _run(wrapper)
    assert seen["site"] is False
    assert Path(seen["file"]).resolve() == (tmp_path / "slurm_ft" / "node" / f"{kind}.py").resolve()  # this checkout's code
    assert Path(seen["path"][0]).resolve() == tmp_path.resolve()
    assert seen["path"][1:] == _site_path(tmp_path)       # then exactly what site would give


@pytest.mark.parametrize("case", ["system-site-packages", "foreign-pth"])
def test_a_venv_site_must_see_is_started_with_site(tmp_path, case):
    extra = tmp_path / "extra-dir"
    extra.mkdir()
    wrapper = _checkout(tmp_path, "prolog",
                        cfg="include-system-site-packages = true\n" if case == "system-site-packages" else "",
                        pth={"extra.pth": f"{extra}\n"} if case == "foreign-pth" else None)
    seen = _run(wrapper)
    assert seen["site"] is True
    assert Path(seen["path"][0]).resolve() == tmp_path.resolve()
    assert seen["path"][1:] == _site_path(tmp_path)
    if case == "foreign-pth":
        assert str(extra) in seen["path"]
