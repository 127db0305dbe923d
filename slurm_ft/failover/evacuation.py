"""``slurm-ft drain NODE --checkpoint``: an admin asks the daemon to evacuate the ft jobs running on
NODE, and follows what it does in the daemon journal. There is one evacuation protocol: the
daemon's state machine (:mod:`.machine`, ``_evacuation_request``) carries the request out exactly as
it carries out a health-check evacuation, within the same bounds (``[failover] max_evacuations``,
the requeue's ``priority_boost`` and ``priority_ceiling``, the job's ``--ft-ckpt-wait``).

Runs as root on the controller host (it drains a node and writes the daemon journal). Steps:

1. :func:`request`: drain NODE (an admin's earlier reason is kept: slurm_ft.drain), list the jobs
   running there (one light ``squeue -o``, slurm_ft.slurm.jobinfo), read each candidate once
   (``scontrol show job``) for its options fixed at submit, and journal one ``evacuate-request``
   row (status intent, target NODE) per ft-enabled job's running attempt;
2. the daemon, next cycle, starts the evacuation (``evacuate`` + ``ckpt-notify``) and answers the
   request (done), or answers it skipped with the reason (bound used up, job gone ...);
3. :func:`follow` reads only the journal (no Slurm call) until each job's attempt is decided or
   ``timeout_s`` passes, and returns one :class:`Outcome` per job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from slurm_ft.drain import LEADER, drain_node
from slurm_ft.errors import ConfigError
from slurm_ft.slurm.jobinfo import list_jobs
from slurm_ft.slurm import split_nodes
from slurm_ft.failover.machine import EVACUATE_REQUEST
from slurm_ft.failover.options import trusted_options

#: Seconds :func:`follow` allows, beyond the longest ``--ft-ckpt-wait`` of the jobs, for the daemon
#: to see the request (a poll interval), look at the ack (every 2 s) and requeue.
FOLLOW_MARGIN_S = 60.0
#: Seconds between two reads of the journal while following.
FOLLOW_POLL_S = 0.5
#: Journal actions that settle an attempt (machine.DECIDING, less ``decide``: its requeue follows).
_SETTLING = ("failover", "evacuation", "continue", "release")

#: What each result means for the admin. ``OK``: evacuated as asked (the command exits 0 only
#: when every job's result is one of them).
RESULTS = {
    "saved": "evacuated after its exit checkpoint",
    "unprepared": "evacuated without a checkpoint (nothing in the job catches its checkpoint signal)",
    "not-signalled": "evacuated without a checkpoint (the signal could not be delivered)",
    "failed": "evacuated; its checkpoint failed",
    "timeout": "evacuated without a checkpoint: it did not save within its wait",
    "ended": "ended instead of saving",
    "refused": "not evacuated",
    "requeue-refused": "not evacuated: Slurm refused the requeue",
    "no-answer": "no answer from the daemon in time",
    "skipped": "left running",
}
OK = ("saved", "unprepared")


@dataclass
class Request:
    """One journaled request: job, attempt, the ``evacuate-request`` row's id, the job's wait."""
    job_id: int
    attempt: int
    action_id: int
    ckpt_wait_s: float
    created: float


@dataclass
class Outcome:
    """What became of one job: ``result`` (a key of :data:`RESULTS`), ``detail`` (from the journal),
    ``excluded`` (the hostlist its requeue excluded), ``step``/``path`` of a saved checkpoint,
    ``waited_s`` from the signal to the ack or timeout (None: no signal), ``lines`` reported."""
    job_id: int
    attempt: int | None
    result: str
    detail: str = ""
    excluded: str = ""
    step: int | None = None
    path: str | None = None
    waited_s: float | None = None
    lines: list[str] = field(default_factory=list)

    requeued: bool = False

    @property
    def ok(self) -> bool:
        return self.result in OK

    def line(self) -> str:
        """``evacuated after its exit checkpoint; requeued excluding n1`` (one line, the journal's words)."""
        text = RESULTS[self.result]
        if self.detail and not self.ok:
            text += f": {self.detail}"
        if self.requeued:
            text += f"; requeued excluding {self.excluded or 'no node'}"
        return text


def drain(slurm, node: str, reason: str | None) -> str:
    """Drain ``node`` with ``slurm-ft: <reason>`` (an admin's reason already there is kept); a line
    for the admin. Raises SlurmCommandError if Slurm refuses."""
    reason = reason or "drained by admin"
    if not reason.startswith(LEADER):
        reason = f"{LEADER} {reason}"
    done = drain_node(slurm, node, reason)
    return {"drained": f"drained ({reason})",
            "kept-admin-reason": "already drained by an admin: reason kept",
            "already-drained": "already drained by slurm-ft: its first reason kept",
            "observed": f"not drained: [failover] mode = observe (would drain: {reason})"}.get(done, done)


def request(slurm, journal, node: str, failover_cfg, *, reason: str | None = None,
            only_jobs: list[int] | None = None, clock=None) -> tuple[str, list[Request], list[Outcome]]:
    """Drain ``node`` and journal an ``evacuate-request`` for each ft-enabled job running on it
    (or only ``only_jobs``). Returns (the drain line, the requests, the jobs left alone: not
    ft-enabled, bad options, not running). Raises SlurmCommandError (Slurm refused or timed out)
    or JournalError."""
    clock = clock or time.time
    line = drain(slurm, node, reason or "drain --checkpoint by admin")
    why = (reason or "drain --checkpoint by admin").removeprefix(LEADER).strip()
    requests: list[Request] = []
    left: list[Outcome] = []
    for row in list_jobs(slurm):
        if row.state != "RUNNING" or node not in split_nodes(row.nodes) \
                or (only_jobs is not None and row.job_id not in only_jobs):
            continue
        job = slurm.job(row.job_id)
        if job is None or job.state != "RUNNING" or node not in split_nodes(job.nodes):
            continue
        try:
            opts = trusted_options(job, journal, failover_cfg)
        except ConfigError as exc:
            left.append(Outcome(job.job_id, job.restart_count, "skipped", f"bad ft options: {exc}"))
            continue
        if not opts.enabled:
            left.append(Outcome(job.job_id, job.restart_count, "skipped", "not ft-enabled"))
            continue
        journal.upsert_attempt(job.job_id, job.restart_count, nodes=job.nodes or None, start=job.start_time,
                               state=job.state)
        aid = journal.intend(job.job_id, job.restart_count, EVACUATE_REQUEST, node, why)
        requests.append(Request(job.job_id, job.restart_count, aid, float(opts.ckpt_wait_s), clock()))
    for jid in sorted(set(only_jobs or ()) - {r.job_id for r in requests} - {o.job_id for o in left}):
        left.append(Outcome(jid, None, "skipped", f"not running on {node}"))
    return line, requests, left


def default_timeout_s(requests: list[Request]) -> float:
    """How long :func:`follow` waits by default: the longest wait of the jobs + :data:`FOLLOW_MARGIN_S`."""
    return max((r.ckpt_wait_s for r in requests), default=0.0) + FOLLOW_MARGIN_S


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def follow(journal, requests: list[Request], timeout_s: float, *, report=lambda line: None,
           clock=None, sleep=None, poll_s: float = FOLLOW_POLL_S) -> list[Outcome]:
    """Read the journal until every request's attempt is settled or ``timeout_s`` has passed;
    ``report(line)`` each step as it appears (signal sent, checkpoint acked, requeued). Reads only
    the journal. Returns one :class:`Outcome` per request, in order. ``clock``/``sleep``: default
    ``time.time`` and :func:`_pause`."""
    clock, sleep = clock or time.time, sleep or _pause
    deadline = clock() + timeout_s
    seen: dict[int, set[int]] = {r.job_id: set() for r in requests}
    done: dict[int, Outcome] = {}
    while True:
        for r in requests:
            if r.job_id in done:
                continue
            rows = [a for a in journal.actions(r.job_id, r.attempt) if a["id"] == r.action_id
                    or a["created"] >= r.created - 1.0]
            for a in rows:
                if a["id"] in seen[r.job_id] or a["status"] == "intent":
                    continue
                seen[r.job_id].add(a["id"])
                line = _line(a)
                if line:
                    report(f"job {r.job_id}: {line}")
            out = settle(r, rows)
            if out is not None:
                done[r.job_id] = out
                report(f"job {r.job_id}: {out.line()}")
        if len(done) == len(requests) or clock() >= deadline:
            break
        sleep(poll_s)
    for r in requests:
        if r.job_id not in done:
            done[r.job_id] = Outcome(r.job_id, r.attempt, "no-answer",
                                     f"the journal shows no outcome within {timeout_s:g} s (is `slurm-ft daemon` "
                                     "running? the request stays journaled and is carried out when it runs)")
            report(f"job {r.job_id}: {RESULTS['no-answer']}: {done[r.job_id].detail}")
    return [done[r.job_id] for r in requests]


def _line(a) -> str:
    """One line for the admin about a finished journal row of the evacuation, or ''."""
    kind, status, detail = a["action"], a["status"], a["detail"] or ""
    if kind == "ckpt-notify":
        return f"checkpoint signal: {detail}" if status != "failed" else f"checkpoint signal not sent: {detail}"
    if kind == "ckpt-ack":
        return f"checkpoint {detail}" if status == "done" else f"checkpoint failed ({detail})"
    if kind == "ckpt-timeout":
        return f"checkpoint timeout: {detail}"
    if kind == EVACUATE_REQUEST and status != "done":
        return f"request {status}: {detail}"
    return ""


def settle(r: Request, rows: list) -> Outcome | None:
    """The outcome of request ``r`` from its attempt's journal rows, or None while unsettled."""
    req = next((a for a in rows if a["id"] == r.action_id), None)
    if req is not None and req["status"] not in ("intent", "done"):
        return Outcome(r.job_id, r.attempt, "refused", req["detail"] or req["status"])
    settled = [a for a in rows if a["action"] in _SETTLING and a["status"] != "intent"]
    finals = [a for a in rows if a["action"] == "decide" and not (a["detail"] or "").startswith(("evacuate:",
                                                                                                 "continue:"))]
    if not settled and not finals:
        return None
    notes = [a for a in rows if a["action"] == "ckpt-notify"]
    acks = [a for a in rows if a["action"] == "ckpt-ack"]
    timeouts = [a for a in rows if a["action"] == "ckpt-timeout"]
    out = Outcome(r.job_id, r.attempt, "ended")
    if notes:
        end = (acks or timeouts or [None])[-1]
        out.waited_s = end["created"] - notes[-1]["created"] if end else None
    if acks:
        for part in (acks[-1]["detail"] or "").split()[1:]:
            key, _, val = part.partition("=")
            if key == "step" and val.isdigit():
                out.step = int(val)
            elif key == "path":
                out.path = val
    last = (settled or finals)[-1]
    if last["action"] == "evacuation" and last["status"] != "done":
        out.result, out.detail = "requeue-refused", last["detail"] or ""
        return out
    if last["action"] != "evacuation":
        out.detail = last["detail"] or last["action"]
        return out
    out.excluded, out.requeued = last["target"] or "", True
    if acks and acks[-1]["status"] == "done":
        out.result = "saved"
    elif acks:
        out.result, out.detail = "failed", acks[-1]["detail"] or ""
    elif timeouts:
        out.result, out.detail = "timeout", timeouts[-1]["detail"] or ""
    elif notes and notes[-1]["status"] == "skipped":
        out.result = "unprepared"
    elif notes and notes[-1]["status"] == "failed":
        out.result, out.detail = "not-signalled", notes[-1]["detail"] or ""
    else:
        out.result, out.detail = "ended", last["detail"] or ""
    return out
