"""Slurm accounting for the lab: slurmdbd on a private MariaDB, so that ``sacct`` works there
(submitit polls ``sacct`` for job states; users of ``sacct`` get what a real cluster gives).

Per lab incarnation (``lab up`` from scratch), ``DIR/accounting/`` (0700, root) holds a fresh
MariaDB data directory made by ``mariadb-install-db`` (root by unix-socket authentication only),
its socket and pid file. ``mariadbd`` runs as root without networking (``--skip-networking``):
only root on this host reaches it, through that socket. ``slurmdbd`` (``DIR/slurmdbd.conf``,
0600 as slurmdbd demands) finds the socket through ``MYSQL_UNIX_PORT`` and listens on
``port_base + 19``; slurmctld registers the cluster by itself at start-up. Job ids restart at 1
with each incarnation, so the database is made anew, never reused (like Slurm's state).

Measured on the lab host (Debian 12, 2 cores): ``apt-get install slurmdbd mariadb-server-core
mariadb-client-core`` 10 s; ``mariadb-install-db`` 0.6 s; mariadbd and slurmdbd ready 0.1-0.2 s
each; mariadbd about 100 MB resident.

Debian packages: ``slurmdbd`` (22.05: storage in MySQL/MariaDB only), ``mariadb-server-core``
(``mariadbd``, ``mariadb-install-db``), ``mariadb-client-core`` (``my_print_defaults``, which
``mariadb-install-db`` runs). ``scripts/setup-system.sh`` installs them.
"""

from __future__ import annotations

import os
import socket
import subprocess

from slurm_ft.errors import LabError
from slurm_ft.slurm import SAFE_PATH
from slurm_ft.lab.layout import Layout

SLURMDBD = "/usr/sbin/slurmdbd"
MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = "/usr/bin/mariadb-install-db"
PACKAGES = "slurmdbd mariadb-server-core mariadb-client-core"
DATABASE = "slurm_acct_db"

#: MariaDB settings slurmdbd checks at start-up (it logs an error for smaller values).
_SERVER_OPTIONS = ["--innodb-buffer-pool-size=512M", "--innodb-lock-wait-timeout=900",
                   "--innodb-log-file-size=32M", "--skip-name-resolve"]


def socket_path(lay: Layout) -> str:
    return str(lay.acct_dir / "mysqld.sock")


def missing_executables() -> list[str]:
    return [exe for exe in (SLURMDBD, MARIADBD, INSTALL_DB) if not os.access(exe, os.X_OK)]


def slurm_conf_lines(lay: Layout) -> list[str]:
    return ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
            f"AccountingStoragePort={lay.dbd_port}"]


def render_slurmdbd_conf(lay: Layout) -> str:
    return "\n".join([
        "# Written by `slurm-ft lab up`; regenerated on every fresh start (0600: slurmdbd demands it).",
        "AuthType=auth/munge",
        "DbdHost=localhost", f"DbdPort={lay.dbd_port}",
        "SlurmUser=root",
        f"PidFile={lay.run_dir}/slurmdbd.pid", f"LogFile={lay.log('slurmdbd')}", "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost", "StorageUser=root",   # unix-socket authentication: root only
        f"StorageLoc={DATABASE}",
    ]) + "\n"


def install_db(lay: Layout, timeout_s: float = 120) -> None:
    """A fresh MariaDB data directory in ``DIR/accounting/db`` (the directory must not exist)."""
    argv = [INSTALL_DB, "--no-defaults", "--user=root", f"--datadir={lay.acct_dir / 'db'}",
            "--auth-root-authentication-method=socket", "--skip-test-db", *_SERVER_OPTIONS]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                             env={"PATH": SAFE_PATH, "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"mariadb-install-db failed: {exc}") from None
    if out.returncode != 0:
        raise LabError(f"mariadb-install-db failed (exit {out.returncode}):\n{(out.stdout + out.stderr)[-2000:]}")


def mariadbd_argv(lay: Layout) -> list[str]:
    return [MARIADBD, "--no-defaults", "--user=root", f"--datadir={lay.acct_dir / 'db'}",
            f"--socket={socket_path(lay)}", f"--pid-file={lay.acct_dir / 'mysqld.pid'}",
            "--skip-networking", f"--log-error={lay.log('mariadbd')}", *_SERVER_OPTIONS]


def slurmdbd_argv() -> list[str]:
    return [SLURMDBD, "-D"]


def slurmdbd_env(lay: Layout, slurm_env: dict[str, str]) -> dict[str, str]:
    """slurmdbd reads ``slurmdbd.conf`` beside ``$SLURM_CONF``; the lab's MariaDB socket comes
    from ``MYSQL_UNIX_PORT`` (the client library's default otherwise: the system's MariaDB)."""
    return {**slurm_env, "MYSQL_UNIX_PORT": socket_path(lay)}


def db_ready(lay: Layout) -> bool:
    """MariaDB accepts connections on the lab's socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(socket_path(lay))
        except OSError:
            return False
    return True


def dbd_ready(lay: Layout) -> bool:
    """Something listens on slurmdbd's port (checked by binding it, not by talking to slurmdbd,
    which would log a bad message); the caller knows its own slurmdbd is alive."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", lay.dbd_port))
        except OSError:
            return True
    return False
