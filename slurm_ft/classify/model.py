"""The classifier's value types: what goes in (:class:`Evidence`) and what comes out (:class:`Verdict`).

Plain frozen dataclasses, no I/O, no regexes: importing this module costs next to nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

#: Verdict classes, in the order the docs explain them.
#: hardware: fail over, drain/exclude the node or GPU.  user: deterministic, do not retry.
#: infra: a shared service failed transiently, retry allowed, no drain.  hang: the job stopped
#: making progress.  unknown: the evidence does not support a decision.  ok: the job succeeded.
CLASSES = ("hardware", "user", "infra", "hang", "unknown", "ok")

#: Recommended actions a verdict may carry.  ``verify``: the evidence for a hardware fault is
#: untrusted (the job's own output): run the trusted GPU checks before acting (docs/security.md).
ACTIONS = ("drain_node", "reset_gpu", "retry", "none", "verify")

#: Default action per class (used when a policy row or an admin override names none).
DEFAULT_ACTION = {
    "hardware": "drain_node",
    "user": "none",
    "infra": "retry",
    "hang": "retry",
    "unknown": "none",
    "ok": "none",
}

#: Bounds on :attr:`Verdict.evidence`: at most this many lines, each at most this many characters.
MAX_EVIDENCE_LINES = 20
MAX_EVIDENCE_CHARS = 500


@dataclass(frozen=True)
class XidEvent:
    """One NVIDIA Xid (GPU) or SXid (NVSwitch) kernel message.

    ``bus_id`` is normalised to ``"dddd:bb:dd"`` (PCI domain:bus:device, lower-case, no function),
    or None when the line's format carries no bus id (old drivers).  ``gpu_index`` is the GPU's
    index on the node when the caller gave a bus-id map, else None.  ``line`` is the raw line.
    """

    xid: int
    bus_id: str | None
    gpu_index: int | None
    line: str
    kind: str = "xid"  # "xid" or "sxid" (NVSwitch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "xid": self.xid,
            "bus_id": self.bus_id,
            "gpu_index": self.gpu_index,
            "kind": self.kind,
            "line": self.line,
        }


class PriorXid(NamedTuple):
    """An Xid this node saw before the current job (from the node journal).

    time: epoch seconds (when the verdict holding it was recorded: the end of that job).
    bus_id: normalised bus id.  pid: the faulting process from the Xid line, when it names one
    (an event seen by two jobs' evidence counts once)."""

    time: float
    xid: int
    bus_id: str | None
    pid: int | None = None


class PriorCrash(NamedTuple):
    """A job that ended on this node before the current one, by the rule that decided its verdict
    (from the node journal), for recurrence rules across jobs (:mod:`.recurrence`).
    time: epoch seconds (when its verdict was recorded).  rule: its deciding rule id
    (``segfault``...).  job_id: its Slurm job id.  user: its owner's user name or uid (None when
    unknown: such an event never counts toward distinct users)."""

    time: float
    rule: str
    job_id: str
    user: str | None = None


@dataclass(frozen=True)
class Evidence:
    """Everything known about one job's end on one node; every field is optional.

    kernel_lines: kernel log messages, already limited by the caller to the job's time window.
    stderr_tail: the tail of the job's stderr/stdout (text the job's user controls: only
      ``output`` signature rows look at it, never the Xid parser).
    exit_code: 0-255 or None.  signal: terminating signal number or None.
    slurm_state: Slurm's job state/reason, e.g. ``NODE_FAIL``, ``OUT_OF_MEMORY``, ``TIMEOUT``.
    job_bus_ids: normalised bus ids of the job's GPUs on this node; an empty set for a job with
      no GPUs (it owns none: no GPU record is ever its evidence); None: unknown (an offline
      ``slurm-ft classify``), fall back to node_bus_ids.  node_bus_ids: normalised bus id -> GPU
      index for every GPU of the node (None: unknown).  A kernel record naming no bus id, or one
      the node's map does not hold, is *unplaced*: attributed to no job (:attr:`Verdict.unplaced`).
    prior_xids: this node's earlier Xid events, for count/window rules across jobs:
      :class:`PriorXid` ``(time, xid, bus_id, pid)`` tuples (plain ``(time, xid, bus_id)`` tuples
      too), ``time`` in epoch seconds.  The epilog fills them from the node journal
      (:func:`slurm_ft.classify.history.prior_xids`).  Events without a bus id are not counted.
    now: epoch seconds of this evidence (the job's end); prior events count when
      ``time >= now - window_s``.  None: ``time.time()`` when prior_xids are given.
    kernel_records: kernel_lines are ``/dev/kmsg`` record bodies, read as they are.  False: lines
      of a saved log (dmesg, syslog): each first loses its log tool's own wrappers (timestamps,
      host, ``kernel:``; :func:`slurm_ft.classify.parse.message_body`).  Either way a record is
      evidence for hardware only when it BEGINS with a kernel-owned header
      (:func:`slurm_ft.classify.parse.kernel_header`); anything else in it is text.
    kernel_log_error: why the kernel log could not be read ("" when it was, or when no kernel log
      was asked for): kernel_lines are then empty for want of a source, not for want of a fault
      (the epilog then runs the trusted GPU checks: :func:`slurm_ft.node.epilog.verify_untrusted`).
    """

    kernel_lines: list[str] | tuple[str, ...] = ()
    stderr_tail: str = ""
    exit_code: int | None = None
    signal: int | None = None
    slurm_state: str | None = None
    job_bus_ids: frozenset[str] | None = None
    node_bus_ids: dict[str, int] | None = None
    prior_xids: tuple[PriorXid | tuple, ...] = ()
    now: float | None = None
    kernel_records: bool = False
    kernel_log_error: str = ""
    #: ``output not read: <reason>`` lines, one per job output the epilog could not read (an
    #: unexpandable filename pattern, a file it may not read; slurm_ft.node.epilog.read_outputs):
    #: stderr_tail then lacks it for want of a source. The epilog adds them to the verdict's
    #: evidence (slurm_ft.node.epilog.with_unread_outputs).
    output_unread: tuple[str, ...] = ()
    #: This node's earlier job ends (:class:`PriorCrash`, or plain ``(time, rule, job_id, user)``
    #: tuples) for recurrence rules (:mod:`.recurrence`): the epilog fills them from the node
    #: journal (:func:`slurm_ft.classify.history.prior_crashes`) only when the current verdict's
    #: rule is one a recurrence rule counts (:func:`slurm_ft.classify.history.needs_crash_history`).
    prior_crashes: tuple[PriorCrash | tuple, ...] = ()
    #: The current job's id and owner (user name or uid), for recurrence rules: the current job
    #: counts as one job and one user.  None: unknown.
    job_id: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class Verdict:
    """The classifier's answer for one job on one node.

    verdict: one of :data:`CLASSES`.  rule: id of the deciding policy row (``xid-79``,
    ``cuda-oom``, ``exit-nonzero``, ``clean-exit``, ``no-evidence``...).  xids: the Xids attributed
    to this job after bus-id filtering, in log order.  evidence: the deciding lines first, at most
    :data:`MAX_EVIDENCE_LINES` lines of at most :data:`MAX_EVIDENCE_CHARS` characters.
    action: one of :data:`ACTIONS`.
    unplaced: kernel records that suggest hardware but name no GPU of this job or node (an Xid
      without a bus id, a bus id the node's GPU map does not hold, a driver message with an RM
      GPU number): attributed to no job, they decide nothing; the epilog runs the trusted node
      checks for them (:func:`slurm_ft.node.epilog.verify_untrusted`).  At most
      :data:`MAX_EVIDENCE_LINES` lines.
    """

    verdict: str
    rule: str
    xids: tuple[XidEvent, ...]
    evidence: tuple[str, ...]
    action: str
    #: The winning trusted hardware rule when ``rule`` does not name it (a job that exited 0 on
    #: a node with a trusted fault: rule ``clean-exit``, action ``drain_node``); "" otherwise.
    cause: str = ""
    unplaced: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``{verdict, rule, action, xids: [{xid, bus_id, gpu_index, kind, line}], evidence,
        unplaced}``."""
        return {
            "verdict": self.verdict,
            "rule": self.rule,
            "action": self.action,
            "xids": [x.to_dict() for x in self.xids],
            "evidence": list(self.evidence),
            "unplaced": list(self.unplaced),
        }
