"""Slurm versions and how a job is requeued in each: the version differences in requeue behaviour
that slurm-ft and its benchmarks rely on (docs/lab.md lists every Slurm version difference).

* **Expedited requeue** (Slurm >= 25.11): ``sbatch --requeue=expedite`` is accepted only where
  slurm.conf's ``SlurmctldParameters`` holds ``enable_expedited_requeue`` (else the submission fails:
  ``Requested operation not supported on this system``, slurmctld logs ``Expedited requeue
  requested but not enabled``; measured on 26.05.5: the word in ``SchedulerParameters`` does not
  enable it). Such a job that exits non-zero is kept (``JOB_REQUEUE|JOB_EXPEDITING``, state
  ``EXPEDITING``) until its node epilogs end; if one failed (or a node failed) it is requeued with
  ``begin_time = 0`` (eligible at once) as the highest-priority job; if none failed it is requeued
  **held** (state ``REQUEUE_HOLD``; slurmctld: ``holding expedited requeue ... as no epilogs
  failed``): it never runs again by itself. ``scontrol show job`` prints ``ExpeditedRequeue=Yes``.
* **Plain requeue**: ``begin_time = now + requeue_delay + 1`` s unless the job's begin time is
  already later (``batch_requeue_fini``, run when the job's last epilog completes); before 25.11
  ``requeue_delay`` is the credential lifetime (``AuthInfo=cred_expire``, at least 5 s, 120 s by
  default), from 25.11 on ``SchedulerParameters=requeue_delay=`` sets it (default as before;
  read in the 25.11.0 and 26.05.3 sources). ``requeue_delay=-1`` makes the job eligible in the
  epilog-complete RPC, which runs the scheduler at once (slurm_ft.node.handoff relies on it);
  measured on 26.05.5, a job requeued that way ran again on the node it had left within the same
  second (each run has its own ``SLUID``), where 22.05's slurmd kills such a launch ("Job
  credential revoked").
* **``scontrol reconfigure``**: on 22.05 slurmctld re-reads slurm.conf in place (its start time is
  unchanged); on 26.05 it saves its state and starts again (a new start time: what
  ``Slurm.boot_time`` reads, and what slurm_ft.failover.reconcile takes for a restart that may have
  lost drains), and slurmd re-executes itself in place under ``-D`` (same pid).
* **After an expedited requeue at a node failure** (26.05) the job is eligible at once but waits for
  the next scheduling pass (29 s in the lab); at a failed epilog it is allocated in the same RPC.
* **When the scheduler runs after a change**: on 22.05 the epilog-complete RPC calls ``schedule()``
  at once; ``scontrol update`` only asks for a pass at the next whole-second tick of slurmctld's
  background thread.
"""

from __future__ import annotations

import re

#: First Slurm release with expedited requeue (``--requeue=expedite``).
EXPEDITED_REQUEUE_SINCE = (25, 11)
#: The slurm.conf key and the word in it that let jobs ask for expedited requeue.
EXPEDITE_CONF_KEY = "SlurmctldParameters"
EXPEDITE_CONF_WORD = "enable_expedited_requeue"
#: The job states of an expedited job between its end and its next run (``squeue --json``
#: ``job_state`` items): waiting for its epilogs / requeued held because none failed.
EXPEDITING_STATE = "EXPEDITING"
REQUEUE_HOLD_STATE = "REQUEUE_HOLD"


def parse_version(text: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a Slurm version as ``scontrol --version`` / ``slurmctld -V`` print it
    (``slurm 22.05.8``, ``slurm-wlm 26.05.5``, ``26.05``); None if there is none."""
    m = re.search(r"(?<![\d.])(\d{2})\.(\d{1,2})(?:\.\d+)?", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def has_expedited_requeue(version: str | tuple[int, int] | None) -> bool:
    """Whether Slurm ``version`` (text or ``(major, minor)``) knows ``--requeue=expedite``."""
    v = parse_version(version) if isinstance(version, str) else version
    return v is not None and v >= EXPEDITED_REQUEUE_SINCE


def requeue_option(version: str | tuple[int, int] | None, expedite: bool = False) -> str:
    """The sbatch option of a requeue-able job: ``--requeue=expedite`` when ``expedite`` (raises
    ValueError before 25.11, which has no such value), else ``--requeue``."""
    if not expedite:
        return "--requeue"
    if not has_expedited_requeue(version):
        raise ValueError(f"Slurm {version}: no expedited requeue before "
                         f"{EXPEDITED_REQUEUE_SINCE[0]}.{EXPEDITED_REQUEUE_SINCE[1]:02d}")
    return "--requeue=expedite"


def with_param(value: str | None, word: str) -> str:
    """A ``SlurmctldParameters``/``SchedulerParameters`` value (comma list, None: unset) with ``word`` in it once
    (``key=`` words replace an earlier value of that key)."""
    items = [x for x in (value or "").split(",") if x.strip()]
    key = word.split("=", 1)[0]
    items = [x for x in items if x.split("=", 1)[0] != key]
    return ",".join([*items, word])
