"""The ``xid_events`` check: Xid errors since the last check, judged against the Xid lists.

Source: an NVML event set (nvmlEventSetCreate, nvmlDeviceGetSupportedEventTypes,
nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError), nvmlEventSetWait, nvmlEventSetFree,
nvmlDeviceGetIndex). On a real driver an event set only sees Xids raised *after* it was
registered, so in a short-lived prolog it catches little; the kernel log is the source for
older Xids: with ``[health] xid_kmsg_window_s`` > 0 the check also reads the kernel log of that
many past seconds (``slurm_ft.classify.sources.read_kmsg``, parsed by
``slurm_ft.classify.parse.parse_xid``: only records that begin with the driver's Xid header
count; the header's bus id is matched to the GPU index through nvmlDeviceGetPciInfo, and a record
naming no GPU of this node is not counted). :func:`judge` is the pure half and :func:`kmsg_events` takes plain lines,
so any source of ``(gpu, xid)`` pairs can feed the same verdicts.
"""

from __future__ import annotations

import time
import traceback
from typing import Iterable

import pynvml

from slurm_ft.health.config import HealthConfig
from slurm_ft.health.context import Context, crashed
from slurm_ft.health.result import CheckResult

#: Events read per check at most (an Xid storm must not keep the prolog busy).
MAX_EVENTS = 256


def judge(events: Iterable[tuple[int | None, int]], cfg: HealthConfig) -> list[CheckResult]:
    """``[(gpu index or None, xid), …]`` -> one result per GPU with events (``value``: the
    codes, comma-separated), or one node-level pass when there are none.

    A GPU fails if any code is in ``xid_fail``, warns if any code is not in ``xid_ignore``,
    else passes.
    """
    by_gpu: dict[int | None, list[int]] = {}
    for gpu, xid in events:
        by_gpu.setdefault(gpu, []).append(xid)
    if not by_gpu:
        return [CheckResult("xid_events", "pass", None, "no Xid events")]
    out = []
    for gpu in sorted(by_gpu, key=lambda g: -1 if g is None else g):
        codes = by_gpu[gpu]
        shown = ",".join(map(str, sorted(set(codes))))
        where = f"GPU{gpu} " if gpu is not None else ""
        if any(c in cfg.xid_fail for c in codes):
            status = "fail"
        elif any(c not in cfg.xid_ignore for c in codes):
            status = "warn"
        else:
            status = "pass"
        out.append(CheckResult("xid_events", status, gpu, f"{where}Xid {shown}", shown))
    return out


def nvml_events(ctx: Context) -> list[tuple[int | None, int]]:
    """Drain Xid events from a fresh NVML event set over every usable GPU (``xid_wait_ms`` each)."""
    nv = ctx.nv
    event_set = nv.nvmlEventSetCreate()
    events: list[tuple[int | None, int]] = []
    try:
        for index, handle in ctx.handles.items():
            ctx.progress("xid_events", index)
            try:
                if nv.nvmlDeviceGetSupportedEventTypes(handle) & pynvml.nvmlEventTypeXidCriticalError:
                    nv.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError_NotSupported:
                continue
        ctx.progress("xid_events", None)
        for _ in range(MAX_EVENTS):
            try:
                data = nv.nvmlEventSetWait(event_set, ctx.cfg.xid_wait_ms)
            except pynvml.NVMLError_Timeout:
                break
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                try:
                    gpu = nv.nvmlDeviceGetIndex(data.device)
                except pynvml.NVMLError:
                    gpu = None
                events.append((gpu, int(data.eventData)))
    finally:
        try:
            nv.nvmlEventSetFree(event_set)
        except pynvml.NVMLError:
            pass
    return events


def kmsg_events(lines: Iterable[str], bus_ids: dict[int, str]) -> list[tuple[int | None, int]]:
    """``/dev/kmsg`` record bodies -> ``(gpu index, xid)`` for each record that BEGINS with the
    NVIDIA driver's Xid header and names one of this node's GPUs (the classifier's parser,
    :func:`slurm_ft.classify.parse.parse_xid`). ``bus_ids``: index -> bus id as NVML prints it.
    An Xid-looking text anywhere else in a record (a process or file name the kernel printed), an
    Xid without a bus id or with a bus id no GPU of this node has, and NVSwitch SXids are left
    out: they name none of this node's GPUs, so they never fail the node."""
    from slurm_ft.classify.parse import normalise_bus_id, parse_xid

    by_bus = {normalise_bus_id(b): i for i, b in bus_ids.items()}
    out: list[tuple[int | None, int]] = []
    for line in lines:
        if "Xid" not in line:
            continue
        hit = parse_xid(line.encode("utf-8", "replace"))
        if hit is not None and hit.kind == "xid" and hit.bus_id in by_bus:
            out.append((by_bus[hit.bus_id], hit.xid))
    return out


def _bus_ids(ctx: Context) -> dict[int, str]:
    from slurm_ft.nvml import bus_id_text

    out = {}
    for index, handle in ctx.handles.items():
        try:
            out[index] = bus_id_text(ctx.nv.nvmlDeviceGetPciInfo(handle))
        except pynvml.NVMLError:
            continue
    return out


def xid_events(ctx: Context) -> list[CheckResult]:
    """Xid events from the NVML event set (and the kernel log when ``xid_kmsg_window_s`` > 0),
    judged per GPU. A source failure other than NotSupported is a node-level fail (fail safe)."""
    events: list[tuple[int | None, int]] = []
    try:
        events += nvml_events(ctx)
    except pynvml.NVMLError_NotSupported:
        if not ctx.cfg.xid_kmsg_window_s:
            return [CheckResult("xid_events", "pass", None, "Xid events not supported")]
    except pynvml.NVMLError as exc:
        return [CheckResult("xid_events", "fail", None, f"Xid event set: {exc}")]
    except Exception:
        return [crashed("xid_events", None)]
    if ctx.cfg.xid_kmsg_window_s:
        ctx.progress("xid_events", None)
        try:
            from slurm_ft.classify.sources import read_kmsg

            lines = read_kmsg(time.monotonic() - ctx.cfg.xid_kmsg_window_s)
            events += kmsg_events(lines, _bus_ids(ctx))
        except Exception as exc:
            return [CheckResult("xid_events", "fail", None, f"kernel log unreadable: {exc}",
                                detail=traceback.format_exc())]
    return judge(events, ctx.cfg)
