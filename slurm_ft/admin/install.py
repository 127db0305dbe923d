"""``slurm-ft install``: put slurm-ft's files beside Slurm on a node or the controller, from the
installed package, idempotently (docs/install.md).

What goes where (below ``--prefix``, default ``/``); which components a host gets: its
``--role`` (``controller``, ``compute``, ``login``; the table ``slurm_ft/data/install/roles.toml``),
or ``--only COMPONENT``:

=========== ============================================================ =====================
component   files                                                        who reads them
=========== ============================================================ =====================
wrappers    /usr/local/libexec/slurm-ft/slurm-ft-{prolog,epilog} (0755)  slurmd (Prolog=, Epilog=)
job_submit  <slurm conf dir>/job_submit.lua                              slurmctld
cli_filter  <slurm conf dir>/cli_filter.lua                              sbatch, srun, salloc
spank       /usr/local/src/slurm-ft/spank/{slurm_ft_spank.c,Makefile};   the admin (make install),
            <slurm conf dir>/plugstack.conf.d/slurm-ft.conf              slurmd, sbatch, srun
ctld_event  /usr/local/libexec/slurm-ft/slurm-ft-ctld-event (0755);      slurmctld (PrologSlurmctld=,
            /etc/tmpfiles.d/slurm-ft.conf; the directory                 EpilogSlurmctld=), as
            ``[failover] events_dir`` (0700, SlurmUser's)                SlurmUser; the daemon
systemd     /etc/systemd/system/slurm-ft-daemon.service                  systemd (controller)
config      /etc/slurm-ft/slurm-ft.toml (only if absent)                 every slurm-ft process
job_client  /usr/share/slurm-ft/python/slurm_ft_job.py (0644)            training jobs (by path)
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
import pwd
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from slurm_ft import pathtrust
from slurm_ft.admin import assets
from slurm_ft.errors import SlurmFTError

COMPONENTS = ("wrappers", "job_submit", "cli_filter", "spank", "ctld_event", "systemd", "config", "job_client")
_MARKER = re.compile(r"slurm-ft-install: sha256=([0-9a-f]{64})")
_COMMENT = {"sh": ("# ", ""), "lua": ("-- ", ""), "c": ("/* ", " */"), "conf": ("# ", ""), "py": ("# ", "")}


class InstallError(SlurmFTError):
    """``slurm-ft install`` cannot go on (not root, an untrusted Python, a bad path)."""


@dataclass(frozen=True)
class Item:
    """One file to install: ``path`` as Slurm sees it (no prefix), its content and mode; or, with
    ``owner``, a directory (``text`` unused) owned by that user, created when missing and never
    removed."""

    component: str
    path: str
    text: str
    mode: int = 0o644
    #: ``sh``/``lua``/``c``/``conf``/``py``: comment syntax of the marker line; None: written once, then the
    #: admin's (no marker, never replaced nor removed).
    syntax: str | None = "conf"
    #: a directory's owner (user name; its group: that user's primary group)
    owner: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.owner is not None

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
    and the path it resolves to, with :mod:`slurm_ft.pathtrust`: each must be root's and not
    writable by group or others (a directory may be, with the sticky bit, as /tmp, except the
    last component); a symlink passes when root's (its target is on the resolved path)."""
    p = Path(path)
    above = pathtrust.Rule(frozenset({0}), 0o022, sticky=True, kind=pathtrust.ANY, links=True)
    leaf = pathtrust.Rule(frozenset({0}), 0o022, sticky=False, kind=pathtrust.ANY, links=True)
    for chain in (p, Path(os.path.realpath(p))):
        found = pathtrust.check_chain(chain, above, leaf=leaf)
        if found is None:
            continue
        if found.exc is not None:
            return f"{found.path}: {found.exc.strerror}"
        if found.why == pathtrust.OWNER:
            return f"{found.path} is owned by uid {found.uid}, not root"
        return f"{found.path} is writable by group or others (mode {found.perms})"
    return None


# ------------------------------------------------------------------------------------- roles
def roles() -> dict[str, tuple[str, ...]]:
    """role -> its components, from ``slurm_ft/data/install/roles.toml``. Raises InstallError
    when the table names a component this module does not know (a packaging bug)."""
    table = assets.roles_table()
    out = {name: tuple(r["components"]) for name, r in table["roles"].items()}
    for name, comps in [*out.items(), *table.get("aliases", {}).items()]:
        unknown = set(comps) - set(COMPONENTS)
        if unknown:
            raise InstallError(f"roles.toml: {name} names unknown components {sorted(unknown)}")
    return out


def aliases() -> dict[str, tuple[str, ...]]:
    """``--only`` names that stand for several components (``lua``: job_submit and cli_filter)."""
    return {k: tuple(v) for k, v in assets.roles_table().get("aliases", {}).items()}


def components_for(role_names=(), only=()) -> tuple[str, ...]:
    """The components of the ``role_names`` together, or of ``only`` (components or aliases), in
    :data:`COMPONENTS` order. Raises InstallError for an unknown role or component, or when
    both or neither are given."""
    if bool(role_names) == bool(only):
        raise InstallError("choose the host's role: --role controller|compute|login (repeatable), "
                           "or components with --only")
    table, alias = roles(), aliases()
    wanted: set[str] = set()
    for r in role_names:
        if r not in table:
            raise InstallError(f"unknown role {r!r}: one of {', '.join(table)}")
        wanted |= set(table[r])
    for c in only:
        if c not in COMPONENTS and c not in alias:
            raise InstallError(f"unknown component {c!r}: one of {', '.join([*COMPONENTS, *alias])}")
        wanted |= set(alias.get(c, (c,)))
    return tuple(c for c in COMPONENTS if c in wanted)


def slurm_user(conf: dict[str, str]) -> str:
    """SlurmUser of a parsed slurm.conf (lower-case keys); Slurm's default when unset: root."""
    return conf.get("slurmuser", "").strip() or "root"


def read_slurm_conf(prefix: str, slurm_conf_dir: str) -> dict[str, str] | None:
    """The global settings of ``<prefix>/<slurm_conf_dir>/slurm.conf`` (lower-case keys; its
    ``Include`` files are not read), or None when it cannot be read."""
    from slurm_ft.slurm import parse_slurm_conf
    try:
        return parse_slurm_conf(_target(prefix, f"{slurm_conf_dir}/slurm.conf").read_text(errors="replace"))
    except OSError:
        return None


# -------------------------------------------------------------------------------------- plan
def plan(*, components=COMPONENTS, slurm_conf_dir: str = assets.SLURM_CONF_DIR, python: str | None = None,
         command: str | None = None, max_retries: int = 10, default_retries: int = 3,
         events_dir: str = assets.FailoverConfig.events_dir, slurm_user: str = "slurm") -> list[Item]:
    """The files of ``components``. ``python``/``command``: what the wrappers and the unit run
    (default: this Python's venv); ``max_retries``/``default_retries``: the site limits
    rendered into job_submit.lua; ``events_dir`` (``[failover] events_dir``; ``""``: no events,
    so no hook) and ``slurm_user`` (SlurmUser, who runs the hook): the ctld_event component.
    Raises :class:`InstallError` for a path or name that cannot go into a script or unit."""
    python = python or assets.venv_python()
    command = command or assets.slurm_ft_command()
    conf = Path(slurm_conf_dir)
    items: list[Item] = []
    try:
        if "wrappers" in components:
            for kind in ("prolog", "epilog"):
                at = f"{assets.LIBEXEC_DIR}/slurm-ft-{kind}"
                items.append(Item("wrappers", at, assets.render_wrapper(kind, python, at), 0o755, "sh"))
        if "job_submit" in components:
            items.append(Item("job_submit", str(conf / "job_submit.lua"),
                              assets.render_job_submit(max_retries, default_retries), 0o644, "lua"))
        if "cli_filter" in components:
            items.append(Item("cli_filter", str(conf / "cli_filter.lua"), assets.render_cli_filter(), 0o644, "lua"))
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
        if "ctld_event" in components and events_dir:
            items.append(Item("ctld_event", assets.CTLD_EVENT_PATH, assets.render_ctld_event(events_dir), 0o755, "sh"))
            items.append(Item("ctld_event", assets.TMPFILES_PATH, assets.render_tmpfiles(events_dir, slurm_user),
                              0o644, "conf"))
            items.append(Item("ctld_event", events_dir, "", 0o700, None, owner=slurm_user))
        if "systemd" in components:
            items.append(Item("systemd", assets.UNIT_PATH, assets.render_unit(command), 0o644, "conf"))
        if "config" in components:
            items.append(Item("config", assets.CONFIG_PATH, assets.default_config(), 0o644, None))
        if "job_client" in components:
            items.append(Item("job_client", assets.JOB_CLIENT_PATH, assets.job_client_source(), 0o644, "py"))
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
        if item.is_dir:
            out.append(_apply_dir(item, target, real=os.path.realpath(prefix) == "/", dry_run=dry_run))
            continue
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


def _apply_dir(item: Item, target: Path, *, real: bool, dry_run: bool) -> Outcome:
    """Create the directory ``target`` (``item.mode``, owned by ``item.owner`` and its primary
    group), or bring an existing one to that mode and owner, through an ``O_NOFOLLOW`` descriptor.
    A symlink or non-directory there is a conflict, left alone. Under a ``--prefix`` an owner
    unknown on this host is not set; on ``/`` it raises InstallError."""
    try:
        pw = pwd.getpwnam(item.owner)
    except KeyError:
        if real:
            raise InstallError(f"{target}: SlurmUser {item.owner!r} is not a user on this host "
                               f"(slurm.conf SlurmUser=, or --slurm-user)") from None
        pw = None
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return Outcome(item, target, "conflict", "not a directory (a symlink or a file): left alone; remove it, rerun")
    detail = f"directory {item.mode:04o}, owner {item.owner}" + ("" if pw else " (no such user here: owner not set)")
    fixes = []
    if st is not None and stat.S_IMODE(st.st_mode) != item.mode:
        fixes.append(f"mode {stat.S_IMODE(st.st_mode):04o} -> {item.mode:04o}")
    if st is not None and pw and (st.st_uid, st.st_gid) != (pw.pw_uid, pw.pw_gid):
        fixes.append(f"owner uid {st.st_uid} -> {item.owner}")
    action = "install" if st is None else "update" if fixes else "unchanged"
    if dry_run or action == "unchanged":
        return Outcome(item, target, action, "; ".join(fixes) or detail)
    old = os.umask(0o022)
    try:
        if st is None:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(target, 0o700)
        fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if pw and os.geteuid() == 0:
                os.fchown(fd, pw.pw_uid, pw.pw_gid)
            os.fchmod(fd, item.mode)
        finally:
            os.close(fd)
    except OSError as exc:
        raise InstallError(f"{target}: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    return Outcome(item, target, action, "; ".join(fixes) or detail)


def uninstall(items: list[Item], *, prefix: str = "/", dry_run: bool = False) -> list[Outcome]:
    """Remove the managed files that are unchanged since slurm-ft wrote them; an edited or
    foreign file is left (and said so); the config, plugstack.conf and journals stay."""
    out = []
    for item in items:
        target = _target(prefix, item.path)
        have, st = _read(target)
        if item.is_dir:
            out.append(Outcome(item, target, "kept" if have is not None else "absent",
                               "a directory, left (under /run: gone at the next boot)" if have is not None else ""))
        elif have is None:
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


def next_steps(items: list[Item], outcomes: list[Outcome], components=()) -> list[str]:
    """What the admin still does by hand (slurm.conf lines, building the plugin, systemd), for
    ``items`` of ``components`` (default: the items' own)."""
    comps = {i.component for i in items} | set(components)
    changed = {o.item.path for o in outcomes if o.action in ("install", "update", "replaced")}
    steps = []
    if "wrappers" in comps:
        steps.append(f"slurm.conf: Prolog={assets.LIBEXEC_DIR}/slurm-ft-prolog  "
                     f"Epilog={assets.LIBEXEC_DIR}/slurm-ft-epilog  PrologFlags=Alloc,NoHold (Alloc,Contain "
                     f"where pam_slurm_adopt needs Contain)")
    if "job_submit" in comps:
        steps.append("slurm.conf: JobSubmitPlugins=lua  (then `scontrol reconfigure`)")
    if "cli_filter" in comps:
        steps.append("slurm.conf: CliFilterPlugins=lua  (one slurm.conf everywhere: every host that runs "
                     "sbatch/srun/salloc, compute nodes included, needs cli_filter.lua)")
    if any(i.path == assets.CTLD_EVENT_PATH for i in items):
        steps.append(f"slurm.conf: PrologSlurmctld={assets.CTLD_EVENT_PATH}  EpilogSlurmctld={assets.CTLD_EVENT_PATH}"
                     f"  (keep an existing one: call the hook from it)")
    elif "ctld_event" in comps:
        steps.append("no ctld event hook: [failover] events_dir is empty (faults are found by the node poll)")
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


# ---------------------------------------------------------------------- uninstall: slurm.conf
def slurm_conf_references(conf: dict[str, str], slurm_conf_dir: str) -> list[tuple[str, str]]:
    """(``Key=value`` as written, path) for each file a parsed slurm.conf (lower-case keys, as
    :func:`read_slurm_conf`) makes a Slurm daemon or command load: Prolog=, Epilog=,
    PrologSlurmctld=, EpilogSlurmctld= (their comma-separated paths), JobSubmitPlugins=lua and
    CliFilterPlugins=lua (``job_submit.lua``, ``cli_filter.lua`` beside slurm.conf), and
    PlugStackConfig (default ``plugstack.conf`` beside slurm.conf). Source: slurm.conf(5)."""
    conf_dir = slurm_conf_dir.rstrip("/") or "/"
    refs = []
    for key, name in (("prolog", "Prolog"), ("epilog", "Epilog"), ("prologslurmctld", "PrologSlurmctld"),
                      ("epilogslurmctld", "EpilogSlurmctld")):
        for path in (p.strip() for p in conf.get(key, "").split(",")):
            if path.startswith("/"):
                refs.append((f"{name}={path}", path))
    for key, name, script in (("jobsubmitplugins", "JobSubmitPlugins", "job_submit.lua"),
                              ("clifilterplugins", "CliFilterPlugins", "cli_filter.lua")):
        plugins = [p.strip().lower() for p in conf.get(key, "").split(",")]
        if any(p in ("lua", f"{script.split('.')[0]}/lua") for p in plugins):
            refs.append((f"{name}={conf[key]}", f"{conf_dir}/{script}"))
    plugstack = conf.get("plugstackconfig", "").strip()
    refs.append((f"PlugStackConfig={plugstack}" if plugstack else "PlugStackConfig (default)",
                 plugstack or f"{conf_dir}/plugstack.conf"))
    return refs


#: What breaks when slurm.conf still names a file slurm-ft removed, by the key's name.
_BREAKS = {
    "Prolog": "slurmd cannot run it: every node drains at its next job (Prolog error)",
    "Epilog": "slurmd cannot run it: every node drains after its next job (Epilog error)",
    "PrologSlurmctld": "slurmctld cannot run it at job starts",
    "EpilogSlurmctld": "slurmctld cannot run it at job ends",
    "JobSubmitPlugins": "slurmctld cannot load job_submit/lua",
    "CliFilterPlugins": "every sbatch, srun and salloc fails "
                        "(srun: fatal: failed to initialize cli_filter plugin)",
    "PlugStackConfig": "it loads slurm-ft's SPANK plugin",
}


def uninstall_warnings(outcomes: list[Outcome], *, prefix: str = "/",
                       slurm_conf_dir: str = assets.SLURM_CONF_DIR) -> list[str]:
    """One line per slurm.conf setting that still names a file this uninstall removed (or found
    absent), with what that breaks, and per plugstack.conf line that still loads
    ``slurm_ft_spank.so``; [] when slurm.conf cannot be read (then one line saying so)."""
    conf = read_slurm_conf(prefix, slurm_conf_dir)
    where = _target(prefix, f"{slurm_conf_dir}/slurm.conf")
    if conf is None:
        return [f"{where} not read: check by hand that slurm.conf names no slurm-ft file "
                f"(Prolog, Epilog, PrologSlurmctld, EpilogSlurmctld, JobSubmitPlugins, CliFilterPlugins, "
                f"PlugStackConfig)"]
    gone = {o.item.path for o in outcomes if o.action in ("remove", "absent") and not o.item.is_dir}
    out = []
    for setting, path in slurm_conf_references(conf, slurm_conf_dir):
        key = setting.split("=")[0].split(" ")[0]
        if path in gone:
            naming = "" if setting.endswith("=" + path) else f", naming {path},"
            out.append(f"{where} still has {setting}{naming} which is now gone: {_BREAKS[key]}; "
                       f"remove the line, then `scontrol reconfigure`")
        elif key == "PlugStackConfig":
            out += _plugstack_warnings(_target(prefix, path), prefix, gone)
    return out


def _plugstack_warnings(path: Path, prefix: str, gone: set[str]) -> list[str]:
    """plugstack.conf lines (and the files they ``include``, below ``prefix``) that load
    ``slurm_ft_spank.so`` or include a removed slurm-ft file by its own name."""
    from slurm_ft.slurm import plugstack_lines

    def include(pattern: str) -> list[Path]:
        if any(c in pattern for c in "*?["):
            return sorted(Path(prefix).glob(pattern.lstrip("/")))
        return [_target(prefix, pattern)]

    out = []
    for where, line in plugstack_lines(path, include):
        words = line.split()
        if words[0] == "include" and len(words) > 1:
            if words[1] in gone:
                out.append(f"{where} still includes {words[1]}, which is now gone; remove the line")
        elif any(w.endswith("/" + Path(assets.SPANK_LIB).name) for w in words):
            out.append(f"{where} still loads slurm-ft's SPANK plugin ({line}): remove the line before "
                       f"removing {Path(assets.SPANK_LIB).parent}/")
    return out
