"""What the hang watcher reads besides heartbeats, and the evidence it records for a hang.

Everything here runs in the watcher (root) but touches the job's own things only as the job's
user or through descriptors: the job's output file is opened by a child process that has become
the job's user (the descriptor is handed back over a socket; root never resolves the job's path),
``py-spy`` runs as the job's user (root never parses the job's memory or binaries). NVML and the
kernel log are root's own, trusted readings.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

from slurm_ft.slurm import SAFE_PATH

#: Characters of one rank's stack dump kept in the evidence.
DUMP_CHARS = 4000
#: Ranks dumped at most (a node rarely runs more than 8).
MAX_DUMPS = 16


# ------------------------------------------------------------------------------ the job's output
def open_as_user(path: str | bytes, uid: int, gid: int, deadline_s: float = 2.0) -> int | None:
    """An ``O_PATH`` descriptor of the job's output ``path``, found by a child that has dropped to
    ``uid``/``gid`` and walked the path without following a symlink
    (:func:`slurm_ft.node.userfile.open_path`), or None when it is not a regular file of that user,
    that user may not reach it, or the child did not answer within ``deadline_s`` seconds. Root
    only ever ``fstat()`` s it (the output's growth)."""
    from slurm_ft.node.userfile import open_path
    from slurm_ft.errors import SlurmFTError
    try:
        return open_path(path, uid, gid, deadline_s)
    except SlurmFTError:
        return None


# ------------------------------------------------------------------------------ GPU utilisation
def gpu_utilisation(cfg, node: str, gpus: tuple[int, ...] | None) -> dict[int, int]:
    """Percent utilisation (NVML ``nvmlDeviceGetUtilizationRates().gpu``, averaged by the driver
    over its last sample period, 1/6 s to 1 s) of the job's GPUs on ``node`` (all GPUs when
    ``gpus`` is None); {} when NVML cannot tell."""
    from slurm_ft import nvml
    try:
        nv = nvml.load(cfg.nvml.backend, cfg.nvml_inventory_path(node) if cfg.nvml.backend == "fake" else None)
        nv.nvmlInit()
    except Exception:
        return {}
    out = {}
    try:
        for index in range(nv.nvmlDeviceGetCount()):
            if gpus is not None and index not in gpus:
                continue
            try:
                out[index] = int(nv.nvmlDeviceGetUtilizationRates(nv.nvmlDeviceGetHandleByIndex(index)).gpu)
            except Exception:
                continue
    except Exception:
        return out
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return out


# ------------------------------------------------------------------------------ stack dumps
def find_py_spy(configured: str = "") -> str | None:
    """The py-spy to run: ``[hang] py_spy``, else beside this Python, else /usr/local/bin, /usr/bin.
    Only a regular file owned by root and not writable by group or others (root starts it)."""
    for path in ([configured] if configured else
                 [os.path.join(os.path.dirname(sys.executable), "py-spy"), "/usr/local/bin/py-spy", "/usr/bin/py-spy"]):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022 and st.st_mode & 0o111:
            return path
    return None


def stack_dump(py_spy: str | None, pid: int, uid: int, gid: int, timeout_s: float) -> str:
    """``py-spy dump --pid PID`` run as the job's user (it reads only what that user may ptrace),
    its output cut to :data:`DUMP_CHARS`; a one-line reason when it cannot be had."""
    if py_spy is None:
        return "no stack dump: py-spy is not installed (pip install py-spy, or set [hang] py_spy)"
    try:
        p = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, errors="replace",
                           timeout=timeout_s, env={"PATH": SAFE_PATH, "LC_ALL": "C"}, stdin=subprocess.DEVNULL,
                           user=uid, group=gid, extra_groups=[], cwd="/")
    except subprocess.TimeoutExpired:
        return f"no stack dump: py-spy took more than {timeout_s:g} s"
    except OSError as exc:
        return f"no stack dump: py-spy could not run ({exc.strerror})"
    text = (p.stdout if p.returncode == 0 else (p.stderr or p.stdout)).strip()
    if p.returncode != 0:
        return f"no stack dump (py-spy exit {p.returncode}): {text.splitlines()[0] if text else ''}"[:DUMP_CHARS]
    return text[:DUMP_CHARS]


# ------------------------------------------------------------------------------ kernel log
def kernel_verdict(cfg, node: str, gpus: tuple[int, ...] | None, since_mono: float):
    """The classifier's verdict on this node's kernel log since ``since_mono`` (root's trusted
    evidence, attributed to the job's GPUs by bus id as the epilog does: ``gpus`` from
    ``SLURM_JOB_GPUS``; None, a job without GPUs, owns none, so no GPU record is its evidence),
    or None when the log cannot be read. A hang caused by a GPU that fell off the bus is that
    hardware fault."""
    from slurm_ft import nvml
    from slurm_ft.classify import Evidence, classify, default_policy, from_config
    from slurm_ft.classify.sources import read_kmsg
    from slurm_ft.errors import SlurmFTError
    try:
        lines = read_kmsg(since_mono)
    except SlurmFTError:
        return None
    node_bus = job_bus = None
    try:
        node_bus, job_bus = nvml.gpu_map(cfg, node, gpus)  # no GPUs: owns none
    except Exception:
        return None        # no GPU map: an Xid could not be attributed to this job's GPUs
    policy = from_config(cfg.classify) if cfg.classify else default_policy()
    return classify(Evidence(kernel_lines=lines, job_bus_ids=job_bus, node_bus_ids=node_bus, now=time.time(),
                             kernel_records=True), policy)
