"""The one typed verdict, end to end: what one node concluded about one attempt of one job.

The epilog makes it from the classifier's answer (:meth:`NodeVerdict.from_classified`), writes it
to its node journal (:meth:`slurm_ft.journal.Journal.add_node_verdict`) and posts it to the
node's mailbox field (:meth:`encode`, ``slurm-ft/1`` record); the daemon decodes it
(:meth:`decode`), journals it, and the state machine and the policy read it
(:mod:`slurm_ft.failover.machine`, :func:`slurm_ft.failover.policy.decide`). Journal rows come
back as the same type (:meth:`from_row`).

It is also a read-only mapping with the keys of a journal verdict row (``job_id``, ``attempt``,
``node``, ``verdict``, ``rule``, ``xids`` as ``[{"xid", "bus_id"}]``, ``exit_code``,
``evidence``, ``action``, ``source``, ``created``), so code written against rows reads it as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Iterator
from urllib.parse import quote, unquote

KEYS = ("job_id", "attempt", "node", "verdict", "rule", "xids", "exit_code", "evidence", "action", "source",
        "created")


@dataclass(frozen=True)
class NodeVerdict(Mapping):
    job_id: int
    attempt: int
    verdict: str                              # class: hardware | user | infra | hang | unknown | ok
    rule: str
    xids: tuple[tuple[int, str], ...] = ()    # (xid, bus id or "")
    exit_code: int | None = None
    time: float = 0.0                         # epoch seconds, when the node concluded it
    node: str = ""
    evidence: tuple[str, ...] = field(default=(), compare=False)
    action: str = field(default="none", compare=False)
    source: str = field(default="mailbox", compare=False)   # epilog | prolog | mailbox | daemon
    #: The trusted hardware rule behind a verdict whose ``rule`` does not name it (a clean exit on
    #: a faulty node: rule ``clean-exit``, action ``drain_node``); the drain reason names it.
    #: Local to the node (not in the mailbox record nor the journal row).
    cause: str = field(default="", compare=False)
    #: A one-line summary that travels in the mailbox record (its optional 7th field, at most
    #: :data:`SUMMARY_CHARS` printable ASCII characters) and becomes the daemon's evidence line:
    #: numbers only, never the job's text (the node field is readable by every user). The hang
    #: watcher's: window, last heartbeat, stack dump size (slurm_ft.failover.marker.hang_summary).
    summary: str = field(default="", compare=False)

    # -- identity ---------------------------------------------------------------------------
    @property
    def key(self) -> str:
        """``job.attempt``: the mailbox record key (one record per node per attempt)."""
        return f"{self.job_id}.{self.attempt}"

    @property
    def hardware(self) -> bool:
        return self.verdict == "hardware"

    def on(self, node: str, source: str | None = None) -> "NodeVerdict":
        """The same verdict as seen on ``node`` (a mailbox record names no node: its field does)."""
        return replace(self, node=node, source=source or self.source)

    # -- the classifier's answer -----------------------------------------------------------
    @classmethod
    def from_classified(cls, v, *, job_id: int, attempt: int, node: str, exit_code: int | None,
                        time: float, source: str = "epilog") -> "NodeVerdict":
        """From a :class:`slurm_ft.classify.model.Verdict`."""
        return cls(job_id, attempt, v.verdict, v.rule, tuple((x.xid, x.bus_id or "") for x in v.xids), exit_code,
                   time, node, tuple(v.evidence), v.action, source, getattr(v, "cause", ""))

    # -- mailbox record: job.attempt,verdict,rule,xids,exit,time[,summary] ----------------------
    def encode(self) -> str:
        xids = "+".join(f"{x}@{quote(b or '', safe=':')}" for x, b in self.xids)
        ec = "" if self.exit_code is None else str(self.exit_code)
        fields = [self.key, quote(self.verdict, safe=""), quote(self.rule, safe="-_."), xids, ec, f"{self.time:.1f}"]
        if self.summary:
            fields.append(quote(_printable(self.summary), safe="()-_.:="))
        return ",".join(fields)

    @classmethod
    def decode(cls, text: str, node: str = "") -> "NodeVerdict | None":
        """Parse one mailbox record; None if it is malformed (a node field is not trusted input)."""
        parts = text.split(",")
        if len(parts) not in (6, 7):
            return None
        key, verdict, rule, xids, ec, t = parts[:6]
        summary = _printable(unquote(parts[6])) if len(parts) == 7 else ""
        try:
            job, attempt = (int(v) for v in key.split("."))
            pairs = []
            for item in filter(None, xids.split("+")):
                x, _, b = item.partition("@")
                pairs.append((int(x), unquote(b)))
            return cls(job, attempt, unquote(verdict), unquote(rule), tuple(pairs),
                       int(ec) if ec else None, float(t), node, (summary,) if summary else (),
                       "drain_node" if unquote(verdict) == "hardware" else "none", "mailbox", summary=summary)
        except ValueError:
            return None

    # -- journal row ---------------------------------------------------------------------------
    @classmethod
    def from_row(cls, row: Mapping) -> "NodeVerdict":
        xids = tuple((int(x["xid"]), x.get("bus_id") or "") for x in (row.get("xids") or []))
        return cls(int(row["job_id"]), int(row["attempt"]), row["verdict"], row["rule"] or "", xids,
                   row.get("exit_code"), float(row.get("created") or 0.0), row.get("node") or "",
                   tuple(row.get("evidence") or ()), row.get("action") or "none", row.get("source") or "")

    # -- mapping view (a journal row's keys) -------------------------------------------------
    def __getitem__(self, k: str) -> Any:
        if k == "xids":
            return [{"xid": x, "bus_id": b or None} for x, b in self.xids]
        if k == "created":
            return self.time
        if k == "evidence":
            return list(self.evidence)
        if k in KEYS or k == "cause":   # "cause": readable, not a row key (never journaled)
            return getattr(self, k)
        raise KeyError(k)

    def __iter__(self) -> Iterator[str]:
        return iter(KEYS)

    def __len__(self) -> int:
        return len(KEYS)


#: The most characters of a mailbox record's summary.
SUMMARY_CHARS = 300


def _printable(text: str) -> str:
    """``text`` as printable ASCII (anything else ``?``), at most :data:`SUMMARY_CHARS`."""
    return "".join(c if " " <= c <= "~" else "?" for c in str(text)[:SUMMARY_CHARS])


# -- a node's mailbox field holds at most ``keep`` records (slurm_ft.failover.mailbox) ---------------
def hardware_reserve(keep: int) -> int:
    """Slots of a ``keep``-record field that only hardware records may take: half, rounded up."""
    return (keep + 1) // 2


def bounded(records: list[NodeVerdict], keep: int) -> list[NodeVerdict]:
    """The records a field of at most ``keep`` records holds, oldest first, in two pools:

    - **hardware** verdicts: the newest ``max(hardware_reserve(keep), keep - non-hardware)``;
    - **other** verdicts (user, infra, hang, unknown, ok): the newest that fit in what is left.

    So however many jobs fail on a node (each posts a non-hardware record), they never evict one
    of its newest :func:`hardware_reserve` hardware verdicts before the daemon has read it (issue
    27: 16 tiny failing jobs used to push another user's hardware verdict out of a 16-slot field).
    A pool that does not use its share leaves it to the other; the field never holds more than
    ``keep`` records (Slurm's field stays as small as before)."""
    hardware = [r for r in records if r.hardware]
    other = [r for r in records if not r.hardware]
    n_hw = min(len(hardware), max(hardware_reserve(keep), keep - len(other)))
    n_other = min(len(other), keep - n_hw)
    kept = {id(r) for r in hardware[len(hardware) - n_hw:]} | {id(r) for r in other[len(other) - n_other:]}
    return [r for r in records if id(r) in kept]
