"""The drain reasons slurm-ft writes and reads: its leader (``slurm-ft:``), the reasons Slurm sets by
itself, and the reason of a verdict's drain, and the health check a health drain's reason names. No slurm_ft
imports: every room reads these."""

from __future__ import annotations

import re
from typing import Collection, NamedTuple

LEADER = "slurm-ft:"
#: What :func:`drain_node` returns in observe mode (the drain held back by the client's gate).
OBSERVED = "observed"
#: Rule prefix of a hardware verdict the trusted GPU checks confirmed (slurm_ft/node/epilog.py).
VERIFIED = "verified:"
#: Reasons slurmctld/slurmd set by themselves (not an admin's words): slurm-ft may replace them
#: with its own, more precise reason. From Slurm's source (node_mgr.c, job_mgr.c, req.c).
SLURM_REASONS = ("Not responding", "Prolog error", "Epilog error", "Kill task failed", "Node unexpectedly rebooted",
                 "batch job complete failure", "Prolog failed", "Epilog failed", "Job credential expired")


#: ``sinfo -R`` shows the first 20 characters of a reason: :func:`drain_reason` puts who and what
#: first (``slurm-ft: Xid 79 GPU``), where and which job after.
SINFO_REASON_WIDTH = 20


def drain_reason(job_id: int, verdict: dict) -> str:
    """The drain reason for a verdict (a dict with ``xids`` and ``rule``, as ``Verdict.to_dict()``
    or the journal gives it): ``slurm-ft: Xid 79 GPU 0000:10:00 (job 12)`` (every distinct Xid
    code, up to three: ``Xid 79,48 GPU ...``; the first one's bus id), else
    ``slurm-ft: <rule> (job 12)`` with a ``verified:`` prefix moved behind the rule
    (``slurm-ft: cuda-ecc-uncorrectable, verified (job 12)``). The rule is the fault's: a verdict
    whose rule does not name it (a job that exited 0 on a node with a trusted fault: rule
    ``clean-exit``) carries the winning hardware rule as ``cause``, and that is named
    (``slurm-ft: gpu-fallen-off-bus (job 12)``). The first 20 characters (what ``sinfo -R``
    shows) name slurm-ft and the fault; ``(job N)`` always ends it (the drain report reads it)."""
    xids = [x for x in verdict.get("xids") or [] if isinstance(x, dict) and "xid" in x]
    if xids:
        codes: list[str] = []
        for x in xids:
            if str(x["xid"]) not in codes:
                codes.append(str(x["xid"]))
        bus = next((x["bus_id"] for x in xids if x.get("bus_id")), None)
        where = f" GPU {bus}" if bus else ""
        return f"{LEADER} Xid {','.join(codes[:3])}{where} (job {job_id})"
    rule = str(verdict.get("cause") or verdict.get("rule") or "fault")
    if rule.startswith(VERIFIED):
        rule = f"{rule[len(VERIFIED):]}, verified"
    return f"{LEADER} {rule} (job {job_id})"


class FailedCheck(NamedTuple):
    """The failing health check a health drain's reason names: ``check`` (a check name,
    ``slurm_ft.health.config.CHECK_NAMES``) and ``gpu`` (its NVML GPU index, None for a node-level
    result)."""
    check: str
    gpu: int | None


#: The GPU a health reason's measurement names: the first ``GPU<n>`` word.
_GPU = re.compile(r"\bGPU(\d+)\b")


def health_reason(results) -> str | None:
    """The drain reason of a node's health results (``slurm_ft.health`` results: ``status``,
    ``check``, ``gpu``, ``measurement``): ``slurm-ft: <check>: [GPU<n> ]<measurement>`` for the
    first failing result (cut to Slurm's 200 characters), or None if none fails. ``GPU<n> `` is
    written unless the measurement already names that GPU first, as :func:`read_health_reason`
    reads it back (the daemon, from the node's record: slurm_ft.slurm.records.Node): one naming
    another GPU first, or ``GPU51`` for GPU 5, gets it."""
    failing = [r for r in results if r.status == "fail"]
    if not failing:
        return None
    first = failing[0]
    named = _GPU.search(first.measurement)
    named_first = named is not None and first.gpu is not None and int(named.group(1)) == first.gpu
    where = f"GPU{first.gpu} " if first.gpu is not None and not named_first else ""
    return f"{LEADER} {first.check}: {where}{first.measurement}"[:200]


def read_health_reason(reason: str, checks: Collection[str]) -> FailedCheck | None:
    """The :class:`FailedCheck` a reason :func:`health_reason` wrote names (``slurm-ft: <check>:
    [GPU<n> ]<measurement>``: the check, and the first ``GPU<n>`` word after it, else None), or
    None when ``reason`` is no such reason: not slurm-ft's, or its first ``<word>:`` is not one of
    ``checks`` (the check names: a verdict's, a bisect's or an admin's reason names none)."""
    if not reason.startswith(LEADER):
        return None
    check, sep, rest = reason[len(LEADER):].strip().partition(":")
    if not sep or check not in checks:
        return None
    m = _GPU.search(rest)
    return FailedCheck(check, int(m.group(1)) if m else None)


def bisect_reason(test: str, culprit: str, last_round: int, rounds: int) -> str:
    """``slurm-ft: bisect: <test> fails with n5 (round 3 of 3)``: names the test, as an admin must
    know what to rerun (cut to Slurm's 200 characters; slurm_ft.bisect finds the culprit)."""
    return f"{LEADER} bisect: {test} fails with {culprit} (round {last_round} of {rounds})"[:200]
