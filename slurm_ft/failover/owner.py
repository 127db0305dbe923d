"""What the job's owner is told when slurm-ft decides a job's final ft state.

Runs in the daemon (controller, root), from :meth:`slurm_ft.failover.effects.Effects._Final`.
Slurm lets a job's live record be updated only while the job is pending or running (measured on
22.05: ``scontrol update JobId=J AdminComment=...`` on a finished job answers ``Job has already
finished``), so the final state goes where Slurm still takes it:

- a pending (held) job: its live ``AdminComment`` (``scontrol show job``);
- a finished job: its accounting record (``sacctmgr -i modify job where jobid=J set
  AdminComment=...``, the one job field besides Comment, DerivedExitCode, SystemComment and
  WCKey that sacctmgr may change after the end; ``sacct -o AdminComment`` shows it; measured
  0.27 s on the lab). Without slurmdbd the command fails and only ft-history has it;
- mail (Slurm's MailProg, to a job that asked with ``--mail-type``) or a site webhook, when
  ``[notify]`` says so (:mod:`.notify_owner`), also on each failover;
- the job's own output file gets the give-up line (``slurm-ft: gave up after attempt 3: ...``),
  appended as the job's user under :mod:`slurm_ft.node.userfile`'s rules (never as root through the
  user's path), when the file is reachable from the daemon's host (a shared file system).
"""

from __future__ import annotations

import logging

from slurm_ft.errors import SlurmCommandError
from slurm_ft.failover import policy
from slurm_ft.failover.marker import FIX, give_up_sentence
from slurm_ft.failover.notify_owner import notify
from slurm_ft.failover.options import admin_comment

log = logging.getLogger("slurm_ft.daemon")
#: Seconds sacctmgr may take (it talks to slurmdbd).
SACCTMGR_TIMEOUT_S = 10.0


def tell_final(fx, job, a) -> None:
    """Tell the owner of ``job`` (a :class:`slurm_ft.slurm.Job`) the final decision ``a`` (a
    :class:`slurm_ft.failover.machine.Final`); ``fx``: the daemon's Effects. Never raises for a
    refusal: each channel is best effort and logged."""
    sentence = give_up_sentence(a.kind, a.reason, a.attempt) if a.kind in FIX else ""
    text = admin_comment(fx.journal, job.job_id, a.kind, sentence)
    if job.state == "PENDING" or a.hold:
        fx.try_update(job.job_id, AdminComment=text)
    else:   # every final state, completed too: `slurm-ft wait` tells a continuation's COMPLETED by it
        _accounting(fx.slurm, job.job_id, text)
    if sentence and not getattr(fx.slurm, "observe", False):   # observe mode changes nothing
        _give_up_line(fx.slurm, job.job_id, sentence)
        notify(getattr(fx.d.cfg, "notify", None), fx.slurm, job.job_id, "give-up", a.kind, sentence)


def tell_failover(fx, job) -> None:
    """A failover of ``job`` was carried out: mail/webhook (``[notify]``) with its sentence."""
    from slurm_ft.failover.marker import journal_sentence

    ncfg = getattr(fx.d.cfg, "notify", None)
    if ncfg is not None and (ncfg.mail or ncfg.webhook):
        notify(ncfg, fx.slurm, job.job_id, "failover", policy.FAILOVER,
               journal_sentence(fx.journal, job.job_id) or "failed over")


def _accounting(slurm, job_id: int, text: str) -> None:
    try:
        proc = slurm.run("sacctmgr", "-i", "modify", "job", "where", f"jobid={job_id}", "set",
                         f"AdminComment={text}", check=False, timeout_s=SACCTMGR_TIMEOUT_S)
    except SlurmCommandError as exc:
        log.debug("job %s: accounting record not updated: %s", job_id, exc)
        return
    if proc.returncode != 0:
        log.debug("job %s: accounting record not updated: %s", job_id, (proc.stderr or "").strip()[:200])


def job_outputs(slurm, job_id: int) -> tuple[int | None, int | None, list[str]]:
    """(uid, gid, paths) of ``job_id``'s output: its StdOut, and its StdErr when that is another
    file, as ``scontrol show job`` shows them (Slurm expands the filename patterns); absolute
    paths only. (None, None, []) when Slurm cannot tell. Never raises."""
    from slurm_ft.slurm.jobinfo import split_record

    try:
        proc = slurm.run("scontrol", "show", "job", str(job_id), check=False)
    except SlurmCommandError as exc:
        log.debug("job %s: output paths not known: %s", job_id, exc)
        return None, None, []
    kv = (split_record(proc.stdout, job_id) if proc.returncode == 0 else None) or {}
    paths = [p for p in dict.fromkeys((kv.get("StdOut"), kv.get("StdErr"))) if p and p.startswith("/")]
    return _id(kv.get("UserId")), _id(kv.get("GroupId")), paths


def _give_up_line(slurm, job_id: int, sentence: str) -> None:
    """Append ``slurm-ft: <sentence>`` to the job's StdOut (and StdErr when it is another file)."""
    from slurm_ft.node.userfile import UserFileError, append_line

    uid, gid, paths = job_outputs(slurm, job_id)
    for path in paths:
        try:
            append_line(path, uid, gid, f"slurm-ft: {sentence}".encode("ascii", "replace"))
        except UserFileError as exc:
            log.info("job %s: give-up line not written to the job's output: %s", job_id, exc)


def _id(owner: str | None) -> int | None:
    """``alice(1000)`` -> 1000 (scontrol's UserId/GroupId), else None."""
    import re

    m = re.fullmatch(r".*\((\d+)\)", owner or "")
    return int(m.group(1)) if m else None
