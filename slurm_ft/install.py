"""``slurm-ft install``: put slurm-ft's files beside Slurm on a node or the controller, from the
installed package, idempotently (docs/install.md).

What goes where (below ``--prefix``, default ``/``):

=========== ============================================================ =====================
component   files                                                        who reads them
=========== ============================================================ =====================
wrappers    /usr/local/libexec/slurm-ft/slurm-ft-{prolog,epilog} (0755)  slurmd (Prolog=, Epilog=)
lua         <slurm conf dir>/job_submit.lua, cli_filter.lua              slurmctld, sbatch
spank       /usr/local/src/slurm-ft/spank/{slurm_ft_spank.c,Makefile};   the admin (make install),
            <slurm conf dir>/plugstack.conf.d/slurm-ft.conf              slurmd, sbatch, srun
systemd     /etc/systemd/system/slurm-ft-daemon.service                  systemd (controller)
config      /etc/slurm-ft/slurm-ft.toml (only if absent)                 every slurm-ft process
=========== ============================================================ =====================

**Managed files** carry a marker line ``slurm-ft-install: sha256=<hash of the rest>``. A managed
file on disk is replaced only when it is unchanged since slurm-ft wrote it (its body still
hashes to its marker); a file slurm-ft did not write, or one an admin edited, is a *conflict*:
left alone, slurm-ft's version written beside it as ``<name>.slurm-ft-new`` and the command
exits 1 (``--force``: the old file is kept as ``<name>.slurm-ft-old`` and replaced). The config
and a missing ``plugstack.conf`` are written once and are the admin's from then on.

Every file is written to a temporary file in its directory and renamed into place (a symlink
at the target is replaced, never followed), with the umask at 022. The wrappers and the unit
name the Python that runs this command; it must be a path only root can change (else the
prolog would run code another user controls, as root).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import assets
from .errors import SlurmFTError

COMPONENTS = ("wrappers", "lua", "spank", "systemd", "config")
_MARKER = re.compile(r"slurm-ft-install: sha256=([0-9a-f]{64})")
_COMMENT = {"sh": ("# ", ""), "lua": ("-- ", ""), "c": ("/* ", " */"), "conf": ("# ", "")}


class InstallError(SlurmFTError):
    """``slurm-ft install`` cannot go on (not root, an untrusted Python, a bad path)."""


@dataclass(frozen=True)
class Item:
    """One file to install: ``path`` as Slurm sees it (no prefix), its content and mode."""

    component: str
    path: str
    text: str
    mode: int = 0o644
    #: ``sh``/``lua``/``c``/``conf``: comment syntax of the marker line; None: written once, then the
    #: admin's (no marker, never replaced nor removed).
    syntax: str | None = "conf"

    @property
    def managed(self) -> bool:
        return self.syntax is not None

    def content(self) -> str:
        """The text as written: with the marker line after a ``#!`` line, or first."""
        if not self.managed:
            return self.text
        start, end = _COMMENT[self.syntax]
        digest = hashlib.sha256(self.text.encode()).hexdigest()
        line = f"{start}slurm-ft-install: sha256={digest} (written by `slurm-ft install`; an edited copy is " \
               f"left alone){end}\n"
        if self.text.startswith("#!"):
            first, _, rest = self.text.partition("\n")
            return f"{first}\n{line}{rest}"
        return line + self.text


@dataclass(frozen=True)
class Outcome:
    item: Item
    target: Path
    #: install, update, unchanged, conflict, replaced (conflict with --force), kept (the
    #: admin's file), remove, absent, left (uninstall: not slurm-ft's or edited)
    action: str
    detail: str = ""


def marker_state(text: str) -> str:
    """``ours`` (a managed file unchanged since slurm-ft wrote it), ``edited`` (marker present, body
    changed) or ``foreign`` (no marker)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines[:3]):
        m = _MARKER.search(line)
        if m:
            body = "".join(lines[:i] + lines[i + 1:])
            return "ours" if hashlib.sha256(body.encode()).hexdigest() == m.group(1) else "edited"
    return "foreign"


# ------------------------------------------------------------------------------------- trust
def untrusted(path: str | Path) -> str | None:
    """Why ``path`` is not safe for root to execute or read code from (a file or directory another
    user could replace), or None. Checks the path as given (every component, symlinks included)
    and the path it resolves to: each must be root's and not writable by group or others (a
    directory may be, with the sticky bit, as /tmp)."""
    p = Path(path)
    for chain in (p, Path(os.path.realpath(p))):
        for q in [chain, *chain.parents]:
            try:
                st = os.lstat(q)
            except OSError as exc:
                return f"{q}: {exc.strerror}"
            if st.st_uid != 0:
                return f"{q} is owned by uid {st.st_uid}, not root"
            if stat.S_ISLNK(st.st_mode):
                continue
            sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and q != chain
            if st.st_mode & 0o022 and not sticky_dir:
                return f"{q} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


# -------------------------------------------------------------------------------------- plan
def plan(*, components=COMPONENTS, slurm_conf_dir: str = assets.SLURM_CONF_DIR, python: str | None = None,
         command: str | None = None, max_retries: int = 10, default_retries: int = 3) -> list[Item]:
    """The files of ``components``. ``python``/``command``: what the wrappers and the unit run
    (default: this Python's venv); ``max_retries``/``default_retries``: the site limits
    rendered into job_submit.lua. Raises :class:`InstallError` for a path that cannot go into a
    script or unit."""
    python = python or assets.venv_python()
    command = command or assets.slurm_ft_command()
    conf = Path(slurm_conf_dir)
    items: list[Item] = []
    try:
        if "wrappers" in components:
            for kind in ("prolog", "epilog"):
                at = f"{assets.LIBEXEC_DIR}/slurm-ft-{kind}"
                items.append(Item("wrappers", at, assets.render_wrapper(kind, python, at), 0o755, "sh"))
        if "lua" in components:
            items.append(Item("lua", str(conf / "job_submit.lua"),
                              assets.render_job_submit(max_retries, default_retries), 0o644, "lua"))
            items.append(Item("lua", str(conf / "cli_filter.lua"), assets.render_cli_filter(), 0o644, "lua"))
        if "spank" in components:
            for name, text in assets.spank_sources().items():
                items.append(Item("spank", f"{assets.SPANK_SRC_DIR}/{name}", text, 0o644,
                                  "c" if name.endswith(".c") else "conf"))
            items.append(Item("spank", str(conf / "plugstack.conf.d" / "slurm-ft.conf"),
                              "# slurm-ft SPANK plugin (--ft options); docs/install.md\n"
                              f"{assets.render_plugstack_line()}\n", 0o644, "conf"))
            items.append(Item("spank", str(conf / "plugstack.conf"),
                              "# Written by `slurm-ft install` because there was none; yours from now on.\n"
                              f"include {assets.plain_path(conf, 'slurm conf dir')}/plugstack.conf.d/*.conf\n",
                              0o644, None))
        if "systemd" in components:
            items.append(Item("systemd", assets.UNIT_PATH, assets.render_unit(command), 0o644, "conf"))
        if "config" in components:
            items.append(Item("config", assets.CONFIG_PATH, assets.default_config(), 0o644, None))
    except ValueError as exc:
        raise InstallError(str(exc)) from None
    return items


def _target(prefix: str, path: str) -> Path:
    return Path(prefix) / path.lstrip("/")


def _read(target: Path) -> tuple[str | None, os.stat_result | None]:
    """(text, lstat) of what is at ``target`` now; (None, None) when nothing; a symlink or
    non-file reads as text "" (foreign)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None, None
    if not stat.S_ISREG(st.st_mode):
        return "", st
    with open(target, encoding="utf-8", errors="replace") as fh:
        return fh.read(), st


def _write(target: Path, text: str, mode: int) -> None:
    """Temp file in the same directory, then rename over ``target`` (never through a symlink)."""
    old = os.umask(0o022)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fchmod(fh.fileno(), mode)
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.umask(old)


def apply(items: list[Item], *, prefix: str = "/", dry_run: bool = False, force: bool = False) -> list[Outcome]:
    """Install ``items`` below ``prefix`` (see the module doc); nothing is written with
    ``dry_run``. Raises :class:`InstallError` on an OS error, naming the file."""
    out = []
    for item in items:
        target = _target(prefix, item.path)
        want = item.content()
        have, st = _read(target)
        try:
            if have is None:
                action, detail = "install", ""
                if not dry_run:
                    _write(target, want, item.mode)
            elif not item.managed:
                action, detail = "kept", "exists: the admin's file, never replaced"
            elif have == want and stat.S_ISREG(st.st_mode):
                action, detail = "unchanged", ""
                if stat.S_IMODE(st.st_mode) != item.mode:
                    action, detail = "update", f"mode {stat.S_IMODE(st.st_mode):04o} -> {item.mode:04o}"
                    if not dry_run:
                        os.chmod(target, item.mode, follow_symlinks=False)
            elif stat.S_ISREG(st.st_mode) and marker_state(have) == "ours":
                action, detail = "update", ""
                if not dry_run:
                    _write(target, want, item.mode)
            else:
                why = ("edited since slurm-ft wrote it" if stat.S_ISREG(st.st_mode) and marker_state(have) == "edited"
                       else "not written by slurm-ft")
                if force:
                    action, detail = "replaced", f"{why}; the old file kept as {target.name}.slurm-ft-old"
                    if not dry_run:
                        os.replace(target, target.with_name(target.name + ".slurm-ft-old"))
                        _write(target, want, item.mode)
                else:
                    new = target.with_name(target.name + ".slurm-ft-new")
                    action, detail = "conflict", (f"{why}: left alone; slurm-ft's version written to {new.name}: "
                                                  f"merge it, or rerun with --force")
                    if not dry_run:
                        _write(new, want, item.mode)
        except OSError as exc:
            raise InstallError(f"{target}: {exc.strerror or exc}") from None
        out.append(Outcome(item, target, action, detail))
    return out


def uninstall(items: list[Item], *, prefix: str = "/", dry_run: bool = False) -> list[Outcome]:
    """Remove the managed files that are unchanged since slurm-ft wrote them; an edited or
    foreign file is left (and said so); the config, plugstack.conf and journals stay."""
    out = []
    for item in items:
        target = _target(prefix, item.path)
        have, st = _read(target)
        if have is None:
            out.append(Outcome(item, target, "absent"))
        elif not item.managed:
            out.append(Outcome(item, target, "kept", "the admin's file: remove it yourself if unwanted"))
        elif stat.S_ISREG(st.st_mode) and marker_state(have) == "ours":
            if not dry_run:
                try:
                    os.unlink(target)
                except OSError as exc:
                    raise InstallError(f"{target}: {exc.strerror or exc}") from None
            out.append(Outcome(item, target, "remove"))
        else:
            out.append(Outcome(item, target, "left", "edited or not written by slurm-ft: left alone"))
    return out


def next_steps(items: list[Item], outcomes: list[Outcome]) -> list[str]:
    """What the admin still does by hand (slurm.conf lines, building the plugin, systemd)."""
    comps = {i.component for i in items}
    changed = {o.item.path for o in outcomes if o.action in ("install", "update", "replaced")}
    steps = []
    if "wrappers" in comps:
        steps.append(f"slurm.conf: Prolog={assets.LIBEXEC_DIR}/slurm-ft-prolog  "
                     f"Epilog={assets.LIBEXEC_DIR}/slurm-ft-epilog  PrologFlags=Alloc")
    if "lua" in comps:
        steps.append("slurm.conf: JobSubmitPlugins=lua  CliFilterPlugins=lua  (then `scontrol reconfigure`)")
    if "spank" in comps:
        steps.append(f"build the SPANK plugin: make -C {assets.SPANK_SRC_DIR} install   "
                     f"(-> {assets.SPANK_LIB}; on every submit host and node)")
        plug = next(i for i in items if i.path.endswith("plugstack.conf"))
        steps.append(f"plugstack.conf ({plug.path}) must hold: include {Path(plug.path).parent}/plugstack.conf.d/*.conf"
                     f"   (or the line: {assets.render_plugstack_line()})")
    if "systemd" in comps:
        reload_ = "systemctl daemon-reload && " if assets.UNIT_PATH in changed else ""
        steps.append(f"controller: {reload_}systemctl enable --now slurm-ft-daemon")
    steps.append("check: slurm-ft doctor")
    return steps
