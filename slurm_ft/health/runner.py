"""Run the enabled checks against NVML under one deadline, so a hung driver never hangs the caller.

:func:`collect` does the NVML work in-process and reports each result (and where it is, for
blame) through callbacks. :func:`run` puts it behind the deadline, in one of two ways
(``[health] isolation``):

- ``subprocess`` (default): a child Python process runs :func:`collect`
  (``slurm_ft.health.worker``), streaming JSON lines. Past the deadline the child is killed and
  *not* waited for beyond 0.5 s, so even a child stuck in an uninterruptible driver call
  cannot hold the prolog.
- ``thread``: a daemon thread runs :func:`collect`; past the deadline it is abandoned. Cheaper,
  but a thread stuck in the kernel can keep the process from exiting.

Either way the caller gets every result finished before the deadline plus an
``nvml_responsive`` verdict: pass with the seconds NVML took, or fail naming the check and GPU
NVML was stuck in.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable

from .config import HealthConfig
from .result import CheckResult

Emit = Callable[[CheckResult], None]
Progress = Callable[[str, "int | None"], None]


def collect(backend: str, inventory: str | None, cfg: HealthConfig, node: str, names: list[str],
            expected_gpus: int, emit: Emit, progress: Progress) -> None:
    """Initialise NVML, run the checks ``names`` in order, emit every result, shut NVML down.

    Never raises for NVML or check trouble: an init failure is an ``nvml_responsive`` fail, a
    crashing check a ``fail`` with its traceback. Ends with an ``nvml_responsive`` pass whose
    ``value`` is the seconds NVML took.
    """
    import pynvml

    from .. import nvml
    from .context import Context, crashed, nvml_error_text
    from .registry import CHECKS

    t0 = time.monotonic()
    progress("nvmlInit", None)
    try:
        nv = nvml.load(backend, inventory)
        nv.nvmlInit()
    except pynvml.NVMLError as exc:
        # an answer from NVML (no driver, driver not loaded, no permission), not a crash: no traceback
        emit(CheckResult("nvml_responsive", "fail", None, f"NVML init failed: {nvml_error_text(exc)}",
                         detail=init_hint(exc)))
        return
    except Exception as exc:
        emit(CheckResult("nvml_responsive", "fail", None, f"NVML init failed: {exc}",
                         detail=traceback.format_exc()))
        return
    try:
        progress("nvmlDeviceGetCount", None)
        try:
            count = nv.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            emit(CheckResult("nvml_responsive", "fail", None, f"NVML device count failed: {nvml_error_text(exc)}",
                             detail=traceback.format_exc()))
            return
        handles: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        for index in range(count):
            progress("nvmlDeviceGetHandleByIndex", index)
            try:
                handles[index] = nv.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as exc:
                errors[index] = exc
        ctx = Context(nv=nv, cfg=cfg, node=node, count=count, handles=handles, handle_errors=errors,
                      expected_gpus=expected_gpus, progress=progress)
        for name in names:
            try:
                for r in CHECKS[name](ctx):
                    emit(r)
            except Exception:
                emit(crashed(name, None))
        took = time.monotonic() - t0
        emit(CheckResult("nvml_responsive", "pass", None, f"NVML answered in {took:.2f} s", round(took, 4)))
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def init_hint(exc: BaseException) -> str:
    """What an admin does about an NVML init error (the ``detail`` of the ``nvml_responsive`` fail)."""
    import pynvml

    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return ("libnvidia-ml.so.1 cannot be loaded: no NVIDIA driver on this host (install it; on a host "
                "without GPUs, slurm-ft health has nothing to check)")
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return "the NVIDIA kernel module is not loaded (modprobe nvidia; dmesg | grep -i nvrm)"
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return "no permission to open the NVIDIA devices: run as root"
    return "nvidia-smi shows the same error; see the driver's kernel log (dmesg | grep -i nvrm)"


def _timed_out(timeout_s: float, where: tuple[str, int | None]) -> CheckResult:
    check, gpu = where
    at = f"{check}" + (f" on GPU{gpu}" if gpu is not None else "")
    return CheckResult("nvml_responsive", "fail", gpu, f"NVML did not answer within {timeout_s:g} s (in {at})",
                       timeout_s)


def run_in_thread(request: dict[str, Any], cfg: HealthConfig, timeout_s: float) -> list[CheckResult]:
    """:func:`collect` in a daemon thread, abandoned after ``timeout_s``."""
    results: list[CheckResult] = []
    where: list[Any] = ["start", None]

    def progress(check: str, gpu: int | None) -> None:
        where[:] = [check, gpu]

    def body() -> None:
        try:
            collect(request["backend"], request["inventory"], cfg, request["node"], request["names"],
                    request["expected_gpus"], results.append, progress)
        except BaseException:  # pragma: no cover - collect() does not raise
            results.append(CheckResult("nvml_responsive", "fail", None, "health worker crashed",
                                       detail=traceback.format_exc()))

    worker = threading.Thread(target=body, name="slurm-ft-health", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return list(results) + [_timed_out(timeout_s, (where[0], where[1]))]
    return results


_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker_argv() -> list[str]:
    """argv of the worker process: this interpreter, isolated (``-I``: no PYTHON* variables,
    no user site), importing slurm_ft from where this copy lives."""
    code = (f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
            "from slurm_ft.health.worker import main; sys.exit(main())")
    return [sys.executable, "-I", "-c", code]


def run_in_subprocess(request: dict[str, Any], timeout_s: float) -> list[CheckResult]:
    """:func:`collect` in a child process (``slurm_ft.health.worker``), killed after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    proc = subprocess.Popen(worker_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, close_fds=True)
    results: list[CheckResult] = []
    where: tuple[str, int | None] = ("start", None)
    buf = {proc.stdout.fileno(): b"", proc.stderr.fileno(): b""}
    try:
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    sel = selectors.DefaultSelector()
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f.fileno(), selectors.EVENT_READ)
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    open_fds = 2
    timed_out = False
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    open_fds -= 1
                    continue
                buf[key.fd] += chunk
                if key.fd == out_fd:
                    *lines, buf[out_fd] = buf[out_fd].split(b"\n")
                    for line in lines:
                        msg = json.loads(line)
                        if "result" in msg:
                            results.append(CheckResult.from_dict(msg["result"]))
                        else:
                            where = (msg["progress"][0], msg["progress"][1])
        if not timed_out:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
        if timed_out or proc.poll() is None:
            proc.kill()
            try:
                proc.wait(0.5)  # reap if it dies; a child stuck in the kernel is left behind
            except subprocess.TimeoutExpired:
                pass
        proc.stdout.close()
        proc.stderr.close()
    if timed_out:
        return results + [_timed_out(timeout_s, where)]
    if not any(r.check == "nvml_responsive" for r in results):
        stderr = buf[err_fd].decode("utf-8", "replace")[-4000:]
        results.append(CheckResult("nvml_responsive", "fail", None,
                                   f"health worker exited with status {proc.returncode}", detail=stderr))
    return results


def run(backend: str, inventory: str | None, cfg: HealthConfig, node: str, names: list[str],
        expected_gpus: int) -> list[CheckResult]:
    """Run ``names`` under ``cfg.nvml_timeout_s`` per ``cfg.isolation``; ``nvml_responsive`` first."""
    request = {"backend": backend, "inventory": inventory, "node": node, "names": names,
               "expected_gpus": expected_gpus, "health": _cfg_table(cfg)}
    if cfg.isolation == "subprocess" and sys.executable:
        results = run_in_subprocess(request, cfg.nvml_timeout_s)
    else:
        results = run_in_thread(request, cfg, cfg.nvml_timeout_s)
    return sorted(results, key=lambda r: r.check != "nvml_responsive")


def _cfg_table(cfg: HealthConfig) -> dict[str, Any]:
    """HealthConfig -> a ``[health]`` table that ``from_config`` reads back to the same config."""
    import dataclasses

    return {f.name: (list(v) if isinstance(v := getattr(cfg, f.name), tuple) else v)
            for f in dataclasses.fields(cfg)}
