"""Mail or a site webhook to a job's owner on each failover and on a give-up (``[notify]``, off
by default; docs/configuration.md).

Runs in the daemon (controller, root), from :mod:`slurm_ft.failover.owner` and
:meth:`slurm_ft.failover.effects.Effects._Failover`. Never in observe mode (no side effect).

- **mail** (``[notify] mail = true``): only to a job that asked for mail with ``--mail-type``
  FAIL, REQUEUE, END or ALL (``MailType=`` of ``scontrol show job``), to its ``--mail-user`` (or
  the job's user), through Slurm's own ``MailProg`` (``scontrol show config``) as
  ``MailProg -s SUBJECT ADDRESS`` with the text on stdin, as slurmctld runs it. The address is
  the job owner's choice: only ``[A-Za-z0-9._%+=@-]`` and never a leading ``-`` (it would be an
  option of the mail program); anything else is not mailed (logged).
- **webhook** (``[notify] webhook = "https://..."``): one JSON object POSTed (``job_id``,
  ``user``, ``event``: ``failover`` | ``give-up``, ``ft_state``, ``text``).

Each call is bounded by ``[notify] timeout_s``; a failure is logged, never raised.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess

log = logging.getLogger("slurm_ft.daemon")
#: Mail types (``--mail-type``) that ask for each event.
WANTS = {"failover": {"FAIL", "REQUEUE", "ALL"}, "give-up": {"FAIL", "END", "ALL"}}
_ADDRESS = re.compile(r"[A-Za-z0-9._%+=@][A-Za-z0-9._%+=@-]{0,254}")


def mail_target(kv: dict[str, str], event: str) -> str | None:
    """The address to mail ``event`` to, from a job record's fields (``split_record``: the
    free-text ``MailUser`` holds ``alice MailType=FAIL,REQUEUE`` on 22.05), or None."""
    user_part = kv.get("MailUser", "")
    address, _, types = user_part.rpartition(" MailType=")
    if not _:
        address, types = user_part, kv.get("MailType", "")
    wanted = {t.strip().upper() for t in types.split(",") if t.strip()}
    if not wanted & WANTS[event]:
        return None
    address = address.strip() or kv.get("UserId", "").split("(")[0]
    return address if _ADDRESS.fullmatch(address) else None


def notify(ncfg, slurm, job_id: int, event: str, ft_state: str, text: str) -> None:
    """Tell the owner of ``job_id`` about ``event`` (``failover`` or ``give-up``) per ``ncfg``
    (:class:`slurm_ft.config.NotifyConfig`). ``text``: the owner's sentence (already clean)."""
    if ncfg is None or not (ncfg.mail or ncfg.webhook) or getattr(slurm, "observe", False):
        return
    from slurm_ft.errors import SlurmCommandError
    from slurm_ft.slurm.jobinfo import split_record
    from slurm_ft.failover.marker import clean

    try:
        proc = slurm.run("scontrol", "show", "job", str(job_id), check=False)
    except SlurmCommandError as exc:
        log.info("job %s: %s not notified: %s", job_id, event, exc)
        return
    kv = (split_record(proc.stdout, job_id) if proc.returncode == 0 else None) or {}
    user = kv.get("UserId", "").split("(")[0]
    name = clean(kv.get("JobName", ""), 60)
    if ncfg.mail:
        address = mail_target(kv, event)
        if address is not None:
            _mail(ncfg, slurm, job_id, f"Slurm Job_id={job_id} Name={name} slurm-ft {event}: {ft_state}",
                  address, f"slurm-ft: job {job_id} ({name}): {text}\n")
    if ncfg.webhook:
        _post(ncfg, job_id, {"job_id": job_id, "user": user, "event": event, "ft_state": ft_state, "text": text})


def _mail(ncfg, slurm, job_id: int, subject: str, address: str, body: str) -> None:
    try:
        prog = slurm.show_config().get("MailProg", "") or "/bin/mail"
    except Exception as exc:    # noqa: BLE001 - a notification never stops the daemon
        log.info("job %s: no mail: MailProg unknown: %s", job_id, exc)
        return
    try:
        out = subprocess.run([prog, "-s", subject, address], input=body, text=True, capture_output=True,
                             timeout=ncfg.timeout_s, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("job %s: mail through %s failed: %s", job_id, prog, exc)
        return
    if out.returncode != 0:
        log.info("job %s: mail through %s failed (exit %s): %s", job_id, prog, out.returncode,
                 (out.stderr or "").strip()[:200])


def _post(ncfg, job_id: int, event: dict) -> None:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(ncfg.webhook, data=json.dumps(event).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=ncfg.timeout_s) as resp:
            resp.read(1024)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.info("job %s: webhook %s failed: %s", job_id, ncfg.webhook, exc)
