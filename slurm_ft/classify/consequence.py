"""Consequence rules: an Xid that one earlier fault on the same GPU explains is judged as that fault.

A rule (``[[consequence]]`` in ``slurm_ft/data/classify_policy.toml``) reads: "Xid A on a GPU,
within the same job, after Xid B on that GPU, is judged as B".  The shipped rule: Xid 32 (the
DMA/PBDMA engine saw a corrupted command stream) after an application fault (Xid 13, 31, 43) on
the same GPU is that fault's consequence: the application's channel was torn down mid-stream,
no bus or board fault is shown (NVIDIA Xid catalog: 32 is "depends", its investigatory step is
CHECK_APP/CUDA; public corpus p007).

"Within the same job": the classifier's evidence is one job's kernel window and only the Xids on
the job's GPUs (``Evidence.prior_xids`` from earlier jobs are never a cause).  "On that GPU": the
same PCI bus id; an Xid without a bus id is never a consequence nor a cause (which GPU it hit is
unknown).  No I/O, no regexes: a pure function over the parsed events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ConsequenceRule:
    """``xids`` (the consequences) after any of ``after`` (the causes) on the same GPU are judged
    as that cause.  ``ref``: where the causal link comes from."""

    id: str
    xids: frozenset[int]
    after: frozenset[int]
    ref: str = ""


def judged_as(events: Sequence[tuple[str, int, str | None]],
              rules: Sequence[ConsequenceRule]) -> dict[int, tuple[int, str]]:
    """Which events a consequence rule re-judges.

    ``events``: ``[(kind, xid, bus_id)]`` in log order (``kind`` ``"xid"`` or ``"sxid"``; SXids
    are NVSwitch codes and never take part).  Returns ``{index: (cause xid, rule id)}`` for every
    event that is one rule's consequence of the nearest earlier cause event on the same bus id.
    Events without a bus id are left out.  O(len(events) * len(rules)).
    """
    out: dict[int, tuple[int, str]] = {}
    if not rules:
        return out
    last_cause: dict[tuple[str, str], int] = {}  # (rule id, bus id) -> newest cause xid so far
    for i, (kind, xid, bus) in enumerate(events):
        if kind != "xid" or bus is None:
            continue
        for rule in rules:
            if xid in rule.xids and (rule.id, bus) in last_cause and i not in out:
                out[i] = (last_cause[(rule.id, bus)], rule.id)
            if xid in rule.after:
                last_cause[(rule.id, bus)] = xid
    return out
