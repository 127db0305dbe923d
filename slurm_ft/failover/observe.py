"""Observe-only rollout (``[failover] mode = "observe"``): the daemon decides as it would, and
changes nothing in Slurm.

How it is kept: **one gate** where slurm-ft meets Slurm, the client's :meth:`slurm_ft.slurm.Slurm.run`
(every Slurm command of every slurm-ft process goes through it; tests/test_observe_mode.py proves
that no other code path starts a Slurm command). In observe mode the gate lets only reads
(``slurm_ft/data/slurm_reads.toml``, an allowlist) and the verdict post into the node mailbox
through; every other command is handed to :meth:`ObservedJournal.observed` (the daemon) or logged
(prolog, epilog, ``health --act``) and answered as if done.

The journal then tells what *would* have happened, as such: :class:`ObservedJournal` stores each
decision and step the effects mark ``done`` with status ``observed`` instead, and adds one
``observed`` row per held-back Slurm command (detail: the command line). To the state machine it
reads those rows back as ``done``, so observe mode decides exactly what act mode would, once each
(a decision observed is a decision made: it is not taken again every cycle).
"""

from __future__ import annotations

import logging
import re
import shlex

log = logging.getLogger("slurm_ft.daemon")

#: Journal status of an action slurm-ft would have taken (``[failover] mode = "observe"``).
OBSERVED = "observed"
#: Journal action of one Slurm command the observe gate held back (detail: the command line).
OBSERVED_COMMAND = "observed"
_JOB_ARG = re.compile(r"^(?:JobId=|--jobid=)?(\d+)$")
_NODE_ARG = re.compile(r"^NodeName=(\S+)$")


#: Longest argument shown in an observed command line (a checkpoint step carries a whole program).
MAX_ARG = 120


def command_line(argv: list[str]) -> str:
    """The journal text of a held-back command: shell-quoted, each argument cut to :data:`MAX_ARG`
    characters (``…`` marks a cut)."""
    return shlex.join(a if len(a) <= MAX_ARG else a[:MAX_ARG] + "…" for a in map(str, argv))


def command_target(argv: list[str]) -> tuple[int | None, str]:
    """(job id, target) named by a Slurm command: ``scontrol update JobId=12 ...`` -> (12, "12");
    ``scontrol update NodeName=n1 State=DRAIN`` -> (None, "n1"); ``scontrol hold 12`` -> (12, "12")."""
    for a in argv[1:]:
        m = _JOB_ARG.match(a)
        if m:
            return int(m.group(1)), m.group(1)
        m = _NODE_ARG.match(a)
        if m:
            return None, m.group(1)
    return None, ""


class ObservedJournal:
    """The daemon's journal in observe mode: a proxy of :class:`slurm_ft.journal.store.Journal`.

    Writes: ``finish``/``record`` with status ``done`` store ``observed``. Reads: ``actions``
    gives ``observed`` rows back as ``done`` (the state machine's view). Everything else is the
    journal's own. ``acting``: (job id, attempt) the effects are carrying out an action for (the
    job a node command such as a drain belongs to)."""

    def __init__(self, journal):
        self._journal = journal
        self.acting: tuple[int, int] = (0, 0)

    def __getattr__(self, name):
        return getattr(self._journal, name)

    def __setattr__(self, name, value):
        if name in ("_journal", "acting"):
            object.__setattr__(self, name, value)
        else:                        # e.g. ``journal.clock = ...``: the journal's own attribute
            setattr(self._journal, name, value)

    def finish(self, action_id: int, status: str = "done", detail: str | None = None) -> None:
        self._journal.finish(action_id, OBSERVED if status == "done" else status, detail)

    def record(self, job_id: int, attempt: int, action: str, target: str = "", detail: str = "",
               status: str = "done", **typed) -> int:
        return self._journal.record(job_id, attempt, action, target, detail,
                                    OBSERVED if status == "done" else status, **typed)

    def actions(self, job_id: int, attempt: int | None = None) -> list[dict]:
        return [dict(r, status="done") if r["status"] == OBSERVED else r
                for r in self._journal.actions(job_id, attempt)]

    def observed(self, argv: list[str]) -> None:
        """The observe gate's hook (:attr:`slurm_ft.slurm.Slurm.observer`): journal one held-back
        Slurm command as an ``observed`` row of the job it names, else of the job being acted on."""
        job_id, target = command_target(argv)
        acting_job, attempt = self.acting
        if job_id is None or job_id != acting_job:
            attempt = attempt if job_id is None else 0
        line = command_line(argv)
        log.info("observed (mode = observe, not run): %s", line)
        self._journal.record(job_id if job_id is not None else acting_job, attempt, OBSERVED_COMMAND,
                             target, line, OBSERVED)
