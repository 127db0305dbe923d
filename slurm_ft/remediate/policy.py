"""Break-fix remediation decisions, pure: one node's typed facts in, actions out (no I/O).

Runs inside the daemon on the controller host (``[remediate] enabled``); the I/O around it is
:mod:`slurm_ft.remediate.actions`. The rules (docs/drain-report.md, "Break-fix remediation"):

- only a node **slurm-ft** drained is repaired: a reason not starting with ``slurm-ft:`` (an
  admin's, or Slurm's own) is never touched, whatever the journal says;
- only once **no job runs** there (the node is idle, not draining);
- **one repair in flight per node**: a repair is started only when the node has none open (the
  last journaled step is not a reset or reboot), or in the same decision that closes the open one
  as failed (``Fail`` before ``Repair``);
- the repair is the Xid catalog's (``xid_catalog.csv`` column ``repair``, from NVIDIA's
  immediate-action bucket): ``reset`` when every Xid calls at most for a GPU reset (and
  ``[remediate] reset`` is on and the GPU's bus id is known), ``reboot`` when any calls for one
  or the drain names no Xid (a health check's drain), nothing when the catalog lists no repair; a
  failed reset falls back to a reboot;
- a later Xid that cancels every Xid of the drain (catalog column ``cancels``: 162/163) makes
  the repair unnecessary (``Cancel``, once);
- a node that needs repair more than ``max_repairs`` times within ``window_s`` is an RMA
  candidate: drained with ``slurm-ft: rma: ...`` and never repaired again by slurm-ft;
- the repair's outcome comes from the trusted checks run on the node (``slurm-ft health --act``
  as HealthCheckProgram): the node resumed (``Pass``), or its reason turned to
  ``slurm-ft: remediate: failed: ...``, or no result within ``repair_timeout_s`` (``Fail``);
- observe mode (``[failover] mode = "observe"``): the first step is journaled as observed and the
  node is then left alone (nothing in Slurm changed, so nothing would ever finish).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

LEADER = "slurm-ft:"
#: Reason prefix of a node under repair (set by slurm-ft: the reboot's or the reset's reason).
REMEDIATE = "slurm-ft: remediate:"
#: Reason prefix the trusted checks set when a repaired node still fails them.
FAILED = "slurm-ft: remediate: failed"
#: Reason prefix of an RMA candidate: stays drained, slurm-ft never repairs it again.
RMA = "slurm-ft: rma:"
#: Journaled steps that are repairs (an open one is "in flight").
REPAIR_KINDS = ("reset", "reboot")
#: Every journaled step kind (journal action ``remediate-<kind>``).
STEP_KINDS = (*REPAIR_KINDS, "pass", "fail", "rma", "cancel")

_XID_REASON = re.compile(r"^slurm-ft: Xid (?P<codes>\d+(?:,\d+)*)(?: GPU (?P<bus>[0-9A-Fa-f:.]+))?")
_JOB = re.compile(r"\(job (\d+)\)")


@dataclass(frozen=True)
class Step:
    """One journaled remediation step of a node: ``kind`` (:data:`STEP_KINDS`), ``at`` (epoch
    seconds), and the fault it is about: ``xids``, the GPU ``bus`` id, the ``job_id`` whose fault
    drained the node (0: none known), ``what`` (the fault as the drain reason named it)."""

    kind: str
    at: float
    xids: tuple[int, ...] = ()
    bus: str = ""
    job_id: int = 0
    what: str = ""


@dataclass(frozen=True)
class NodeFacts:
    """What the daemon knows of one node: Slurm's view (``drained``, ``idle``: no job there,
    ``rebooting``: a reboot requested or issued, ``reason``) and the journal's (``steps`` of this
    node, oldest first; ``later_xids``: Xids seen on the node since the drain)."""

    name: str
    drained: bool
    idle: bool
    rebooting: bool
    reason: str
    steps: tuple[Step, ...] = ()
    later_xids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Limits:
    """``[remediate]`` settings and this cycle's allowance: ``may_start`` is False while the
    circuit breaker forbids taking another node through a repair (slurm_ft.drain.breaker)."""

    max_repairs: int = 3
    window_s: float = 2592000.0
    repair_timeout_s: float = 900.0
    reset: bool = True
    observe: bool = False
    may_start: bool = True


@dataclass(frozen=True)
class CatalogRow:
    """The catalog's word on one Xid: ``repair`` (reset/reboot/none) and the Xids it ``cancels``."""

    repair: str = "none"
    cancels: frozenset[int] = frozenset()


# -- actions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Repair:
    """Start a repair: ``kind`` reset or reboot, the node's new ``reason``, the fault (``xids``,
    ``bus``, ``job_id``, ``what``) and ``n``, its ordinal among the repairs in the window."""

    node: str
    kind: str
    reason: str
    xids: tuple[int, ...]
    bus: str
    job_id: int
    what: str
    n: int


@dataclass(frozen=True)
class Pass:
    """The repaired node is back in service (journal only)."""

    node: str
    why: str
    job_id: int = 0


@dataclass(frozen=True)
class Fail:
    """The open repair failed (journal only)."""

    node: str
    why: str
    kind: str
    job_id: int = 0


@dataclass(frozen=True)
class Rma:
    """Drain the node for good with ``reason`` (``slurm-ft: rma: ...``)."""

    node: str
    reason: str
    repairs: int
    job_id: int = 0


@dataclass(frozen=True)
class Cancel:
    """A later Xid cancelled the fault: no repair (journal only)."""

    node: str
    why: str
    job_id: int = 0


Action = Repair | Pass | Fail | Rma | Cancel


def parse_drain(reason: str) -> Step:
    """The fault a slurm-ft drain reason names (slurm_ft.drain.drain_reason): ``slurm-ft: Xid
    79,48 GPU 0000:10:00 (job 12)`` -> xids (79, 48), bus, job 12; another ``slurm-ft:`` reason
    (a health check's) -> no Xid, its job if it names one. ``what``: the reason without the
    leader and without what Slurm appends (`` : reboot issued``)."""
    what = reason[len(LEADER):].strip() if reason.startswith(LEADER) else reason
    what = what.split(" : ", 1)[0]
    m = _XID_REASON.match(reason)
    xids = tuple(int(x) for x in m.group("codes").split(",")) if m else ()
    bus = (m.group("bus") or "") if m else ""
    j = _JOB.search(reason)
    return Step("drain", 0.0, xids, bus, int(j.group(1)) if j else 0, what[:120])


def repair_for(xids: tuple[int, ...], catalog: Mapping[int, CatalogRow], *, reset_ok: bool, bus: str,
               after_failed: str | None) -> str:
    """``reset``, ``reboot`` or ``none`` for a fault with ``xids`` (module doc)."""
    if after_failed == "reset":
        return "reboot"                      # a failed reset falls back to a reboot
    if not xids:
        return "reboot"                      # a health check's drain: the reboot, then the checks decide
    wanted = {catalog.get(x, CatalogRow()).repair for x in xids}
    if "reboot" in wanted:
        return "reboot"
    if "reset" in wanted:
        return "reset" if reset_ok and bus and after_failed is None else "reboot"
    return "none"


def cancelled(xids: tuple[int, ...], later: tuple[int, ...], catalog: Mapping[int, CatalogRow]) -> int | None:
    """The later Xid that cancels every one of ``xids`` (catalog ``cancels``), or None."""
    if not xids:
        return None
    for x in later:
        if set(xids) <= catalog.get(x, CatalogRow()).cancels:
            return x
    return None


def _fault(f: NodeFacts) -> Step:
    """The fault this node is drained for: the drain reason's while it still shows, else the
    journal's newest step that names one (our own reasons replaced the original)."""
    if f.reason.startswith(LEADER) and not f.reason.startswith((REMEDIATE, RMA)):
        return parse_drain(f.reason)
    for s in reversed(f.steps):
        if s.kind in REPAIR_KINDS or s.what:
            return s
    return parse_drain(f.reason)


def decide(f: NodeFacts, lim: Limits, catalog: Mapping[int, CatalogRow], now: float) -> list[Action]:
    """The actions for node ``f`` now (module doc). At most one :class:`Repair`, and only when no
    repair is open or the same list closes it with a :class:`Fail` first."""
    last = f.steps[-1] if f.steps else None
    open_repair = last is not None and last.kind in REPAIR_KINDS
    job = last.job_id if last is not None else 0
    if not f.drained:
        return [Pass(f.name, f"back in service after the {last.kind}", job)] if open_repair else []
    if not f.reason.startswith(LEADER) or f.reason.startswith(RMA):
        return []                            # an admin's drain (or Slurm's own), or an RMA candidate
    out: list[Action] = []
    failed_kind = None
    if open_repair:
        if lim.observe or f.rebooting:
            return []
        if f.reason.startswith(FAILED):
            why = f.reason[len(LEADER):].strip().split(" : ", 1)[0]
        elif now - last.at > lim.repair_timeout_s:
            why = f"no trusted check result within {lim.repair_timeout_s:g} s of the {last.kind}"
        else:
            return []                        # the checks have not run yet
        out.append(Fail(f.name, why, last.kind, job))
        failed_kind = last.kind
    elif f.rebooting or (lim.observe and f.steps and f.steps[-1].kind != "pass"):
        return []                            # someone else's reboot; observe: once per node
    if not f.idle:
        return out                           # a job still runs there: the repair waits for it
    fault = _fault(f)
    by = cancelled(fault.xids, f.later_xids, catalog)
    if by is not None:
        if last is None or last.kind != "cancel":
            out.append(Cancel(f.name, f"Xid {by} cancelled Xid {','.join(map(str, fault.xids))}: no repair",
                              fault.job_id))
        return out
    repairs = [s for s in f.steps if s.kind in REPAIR_KINDS and s.at >= now - lim.window_s]
    if len(repairs) >= lim.max_repairs:
        reason = (f"{RMA} {len(repairs)} repairs in {_span(lim.window_s)}, still failing: {fault.what}")[:200]
        out.append(Rma(f.name, reason, len(repairs), fault.job_id))
        return out
    if not lim.may_start:
        return out
    kind = repair_for(fault.xids, catalog, reset_ok=lim.reset, bus=fault.bus, after_failed=failed_kind)
    if kind == "none":
        return out
    n = len(repairs) + 1
    where = f" GPU {fault.bus}" if kind == "reset" else ""
    reason = f"{REMEDIATE} {kind}{where} {n}/{lim.max_repairs} after {fault.what}"[:200]
    out.append(Repair(f.name, kind, reason, fault.xids, fault.bus, fault.job_id, fault.what, n))
    return out


def _span(seconds: float) -> str:
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{int(seconds // 86400)} days"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    return f"{seconds:g} s"
