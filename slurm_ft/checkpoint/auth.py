"""Who may use the checkpoint HTTP channel: the job's own processes (and root), proved by a secret.

A local port can be reached by every user of the node, so :class:`~.http.NotifyServer` requires
``Authorization: Bearer <secret>`` on every request. The secret (``secrets.token_hex(32)``, 64 hex
characters) is made when the server starts, unless the job chose one (``SLURM_FT_CKPT_TOKEN``), and
is handed out in two places only the job's user (and root) can read:

* the environment of the serving process (``SLURM_FT_CKPT_TOKEN``), inherited by its children;
  ``/proc/PID/environ`` is readable by the same user only;
* a token file for siblings on the node (other steps, a shell in the job)::

      <base>/slurm-ft-<uid>/job-<SLURM_JOB_ID>/notify-<port>.token      (dirs 0700, file 0600)

  ``<base>`` is ``$SLURM_FT_RUNTIME_DIR``, else the temp dir (``$TMPDIR`` or ``/tmp``). Both
  directories must be real directories owned by the job's user and closed to group and others; a
  symlink, another owner or open permissions anywhere on that path is refused
  (:class:`~slurm_ft.errors.ConfigError`), never followed or repaired. Every step opens relative to
  the already checked parent (``dir_fd``, ``O_NOFOLLOW``), and the file is created with ``O_EXCL``.
  The server removes its file when it stops.

The secret never goes on a command line (``ps`` shows those to everyone).
"""

from __future__ import annotations

import errno
import hmac
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from slurm_ft import pathtrust
from slurm_ft.errors import ConfigError, SlurmFTError

ENV_TOKEN = "SLURM_FT_CKPT_TOKEN"
ENV_RUNTIME_DIR = "SLURM_FT_RUNTIME_DIR"
TOKEN_BYTES = 32
#: What a secret may look like (``token_hex``/``token_urlsafe`` of 24 bytes or more).
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32,256}")
_MAX_FILE = 1024

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TokenError(SlurmFTError):
    """The secret of a checkpoint server cannot be found or read safely."""


class TokenMissing(TokenError):
    """There is no token file where the server of that port would put it."""


def new_token() -> str:
    """A fresh secret: 64 hex characters (32 random bytes from :mod:`secrets`)."""
    return secrets.token_hex(TOKEN_BYTES)


def valid_token(token: str) -> bool:
    """True if ``token`` looks like a secret (32..256 characters of ``[A-Za-z0-9_-]``)."""
    return bool(_TOKEN_RE.fullmatch(token or ""))


def server_token(env: Mapping[str, str] | None = None, token: str | None = None) -> str:
    """The secret a server uses: ``token``, else ``$SLURM_FT_CKPT_TOKEN``, else a new one.

    Raises :class:`ConfigError` if a given secret is malformed (too short or odd characters)."""
    env = os.environ if env is None else env
    chosen = token if token is not None else env.get(ENV_TOKEN)
    if chosen is None or chosen == "":
        return new_token()
    if not valid_token(chosen):
        raise ConfigError(f"{ENV_TOKEN}: must be 32..256 characters of [A-Za-z0-9_-] "
                          f"(e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    return chosen


def check_bearer(header: str | None, token: str) -> int | None:
    """Check an ``Authorization`` header value against the server's secret.

    Returns None when it is ``Bearer <token>`` (constant-time comparison), 401 when the header is
    missing or not a bearer credential, 403 when the secret is wrong."""
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return 401
    given_b = given.strip().encode("utf-8", "surrogateescape")
    return None if hmac.compare_digest(given_b, token.encode("ascii")) else 403


# -- the token file --------------------------------------------------------------------------------

def job_key(env: Mapping[str, str] | None = None) -> str:
    """The job part of the path: ``$SLURM_JOB_ID`` (digits), ``local`` outside a Slurm job."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    return job if job.isdigit() else "local"


@dataclass(frozen=True)
class TokenLocation:
    """Where a server's secret lives: ``base/slurm-ft-<uid>/job-<job>/notify-<port>.token``."""
    base: str
    uid: int
    job: str
    port: int

    @classmethod
    def for_port(cls, port: int, *, uid: int | None = None, job: str | int | None = None,
                 env: Mapping[str, str] | None = None) -> "TokenLocation":
        """The location for ``port`` of job ``job`` (default: this job) of ``uid`` (default: us)."""
        env = os.environ if env is None else env
        base = env.get(ENV_RUNTIME_DIR) or tempfile.gettempdir()
        job_s = job_key(env) if job is None else str(job)
        if not (job_s.isdigit() or job_s == "local"):
            raise ConfigError(f"job: must be a Slurm job id, got {job_s!r}")
        return cls(base, os.geteuid() if uid is None else int(uid), job_s, int(port))

    @property
    def dirs(self) -> tuple[str, str]:
        """The two private directories under ``base``: ``slurm-ft-<uid>``, ``job-<job>``."""
        return f"slurm-ft-{self.uid}", f"job-{self.job}"

    @property
    def name(self) -> str:
        """The file name: ``notify-<port>.token``."""
        return f"notify-{self.port}.token"

    @property
    def path(self) -> str:
        """The full path of the token file."""
        return os.path.join(self.base, *self.dirs, self.name)


def _private_dir(parent_fd: int, name: str, uid: int, where: str, create: bool) -> int:
    """Open directory ``name`` under ``parent_fd`` (never through a symlink) and check it is owned
    by ``uid`` and closed to group and others (:func:`slurm_ft.pathtrust.private`); with
    ``create``, make it (0700) if missing. Returns its descriptor; raises :class:`ConfigError`
    (FileNotFoundError / PermissionError when it is not there / not reachable)."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except (FileNotFoundError, PermissionError):
        raise  # callers tell "not there" and "not yours" apart
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ConfigError(f"{where}: refusing a symlink or non-directory here") from None
        raise ConfigError(f"{where}: cannot open: {exc.strerror}") from None
    st = os.fstat(fd)
    if pathtrust.judge(st, pathtrust.private(uid, pathtrust.DIR)) is not None:
        os.close(fd)
        raise ConfigError(f"{where}: refusing a directory owned by uid {st.st_uid} with mode "
                          f"{stat.S_IMODE(st.st_mode):04o} (want uid {uid}, mode 0700)")
    return fd


def _open_job_dir(loc: TokenLocation, create: bool) -> int:
    """fd of ``base/slurm-ft-<uid>/job-<job>``, checked level by level."""
    try:
        base_fd = os.open(loc.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, PermissionError):
        raise
    except OSError as exc:
        raise ConfigError(f"{loc.base}: cannot open: {exc.strerror}") from None
    try:
        user_dir, job_dir = loc.dirs
        user_fd = _private_dir(base_fd, user_dir, loc.uid, os.path.join(loc.base, user_dir), create)
    finally:
        os.close(base_fd)
    try:
        return _private_dir(user_fd, job_dir, loc.uid, os.path.join(loc.base, *loc.dirs), create)
    finally:
        os.close(user_fd)


def write_token(loc: TokenLocation, token: str) -> str:
    """Write ``token`` to its file (mode 0600, ``O_EXCL|O_NOFOLLOW``), making the directories.

    A regular file of ours already there is a stale one (the port is bound by the caller now) and
    is replaced. Returns the path. Raises :class:`ConfigError` for anything unsafe on the path (a
    symlink, a directory or file of another user, open permissions) and :class:`OSError` when the
    file system refuses."""
    if loc.uid != os.geteuid():
        raise ConfigError(f"token file: written by its owner only (uid {loc.uid}, running as {os.geteuid()})")
    dir_fd = _open_job_dir(loc, create=True)
    try:
        for _ in range(2):
            try:
                fd = os.open(loc.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=dir_fd)
                break
            except FileExistsError:
                st = os.stat(loc.name, dir_fd=dir_fd, follow_symlinks=False)
                stale = pathtrust.Rule(frozenset({loc.uid}), 0, kind=pathtrust.FILE)   # any mode: it is replaced
                if pathtrust.judge(st, stale) is not None:
                    raise ConfigError(f"{loc.path}: refusing to replace a symlink or a file not ours") from None
                os.unlink(loc.name, dir_fd=dir_fd)
        else:
            raise ConfigError(f"{loc.path}: keeps reappearing; refusing")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, (token + "\n").encode("ascii"))
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    return loc.path


def remove_token(loc: TokenLocation) -> None:
    """Remove the token file (and the job directory once empty); quiet if already gone."""
    try:
        dir_fd = _open_job_dir(loc, create=False)
    except (OSError, ConfigError):
        return
    try:
        st = os.stat(loc.name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            os.unlink(loc.name, dir_fd=dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    try:
        os.rmdir(os.path.join(loc.base, *loc.dirs))
    except OSError:
        pass


def read_token_file(path: str, uid: int) -> str:
    """The secret in ``path``: a regular file owned by ``uid``, mode 0600 or tighter, not a symlink.

    Raises :class:`TokenError` if it is missing, unsafe or does not hold a secret."""
    fd = _open_token_file(path, path)
    try:
        return _read_checked(fd, path, uid)
    finally:
        os.close(fd)


def _open_token_file(name: str, path: str, dir_fd: int | None = None) -> int:
    """Open token file ``name`` (relative to ``dir_fd`` if given) read-only, never through a
    symlink; ``path`` names it in errors. Raises :class:`TokenMissing` / :class:`TokenError`."""
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        raise TokenMissing(f"{path}: no token file (is the checkpoint server running?)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TokenError(f"{path}: refusing a symlink") from None
        raise TokenError(f"{path}: cannot read: {exc.strerror}") from None


def _read_checked(fd: int, path: str, uid: int) -> str:
    if pathtrust.judge(os.fstat(fd), pathtrust.private(uid, pathtrust.FILE)) is not None:
        raise TokenError(f"{path}: refusing: not a regular file of uid {uid} with mode 0600")
    token = os.read(fd, _MAX_FILE).decode("ascii", "replace").strip()
    if not valid_token(token):
        raise TokenError(f"{path}: does not hold a checkpoint secret")
    return token


def read_token(loc: TokenLocation) -> str:
    """The secret of the server at ``loc``, read through checked directories (as :func:`write_token`).

    Raises :class:`TokenError` (missing, unreadable, malformed) or :class:`ConfigError` (unsafe path)."""
    try:
        dir_fd = _open_job_dir(loc, create=False)
    except FileNotFoundError:
        raise TokenMissing(f"{loc.path}: no token file (is the checkpoint server running?)") from None
    except PermissionError:
        raise TokenError(f"{loc.path}: permission denied (only the job's user and root may read it)") from None
    try:
        fd = _open_token_file(loc.name, loc.path, dir_fd)
        try:
            return _read_checked(fd, loc.path, loc.uid)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def client_token(port: int, *, token: str | None = None, token_file: str | None = None,
                 uid: int | None = None, job: str | int | None = None,
                 env: Mapping[str, str] | None = None) -> str:
    """The secret a client sends to the server on ``port`` of this node.

    Order: ``token``; ``token_file`` (owned by ``uid``, default us); the token file of ``port`` for
    job ``job`` of user ``uid`` (defaults: this job, us) if there is one; ``$SLURM_FT_CKPT_TOKEN``
    (a child of the serving process). Raises :class:`TokenError` when none is found or usable,
    :class:`ConfigError` when the token file's path is unsafe."""
    env = os.environ if env is None else env
    if token is not None:
        if not valid_token(token):
            raise TokenError("token: malformed checkpoint secret")
        return token
    owner = os.geteuid() if uid is None else int(uid)
    if token_file:
        return read_token_file(token_file, owner)
    loc = TokenLocation.for_port(port, uid=owner, job=job, env=env)
    try:
        return read_token(loc)
    except TokenMissing:
        fallback = env.get(ENV_TOKEN, "")
        if valid_token(fallback):
            return fallback
        raise


def export_token(env: MutableMapping[str, str], token: str) -> None:
    """Put the secret in ``env`` (``os.environ``: children started later inherit it)."""
    env[ENV_TOKEN] = token
