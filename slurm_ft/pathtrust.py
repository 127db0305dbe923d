"""Whether a file or directory can be trusted: the one rule, for root and for a job's user.

Root keeps state under, runs code from, and reads secrets out of paths. A path is only as safe as
every name on it: whoever can write a directory can rename, replace or symlink what is in it. The
rule (:func:`judge`, for one ``lstat``/``fstat`` result):

1. **No symlink** (``lstat``, never followed), unless the :class:`Rule` accepts links: then a link
   owned by an allowed owner passes as it is and its target is the caller's to check.
2. **The expected kind**: a directory, a regular file, or (``any``) whatever it is.
3. **An allowed owner**: root, or the uid the caller expects (a job's user for its own files).
4. **No forbidden permission bits** (``forbid``: 0o022, not writable by group or others; 0o077,
   closed to them), except a directory with the sticky bit where the rule allows it (``/tmp``:
   others may create names in it, not rename or remove ours).

:func:`check_chain` applies it to a path and to every directory above it, up to ``/``, in the
same way (the path itself may have its own rule, e.g. no sticky bit). Reasons are the words
:data:`SYMLINK`, :data:`KIND`, :data:`OWNER`, :data:`MODE` (and :data:`MISSING`, :data:`ERROR` for a
name that cannot be looked at), so each caller keeps its own message and error class.

Callers, and why their rules differ:

* ``slurm_ft.hang.watcher.secure_root`` (the heartbeat root): :data:`ROOT_DIR` for the directory
  and every one above it alike.
* ``slurm_ft.lab.cluster.check_lab_dir``: :data:`ROOT_DIR` above the lab directory, the lab
  directory itself with no sticky bit (root runs daemons from it; nobody else may even add a
  name), and each entry in it :data:`ROOT_ENTRY` (root's, no link).
* ``slurm_ft.admin.install.untrusted`` (code root executes): every component of the path as given
  and of the path it resolves to, root's and not group/world-writable, links accepted (their
  targets are in the resolved path), a sticky directory only above the leaf.
* ``slurm_ft.checkpoint.auth`` (the job's token files, run as the job's user): the user's two
  directories and the token file must be the user's and closed (0o077); the directories above
  them (``$TMPDIR``, ``/tmp``) are not checked: they are opened by descriptor, each level relative
  to the checked one above, so nothing above can swap them.
* ``slurm_ft.journal.store`` (the journal and its side files): only rules 1 and 2, on a file root
  then gives root's owner and the configured mode (a repair, not a refusal).

Standard library only; reads nothing but the metadata of the names it is given.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: Reasons :func:`judge` and :func:`check` give.
SYMLINK, KIND, OWNER, MODE, MISSING, ERROR = "symlink", "kind", "owner", "mode", "missing", "error"
#: Kinds a :class:`Rule` may ask for.
DIR, FILE, ANY = "dir", "file", "any"


@dataclass(frozen=True)
class Rule:
    """What one name on a path must be. ``owners``: uids that may own it (None: any);
    ``forbid``: permission bits that must be clear (0o022, 0o077, 0); ``sticky``: a directory with
    the sticky bit may have the forbidden bits; ``kind``: :data:`DIR`, :data:`FILE` or :data:`ANY`;
    ``links``: a symlink owned by one of ``owners`` passes (its target is the caller's to check)."""

    owners: frozenset[int] | None = frozenset({0})
    forbid: int = 0o022
    sticky: bool = False
    kind: str = DIR
    links: bool = False


#: A directory root keeps things in: root's, not writable by group/others unless sticky.
ROOT_DIR = Rule(frozenset({0}), 0o022, sticky=True, kind=DIR)
#: An entry root trusts as it is, whatever its mode or kind: root's, not a symlink.
ROOT_ENTRY = Rule(frozenset({0}), 0, kind=ANY)


def private(uid: int, kind: str = DIR) -> Rule:
    """The rule for a user's private directory or file: owned by ``uid``, closed to group and
    others (no bit of 0o077), no symlink, no sticky exception."""
    return Rule(frozenset({uid}), 0o077, kind=kind)


def judge(st: os.stat_result, rule: Rule) -> str | None:
    """Why the name whose ``lstat`` (or ``fstat``) is ``st`` breaks ``rule``: :data:`SYMLINK`,
    :data:`KIND`, :data:`OWNER` or :data:`MODE`, checked in that order; None when it is trusted."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        if not rule.links:
            return SYMLINK
        return None if rule.owners is None or st.st_uid in rule.owners else OWNER
    if (rule.kind == DIR and not stat.S_ISDIR(mode)) or (rule.kind == FILE and not stat.S_ISREG(mode)):
        return KIND
    if rule.owners is not None and st.st_uid not in rule.owners:
        return OWNER
    if mode & rule.forbid and not (rule.sticky and stat.S_ISDIR(mode) and mode & stat.S_ISVTX):
        return MODE
    return None


@dataclass(frozen=True)
class Finding:
    """One untrusted name: ``path``, ``why`` (a reason word), its ``lstat`` result ``st`` (None
    for :data:`MISSING` and :data:`ERROR`) and the ``OSError`` that stopped the look (or None)."""

    path: Path
    why: str
    st: os.stat_result | None = None
    exc: OSError | None = None

    @property
    def uid(self) -> int | None:
        return None if self.st is None else self.st.st_uid

    @property
    def perms(self) -> str:
        """The permission bits as four octal digits (``0777``; ``?`` when unknown)."""
        return "?" if self.st is None else f"{stat.S_IMODE(self.st.st_mode):04o}"


def check(path: str | os.PathLike, rule: Rule) -> Finding | None:
    """:func:`judge` of ``lstat(path)``; a :class:`Finding` when it is not trusted, also when it
    is missing (:data:`MISSING`) or cannot be looked at (:data:`ERROR`); None when trusted."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError as exc:
        return Finding(p, MISSING, exc=exc)
    except OSError as exc:
        return Finding(p, ERROR, exc=exc)
    why = judge(st, rule)
    return None if why is None else Finding(p, why, st)


def check_above(path: str | os.PathLike, rule: Rule = ROOT_DIR) -> Finding | None:
    """The first directory above ``path`` (its parent, then upwards to the top of the path as
    given: ``/`` for an absolute one) that breaks ``rule``; None when all keep it."""
    for d in Path(path).parents:
        found = check(d, rule)
        if found is not None:
            return found
    return None


def check_chain(path: str | os.PathLike, rule: Rule = ROOT_DIR, *, leaf: Rule | None = None) -> Finding | None:
    """``path`` itself under ``leaf`` (default ``rule``), then every directory above it under
    ``rule`` (:func:`check_above`): the first :class:`Finding`, nearest first; None when trusted."""
    return check(path, rule if leaf is None else leaf) or check_above(path, rule)
