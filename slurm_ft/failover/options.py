"""A job's ft options as fixed at submit: the one place every root path (daemon, checkpoint-before-
exit, health-check evacuation) gets a job's retry budget and checkpoint settings from.

Trust order (docs/security.md):

1. the daemon journal's record (``jobs.ft_options``), written once, the first time slurm-ft saw
   the job, and never changed afterwards;
2. else the job's **admin_comment** record ``slurm-ft:submitted ft:...`` that ``job_submit.lua``
   wrote at submit after validating the options (an owner cannot set AdminComment);
3. else, for a cluster without slurm-ft's job_submit.lua, the legacy ``--comment=ft[:...]`` as
   first seen (trust on first use; documented as weaker).

Whatever the source, the retry budget is clamped to the site's ``[failover] max_retries``.
The live comment is never read again for a job already on record: an owner's
``scontrol update JobId=J Comment=...`` changes nothing.
"""

from __future__ import annotations

from slurm_ft.failover import jobspec, policy
from slurm_ft.failover.jobspec import FtOptions


def trusted_options(job, journal, failover_cfg) -> FtOptions:
    """The options of ``job`` (a :class:`slurm_ft.slurm.Job`) per the trust order above; records
    them in ``journal`` (the daemon journal) when first seen. ``failover_cfg``: ``[failover]``
    (``retries`` default, ``max_retries`` site maximum). A job that is not ft-enabled gives
    ``FtOptions(enabled=False)``. Raises :class:`ConfigError` for malformed options (the job is
    then ``not-configured``)."""
    row = journal.job(job.job_id)
    if row is not None and row.get("ft_options"):
        return jobspec.clamp(jobspec.from_canonical(row["ft_options"], "jobs.ft_options"), failover_cfg.max_retries)
    opts = jobspec.from_admin_comment(job.admin_comment)
    if opts is None:
        opts = jobspec.from_comment(job.comment, failover_cfg.retries)
    if not opts.enabled:
        return opts
    opts = jobspec.clamp(opts, failover_cfg.max_retries)
    fields = {"ft_options": jobspec.admin_token(opts), "retries": opts.retries}
    if row is None:
        journal.upsert_job(job.job_id, name=job.name, user=job.user, account=job.account, ft_enabled=1,
                           ft_state=policy.RUNNING, excluded_nodes="", **fields)
    else:
        journal.upsert_job(job.job_id, **fields)
    return opts


def admin_comment(journal, job_id: int, state_text: str, sentence: str | None = None) -> str:
    """``slurm-ft:<state_text> <sentence> <recorded token>``: what slurm-ft writes into a job's
    AdminComment, keeping the options record next to the state users see in ``scontrol show
    job``. ``sentence``: what the owner reads (:mod:`.marker`); default: the sentence of the
    attempt slurm-ft's last requeue started (none before the first requeue)."""
    from slurm_ft.failover.marker import journal_sentence

    row = journal.job(job_id)
    token = row.get("ft_options") if row else None
    if sentence is None:
        sentence = journal_sentence(journal, job_id)
    from slurm_ft.failover.intent import (  # the durable failover record, last (slurm_ft.failover.intent)
        word)

    fo = word(journal.actions(job_id))
    return f"{jobspec.ADMIN_LEADER}{state_text}" + (f" {sentence}" if sentence else "") \
        + (f" {token}" if token else "") + (f" {fo}" if fo else "")
