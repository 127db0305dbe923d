"""The requeue daemon: verdicts in, Slurm actions out, every step journaled.

Runs as root on the controller host (``slurm-ft daemon``; ``--once`` for one cycle). Each cycle:

1. read every node's verdict mailbox (one ``sinfo --json``) into the journal;
2. read every job (one ``squeue --json``); for each ft-enabled job, record the attempt;
3. for an attempt that ended: decide (``policy.decide``) and act — drain blamed nodes, requeue the
   job in place (same job id) with the nodes added to ``ExcNodeList``, raise its priority above
   every waiting job, and clear Slurm's 121 s requeue delay (``StartTime=now`` once the job has left
   COMPLETING; re-applied each cycle while the job is pending and not yet eligible).

Every action is written to the journal as an *intent* before it is taken and marked done after.
"""

from __future__ import annotations

import logging
import re
import signal
import time

from ..errors import ConfigError, SlurmCommandError, SlurmFTError
from ..drain import LEADER, drain_node
from ..journal import open_journal
from ..slurm import Job, Slurm
from . import jobspec, mailbox, policy

log = logging.getLogger("slurm_ft.daemon")
MAX_PRIORITY = 4294967293
#: Rule ids of prolog health-check verdicts (``health:<check>``).
HEALTH_RULE = "health:"


def drain_reason(job_id: int, verdict: dict) -> str:
    """``slurm-ft: Xid 79 on 0000:10:00 (job 12)``-style reason for a node's drain."""
    xids = verdict.get("xids") or []
    if xids:
        x = xids[0]
        where = f" on {x['bus_id']}" if x.get("bus_id") else ""
        return f"{LEADER} Xid {x['xid']}{where} (job {job_id})"
    return f"{LEADER} {verdict.get('rule', 'fault')} (job {job_id})"


class Daemon:
    def __init__(self, cfg, slurm: Slurm | None = None):
        self.cfg = cfg
        self.slurm = slurm or Slurm.from_config(cfg)
        self.journal = open_journal(cfg.journal.path)
        self._stop = False

    # ------------------------------------------------------------------ loop
    def run(self, once: bool = False) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        log.info("slurm-ft daemon started (journal %s)", self.journal.path)
        while not self._stop:
            t0 = time.monotonic()
            try:
                self.cycle()
            except SlurmFTError as exc:
                log.error("cycle failed: %s", exc)
                if once:
                    raise
            if once:
                return
            time.sleep(max(0.0, self.cfg.failover.poll_interval_s - (time.monotonic() - t0)))
        log.info("slurm-ft daemon stopped")

    def cycle(self) -> None:
        """One pass over mailboxes and jobs."""
        self.ingest_mailboxes()
        jobs = self.slurm.jobs()
        self._top_priority = max((j.priority or 0 for j in jobs if j.state in ("PENDING", "RUNNING")), default=0)
        for job in jobs:
            try:
                self.handle(job)
            except SlurmCommandError as exc:
                log.error("job %s: %s", job.job_id, exc)

    def ingest_mailboxes(self) -> int:
        """Copy new verdict records from node mailbox fields into the journal; returns how many."""
        field = self.cfg.failover.mailbox_field.lower()
        new = 0
        for node in self.slurm.nodes():
            for rec in mailbox.parse(getattr(node, field, "")):
                if self.journal.mailbox_seen(node.name, rec.key):
                    continue
                xids = [{"xid": x, "bus_id": b or None} for x, b in rec.xids]
                self.journal.add_verdict(rec.job_id, rec.attempt, node.name, rec.verdict, rec.rule, xids, [],
                                         "drain_node" if rec.verdict == "hardware" else "none", rec.exit_code,
                                         source="mailbox", created=rec.time)
                self.journal.mark_mailbox_seen(node.name, rec.key)
                log.info("verdict job %s attempt %s on %s: %s (%s)", rec.job_id, rec.attempt, node.name,
                         rec.verdict, rec.rule)
                new += 1
        return new

    # ------------------------------------------------------------------ per job
    def handle(self, job: Job) -> None:
        if job.state == "PENDING" and job.restart_count > 0:
            health = [v for v in self.journal.verdicts(job.job_id, job.restart_count - 1)
                      if v["rule"].startswith(HEALTH_RULE)]
            if health and not any(a["action"] == "release" and a["status"] == "done"
                                  for a in self.journal.actions(job.job_id, job.restart_count - 1)):
                self.release_after_prolog_failure(job, health)
                return
        try:
            opts = jobspec.from_comment(job.comment, self.cfg.failover.retries)
        except ConfigError as exc:
            if self.journal.job(job.job_id) is None:
                log.warning("job %s: bad ft options: %s", job.job_id, exc)
                self.journal.upsert_job(job.job_id, name=job.name, user=job.user, ft_enabled=0,
                                        ft_state=policy.NOT_CONFIGURED)
            return
        if not opts.enabled:
            return
        row = self.journal.job(job.job_id)
        if row is None:
            self.journal.upsert_job(job.job_id, name=job.name, user=job.user, ft_enabled=1, retries=opts.retries,
                                    ft_state=policy.RUNNING, excluded_nodes="")
            row = self.journal.job(job.job_id)
        attempt = job.restart_count
        if job.state != "PENDING":
            self.journal.upsert_attempt(job.job_id, attempt, nodes=job.nodes or None, start=job.start_time,
                                        end=job.end_time if job.ended else None, exit_code=job.exit_code,
                                        signal=job.exit_signal, state=job.state)
        state = row["ft_state"]
        if job.state == "PENDING" and state in (policy.FAILOVER, policy.REQUEUED):
            self._clear_requeue_delay(job)
            return
        if job.state == "RUNNING" and state in (policy.FAILOVER, policy.REQUEUED):
            self.journal.set_ft_state(job.job_id, policy.RUNNING)
            return
        if not job.ended or state in policy.FINAL_STATES or self._decided(job.job_id, attempt):
            return
        verdicts = self.journal.verdicts(job.job_id, attempt)
        since_end = time.time() - (job.end_time or time.time())
        failovers = sum(1 for a in self.journal.actions(job.job_id) if a["action"] == "failover" and a["status"] == "done")
        decision = policy.decide(slurm_state=job.state, failovers_done=failovers, retries=row["retries"],
                                 verdicts=verdicts, job_nodes=_split_nodes(job.nodes), seconds_since_end=since_end)
        if decision.kind == "wait":
            return
        if decision.kind == "failover":
            self.failover(job, decision)
        else:
            self.journal.record(job.job_id, attempt, "decide", detail=f"{decision.kind}: {decision.reason}")
            self.journal.set_ft_state(job.job_id, decision.kind)
            log.info("job %s attempt %s: %s (%s)", job.job_id, attempt, decision.kind, decision.reason)
            if decision.kind == policy.MAX_RETRIES:
                self._drain(job, decision)

    def release_after_prolog_failure(self, job: Job, verdicts: list[dict]) -> None:
        """A prolog health check failed the node before the job ran: Slurm requeued the job held
        (``launch_failed_requeued_held`` on 22.05) with the 121 s delay. Send it elsewhere now:
        exclude the node, release, restore its priority, ``StartTime=now``. Applies to every job
        (ft-enabled or not), and does not count against the retry budget: the job never ran."""
        attempt = job.restart_count - 1
        blamed = sorted({v["node"] for v in verdicts})
        excluded = sorted(set(_split_nodes(job.excluded_nodes)) | set(blamed))
        aid = self.journal.intend(job.job_id, attempt, "release", ",".join(blamed),
                                  f"prolog health check failed ({verdicts[0]['rule']}); ExcNodeList={','.join(excluded)}")
        log.info("job %s: prolog health check failed on %s: releasing elsewhere", job.job_id, ",".join(blamed))
        self.slurm.update_job(job.job_id, ExcNodeList=",".join(excluded))
        if job.priority == 0:
            self.slurm.release(job.job_id)
        fields = {"StartTime": "now"}
        if self.cfg.failover.priority_boost:
            fields["Priority"] = str(min(MAX_PRIORITY, self._top_priority + self.cfg.failover.priority_boost))
        self.slurm.update_job(job.job_id, **fields)
        self.journal.finish(aid)

    def _decided(self, job_id: int, attempt: int) -> bool:
        return any(a["action"] in ("decide", "failover") and a["status"] == "done"
                   for a in self.journal.actions(job_id, attempt))

    def failover(self, job: Job, decision: policy.Decision) -> None:
        """Drain, requeue in place, exclude, boost, clear the requeue delay — each step journaled."""
        attempt = job.restart_count
        j = self.journal
        aid = j.intend(job.job_id, attempt, "failover", ",".join(decision.blamed_nodes), decision.reason)
        j.set_ft_state(job.job_id, policy.FAILOVER)
        log.info("job %s attempt %s: failover (%s), blaming %s", job.job_id, attempt, decision.reason,
                 ",".join(decision.blamed_nodes) or "no node")
        self._drain(job, decision)
        step = j.intend(job.job_id, attempt, "requeue", str(job.job_id))
        try:
            self.slurm.requeue(job.job_id)
        except SlurmCommandError as exc:
            j.finish(step, "failed", str(exc))
            j.finish(aid, "failed", f"requeue refused: {exc}")
            j.set_ft_state(job.job_id, policy.INTERNAL_ERROR)
            return
        j.finish(step)
        excluded = sorted(set(_split_nodes(job.excluded_nodes)) | set(self._blamed_so_far(job.job_id)) |
                          set(decision.blamed_nodes))
        fields = {"AdminComment": f"{LEADER}{policy.FAILOVER}"}
        if excluded:
            fields["ExcNodeList"] = ",".join(excluded)
        if self.cfg.failover.priority_boost:
            fields["Priority"] = str(min(MAX_PRIORITY, max(self._top_priority, job.priority or 0)
                                         + self.cfg.failover.priority_boost))
        step = j.intend(job.job_id, attempt, "update", str(job.job_id),
                        " ".join(f"{k}={v}" for k, v in fields.items()))
        self.slurm.update_job(job.job_id, **fields)
        j.finish(step)
        j.upsert_job(job.job_id, excluded_nodes=",".join(excluded))
        fresh = self.slurm.job(job.job_id)
        if fresh is not None:
            self._clear_requeue_delay(fresh)
        j.finish(aid)

    def _blamed_so_far(self, job_id: int) -> list[str]:
        return [a["target"] for a in self.journal.actions(job_id) if a["action"] == "drain" and a["target"]]

    def _drain(self, job: Job, decision: policy.Decision) -> None:
        if not self.cfg.failover.drain:
            return
        for node in decision.blamed_nodes:
            verdict = next((v for v in decision.verdicts if v["node"] == node), {})
            reason = drain_reason(job.job_id, verdict)
            step = self.journal.intend(job.job_id, job.restart_count, "drain", node, reason)
            try:
                outcome = drain_node(self.slurm, node, reason)
                self.journal.finish(step, "done" if outcome == "drained" else "skipped",
                                    None if outcome == "drained" else f"{outcome}: {reason}")
            except SlurmCommandError as exc:
                self.journal.finish(step, "failed", str(exc))

    def _clear_requeue_delay(self, job: Job) -> None:
        """``StartTime=now`` while a failed-over job waits on Slurm's requeue delay (it only sticks
        once the job has left COMPLETING, so this runs every cycle until the job is eligible)."""
        if job.completing:
            return
        eligible = job.raw.get("eligible_time")
        eligible = eligible.get("number") if isinstance(eligible, dict) else eligible
        if eligible and eligible <= time.time() + 1:
            if self.journal.job(job.job_id)["ft_state"] == policy.FAILOVER:
                self.journal.set_ft_state(job.job_id, policy.REQUEUED)
                self.slurm.update_job(job.job_id, AdminComment=f"{LEADER}{policy.REQUEUED}")
            return
        step = self.journal.intend(job.job_id, job.restart_count, "start-now", str(job.job_id))
        self.slurm.update_job(job.job_id, StartTime="now")
        self.journal.finish(step)


def _split_nodes(expr: str) -> list[str]:
    """Expand a hostlist expression (``n[1-3],gpu7``) into names."""
    if not expr or expr in ("(null)", "None"):
        return []
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", expr):
        prefix, ranges = m.group(1), m.group(2)
        if not ranges:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            a, _, b = part.partition("-")
            width = len(a)
            for i in range(int(a), int(b or a) + 1):
                out.append(f"{prefix}{i:0{width}d}")
    return out
