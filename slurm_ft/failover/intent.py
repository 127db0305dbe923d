"""The daemon's durable failover record in the job's own Slurm record, for when its journal
cannot be written (a full disk, a read-only remount, an I/O error: slurm_ft.journal.trouble).

While the journal refuses writes, the daemon keeps deciding and acting; its rows wait in memory
(:attr:`slurm_ft.journal.store.Journal.unwritten`) until the journal takes them. A daemon
restarted in that time would have lost them, and could book the same failover twice (a job
pending again with no decision on record looks requeued by an admin or by Slurm). So every
AdminComment slurm-ft writes also carries one typed word, :data:`WORD`
``slurm-ft-fo=<attempt>:<count>``: the last attempt slurm-ft failed over and how many failovers
it has made of the job. slurmctld saves it with the job (``StateSaveLocation``); only Slurm's
admins and slurm-ft can set AdminComment (the owner cannot), and the owner-writable Comment is
never read for it.

:func:`recover` (the daemon, before planning a job): when that word names an attempt whose
failover the journal does not hold, the failover is booked again from it (action ``failover``,
status ``done``, detail ``{"reason": "recovered from AdminComment ...", "blamed": []}``), once,
so the state machine sees the attempt decided and the retry budget spent.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

from slurm_ft.failover import policy

log = logging.getLogger("slurm_ft.daemon")
#: The leading text of the word (not ``ft:`` nor ``slurm-ft:``: those are the options record).
WORD = "slurm-ft-fo="
_SHAPE = re.compile(r"slurm-ft-fo=([0-9]{1,9}):([0-9]{1,9})")
#: Whitespace as the AdminComment's words are split (slurm_ft.failover.jobspec).
_WS = re.compile("[ \t\n\x0b\x0c\r]+")
RECOVERED = "recovered from the job's AdminComment: the journal was not writable when the daemon stopped"


@dataclass(frozen=True)
class Record:
    attempt: int     # the last attempt slurm-ft failed over
    count: int       # failovers slurm-ft made of the job, that one included


def word(actions) -> str:
    """``slurm-ft-fo=<attempt>:<count>`` from a job's journal actions (dicts with ``action``,
    ``attempt``, ``status``; a failover begun counts), or "" before its first failover."""
    fo = [a for a in actions if a["action"] == "failover" and a["status"] in ("intent", "done")]
    if not fo:
        return ""
    return f"{WORD}{max(a['attempt'] for a in fo)}:{len(fo)}"


def parse(admin_comment: str | None) -> Record | None:
    """The record in an AdminComment (the first word of exactly that shape), or None."""
    for w in _WS.split(admin_comment or ""):
        m = _SHAPE.fullmatch(w)
        if m:
            return Record(int(m.group(1)), int(m.group(2)))
    return None


def recover(journal, job) -> bool:
    """Book again a failover the job's AdminComment records and the journal lacks (see the module
    doc); True when one was booked. ``job``: a :class:`slurm_ft.slurm.Job` as Slurm shows it now:
    only a failover of an attempt before its current one (``restart_count``) is booked."""
    rec = parse(job.admin_comment)
    if rec is None or rec.attempt >= job.restart_count:
        return False
    if any(a["action"] == "failover" and a["attempt"] == rec.attempt for a in journal.actions(job.job_id)):
        return False
    journal.record(job.job_id, rec.attempt, "failover", "", json.dumps({"reason": RECOVERED, "blamed": []}),
                   kind="unblamed")
    row = journal.job(job.job_id) or {}
    if job.state == "PENDING" and job.restart_count == rec.attempt + 1 and \
            (row.get("ft_state") or policy.RUNNING) == policy.RUNNING:
        journal.set_ft_state(job.job_id, policy.FAILOVER)
    log.warning("job %s: failover of attempt %s booked from its AdminComment (%s%s:%s): the journal had lost "
                "it", job.job_id, rec.attempt, WORD, rec.attempt, rec.count)
    return True
