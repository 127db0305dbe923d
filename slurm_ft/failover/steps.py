"""The Slurm steps of a failover, shared by the daemon and checkpoint-before-exit.

Each step is journaled (intent, then done/failed) and idempotent against Slurm's own state, so it
may be run again after a crash: the requeue happens only while Slurm's restart count still equals
the attempt being failed over (never twice); exclusion and priority are plain assignments.
Facts: shared/SLURM_LAB_NOTES.md ("Requeue, exclude, priority", measured on 22.05).
"""

from __future__ import annotations

import time

from slurm_ft.errors import SlurmCommandError
from slurm_ft.slurm import Job, compress_nodes, split_nodes
from slurm_ft.failover import policy
from slurm_ft.failover.options import admin_comment

#: Highest priority ``scontrol update Priority=`` takes (priority is a uint32; 0xFFFFFFFF = infinite).
MAX_PRIORITY = 4294967293


def top_priority(jobs: list[Job], boosted: set[int] | frozenset[int] = frozenset()) -> int:
    """Highest priority among pending and running jobs that slurm-ft did not boost (``boosted``:
    their ids). A failed-over job goes above it, so boosts never ratchet: a second failover lands
    at the same height as the first, not above it."""
    return max((j.priority or 0 for j in jobs if j.state in ("PENDING", "RUNNING") and j.job_id not in boosted),
               default=0)


def boosted_priority(top: int, boost: int, ceiling: int = 0, current: int = 0) -> int:
    """The priority to set: ``top + boost``, at most ``ceiling`` (``[failover] priority_ceiling``;
    0 = Slurm's maximum); 0 (keep Slurm's priority) when ``boost`` is 0 or the job's ``current``
    priority is already that high."""
    if not boost:
        return 0
    target = min(ceiling or MAX_PRIORITY, MAX_PRIORITY, top + boost)
    return target if target > current else 0


def node_count(job: Job) -> int:
    """Nodes the job needs (``node_count``; 22.05 int, 24.11 ``{"number": n}``)."""
    for key in ("node_count", "num_nodes"):
        v = job.raw.get(key)
        v = v.get("number") if isinstance(v, dict) else v
        if isinstance(v, int) and v > 0:
            return v
    return max(1, len(split_nodes(job.nodes)))


def usable_nodes(job: Job, nodes: list, excluded: list[str]) -> int:
    """Nodes of the job's partition that are not excluded (drained or down nodes count: an admin
    may bring them back; an excluded one is never used by this job again)."""
    part = job.raw.get("partition", "")
    return sum(1 for n in nodes
               if not (part and n.partitions and part not in n.partitions)
               and n.name not in excluded)


def requeue_in_place(slurm, journal, job_id: int, attempt: int) -> str | None:
    """``scontrol requeue`` (same job id, priority kept) unless Slurm already requeued this attempt.
    Returns None on success (or nothing to do), else Slurm's refusal."""
    fresh = slurm.job(job_id)
    if fresh is None or fresh.restart_count != attempt or fresh.state == "PENDING":
        return None
    step = journal.intend(job_id, attempt, "requeue", str(job_id))
    try:
        slurm.requeue(job_id)
    except SlurmCommandError as exc:
        # a timeout may come after slurmctld did it: Slurm's restart count says
        try:
            after = slurm.job(job_id)
        except SlurmCommandError:
            after = None
        if after is not None and after.restart_count > attempt:
            journal.finish(step, "done", f"took effect despite: {exc}")
            return None
        journal.finish(step, "failed", str(exc))
        return str(exc)
    journal.finish(step)
    return None


def exclude_and_boost(slurm, journal, job_id: int, attempt: int, blamed: list[str], *, nodes: list,
                      top: int, priority_boost: int, ceiling: int = 0, unsatisfiable: str = "hold",
                      avoid: list[str] = ()) -> str:
    """After the requeue: ``ExcNodeList`` = every node blamed in any attempt, ``Priority`` above
    every waiting job, ft state in ``AdminComment``; releases a job Slurm requeued held.

    If the job cannot run with those nodes excluded (it requires one with ``-w``, needs more
    nodes than its partition has left, a feature or reservation only they provide:
    :func:`slurm_ft.failover.constraints.check`), Slurm would leave it pending with
    ``BadConstraints`` forever. Then ``unsatisfiable`` (``[failover] unsatisfiable``) decides:
    ``"hold"`` holds it (``scontrol hold``; ``AdminComment`` ``slurm-ft: held: <reason>``;
    journal action ``hold`` with the reason; ft state ``held``; a warning in the daemon log);
    ``"relax"`` drops the excluded nodes from its required node list (``scontrol update
    ReqNodeList=<rest>``, verified on 22.05; journal action ``relax``) where that suffices and
    goes on with the failover, else holds. ``avoid``: nodes excluded too, but only where the job
    can still run without them (never a hold or a relax for them: they are suspects, not blamed).
    Returns ``"requeued"`` or ``"held"``."""
    fresh = slurm.job(job_id)
    if fresh is None:
        return "requeued"
    blamed_before = [a["target"] for a in journal.actions(job_id) if a["action"] == "drain" and a["target"]]
    excluded = sorted(set(split_nodes(fresh.excluded_nodes)) | set(blamed_before) | set(blamed))
    if set(avoid) - set(excluded):
        from slurm_ft.failover import constraints
        wider = sorted(set(excluded) | set(avoid))
        # a reservation is not read for a suspect: a job in one keeps its nodes
        if not (fresh.raw or {}).get("resv_name") and constraints.check(fresh, nodes, wider).runnable:
            excluded = wider
    fit = feasibility(slurm, journal, fresh, attempt, excluded, blamed, nodes=nodes, unsatisfiable=unsatisfiable)
    outcome = "requeued"
    if not fit.runnable:
        fields = hold(slurm, journal, job_id, attempt, fit.reason)
        outcome = "held"
    else:
        if fresh.state == "PENDING" and fresh.priority == 0:
            # Slurm requeued it held (e.g. launch_failed_requeued_held after a prolog failure)
            slurm.run("scontrol", "release", str(job_id), check=False)
        fields = {"AdminComment": admin_comment(journal, job_id, policy.FAILOVER)}
        if excluded:
            fields["ExcNodeList"] = compress_nodes(excluded)
        target = boosted_priority(top, priority_boost, ceiling, fresh.priority or 0)
        if target:
            fields["Priority"] = str(target)
        if start_now(journal, fresh, attempt, excluded):
            fields["StartTime"] = "now"
    step = journal.intend(job_id, attempt, "update", str(job_id), " ".join(f"{k}={v}" for k, v in fields.items()))
    try:
        slurm.update_job(job_id, **fields)
        journal.finish(step)
    except SlurmCommandError as exc:
        journal.finish(step, "failed", str(exc))
    journal.upsert_job(job_id, excluded_nodes=compress_nodes(excluded))
    return outcome


def start_now(journal, fresh: Job, attempt: int, excluded: list[str]) -> bool:
    """Whether the failover's one ``scontrol update`` may carry ``StartTime=now`` too (issue 23:
    one RPC, and one chance less to meet slurmctld's up-to-1-s hold of updates while it asks
    slurmdbd for the requeued run's accounting index): only for a job Slurm has finished
    requeueing (not COMPLETING: until then its requeue delay is set again at the end) whose
    every node of ``attempt`` is excluded (elsewhere, no slurmd there holds the revoked
    credential of the run just ended: see :func:`clear_requeue_delay`). Otherwise the daemon
    clears the delay later (machine._restart)."""
    if fresh.completing or fresh.state != "PENDING":
        return False
    left = {n for a in journal.attempts(fresh.job_id) if a["attempt"] == attempt for n in split_nodes(a.get("nodes") or "")}
    return bool(left) and left <= set(excluded)


def feasibility(slurm, journal, fresh: Job, attempt: int, excluded: list[str], blamed, *, nodes: list,
                unsatisfiable: str = "hold"):
    """Whether ``fresh`` (the job as Slurm shows it now) can run with ``excluded`` excluded
    (:func:`slurm_ft.failover.constraints.check`, its reservation read with ``scontrol show
    reservation -o``); under ``unsatisfiable = "relax"`` an unrunnable job pinned to excluded nodes
    gets ``ReqNodeList=<the rest>`` (journal action ``relax``) where that suffices. Returns the
    :class:`~slurm_ft.failover.constraints.Feasibility` that remains (runnable after a relax)."""
    import logging

    from slurm_ft.slurm import parse_kv_line
    from slurm_ft.failover import constraints

    log = logging.getLogger(__name__)
    job_id = fresh.job_id
    resv, resv_name = None, fresh.raw.get("resv_name") or ""
    if isinstance(resv_name, str) and resv_name:
        try:  # 22.05 has no --json here; an unknown reservation (rc 1) is simply not checked
            proc = slurm.run("scontrol", "show", "reservation", "-o", resv_name, check=False)
            resv = parse_kv_line(proc.stdout) if proc.returncode == 0 else None
        except SlurmCommandError as exc:
            log.debug("job %s: reservation %s not read: %s", job_id, resv_name, exc)
    fit = constraints.check(fresh, nodes, excluded, blamed=blamed, reservation=resv,
                            cause=constraints.fault_cause(journal.verdicts(job_id, attempt), blamed))
    for note in fit.notes:
        log.debug("job %s: constraint check: %s", job_id, note)
    if not fit.runnable and unsatisfiable == constraints.RELAX and fit.relaxed_nodelist is not None:
        step = journal.intend(job_id, attempt, "relax", str(job_id), fit.relax_detail)
        try:
            slurm.update_job(job_id, ReqNodeList=fit.relaxed_nodelist)
            journal.finish(step)
            log.warning("job %s: relaxed: %s", job_id, fit.relax_detail)
            fit = constraints.Feasibility(True)
        except SlurmCommandError as exc:
            journal.finish(step, "failed", f"{fit.relax_detail}; refused: {exc}")
    return fit


def hold(slurm, journal, job_id: int, attempt: int, reason: str) -> dict[str, str]:
    """Hold a job that cannot run where slurm-ft lets it (``scontrol hold``; journal action
    ``hold`` with ``reason``; ft state ``held``; a warning in the log). Returns the job fields
    still to set: ``AdminComment`` = ``slurm-ft: held: <reason>`` (+ the job's options record)."""
    import logging

    slurm.run("scontrol", "hold", str(job_id), check=False)
    journal.record(job_id, attempt, "hold", str(job_id), reason)
    journal.set_ft_state(job_id, policy.HELD)
    logging.getLogger(__name__).warning("job %s: held: %s", job_id, reason)
    return {"AdminComment": admin_comment(journal, job_id, f" held: {reason}", "")}


def clear_requeue_delay(slurm, journal, job: Job, *, start: str | None = "now") -> bool:
    """``StartTime=<start>`` while a requeued job waits on Slurm's requeue delay (it only sticks
    once the job has left COMPLETING; call it every cycle until it returns True = job eligible).
    Moves the ft state from failover-in-progress to requeued once the job is eligible.

    ``start``: ``"now"`` (a failover or evacuation that excluded the node; the daemon also gives
    it to a continuation once two seconds have passed since its requeue), or None to keep
    Slurm's delay (a retry that excluded no node: the job may land on the node it just left,
    whose slurmd refuses it while the revoked job credential is current — measured on 22.05:
    "Killing non-startable batch JobId=N: Job credential revoked" when restarted there at once —
    and a retry nobody was blamed for must not jump the queue)."""
    if job.completing:
        return False
    eligible = job.raw.get("eligible_time")
    eligible = eligible.get("number") if isinstance(eligible, dict) else eligible
    if eligible and eligible <= time.time() + 3:
        row = journal.job(job.job_id)
        if row is not None and row["ft_state"] == policy.FAILOVER:
            journal.set_ft_state(job.job_id, policy.REQUEUED)
            try:
                slurm.update_job(job.job_id, AdminComment=admin_comment(journal, job.job_id, policy.REQUEUED))
            except SlurmCommandError:
                pass
        return True
    if start is None:
        return False
    step = journal.intend(job.job_id, job.restart_count, "start-now", str(job.job_id), f"StartTime={start}")
    slurm.update_job(job.job_id, StartTime=start)
    journal.finish(step)
    return False
