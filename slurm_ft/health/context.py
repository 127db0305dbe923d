"""What every check receives, and the one loop that runs a per-GPU measurement safely.

A per-GPU measurement is ``fn(ctx, handle, index) -> CheckResult``. :func:`per_gpu` turns the
ways it can go wrong into verdicts, so no check repeats them:

- ``NVMLError_NotSupported``: ``pass`` ("not supported"): the GPU does not have the feature;
- a GPU whose handle could not be had (``NVMLError_GpuIsLost`` …): ``fail``;
- any other ``NVMLError``: ``fail`` (fail safe: an unreadable counter is not a healthy one);
- any other exception: ``fail`` with the traceback in ``detail``.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pynvml

from slurm_ft.health.config import HealthConfig
from slurm_ft.health.result import CheckResult

Progress = Callable[[str, "int | None"], None]


@dataclass
class Context:
    nv: Any                      #: pynvml module or FakeNvml, initialised
    cfg: HealthConfig
    node: str
    count: int                   #: nvmlDeviceGetCount()
    handles: dict[int, Any]      #: index -> handle, for GPUs whose handle could be had
    handle_errors: dict[int, BaseException] = field(default_factory=dict)
    expected_gpus: int = 0       #: 0 = at least one
    progress: Progress = lambda check, gpu: None


def verdict(severity: str) -> str:
    """Map a configured severity (fail / warn / ignore) to a status."""
    return "pass" if severity == "ignore" else severity


def nvml_error_text(exc: BaseException) -> str:
    """``NVMLError_GpuIsLost`` -> ``"GPU is lost"``; other exceptions -> their class name."""
    if isinstance(exc, pynvml.NVMLError):
        try:
            return str(exc)
        except Exception:  # pragma: no cover - str() of an unknown code asks the library
            return f"NVML error {getattr(exc, 'value', '?')}"
    return type(exc).__name__


def crashed(check: str, gpu: int | None) -> CheckResult:
    """The verdict for a check that raised: fail, traceback in detail. Call inside ``except``."""
    where = f"GPU{gpu} " if gpu is not None else ""
    return CheckResult(check, "fail", gpu, f"{where}{check} check crashed", detail=traceback.format_exc())


def per_gpu(ctx: Context, check: str, fn: Callable[[Context, Any, int], CheckResult]) -> Iterator[CheckResult]:
    """Run ``fn`` on every GPU NVML counts, in index order, yielding each verdict as it is
    made (so the runner keeps GPU0's verdict when GPU1 hangs); see the module doc for errors."""
    for index in range(ctx.count):
        ctx.progress(check, index)
        err = ctx.handle_errors.get(index)
        if err is not None:
            yield CheckResult(check, "fail", index, f"GPU{index} {nvml_error_text(err)}")
            continue
        try:
            result = fn(ctx, ctx.handles[index], index)
        except pynvml.NVMLError_NotSupported:
            result = CheckResult(check, "pass", index, f"GPU{index} {check} not supported")
        except pynvml.NVMLError as exc:
            result = CheckResult(check, "fail", index, f"GPU{index} {check}: {nvml_error_text(exc)}",
                                 detail=traceback.format_exc())
        except Exception:
            result = crashed(check, index)
        yield result
