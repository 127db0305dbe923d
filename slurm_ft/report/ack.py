"""Acknowledging a node's hardware faults (``slurm-ft report --ack NODE``): an admin says the
faults counted so far are understood (test drains, a repaired or replaced GPU), so they stop
making the node and its GPUs flapping / RMA candidates.

An acknowledgement is a journal row (daemon journal, action ``report-ack``, target the node, detail
the admin's reason, job id 0): auditable, never a deletion. :func:`slurm_ft.report.collect.collect`
counts only faults *after* a node's newest acknowledgement toward flapping, and shows the ones
before it as acknowledged. Root only (it writes the daemon journal).
"""

from __future__ import annotations

from slurm_ft.slurm import split_nodes

#: Journal action of an acknowledgement.
ACK_ACTION = "report-ack"
#: Longest reason kept (the journal boundary bounds it too).
MAX_REASON = 200


def acknowledge(journal, nodes: str, reason: str, *, by: str = "") -> list[str]:
    """Journal an acknowledgement for each node of the hostlist ``nodes`` (``n[1-3]``); returns
    the node names. ``reason`` is required (why the faults do not count: "test drains", "GPU
    replaced, RMA 1234"). Raises :class:`slurm_ft.errors.HostlistError` on a malformed hostlist,
    ``ValueError`` on an empty one or an empty reason."""
    names = split_nodes(nodes)
    reason = " ".join(reason.split())[:MAX_REASON]
    if not names:
        raise ValueError("no node to acknowledge")
    if not reason:
        raise ValueError("an acknowledgement needs a reason (--ack-reason)")
    detail = f"{reason} (by {by})" if by else reason
    for node in names:
        journal.record(0, 0, ACK_ACTION, node, detail)
    return names


def acks(journal) -> dict[str, tuple[float, str]]:
    """node -> (time, reason) of its newest acknowledgement, read from the daemon journal."""
    out: dict[str, tuple[float, str]] = {}
    for r in journal.db.query("SELECT target, detail, created FROM actions WHERE action = ? ORDER BY created",
                              [ACK_ACTION]):
        out[r["target"]] = (r["created"] or 0.0, r["detail"] or "")
    return out
