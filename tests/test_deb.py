"""The Debian package build (packaging/deb/build.py, `make deb`): control file, file list, versions,
the cache key; with marker ``docker``, the package of the Slurm version under test installed
offline with apt-get into the plain Debian base image of the Docker lab."""

from __future__ import annotations

import configparser
import email.parser
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

ROOT = Path(__file__).resolve().parents[1]


def _load():
    name = "slurm_ft_deb_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "packaging" / "deb" / "build.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


B = _load()
DPKG_DEB = shutil.which("dpkg-deb") or "/usr/bin/dpkg-deb"


def _fields(text: str) -> dict[str, str]:
    return dict(email.parser.Parser().parsestr(text).items())


def test_releases_match_the_docker_lab_images():
    from slurm_ft.lab.docker_engine import VERSIONS
    rel = B.releases()
    assert set(rel) == {"bookworm", "trixie", "forky"}
    for r in rel.values():
        suite, python, _ = VERSIONS[r.slurm]
        assert (suite, python) == (r.name, r.python)
    assert B.release_for_slurm("24.11").name == "trixie" and B.release_for_slurm("22.05").python == "3.11"
    with pytest.raises(B.PackagingError):
        B.release_for_slurm("23.02")


@pytest.mark.parametrize("name", ["bookworm", "trixie", "forky"])
def test_control_file_fields(name):
    r = B.releases()[name]
    text = B.render_control(r, 1234)
    assert "$" not in text and text.endswith("\n")
    f = _fields(text)
    for key in ("Package", "Version", "Architecture", "Maintainer", "Installed-Size", "Depends", "Section",
                "Priority", "Description"):
        assert f.get(key), key
    assert f["Package"] == "slurm-ft" and f["Installed-Size"] == "1234" and f["Architecture"] == "amd64"
    major, minor = r.python.split(".")
    assert f"python3 (>= {r.python}), python3 (<< {major}.{int(minor) + 1})" in f["Depends"]
    assert f["Version"] == f"{B.upstream_version()}-1~{r.suffix}"
    # every continuation line of the description starts with one space (an empty one is " .")
    desc = text.split("Description:", 1)[1].splitlines()[1:]
    assert desc and all(line.startswith(" ") and line.strip() for line in desc)


def test_versions_order_as_the_releases():
    """A trixie host upgraded from bookworm takes the trixie package (dpkg's own ordering)."""
    old, new = (B.deb_version(B.releases()[n]) for n in ("bookworm", "trixie"))
    if not Path(DPKG_DEB).exists():
        pytest.skip("no dpkg here")
    assert subprocess.run(["dpkg", "--compare-versions", old, "lt", new]).returncode == 0
    forky = B.deb_version(B.releases()["forky"])   # and a forky host upgraded from trixie
    assert subprocess.run(["dpkg", "--compare-versions", new, "lt", forky]).returncode == 0
    assert subprocess.run(["dpkg", "--compare-versions", new, "lt", f"{B.upstream_version()}-1"]).returncode == 0


def test_every_console_script_is_linked_into_usr_bin():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    scripts = {line.split("=")[0].strip() for line in cfg["options.entry_points"]["console_scripts"].splitlines()
               if line.strip()}
    assert set(B.LINKS) == scripts
    assert all(t == f"{B.VENV}/bin/{n}" for n, t in B.LINKS.items())


def _fake_stage(tmp_path: Path, files: dict[str, int]) -> Path:
    stage = tmp_path / "stage"
    for rel, size in files.items():
        p = stage / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * size)
    return stage


def test_metadata_and_file_list_with_dpkg_deb(tmp_path):
    """The host's part of the tree, then dpkg-deb itself: control accepted, links absolute into the
    venv, copyright where policy puts it, everything root's (--root-owner-group)."""
    if not Path(DPKG_DEB).exists():
        pytest.skip("no dpkg-deb here")
    venv = B.VENV.lstrip("/")
    stage = _fake_stage(tmp_path, {f"{venv}/bin/slurm-ft": 10, f"{venv}/bin/ft-history": 10,
                                   f"{venv}/lib/python3.13/site-packages/slurm_ft/__init__.py": 3000})
    r = B.releases()["trixie"]
    B.write_metadata(stage, r)
    deb = tmp_path / B.deb_name(r)
    subprocess.run([DPKG_DEB, "--root-owner-group", "-Zgzip", "--build", str(stage), str(deb)], check=True,
                   capture_output=True, timeout=60)
    assert deb.name == f"slurm-ft_{B.deb_version(r)}_amd64.deb"
    info = subprocess.run([DPKG_DEB, "--field", str(deb), "Package", "Version", "Depends"], capture_output=True,
                          text=True, check=True).stdout
    assert "Package: slurm-ft" in info and "python3 (>= 3.13)" in info
    listing = subprocess.run([DPKG_DEB, "--contents", str(deb)], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert all(line.split()[1] == "root/root" for line in listing)
    names = {line.split()[5]: line for line in listing}
    for name, target in B.LINKS.items():
        assert names[f"./usr/bin/{name}"].endswith(f"-> {target}")
    assert "./usr/share/doc/slurm-ft/copyright" in names
    assert f"./{venv}/lib/python3.13/site-packages/slurm_ft/__init__.py" in names


def test_metadata_refuses_a_venv_without_the_commands(tmp_path):
    stage = _fake_stage(tmp_path, {"opt/slurm-ft/venv/bin/slurm-ft": 1})
    with pytest.raises(B.PackagingError, match="ft-history"):
        B.write_metadata(stage, B.releases()["bookworm"])


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6}){0,2}", fullmatch=True), st.integers(0, 5000),
                       max_size=12))
def test_installed_size_is_the_kib_rounded_sum(tmp_path_factory, files):
    """Installed-Size: each file rounded up to a KiB, each directory one, DEBIAN/ left out."""
    tmp = tmp_path_factory.mktemp("size")
    stage = tmp / "stage"
    stage.mkdir()
    made: dict[str, int] = {}
    for rel, size in files.items():
        p = stage / rel
        if any(q.is_file() for q in [p, *p.parents] if q != stage) or p.is_dir():
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"\0" * size)
        made[rel] = size
    (stage / "DEBIAN").mkdir()
    (stage / "DEBIAN" / "control").write_bytes(b"x" * 4096)
    dirs = {q for rel in made for q in Path(rel).parents} - {Path(".")}
    assert B.installed_kb(stage) == sum(-(-s // 1024) for s in made.values()) + len(dirs)


def test_source_digest_follows_the_package_inputs(tmp_path):
    repo = tmp_path / "repo"
    (repo / "slurm_ft" / "data").mkdir(parents=True)
    (repo / "slurm_ft" / "__init__.py").write_text("x = 1\n")
    (repo / "setup.cfg").write_text("[metadata]\nversion = 9\n")
    d0 = B.source_digest(repo)
    assert B.source_digest(repo) == d0
    (repo / "slurm_ft" / "__pycache__").mkdir()
    (repo / "slurm_ft" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_x.py").write_text("not in the package\n")
    assert B.source_digest(repo) == d0
    (repo / "slurm_ft" / "data" / "t.toml").write_text("a = 1\n")
    d1 = B.source_digest(repo)
    assert d1 != d0
    (repo / "slurm_ft" / "data" / "t.toml").write_text("a = 2\n")
    assert B.source_digest(repo) not in (d0, d1)


def test_venv_script_checks_the_python_and_runs_the_command():
    text = B.venv_script(B.releases()["bookworm"])
    assert '[ "$have" = 3.11 ]' in text and "--no-index" in text and f"{B.VENV}/bin/slurm-ft --version" in text
    assert text.startswith("set -eu\n")


def test_old_lab_layers_are_pruned_never_the_base_other_versions_or_a_busy_one():
    """Each code change makes a new lab layer (its tag hashes the package's sources): the older
    ones of that version go, the base image and a layer a container still uses stay."""
    import docker
    from slurm_ft.lab import docker_engine as D
    repo, removed = D.IMAGE_REPO, []

    class Image:
        def __init__(self, tag):
            self.tags = [tag]

    class Images:
        def list(self, name):
            assert name == repo
            return [Image(f"{repo}:{t}") for t in ("24.11-old", "24.11-base-b", "22.05-other", "24.11-new", "24.11-busy")]

        def remove(self, tag):
            if tag.endswith("busy"):
                raise docker.errors.APIError("conflict: image is being used by a running container")
            removed.append(tag)

    class Client:
        images = Images()

    D._prune_layers(Client(), "24.11", f"{repo}:24.11-new")
    assert removed == [f"{repo}:24.11-old"]


# -- the package itself (Docker: the release's own userland, no network) --------------------------
@pytest.mark.docker
def test_package_installs_offline_into_plain_debian_and_runs():
    """The .deb of the Slurm version under test, into the lab's plain base image (no slurm-ft, no
    network): apt-get installs it, the venv's Python runs `slurm-ft --version`, the links work,
    `install --role compute --dry-run` finds its data, and removing it leaves /opt/slurm-ft empty."""
    if os.geteuid() != 0:
        pytest.skip("needs root (dockerd)")
    import docker
    from slurm_ft.lab import docker_engine as D
    version = D.version_or_default(None)
    client = D._client()
    r = B.release_for_slurm(version)
    deb = B.cached_deb(r, client=client, log=lambda *_: None)
    base = D.build_base(client, version, log=lambda *_: None)
    script = (f"set -eu; apt-get install -y -q /pkg/{deb.name} >/dev/null 2>&1; "
              f"{B.VENV}/bin/python -I -m slurm_ft.cli.main --version; slurm-ft --version; ft-history --help >/dev/null; "
              f"{B.VENV}/bin/python -c 'import sys; print(\"py\", \"%d.%d\" % sys.version_info[:2])'; "
              "slurm-ft install --role compute --dry-run >/dev/null; "
              "apt-get remove -y -q slurm-ft >/dev/null 2>&1; test ! -e /opt/slurm-ft && echo removed-clean")
    out = client.containers.run(base, ["/bin/sh", "-c", script], network_mode="none", remove=True,
                                mounts=[docker.types.Mount("/pkg", str(deb.parent), type="bind", read_only=True)],
                                stderr=True).decode()
    assert f"slurm-ft, version {B.upstream_version()}" in out
    assert f"py {r.python}" in out and "removed-clean" in out
