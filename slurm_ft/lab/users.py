"""An ordinary, non-root user for the lab's hostile-user tests (docs/security.md).

The lab runs as root; the attacks slurm-ft must withstand are those of an ordinary user. This
module creates one local system account (``useradd``, argv list, no shell string) and runs Slurm
commands as it (``runuser``), with the lab's environment.
"""

from __future__ import annotations

import os
import pwd
import subprocess

from ..errors import LabError

#: The lab's ordinary user.
LAB_USER = "slurmft-user"


def ensure_user(name: str = LAB_USER) -> pwd.struct_passwd:
    """The account ``name``, created (``useradd --system``, no home, no password) if missing.
    Raises :class:`LabError` when it cannot be created."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    proc = subprocess.run(["/usr/sbin/useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                           "--shell", "/bin/sh", name], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0 and "already exists" not in proc.stderr:
        raise LabError(f"useradd {name} failed: {proc.stderr.strip()}")
    return pwd.getpwnam(name)


def run_as(user: str, argv: list[str], env: dict[str, str], *, cwd: str | None = None,
           timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` (``runuser -u USER --``) with exactly ``env`` (plus PATH/HOME)."""
    full = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C.UTF-8", **env}
    return subprocess.run(["/usr/sbin/runuser", "-u", user, "--", *argv], capture_output=True, text=True,
                          timeout=timeout_s, env=full, cwd=cwd or os.getcwd())
