#!/usr/bin/env python3
"""Build slurm-ft's Debian packages: one ``.deb`` per Debian release of ``releases.toml``.

Who runs it: ``make deb`` (or ``.venv/bin/python packaging/deb/build.py [--release R] [--out DIR]``),
as root, on a build host with dockerd and access to PyPI (the wheels); the lab's image build
(``slurm_ft/lab/docker_engine.py``) and ``tests/test_install_guide.py`` call :func:`cached_deb`.
Reads nothing from the environment but what pip and the docker SDK read.

What a package holds (docs/install.md, step 1): a self-contained venv at ``/opt/slurm-ft/venv``
made by the release's own ``python3`` (slurm-ft and every runtime dependency, byte-compiled; no
pip in it: the package is upgraded as a package), the venv's commands linked into ``/usr/bin``
(:data:`LINKS`), and ``/usr/share/doc/slurm-ft/copyright``. Nothing is downloaded at install time.
Everything else (prolog/epilog wrappers, Lua plugins, the SPANK plugin's source, the ctld hook,
the config) is written by ``slurm-ft install --role ROLE`` from the venv's package data.

Steps, per release (each with Debian's own tools, nothing home-made in the format):

1. slurm-ft's wheel (pure Python) is built on the host from a copy of :data:`SOURCES`
   (``pip wheel --no-build-isolation``: nothing downloaded, the checkout is not written to);
2. its dependencies' wheels are downloaded for the release's Python
   (:func:`slurm_ft.lab.docker_engine.download_wheels`: ``pip download --python-version``);
3. in the release's Debian userland (the Docker lab's debootstrap base image of the Slurm version
   the release ships, ``network_mode=none``): ``python3 -m venv``, ``pip install --no-index``,
   pip removed, ``slurm-ft --version`` run, the venv copied to the staging tree;
4. ``DEBIAN/control`` (:func:`render_control`, from ``control.in``), the links and the copyright
   file are written on the host;
5. ``dpkg-deb --root-owner-group --build``, in the same image.

Errors: :class:`PackagingError` (a step failed; its message carries the step's output tail).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import string
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO))

from slurm_ft.errors import SlurmFTError  # noqa: E402

#: The checkout's files a package is built from (and whose content names the cached package).
SOURCES = ("slurm_ft", "examples", "setup.cfg", "pyproject.toml", "README.md")
#: The packaging's own files (their change also makes a new package).
PACKAGING = ("build.py", "control.in", "copyright", "releases.toml")
VENV = "/opt/slurm-ft/venv"
#: /usr/bin name -> the venv's command it links to (setup.cfg's console_scripts, all of them:
#: tests/test_deb.py checks it). Both are used by admins and users alike, hence /usr/bin.
LINKS = {"slurm-ft": f"{VENV}/bin/slurm-ft", "ft-history": f"{VENV}/bin/ft-history"}
ARCH = "amd64"
#: Where :func:`cached_deb` keeps packages, one directory per source digest.
CACHE = Path("/var/cache/slurm-ft/deb")


class PackagingError(SlurmFTError):
    """A step of the package build failed (the message says which, with its output)."""


@dataclass(frozen=True)
class Release:
    """A Debian release of ``releases.toml``: its name, python3 minor (``"3.13"``), the Slurm
    version of its Docker lab base image and the Debian revision suffix (``"deb13"``)."""
    name: str
    python: str
    slurm: str
    suffix: str


def releases() -> dict[str, Release]:
    """The releases of ``releases.toml``, by name. Raises :class:`PackagingError` on a bad table."""
    try:
        table = tomllib.loads((HERE / "releases.toml").read_text())["releases"]
        return {name: Release(name, str(r["python"]), str(r["slurm"]), str(r["suffix"]))
                for name, r in table.items()}
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
        raise PackagingError(f"{HERE / 'releases.toml'}: {exc!r}") from None


def release_for_slurm(slurm: str) -> Release:
    """The release whose Docker lab base image has Slurm ``slurm`` (``"24.11"`` -> trixie)."""
    for r in releases().values():
        if r.slurm == slurm:
            return r
    raise PackagingError(f"no Debian release in releases.toml ships Slurm {slurm}")


def upstream_version(repo: Path = REPO) -> str:
    """slurm-ft's version, from setup.cfg ``[metadata] version``."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(repo / "setup.cfg")
    return cfg["metadata"]["version"]


def deb_version(release: Release, repo: Path = REPO) -> str:
    """The package version, ``0.1.0-1~deb13``: Debian revision 1, then the release suffix."""
    return f"{upstream_version(repo)}-1~{release.suffix}"


def deb_name(release: Release, repo: Path = REPO) -> str:
    """The file name dpkg expects: ``slurm-ft_<version>_<arch>.deb``."""
    return f"slurm-ft_{deb_version(release, repo)}_{ARCH}.deb"


def render_control(release: Release, installed_kb: int, repo: Path = REPO) -> str:
    """``DEBIAN/control`` from ``control.in``: the version, the size and a ``python3`` dependency
    bounded to the release's minor (the venv's compiled wheels and .pyc files are for it)."""
    major, minor = release.python.split(".")
    return string.Template((HERE / "control.in").read_text()).substitute(
        version=deb_version(release, repo), installed_kb=installed_kb, python=release.python,
        python_next=f"{major}.{int(minor) + 1}")


def _source_files(repo: Path):
    for top in SOURCES:
        p = repo / top
        if p.is_file():
            yield p
        elif p.is_dir():
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.endswith(".egg-info"))
                for f in sorted(filenames):
                    if not f.endswith((".pyc", ".pyo")):
                        yield Path(dirpath) / f


def source_digest(repo: Path = REPO) -> str:
    """16 hex digits of sha256 over the paths and contents of :data:`SOURCES` and
    :data:`PACKAGING`: a package (or a lab image holding it) built from the same digest is the same."""
    h = hashlib.sha256()
    files = [*_source_files(repo), *(HERE / f for f in PACKAGING)]
    for f in files:
        h.update(str(f.relative_to(repo) if f.is_relative_to(repo) else f.name).encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def installed_kb(root: Path) -> int:
    """``Installed-Size`` of the staging tree ``root`` (without ``DEBIAN/``), in KiB: each file
    rounded up to a KiB and each directory or link counted as one, as dpkg-gencontrol does."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d != "DEBIAN"]
        total += len(dirnames)
        for f in filenames:
            st = os.lstat(os.path.join(dirpath, f))
            total += 1 if os.path.islink(os.path.join(dirpath, f)) else -(-st.st_size // 1024)
    return total


def write_metadata(stage: Path, release: Release, repo: Path = REPO) -> None:
    """The host's part of the staging tree ``stage``, whose ``opt/slurm-ft/venv`` is built:
    the ``/usr/bin`` links, the copyright file, ``DEBIAN/control``."""
    (stage / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    for name, target in LINKS.items():
        if not (stage / target.lstrip("/")).is_file():
            raise PackagingError(f"the venv has no {target} for /usr/bin/{name}")
        link = stage / "usr" / "bin" / name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(target, link)  # absolute: /usr -> /opt crosses top-level directories (policy 10.5)
    doc = stage / "usr" / "share" / "doc" / "slurm-ft"
    doc.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "copyright", doc / "copyright")
    (stage / "DEBIAN").mkdir(exist_ok=True)
    (stage / "DEBIAN" / "control").write_text(render_control(release, installed_kb(stage), repo))


def venv_script(release: Release, repo: Path = REPO) -> str:
    """The shell script run in the release's image (``/build`` is the build directory, holding
    ``wheels/``): makes the venv, checks it, copies it to ``/build/stage``."""
    pip = f"{VENV}/bin/pip"
    return f"""set -eu
have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$have" = {release.python} ] || {{ echo "python3 here is $have, {release.name}'s is {release.python}" >&2; exit 1; }}
python3 -m venv {VENV}
{pip} install -q --no-index --no-cache-dir --disable-pip-version-check --find-links /build/wheels 'slurm-ft=={upstream_version(repo)}'
{pip} uninstall -q -y --disable-pip-version-check pip setuptools
{VENV}/bin/slurm-ft --version
mkdir -p /build/stage/opt/slurm-ft
cp -a {VENV} /build/stage/opt/slurm-ft/
"""


def _run_in_image(client, image: str, script: str, build: Path, what: str, timeout_s: int = 900) -> str:
    """Run ``sh -c script`` in a throwaway container of ``image`` without network, ``build``
    mounted at ``/build``; returns its output. Raises :class:`PackagingError` on failure."""
    import docker
    c = client.containers.run(image, ["/bin/sh", "-c", script], detach=True, network_mode="none",
                              environment={"LC_ALL": "C.UTF-8", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                              mounts=[docker.types.Mount("/build", str(build), type="bind")])
    try:
        try:
            rc = c.wait(timeout=timeout_s).get("StatusCode", -1)
        except Exception as exc:  # requests' ReadTimeout and connection errors
            raise PackagingError(f"{what} in {image}: {exc}") from None
        out = c.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        c.remove(force=True)
    if rc != 0:
        raise PackagingError(f"{what} in {image} failed (rc {rc}):\n{out[-3000:]}")
    return out


def _wheel(repo: Path, dest: Path, work: Path) -> Path:
    """slurm-ft's wheel, built from a copy of :data:`SOURCES` (the checkout is left as it is)."""
    src = work / "src"
    for top in SOURCES:
        p = repo / top
        if p.is_dir():
            shutil.copytree(p, src / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        elif p.is_file():
            src.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, src / top)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-w", str(dest), str(src)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise PackagingError(f"pip wheel of slurm-ft failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    wheels = sorted(dest.glob("slurm_ft-*.whl"))
    if len(wheels) != 1:
        raise PackagingError(f"pip wheel left {len(wheels)} slurm-ft wheels in {dest}")
    return wheels[0]


def build(release: Release, out: Path, *, client=None, log=print, repo: Path = REPO) -> Path:
    """Build the package of ``release`` into directory ``out``; returns its path. Needs root,
    dockerd and PyPI (the wheels). Raises :class:`PackagingError` (or the lab's ``LabError``
    when dockerd or the base image fails)."""
    from slurm_ft.lab import docker_engine as D
    client = client or D._client()
    t0 = time.monotonic()
    base = D.build_base(client, release.slurm, log)
    out.mkdir(parents=True, exist_ok=True)
    work = out / f".work-{release.name}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        _wheel(repo, work / "wheels", work)
        D.download_wheels(release.slurm, work / "wheels", repo)
        _run_in_image(client, base, venv_script(release, repo), work, "making the venv")
        write_metadata(work / "stage", release, repo)
        name = deb_name(release, repo)
        _run_in_image(client, base, f"dpkg-deb --root-owner-group -Zxz --build /build/stage /build/{name} >/dev/null",
                      work, "dpkg-deb --build")
        target = out / name
        os.replace(work / name, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"deb: {target} ({target.stat().st_size / 2**20:.1f} MiB) built in {time.monotonic() - t0:.1f} s")
    return target


def cached_deb(release: Release, *, client=None, log=print, repo: Path = REPO) -> Path:
    """The package of ``release`` for the checkout as it is now: from :data:`CACHE` when one was
    built from the same :func:`source_digest`, else built there (older ones of that release are
    removed)."""
    digest = source_digest(repo)
    d = CACHE / f"{release.name}-{digest}"
    path = d / deb_name(release, repo)
    if path.is_file():
        log(f"deb: {path} cached")
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    os.chmod(CACHE, 0o755)
    for old in CACHE.glob(f"{release.name}-*"):
        shutil.rmtree(old, ignore_errors=True)
    return build(release, d, client=client, log=log, repo=repo)


def main(argv=None) -> int:
    import click

    @click.command()
    @click.option("--release", "names", multiple=True, type=click.Choice(sorted(releases())),
                  help="Debian release(s) to build for [default: all of releases.toml].")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=REPO / "build" / "deb",
                  show_default=True, help="Directory the .deb files are written to.")
    def cli(names, out):
        """Build slurm-ft's .deb for each Debian release (root, dockerd; PyPI for the wheels)."""
        try:
            for name in names or sorted(releases()):
                build(releases()[name], out.resolve(), log=click.echo)
        except SlurmFTError as exc:
            raise click.ClickException(str(exc)) from None

    return cli.main(argv, standalone_mode=True)


if __name__ == "__main__":
    sys.exit(main())
