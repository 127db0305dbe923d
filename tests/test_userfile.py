"""Root never reads user files as root (slurm_ft.node.userfile, docs/security.md): a child that became
the job's user walks the path without following a symlink, opens only a regular file of that
user (never a device or FIFO), bounded in bytes and seconds. Real things only: real uids (root
tests drop to uid 65534), a real attacker process racing the reader, a real FIFO and device node
watched with inotify, a read stalled in the kernel by a fanotify permission event."""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft.node import userfile
from slurm_ft.errors import EvidenceError, SlurmFTError
from slurm_ft.node.userfile import UserFileError, UserFileTimeout, open_path, read_tail

NOBODY = 65534          # the job's user in these tests (no passwd entry needed to become it)
OTHER = 65533           # another user
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the reader drops to the job's uid)")
_libc = ctypes.CDLL(None, use_errno=True)


def _tree() -> Path:
    """A directory every user may enter (pytest's tmp_path sits under root's 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="slurm-ft-userfile-", dir="/tmp"))
    os.chmod(d, 0o755)
    return d


@pytest.fixture
def tree():
    d = _tree()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _mine(path: Path, data: bytes = b"hello\n", uid: int = NOBODY, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    return path


def _user_dir(path: Path, uid: int = NOBODY) -> Path:
    path.mkdir()
    os.chown(path, uid, uid)
    os.chmod(path, 0o755)
    return path


class _Inotify:
    """IN_OPEN events on one path (inotify(7) through libc)."""

    IN_OPEN = 0x20

    def __init__(self, path: Path):
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        assert _libc.inotify_add_watch(self.fd, bytes(path), self.IN_OPEN) >= 0, os.strerror(ctypes.get_errno())

    def opens(self) -> int:
        n = 0
        while True:
            try:
                buf = os.read(self.fd, 4096)
            except BlockingIOError:
                return n
            n += len(buf) // 16           # struct inotify_event with no name: 16 bytes

    def close(self) -> None:
        os.close(self.fd)


def _o_path_is_silent(tmp: Path) -> bool:
    """Whether this kernel reports no IN_OPEN for an O_PATH descriptor (Linux >= 6.5), so an
    IN_OPEN on a watched node means a real open; and a real open is seen."""
    probe = tmp / "probe"
    probe.write_bytes(b"")
    w = _Inotify(probe)
    try:
        os.close(os.open(probe, os.O_PATH))
        silent = w.opens() == 0
        os.close(os.open(probe, os.O_RDONLY))
        return silent and w.opens() == 1
    finally:
        w.close()
        probe.unlink()


# ------------------------------------------------------------------------------ what is read
@root_only
def test_reads_the_tail_as_the_job_user(tree):
    _mine(tree / "job.out", b"first\n" + b"x" * 100 + b"\nlast line\n")
    assert read_tail(str(tree / "job.out"), NOBODY, NOBODY, 1 << 20).startswith(b"first\n")
    assert read_tail(bytes(tree / "job.out"), NOBODY, None, 10) == b"last line\n"
    assert read_tail(str(tree / "job.out"), NOBODY, NOBODY, 0) == b""
    # the reader is the user, not root: a directory the user may not enter stops it
    closed = tree / "closed"
    closed.mkdir(mode=0o700)
    _mine(closed / "job.out")
    with pytest.raises(UserFileError, match="Permission denied"):
        read_tail(str(closed / "job.out"), NOBODY, NOBODY, 100)
    # a file of the user that the user may not read is not read either
    _mine(tree / "noread.out", mode=0o000)
    with pytest.raises(UserFileError, match="Permission denied"):
        read_tail(str(tree / "noread.out"), NOBODY, NOBODY, 100)


@root_only
def test_root_jobs_are_read_as_root_under_the_same_walk(tree):
    _mine(tree / "root.out", b"root job\n", uid=0)
    assert read_tail(str(tree / "root.out"), 0, 0, 100) == b"root job\n"
    os.symlink(tree / "root.out", tree / "link.out")
    with pytest.raises(UserFileError, match="symbolic link"):
        read_tail(str(tree / "link.out"), 0, 0, 100)
    _mine(tree / "users.out")
    with pytest.raises(UserFileError, match="owned by uid 65534"):
        read_tail(str(tree / "users.out"), 0, 0, 100)


def test_no_uid_no_read(tmp_path):
    p = tmp_path / "job.out"
    p.write_bytes(b"secret\n")
    for uid in (None, -1, True, "0"):
        with pytest.raises(UserFileError, match="uid"):
            read_tail(str(p), uid, None, 100)
    with pytest.raises(UserFileError, match="uid is unknown"):
        open_path(str(p), None, None)
    assert issubclass(UserFileError, EvidenceError) and issubclass(UserFileTimeout, UserFileError)


def test_paths_refused_before_any_reader_starts(tmp_path):
    for bad, why in ((b"job.out", "absolute"), (b"/a/\0b", "NUL"), (b"/a/../b", r"'\.\.'"), (b"/a/", "file path"),
                     (b"/", "file path"), (b"/" + b"a" * 5000, "PATH_MAX")):
        with pytest.raises(UserFileError, match=why):
            read_tail(bad, os.getuid(), None, 10)


# ------------------------------------------------------------------------------ links and swaps
@root_only
def test_a_symlinked_directory_component_is_never_followed(tree):
    user = _user_dir(tree / "home")
    real = _user_dir(user / "real")
    _mine(real / "job.out", b"through the link\n")
    os.symlink("real", user / "link")
    with pytest.raises(UserFileError, match=r"home/link is a symbolic link; refusing to follow it"):
        read_tail(str(user / "link" / "job.out"), NOBODY, NOBODY, 100)
    os.symlink(str(tree), user / "up")                       # an absolute one, to a root dir
    with pytest.raises(UserFileError, match="symbolic link"):
        read_tail(str(user / "up" / "home" / "real" / "job.out"), NOBODY, NOBODY, 100)
    assert read_tail(str(real / "job.out"), NOBODY, NOBODY, 100) == b"through the link\n"


@root_only
def test_a_symlinked_final_file_is_refused(tree):
    user = _user_dir(tree / "home")
    _mine(user / "mine.out")
    os.symlink("mine.out", user / "job.out")
    os.symlink("/etc/shadow", user / "shadow.out")
    for name in ("job.out", "shadow.out"):
        with pytest.raises(UserFileError, match="is a symbolic link; refusing to follow it"):
            read_tail(str(user / name), NOBODY, NOBODY, 100)
        with pytest.raises(UserFileError, match="symbolic link"):
            open_path(str(user / name), NOBODY, NOBODY)


@root_only
def test_another_users_file_is_refused(tree):
    user = _user_dir(tree / "home")
    _mine(tree / "theirs", b"other user's\n", uid=OTHER, mode=0o644)     # the user could read it
    (tree / "root").write_bytes(b"root's\n")
    os.chmod(tree / "root", 0o644)
    os.link(tree / "root", user / "job.out")                             # a hard link is root's file
    with pytest.raises(UserFileError, match="owned by uid 0, not the job's uid 65534"):
        read_tail(str(user / "job.out"), NOBODY, NOBODY, 100)
    with pytest.raises(UserFileError, match="owned by uid 65533"):
        read_tail(str(tree / "theirs"), NOBODY, NOBODY, 100)
    with pytest.raises(UserFileError, match="owned by uid 0"):
        open_path(str(user / "job.out"), NOBODY, NOBODY)


@root_only
def test_directory_swap_race_by_a_real_unprivileged_user(tree):
    """uid 65534 swaps the directory on the path, as fast as it can, between its real output
    directory, a symlink to a decoy directory and a directory whose job.out is a FIFO, while root
    reads: root gets the real output or a refusal, never the decoy, and never waits."""
    home = _user_dir(tree / "home")
    for name in ("s_real", "s_fifo", "decoy"):
        _user_dir(home / name)
    _mine(home / "s_real" / "job.out", b"GOOD\n")
    _mine(home / "decoy" / "job.out", b"DECOY\n", mode=0o644)
    os.mkfifo(home / "s_fifo" / "job.out")
    os.chown(home / "s_fifo" / "job.out", NOBODY, NOBODY)
    pid = os.fork()
    if pid == 0:                                    # the attacker: uid 65534, swapping
        code = 1
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            os.chdir(home)
            end = time.monotonic() + 60
            while time.monotonic() < end and not os.path.exists("stop"):
                for s in ("real", "link", "fifo"):
                    if s == "link":
                        os.symlink("decoy", "out")
                        os.unlink("out")
                    else:
                        os.rename("s_" + s, "out")
                        os.rename("out", "s_" + s)
            code = 0
        finally:
            os._exit(code)
    seen: dict[str, int] = {}
    path = str(home / "out" / "job.out")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (seen.get("GOOD") and seen.get("symlink") and seen.get("fifo")
                                                   and sum(seen.values()) >= 300):
            t0 = time.monotonic()
            try:
                got = read_tail(path, NOBODY, NOBODY, 100)
                key = got.decode().strip()
            except UserFileError as exc:
                key = "symlink" if "symbolic link" in str(exc) else "fifo" if "a FIFO" in str(exc) else "other"
            assert time.monotonic() - t0 < userfile.DEFAULT_DEADLINE_S + 1.0
            assert key != "DECOY"
            seen[key] = seen.get(key, 0) + 1
    finally:
        (home / "stop").touch()
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the attacker failed"
    assert seen.get("GOOD") and seen.get("symlink") and seen.get("fifo"), seen   # the race really ran
    assert set(seen) <= {"GOOD", "symlink", "fifo", "other"}, seen


# ------------------------------------------------------------------------------ FIFOs and devices
@root_only
def test_a_fifo_is_never_opened(tree):
    """A reader opening the FIFO (even O_NONBLOCK) would complete a writer's blocking open: the
    writer is still blocked afterwards, no IN_OPEN was seen, and the refusal came at once."""
    fifo = tree / "job.out"
    os.mkfifo(fifo)
    os.chown(fifo, NOBODY, NOBODY)
    silent = _o_path_is_silent(tree)
    watch = _Inotify(fifo)
    opened = threading.Event()

    def writer():
        fd = os.open(fifo, os.O_WRONLY)            # blocks until someone opens it for reading
        opened.set()
        os.close(fd)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(UserFileError, match=r"not a regular file \(a FIFO\); never opened"):
            read_tail(str(fifo), NOBODY, NOBODY, 100)
        assert time.monotonic() - t0 < 1.0
        assert open_as_user_is_none(fifo)
        assert not opened.wait(0.2), "the FIFO was opened for reading"
        if silent:
            assert watch.opens() == 0               # (the blocked writer's open is not done yet)
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))   # release the writer
        t.join(5)
        watch.close()


def open_as_user_is_none(path: Path) -> bool:
    from slurm_ft.hang.evidence import open_as_user
    return open_as_user(str(path), NOBODY, NOBODY) is None


@root_only
def test_a_char_device_is_never_opened(tree):
    """``-e /dev/watchdog`` arms the hardware watchdog on open. Here a harmless copy of /dev/null
    (made with mknod, owned by the user so only the type check stands in the way): refused,
    and inotify sees no open."""
    if not _o_path_is_silent(tree):
        pytest.skip("this kernel reports O_PATH opens to inotify (before Linux 6.5): cannot tell")
    dev = tree / "job.err"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.chown(dev, NOBODY, NOBODY)
    watch = _Inotify(dev)
    try:
        with pytest.raises(UserFileError, match=r"not a regular file \(a character device\); never opened"):
            read_tail(str(dev), NOBODY, NOBODY, 100)
        with pytest.raises(UserFileError, match="character device"):
            read_tail("/dev/null", 0, 0, 100)       # root's own job, same rule
        assert open_as_user_is_none(dev)
        assert watch.opens() == 0
        os.close(os.open(dev, os.O_RDONLY))         # the watch works: a real open is seen
        assert watch.opens() == 1
    finally:
        watch.close()


# ------------------------------------------------------------------------------ time
class _Fanotify:
    """A fanotify permission mark that is never answered: every read of the file blocks in the
    kernel (what a hung NFS/FUSE server does) until this listener closes."""

    def __init__(self, path: Path):
        FAN_CLASS_CONTENT, FAN_CLOEXEC, FAN_NONBLOCK = 0x4, 0x1, 0x2
        FAN_MARK_ADD, FAN_ACCESS_PERM, AT_FDCWD = 0x1, 0x20000, -100
        self.fd = _libc.fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC | FAN_NONBLOCK, os.O_RDONLY)
        if self.fd < 0:
            pytest.skip(f"fanotify unavailable: {os.strerror(ctypes.get_errno())}")
        _libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        if _libc.fanotify_mark(self.fd, FAN_MARK_ADD, FAN_ACCESS_PERM, AT_FDCWD, bytes(path)) < 0:
            err = os.strerror(ctypes.get_errno())
            os.close(self.fd)
            pytest.skip(f"fanotify permission events unavailable: {err}")

    def close(self) -> None:
        os.close(self.fd)                           # pending reads are let through


@root_only
def test_a_hung_read_is_killed_at_the_deadline(tree):
    p = _mine(tree / "job.out", b"on a hung server\n")
    hang = _Fanotify(p)
    try:
        t0 = time.monotonic()
        with pytest.raises(UserFileTimeout, match=r"no answer within 0\.5 s"):
            read_tail(str(p), NOBODY, NOBODY, 100, deadline_s=0.5)
        took = time.monotonic() - t0
        assert 0.5 <= took < 2.5, took
        assert not userfile._unreaped                # the killed reader was reaped
    finally:
        hang.close()
    assert read_tail(str(p), NOBODY, NOBODY, 100) == b"on a hung server\n"


@root_only
def test_open_path_gives_root_a_descriptor_it_cannot_read(tree):
    p = _mine(tree / "job.out", b"12345")
    fd = open_path(bytes(p), NOBODY, NOBODY)
    try:
        assert os.fstat(fd).st_size == 5 and os.fstat(fd).st_uid == NOBODY
        with pytest.raises(OSError):
            os.read(fd, 5)                          # O_PATH: fstat only
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ names
HOSTILE_DIR = b"caf\xe9\nslurm-ft epilog: job 1 attempt 0 on n1: verdict hardware (xid-79)\r\x1b[2K"


@root_only
def test_non_utf8_and_newline_paths_are_read_and_logged_as_one_line(tree):
    from slurm_ft.node.log import NodeLog
    from slurm_ft.node.job import NodeJob

    d = bytes(tree) + b"/" + HOSTILE_DIR
    os.mkdir(d)
    os.chown(d, NOBODY, NOBODY)
    f = d + b"/out\xff\n.txt"
    with open(f, "wb") as fh:
        fh.write(b"tail\n")
    os.chown(f, NOBODY, NOBODY)
    assert read_tail(f, NOBODY, NOBODY, 100) == b"tail\n"
    assert read_tail(os.fsdecode(f), NOBODY, NOBODY, 100) == b"tail\n"       # surrogate-escaped str
    with pytest.raises(UserFileError) as err:
        read_tail(f + b".missing", NOBODY, NOBODY, 100)
    msg = str(err.value)
    assert "\n" not in msg and "\r" not in msg and "\x1b" not in msg and "\\xe9\\x0a" in msg
    msg.encode("utf-8")
    log = tree / "node.log"
    job = NodeJob(1, "n1", 0, NOBODY, None, 1, None, None, None, None)
    NodeLog("epilog", job, str(log))(f"job output not read: {err.value}")
    NodeLog("epilog", job, str(log))(f"raw path {os.fsdecode(f)}")         # unescaped by the caller
    lines = log.read_bytes().decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 3, lines
    assert all(" slurm-ft epilog: job 1 attempt 0 on n1: " in line for line in lines[:2])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.text(max_size=40), st.binary(max_size=40).map(os.fsdecode)), min_size=1, max_size=4))
def test_every_node_log_message_is_one_utf8_line(tmp_path, parts):
    from slurm_ft.node.log import NodeLog
    from slurm_ft.node.job import NodeJob

    log = tmp_path / "node.log"
    log.unlink(missing_ok=True)
    NodeLog("epilog", NodeJob(1, "n1", 0, 0, None, 0, None, None, None, None), str(log))(" ".join(parts))
    text = log.read_bytes().decode("utf-8")            # always valid UTF-8
    assert text.endswith("\n") and text.count("\n") == 1 and len(text.splitlines()) == 1


def test_non_utf8_and_newline_output_paths_still_get_the_epilog_verdict(tmp_path, monkeypatch):
    """The whole epilog with SLURM_JOB_STDERR/STDOUT naming non-UTF-8, newline-carrying paths:
    a verdict is journaled and every node-log line is one of the epilog's own."""
    from slurm_ft.node import epilog
    from slurm_ft.journal import open_journal
    from slurm_ft.lab.layout import inventory_gpus
    from slurm_ft.nvml.fake import write_inventory

    write_inventory(str(tmp_path / "inv-n1.json"), "n1", inventory_gpus("n1"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(tmp_path / "bin" / "scontrol", 0o755)
    conf = tmp_path / "slurm-ft.toml"
    conf.write_text(f'''
[journal]
path = "{tmp_path}/journal.db"
node_path = "{tmp_path}/node-{{node}}.db"
[node_state]
dir = "{tmp_path}/state"
log = "{tmp_path}/epilog.log"
[nvml]
backend = "fake"
inventory = "{tmp_path}/inv-{{node}}.json"
[slurm]
bin_dir = "{tmp_path}/bin"
''')
    out_dir = tmp_path / os.fsdecode(HOSTILE_DIR)
    out_dir.mkdir()
    (out_dir / "400.out").write_bytes(b"Traceback (most recent call last):\nValueError: bad\n")
    monkeypatch.setattr("slurm_ft.classify.sources.read_kmsg", lambda since, **kw: [])
    env = {"SLURM_FT_CONFIG": str(conf), "SLURM_JOB_ID": "400", "SLURMD_NODENAME": "n1",
           "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_EXIT_CODE": str(1 << 8), "SLURM_JOB_GPUS": "0",
           "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_STDOUT": f"{out_dir}/%j.out",
           "SLURM_JOB_STDERR": f"{out_dir}/%j\udcff\n.err", "SLURM_JOB_WORK_DIR": str(tmp_path)}
    assert epilog.run(env) == 0
    with open_journal(tmp_path / "node-n1.db") as j:
        (v,) = j.verdicts(400)
    assert v["verdict"] == "user", v
    lines = (tmp_path / "epilog.log").read_bytes().decode("utf-8").splitlines()
    assert lines and all(" slurm-ft epilog: job 400 attempt 0 on n1: " in line for line in lines), lines
    assert any("job output not read" in line and "\\xff\\x0a.err" in line for line in lines), lines


def test_expand_output_pattern_bytes_and_bounds():
    from slurm_ft.node.output_pattern import expand_output_pattern
    from slurm_ft.node.job import NodeJob

    job = NodeJob(12, "n1", 0, 0, None, 0, None, None, None, "/home/u")
    assert expand_output_pattern(b"/o/caf\xe9-%j.out", job) == os.fsdecode(b"/o/caf\xe9-12.out")
    assert os.fsencode(expand_output_pattern(os.fsdecode(b"x\xff\n%j"), job)) == b"/home/u/x\xff\n12"
    assert expand_output_pattern("/o/%99999999j", job) == "/o/0000000012"       # Slurm pads to 10 at most
    assert expand_output_pattern("/o/%\u00b2j", job) is None                   # not an ASCII width
    assert expand_output_pattern("/o/%%x", job) == "/o/%x"


# ------------------------------------------------------------------------------ generative
@pytest.fixture(scope="module")
def world():
    """A tree of the job's files, another user's and root's, links to them, a FIFO and a device:
    ``(base, uid, allowed contents)``."""
    base = _tree()
    uid = NOBODY if os.geteuid() == 0 else os.getuid()

    def own(p: Path, data: bytes, owner: int, mode: int = 0o644) -> None:
        p.write_bytes(data)
        if os.geteuid() == 0:
            os.chown(p, owner, owner)
        os.chmod(p, mode)

    u = base / "u"
    u.mkdir()
    (u / "sub").mkdir()
    (base / "r").mkdir()
    own(u / "mine", b"MINE-OK\n", uid)
    own(u / "sub" / "mine2", b"MINE-OK-2\n", uid)
    own(base / "secret", b"SECRET\n", 0)
    own(base / "r" / "theirs", b"THEIRS\n", OTHER)
    os.symlink("../secret", u / "ln_secret")
    os.symlink("/etc/passwd", u / "ln_passwd")
    os.symlink("../r", u / "ln_dir")
    os.symlink("sub", u / "ln_sub")
    os.symlink("mine", u / "ln_mine")
    os.mkfifo(u / "fifo")
    if os.geteuid() == 0:
        os.link(base / "secret", u / "hl_secret")
        os.mknod(u / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        for p in (u, u / "sub", u / "fifo", u / "null"):
            os.chown(p, uid, uid, follow_symlinks=False)
    for p in (u, u / "sub", base / "r"):
        os.chmod(p, 0o755)
    # what may come back: the contents of the user's own regular files (root's, OTHER's, the
    # system's never; as non-root "secret" and "theirs" are the user's too)
    allowed = tuple(p.read_bytes() for p in base.rglob("*")
                    if p.is_file() and not p.is_symlink() and p.lstat().st_uid == uid and p.lstat().st_nlink == 1)
    assert b"MINE-OK\n" in allowed and (os.geteuid() != 0 or b"SECRET\n" not in allowed)
    yield base, uid, allowed
    shutil.rmtree(base, ignore_errors=True)


NAMES = [b"u", b"sub", b"mine", b"mine2", b"secret", b"r", b"theirs", b"ln_secret", b"ln_passwd", b"ln_dir",
         b"ln_sub", b"ln_mine", b"fifo", b"null", b"hl_secret", b"..", b".", b"", b"etc", b"passwd"]
component = st.one_of(st.sampled_from(NAMES), st.binary(min_size=1, max_size=12))


@settings(max_examples=250, deadline=None)
@given(parts=st.lists(component, min_size=1, max_size=6), rooted=st.booleans(), as_str=st.booleans(),
       max_bytes=st.integers(-1, 64))
def test_any_path_reads_only_the_users_own_files_or_refuses(world, parts, rooted, as_str, max_bytes):
    """Any path (any bytes per component: NUL, '/', newlines, '..', links, FIFO, device): the
    answer is a tail of one of the job user's own files, or UserFileError; nothing else."""
    base, uid, allowed = world
    path = (bytes(base) + b"/" if rooted else b"/") + b"/".join(parts)
    try:
        got = read_tail(os.fsdecode(path) if as_str else path, uid, None, max_bytes, deadline_s=5.0)
    except UserFileError as exc:
        str(exc).encode("utf-8")                    # a printable, encodable reason
        assert "\n" not in str(exc)
        return
    assert isinstance(got, bytes)
    assert len(got) <= max(max_bytes, 0)
    assert any(a.endswith(got) for a in allowed), (path, got)


def test_errors_are_the_documented_ones():
    with pytest.raises(TypeError):
        read_tail(3, 0, 0, 10)
    assert issubclass(UserFileError, SlurmFTError)


#: Rooms whose code runs as root on a node or the controller (docs/architecture.md).
ROOT_ROOMS = ("node", "hang", "failover", "classify", "health", "remediate", "drain", "journal", "slurm")
#: Names a job's output path goes by in slurm-ft (Slurm's StdOut/StdErr, our variables).
_OUTPUT_WORDS = ("stdout", "stderr", "std_out", "std_err", "output", "out_path", "err_path")


def test_root_code_opens_a_jobs_output_only_through_userfile():
    """The one way root code reads or writes a file the job controls is slurm_ft/node/userfile.py
    (read_tail, open_path, append_line): no other module of a root room passes a path named like
    the job's output to open(), os.open(), os.fdopen() or a Path's open/read/write."""
    import ast

    package = Path(userfile.__file__).resolve().parents[1]
    opens = {"open", "fdopen", "read_text", "read_bytes", "write_text", "write_bytes"}
    bad = []
    for room in ROOT_ROOMS:
        for f in sorted((package / room).rglob("*.py")):
            if f == Path(userfile.__file__).resolve():
                continue
            for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if not isinstance(n, ast.Call):
                    continue
                fn = n.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if name not in opens:
                    continue
                what = ast.unparse(n.args[0]) if n.args else ast.unparse(fn)
                if any(w in what.lower() for w in _OUTPUT_WORDS):
                    bad.append(f"{f.relative_to(package)}:{n.lineno}: {name}({what})")
    assert bad == []
