"""The one way root code reads a file the job controls (its stdout/stderr): as the job's user.

Runs inside root processes (the epilog, the hang watcher). A job chooses its output paths
(``sbatch -o/-e``) and owns the directories on them, so every name on such a path is hostile: a
symlinked directory, a FIFO (blocks an ``open``), a device (``-e /dev/watchdog``: opening it arms
the hardware watchdog), a hard link to root's file, a path on a hung NFS/FUSE mount. The rules,
all enforced here and nowhere else (docs/security.md, "Root never reads user files as root"):

1. **As the job's user.** A forked child drops to the job's uid/gid (``setgroups([])``,
   ``setresgid``, ``setresuid``) and checks that the drop held (real/effective/saved ids, no
   supplementary group, ``setuid(0)`` fails, no effective capability) *before* touching the path.
   It can open only what the user could open anyway. Root's own jobs (uid 0) are read as root
   under the same walk rules. No uid, no read.
2. **No symlink followed.** The path is walked from ``/`` one component at a time, each opened
   ``O_PATH|O_DIRECTORY|O_NOFOLLOW`` relative to its parent's descriptor; the last one
   ``O_PATH|O_NOFOLLOW`` (an ``O_PATH`` descriptor opens nothing: no device ``open()`` handler
   runs, a FIFO does not block). ``..`` is refused.
3. **Checked before it is opened.** ``fstat`` of that ``O_PATH`` descriptor: only a regular file
   owned by the job's uid goes on; a device, FIFO, socket or directory is never opened. The file is
   then reopened for reading through ``/proc/self/fd/N`` (the same inode, no second lookup of the
   name: no swap in between), ``O_RDONLY|O_NONBLOCK|O_NOCTTY``, and checked again.
4. **Bounded.** At most ``max_bytes`` of the file's tail, and ``deadline_s`` seconds (default 2)
   for the whole child: ``O_NONBLOCK`` does nothing for a regular file on a hung NFS/FUSE server,
   so the parent waits on the child's socket with a deadline and SIGKILLs it at the deadline.

Paths are bytes end to end (``str`` is accepted and encoded with ``os.fsencode``: a non-UTF-8
name that reached Python as surrogate escapes round-trips). Refusals raise :class:`UserFileError`
(a :class:`slurm_ft.errors.EvidenceError`) whose message shows the path with every control
character and undecodable byte escaped (:func:`slurm_ft.textsafe.terminal_safe`).

The child is a ``fork()`` of the root process (about a millisecond). After ``setresuid`` the
kernel marks it non-dumpable, so the user cannot ``ptrace`` it or read its ``/proc/PID/fd`` or
memory (the copy of root's memory it inherited); it also closes every descriptor it inherited
above stderr before the drop.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import stat
import time

from slurm_ft.errors import EvidenceError
from slurm_ft.textsafe import terminal_safe

#: Seconds the child may take (walk, checks, read) before it is killed.
DEFAULT_DEADLINE_S = 2.0
#: The most ``read_tail`` reads, whatever the caller asks (bytes).
MAX_TAIL_BYTES = 16 << 20
#: Linux PATH_MAX (bytes, with the terminating NUL): longer paths are refused unread.
PATH_MAX = 4096
#: The group a job's child runs as when the caller gives none and the uid has no passwd entry.
NOGROUP = 65534

_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_REASON_MAX = 2048
#: Children killed at their deadline but not yet reaped (stuck in an uninterruptible NFS wait):
#: reaped without waiting at the next call.
_unreaped: set[int] = set()


class UserFileError(EvidenceError):
    """The job's file was not read: refused (its path, type, owner or the job's uid) or failed
    (permission, missing). The message names the path (escaped) and the reason."""


class UserFileTimeout(UserFileError):
    """The child reading the job's file did not finish within its deadline (a hung NFS/FUSE
    mount, a stopped child): it was killed."""


class _Refuse(Exception):
    """Inside the child: a reason to send back instead of data."""


def display(path: bytes | str) -> str:
    """``path`` as one line of printable text: undecodable bytes as ``\\xNN``, controls escaped."""
    return terminal_safe(os.fsdecode(path))


def _as_bytes(path: bytes | str) -> bytes:
    if isinstance(path, (bytes, bytearray)):
        return bytes(path)
    if isinstance(path, str):
        return os.fsencode(path)
    raise TypeError(f"path must be bytes or str, not {type(path).__name__}")


def _check_path(path: bytes) -> list[bytes]:
    """The components of an absolute path, or a refusal (before any child is made)."""
    if not path.startswith(b"/"):
        raise UserFileError(f"{display(path)}: not an absolute path; refusing to read it")
    if b"\0" in path:
        raise UserFileError(f"{display(path)}: contains a NUL byte; refusing to read it")
    if len(path) >= PATH_MAX:
        raise UserFileError(f"{display(path[:80])}...: longer than PATH_MAX ({PATH_MAX} bytes); refusing to read it")
    parts = [c for c in path.split(b"/") if c not in (b"", b".")]
    if not parts or path.endswith(b"/"):
        raise UserFileError(f"{display(path)}: not a file path; refusing to read it")
    if b".." in parts:
        raise UserFileError(f"{display(path)}: contains '..'; refusing to read it")
    return parts


def _group_of(uid: int) -> int:
    import pwd
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return NOGROUP


# ------------------------------------------------------------------------------ in the child
def _close_inherited(keep: int) -> None:
    """Close every descriptor above stderr but ``keep`` (the child never writes to 0-2)."""
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:          # no /proc: every possible descriptor
        import resource
        open_fds = range(3, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1 << 16))
    for fd in open_fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _cap_eff() -> int | None:
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _become(uid: int, gid: int) -> None:
    """Drop to ``uid``/``gid`` with no supplementary groups, then check that it held. Nothing to
    drop when this process already is ``uid`` (root reading a root job's file) or holds no
    privilege at all (not root, no effective capability: the owner check still applies)."""
    if os.getresuid() == (uid, uid, uid):
        return
    if os.geteuid() != 0 and _cap_eff() == 0:
        return    # no privilege to drop (a test, a user's own `slurm-ft classify`): the walk rules hold
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise _Refuse(f"cannot become uid {uid} gid {gid} ({exc.strerror})") from None
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise _Refuse(f"privilege drop to uid {uid} did not hold")
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise _Refuse(f"privilege drop to uid {uid} did not hold: setuid(0) succeeded")
        if _cap_eff() not in (0, None):
            raise _Refuse(f"privilege drop to uid {uid} did not hold: capabilities remain")


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _walk(path: bytes, parts: list[bytes], uid: int) -> tuple[int, os.stat_result]:
    """An ``O_PATH`` descriptor of the regular file ``path`` owned by ``uid``, reached without
    following any symlink; its ``fstat``. Raises :class:`_Refuse`."""
    shown = display(path)
    fd = os.open(b"/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, comp in enumerate(parts[:-1]):
            try:
                nfd = os.open(comp, _PATH_FLAGS | os.O_DIRECTORY, dir_fd=fd)
            except OSError as exc:
                where = display(b"/" + b"/".join(parts[:i + 1]))
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    try:
                        st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        st = None
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        raise _Refuse(f"{shown}: {where} is a symbolic link; refusing to follow it") from None
                    raise _Refuse(f"{shown}: {where} is not a directory") from None
                raise _Refuse(f"{shown}: cannot open: {exc.strerror} (at {where})") from None
            os.close(fd)
            fd = nfd
        try:
            ffd = os.open(parts[-1], _PATH_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise _Refuse(f"{shown}: cannot open: {exc.strerror}") from None
    finally:
        os.close(fd)
    st = os.fstat(ffd)
    if stat.S_ISLNK(st.st_mode):
        raise _Refuse(f"{shown}: is a symbolic link; refusing to follow it")
    if not stat.S_ISREG(st.st_mode):
        raise _Refuse(f"{shown}: not a regular file ({_kind(st.st_mode)}); never opened")
    if st.st_uid != uid:
        raise _Refuse(f"{shown}: owned by uid {st.st_uid}, not the job's uid {uid}; refusing to read it")
    return ffd, st


def _reopen(path: bytes, pfd: int, pst: os.stat_result) -> int:
    """``pfd`` (``O_PATH``) reopened for reading: the same inode, checked again."""
    try:
        fd = os.open(f"/proc/self/fd/{pfd}", _READ_FLAGS)
    except OSError as exc:
        raise _Refuse(f"{display(path)}: cannot open: {exc.strerror}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (pst.st_dev, pst.st_ino) or not stat.S_ISREG(st.st_mode) or st.st_uid != pst.st_uid:
        raise _Refuse(f"{display(path)}: changed while it was opened; refusing to read it")
    return fd


def _tail(path: bytes, fd: int, max_bytes: int) -> bytes:
    st = os.fstat(fd)
    offset = max(0, st.st_size - max_bytes)
    chunks, got = [], 0
    while got < max_bytes:
        try:
            data = os.pread(fd, min(max_bytes - got, 1 << 20), offset + got)
        except OSError as exc:
            raise _Refuse(f"{display(path)}: read failed: {exc.strerror}") from None
        if not data:
            break
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def _append(path: bytes, pfd: int, pst: os.stat_result, data: bytes) -> None:
    """Append ``data`` to ``pfd``'s file (``O_PATH``), reopened write-only through
    ``/proc/self/fd`` (the same inode, checked again), ``O_APPEND|O_NONBLOCK|O_NOCTTY``."""
    try:
        fd = os.open(f"/proc/self/fd/{pfd}", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise _Refuse(f"{display(path)}: cannot open for appending: {exc.strerror}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (pst.st_dev, pst.st_ino) or not stat.S_ISREG(st.st_mode) or st.st_uid != pst.st_uid:
        raise _Refuse(f"{display(path)}: changed while it was opened; refusing to write it")
    try:
        os.write(fd, data)
    except OSError as exc:
        raise _Refuse(f"{display(path)}: write failed: {exc.strerror}") from None


def _child(sock: socket.socket, what: str, path: bytes, parts: list[bytes], uid: int, gid: int,
           max_bytes: int, deadline_s: float, data: bytes = b"") -> None:
    """The forked child: never returns (``os._exit``). Sends ``D``+data, ``F`` with an ``O_PATH``
    descriptor, or ``E``+reason."""
    code = 0
    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(deadline_s) + 2)         # backstop should the parent die first
        try:
            _close_inherited(sock.fileno())
            _become(uid, gid)
            pfd, st = _walk(path, parts, uid)
            if what == "open":
                socket.send_fds(sock, [b"F"], [pfd])
            elif what == "append":
                _append(path, pfd, st, data)
                sock.sendall(b"D")
            else:
                data = _tail(path, _reopen(path, pfd, st), max_bytes)
                sock.sendall(b"D" + data)
        except _Refuse as exc:
            sock.sendall(b"E" + str(exc).encode("utf-8", "backslashreplace")[:_REASON_MAX])
        except OSError as exc:
            sock.sendall(b"E" + f"{display(path)}: {exc.strerror or exc}".encode("utf-8", "backslashreplace"))
    except BaseException:
        code = 1
    finally:
        os._exit(code)


# ------------------------------------------------------------------------------ in the parent
def _reap(pid: int) -> None:
    """Kill ``pid`` (done or hung) and reap it without waiting more than ~0.2 s; a child stuck
    in an uninterruptible wait is remembered and reaped later."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for _ in range(200):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.001)
    _unreaped.add(pid)


def _reap_old() -> None:
    for pid in list(_unreaped):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _unreaped.discard(pid)


def _run(what: str, path: bytes | str, uid: int | None, gid: int | None, max_bytes: int,
         deadline_s: float, data: bytes = b"") -> tuple[bytes, list[int]]:
    """Fork the child for ``what`` ("tail" or "open"); its answer (data, descriptors)."""
    raw = _as_bytes(path)
    if uid is None:
        raise UserFileError(f"{display(raw)}: the job's uid is unknown; never read without it")
    if not isinstance(uid, int) or isinstance(uid, bool) or uid < 0:
        raise UserFileError(f"{display(raw)}: uid {uid!r} is not a uid; refusing to read it")
    parts = _check_path(raw)
    gid = _group_of(uid) if gid is None else gid
    _reap_old()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.fork()
    except OSError as exc:
        a.close()
        b.close()
        raise UserFileError(f"{display(raw)}: cannot fork a reader ({exc.strerror})") from None
    if pid == 0:
        a.close()
        _child(b, what, raw, parts, uid, gid, max_bytes, deadline_s, data)
    b.close()
    deadline = time.monotonic() + deadline_s
    limit = max_bytes + _REASON_MAX + 1
    chunks: list[bytes] = []
    fds: list[int] = []
    total = 0
    poller = select.poll()
    poller.register(a.fileno(), select.POLLIN)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(max(1, int(left * 1000))):
                if time.monotonic() < deadline:
                    continue
                for fd in fds:
                    os.close(fd)
                raise UserFileTimeout(f"{display(raw)}: no answer within {deadline_s:g} s (hung NFS/FUSE "
                                      f"mount?); reader killed")
            data, got, _, _ = socket.recv_fds(a, 1 << 16, 1)
            fds.extend(got)
            if not data:
                break
            chunks.append(data)
            total += len(data)
            if total > limit:
                for fd in fds:
                    os.close(fd)
                raise UserFileError(f"{display(raw)}: the reader sent more than asked; discarded")
    finally:
        a.close()
        _reap(pid)
    reply = b"".join(chunks)
    kind, body = reply[:1], reply[1:]
    if kind == b"E":
        for fd in fds:
            os.close(fd)
        raise UserFileError(body.decode("utf-8", "replace"))
    if (kind == b"D" and not fds) or (kind == b"F" and len(fds) == 1):
        return body, fds
    for fd in fds:
        os.close(fd)
    raise UserFileError(f"{display(raw)}: the reader ended without an answer")


def read_tail(path: bytes | str, uid: int | None, gid: int | None, max_bytes: int,
              deadline_s: float = DEFAULT_DEADLINE_S) -> bytes:
    """The last ``max_bytes`` (at most :data:`MAX_TAIL_BYTES`) bytes of the job's file ``path``
    (absolute), read by a child that became ``uid``/``gid`` (``gid`` None: the uid's passwd
    group). Only a regular file owned by ``uid``, reached without following a symlink.

    Raises :class:`UserFileError` (refused or unreadable, reason in the message; also for ``uid``
    None) or :class:`UserFileTimeout` (not done within ``deadline_s`` seconds)."""
    max_bytes = min(int(max_bytes), MAX_TAIL_BYTES)
    if max_bytes <= 0:
        return b""
    data, _ = _run("tail", path, uid, gid, max_bytes, deadline_s)
    return data


def open_path(path: bytes | str, uid: int | None, gid: int | None,
              deadline_s: float = DEFAULT_DEADLINE_S) -> int:
    """An ``O_PATH`` descriptor of the job's file ``path``, found by a child that became
    ``uid``/``gid`` under the same rules as :func:`read_tail` and passed back over a socket. It
    allows ``fstat`` (size, mtime) and nothing else: root never reads through it. The caller
    closes it. Raises :class:`UserFileError` / :class:`UserFileTimeout`."""
    _, fds = _run("open", path, uid, gid, 0, deadline_s)
    fd = fds[0]
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:   # the child checked; so does root
        os.close(fd)
        raise UserFileError(f"{display(path)}: not a regular file of uid {uid}; refusing it")
    return fd


#: The most bytes :func:`append_line` writes.
MAX_APPEND_BYTES = 4096


def append_line(path: bytes | str, uid: int | None, gid: int | None, line: bytes,
                deadline_s: float = DEFAULT_DEADLINE_S) -> None:
    """Append ``line`` (at most :data:`MAX_APPEND_BYTES`; a newline is added when missing) to the
    job's existing file ``path`` as its user, under the rules of :func:`read_tail`: a child that
    became ``uid``/``gid`` walks the path without following a symlink and writes only to a
    regular file ``uid`` owns (never creates one). Raises :class:`UserFileError` /
    :class:`UserFileTimeout`."""
    data = bytes(line[:MAX_APPEND_BYTES - 1])
    if not data.endswith(b"\n"):
        data += b"\n"
    _run("append", path, uid, gid, 0, deadline_s, data)
