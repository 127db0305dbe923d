"""One rule for trusting a path (slurm_ft/pathtrust.py), and every caller keeps it.

Generated trees: a chain of up to four names under a root-only directory, each a directory, a
file (the last only) or a symlink, with any owner of {root, nobody} and any permission bits,
sticky or not. The expected answer is computed from the generated description alone (the rule
as docs/security.md and the module text state it), never from the file system, and compared with
what pathtrust.check_chain and the callers (hang watcher, lab, install) say about the real tree.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft import pathtrust
from slurm_ft.errors import ConfigError, LabError

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the generated names their owners")


@dataclass(frozen=True)
class Name:
    kind: str          # "dir", "file" or "link" (a link to a root-only directory elsewhere)
    owner: int
    mode: int          # permission bits, sticky included (links: none)


def _names():
    perms = st.sampled_from([0o700, 0o755, 0o750, 0o775, 0o757, 0o777, 0o711, 0o644, 0o620, 0o602])
    sticky = st.sampled_from([0, stat.S_ISVTX])
    owner = st.sampled_from([0, NOBODY])
    name = st.builds(Name, st.sampled_from(["dir", "dir", "dir", "link"]), owner,
                     st.builds(lambda p, s: p | s, perms, sticky))
    leaf = st.builds(Name, st.sampled_from(["dir", "file", "link"]), owner,
                     st.builds(lambda p, s: p | s, perms, sticky))
    return st.tuples(st.lists(name, max_size=3), leaf).map(lambda t: [*t[0], t[1]])


def expected(chain: list[Name], rule: pathtrust.Rule, leaf: pathtrust.Rule) -> tuple[int, str] | None:
    """(index in ``chain`` counted from the top, reason) of the first name that breaks the rule,
    nearest to the leaf first; None when the whole chain keeps it. Only the generated description
    is read: the documented rule, spelled out again."""
    for i in range(len(chain) - 1, -1, -1):
        n, r = chain[i], leaf if i == len(chain) - 1 else rule
        if n.kind == "link":
            if not r.links:
                return i, pathtrust.SYMLINK
            if r.owners is not None and n.owner not in r.owners:
                return i, pathtrust.OWNER
            continue
        if (r.kind == pathtrust.DIR and n.kind != "dir") or (r.kind == pathtrust.FILE and n.kind != "file"):
            return i, pathtrust.KIND
        if r.owners is not None and n.owner not in r.owners:
            return i, pathtrust.OWNER
        sticky_dir = n.kind == "dir" and n.mode & stat.S_ISVTX
        if n.mode & r.forbid and not (r.sticky and sticky_dir):
            return i, pathtrust.MODE
    return None


def build(base: Path, chain: list[Name]) -> list[Path]:
    """Make ``chain`` under ``base`` (root's, 0700): a link points at an empty root-only
    directory outside the chain, so the names below a link are not made (the chain stops there)."""
    target = base / "target"
    target.mkdir(mode=0o700)
    paths, d = [], base / "t"
    d.mkdir(mode=0o755)
    for i, n in enumerate(chain):
        p = d / f"n{i}"
        if n.kind == "link":
            p.symlink_to(target)
            os.chown(p, n.owner, n.owner, follow_symlinks=False)
        else:
            p.mkdir() if n.kind == "dir" else p.write_text("")
            os.chmod(p, n.mode)
            os.chown(p, n.owner, n.owner)
        paths.append(p)
        d = p
        if n.kind == "link":
            break
    return paths


@pytest.fixture(scope="module")
def workdir():
    d = Path(tempfile.mkdtemp(prefix="slurm-ft-pathtrust-"))
    os.chmod(d, 0o700)
    found = pathtrust.check_above(d / "x", pathtrust.ROOT_DIR)
    if found is not None:
        pytest.skip(f"the temp dir's parents are not root-safe here: {found}")
    yield d
    shutil.rmtree(d)


_cases = 0


def _fresh(workdir: Path) -> Path:
    global _cases
    _cases += 1
    d = workdir / f"case{_cases}"
    d.mkdir(mode=0o700)
    return d


RULES = {
    "root_dir": (pathtrust.ROOT_DIR, pathtrust.ROOT_DIR),
    "lab": (pathtrust.ROOT_DIR, pathtrust.Rule(frozenset({0}), 0o022, sticky=False, kind=pathtrust.DIR)),
    "install": (pathtrust.Rule(frozenset({0}), 0o022, sticky=True, kind=pathtrust.ANY, links=True),
                pathtrust.Rule(frozenset({0}), 0o022, sticky=False, kind=pathtrust.ANY, links=True)),
    "private": (pathtrust.private(NOBODY), pathtrust.private(NOBODY, pathtrust.FILE)),
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chain=_names(), which=st.sampled_from(sorted(RULES)))
def test_check_chain_agrees_with_the_rule(workdir, chain, which):
    rule, leaf = RULES[which]
    paths = build(_fresh(workdir), chain)
    chain = chain[:len(paths)]
    want = expected(chain, rule, leaf)
    # the generated chain sits below base/t (root's 0755, base 0700, root-safe parents): under
    # the private rule those root directories are refused, so check only the generated part
    found = pathtrust.check(paths[-1], leaf)
    above = next((f for f in (pathtrust.check(p, rule) for p in reversed(paths[:-1])) if f), None)
    got = found or above
    if want is None:
        assert got is None, got
    else:
        assert got is not None and (got.path, got.why) == (paths[want[0]], want[1])
    if which != "private":                           # the whole chain, up to /, for root's rules
        whole = pathtrust.check_chain(paths[-1], rule, leaf=leaf)
        assert (whole is None) == (want is None) and (whole is None or whole.path == paths[want[0]])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chain=_names())
def test_every_root_caller_refuses_exactly_what_the_rule_refuses(workdir, chain):
    """The hang watcher's heartbeat root, the lab directory and install's code paths accept a
    generated tree if and only if the rule (spelled out in :func:`expected`) does."""
    from slurm_ft.admin.install import untrusted
    from slurm_ft.hang.watcher import secure_root
    from slurm_ft.lab.cluster import check_lab_dir

    paths = build(_fresh(workdir), chain)
    chain = chain[:len(paths)]
    leaf = paths[-1]

    if chain[-1].kind != "file":                      # secure_root makes a missing directory: not one made as a file
        want = expected(chain, *RULES["root_dir"])
        try:
            secure_root(str(leaf))
            refused = False
        except ConfigError:
            refused = True
        assert refused == (want is not None)

    want = expected(chain, *RULES["lab"])
    try:
        check_lab_dir(leaf)
        refused = False
    except LabError:
        refused = True
    assert refused == (want is not None)

    # a link's target is a root-only directory whose parents are root-safe: the resolved path is
    # trusted, so the path as given decides
    assert (untrusted(leaf) is not None) == (expected(chain, *RULES["install"]) is not None)


def test_a_sticky_directory_is_trusted_only_where_the_rule_allows_it(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    assert pathtrust.check(d, pathtrust.ROOT_DIR) is None
    assert pathtrust.check(d, pathtrust.Rule(frozenset({0}), 0o022, sticky=False)).why == pathtrust.MODE
    f = d / "file"
    f.write_text("")
    os.chmod(f, 0o1777)                               # the sticky bit on a file buys nothing
    assert pathtrust.check(f, pathtrust.Rule(frozenset({0}), 0o022, sticky=True, kind=pathtrust.ANY)).why == pathtrust.MODE


def test_missing_and_unreadable_names_are_findings_not_exceptions(tmp_path):
    found = pathtrust.check(tmp_path / "nope", pathtrust.ROOT_DIR)
    assert found.why == pathtrust.MISSING and isinstance(found.exc, FileNotFoundError)
    (tmp_path / "file").write_text("")
    found = pathtrust.check(tmp_path / "file" / "below", pathtrust.ROOT_DIR)
    assert found.why == pathtrust.ERROR and found.exc is not None
