"""An ordinary, non-root user for the lab's hostile-user tests (docs/security.md).

The lab runs as root; the attacks slurm-ft must withstand are those of an ordinary user. This
module creates one local system account (``useradd``, argv list, no shell string) and runs Slurm
commands as it (``runuser``), with the lab's environment.
"""

from __future__ import annotations

import os
import pwd
import subprocess

from slurm_ft.errors import LabError

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


#: The system interpreter every user can run (the lab's venv interpreter may live under root's
#: home, which an ordinary user cannot enter: "bad interpreter: Permission denied").
SYSTEM_PYTHON = "/usr/bin/python3"


def tool_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what an ordinary user needs to run this checkout's ``slurm-ft``/``ft-history``
    with :data:`SYSTEM_PYTHON`: ``PYTHONPATH`` = the checkout and the venv's site-packages (both
    world-readable; same Python minor version). Raises :class:`LabError` when the system Python
    cannot use them."""
    import sys
    import sysconfig
    from pathlib import Path

    from slurm_ft.lab.layout import repo_root

    site = Path(sysconfig.get_paths()["purelib"])
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=30)
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if probe.returncode != 0 or probe.stdout.strip() != mine:
        raise LabError(f"{SYSTEM_PYTHON} is Python {probe.stdout.strip() or '?'}, the venv's is {mine}: "
                       f"an ordinary user cannot run this checkout's slurm-ft")
    return {**env, "PYTHONPATH": f"{repo_root()}:{site}"}


def tool_argv(tool: str, *args: str) -> list[str]:
    """argv running this checkout's ``slurm-ft`` (``tool`` "slurm-ft") or ``ft-history`` with
    :data:`SYSTEM_PYTHON` (with :func:`tool_env`)."""
    module = {"slurm-ft": "slurm_ft.cli.main", "ft-history": "slurm_ft.cli.history"}[tool]
    return [SYSTEM_PYTHON, "-m", module, *args]
