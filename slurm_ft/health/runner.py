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
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable

from slurm_ft.health.config import HealthConfig
from slurm_ft.health.result import CheckResult

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

    from slurm_ft import nvml
    from slurm_ft.health.context import Context, crashed, nvml_error_text
    from slurm_ft.health.registry import CHECKS

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


#: Make the worker with ``fork()`` (no new interpreter) when this process has a single thread
#: (see :class:`ForkedWorker`); False: always start ``worker_argv()`` (tests of the spawned worker).
FORK_WORKER = True


def _single_threaded() -> bool:
    """True when this process has exactly one OS thread (``/proc/self/task``; Python's own count
    misses threads a C library started): only then is ``fork()`` without ``exec`` safe."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


class ForkedWorker:
    """The worker as a forked copy of this process: the same JSON-lines protocol on pipes as the
    spawned ``slurm_ft.health.worker``, without starting and importing a new interpreter (the
    prolog's health gate: ~70 ms less per job, issue 24). The parent imports NVML and the checks
    before forking, so the child only runs :func:`collect`; it never returns into the caller's
    code (``os._exit``), holds no descriptor of the caller but its two pipes (stdin is
    ``/dev/null``), and is killed past the deadline exactly like the spawned worker.

    Offers the part of ``subprocess.Popen`` that :func:`run_in_subprocess` uses."""

    def __init__(self, request: dict[str, Any]):
        import pynvml  # noqa: F401 - imported here, before the fork, so the child has them

        from slurm_ft import nvml  # noqa: F401
        from slurm_ft.health import context, registry  # noqa: F401
        from slurm_ft.health.config import from_config

        cfg = from_config(request["health"])
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):   # nothing buffered is written twice
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        pid = os.fork()
        if pid == 0:
            self._child(request, cfg, out_w, err_w)    # never returns
        os.close(out_w)
        os.close(err_w)
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = open(os.devnull, "wb")    # the request went with the fork
        self.stdout = os.fdopen(out_r, "rb", buffering=0)
        self.stderr = os.fdopen(err_r, "rb", buffering=0)

    @staticmethod
    def _child(request: dict[str, Any], cfg: HealthConfig, out_w: int, err_w: int) -> None:
        status = 1
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in os.listdir("/proc/self/fd"):    # e.g. slurmd's pipes of the prolog
                if int(fd) > 2:
                    try:
                        os.close(int(fd))
                    except OSError:
                        pass

            def write(msg: dict) -> None:
                data = (json.dumps(msg) + "\n").encode()
                while data:
                    data = data[os.write(1, data):]

            collect(request["backend"], request["inventory"], cfg, request["node"], request["names"],
                    request["expected_gpus"], lambda r: write({"result": r.to_dict()}),
                    lambda check, gpu: write({"progress": [check, gpu]}))
            status = 0
        except BaseException:  # noqa: BLE001 - reported on stderr; the parent turns it into a fail
            try:
                os.write(2, traceback.format_exc().encode("utf-8", "replace")[-4000:])
            except BaseException:  # noqa: BLE001
                pass
        finally:
            os._exit(status)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("health worker (forked)", timeout)
            time.sleep(0.002)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_worker(request: dict[str, Any]):
    """The worker process: forked (:class:`ForkedWorker`) when :data:`FORK_WORKER` and this process
    is single-threaded, else ``worker_argv()`` started with pipes. Raises OSError if neither starts."""
    if FORK_WORKER and _single_threaded():
        return ForkedWorker(request)
    return subprocess.Popen(worker_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, close_fds=True)


def run_in_subprocess(request: dict[str, Any], timeout_s: float) -> list[CheckResult]:
    """:func:`collect` in a child process (:func:`start_worker`), killed after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    proc = start_worker(request)
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
