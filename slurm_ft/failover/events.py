"""Events that wake the daemon: "ft job J started / ended", dropped by slurmctld's hooks.

``PrologSlurmctld`` and ``EpilogSlurmctld`` run on the controller host at every job's start and
end; slurm-ft's hook (``contrib/slurm-ft-ctld-event``, POSIX sh, no Python: it runs for every
job) writes one small file per ft job into ``[failover] events_dir``:
``<ns time>.<job>.<start|end>`` holding ``<start|end> <job> <restart count> <nodes> exit=<status>``
(``status``: ``SLURM_JOB_EXIT_CODE``, the job's wait status, at an end; ``unknown`` otherwise). The
daemon reads and deletes them each cycle (:meth:`EventSpool.read`): a local directory scan,
no Slurm call. An event is only a hint to look at that job now: the daemon reads the job from
Slurm itself, so a forged or lost event costs at most one RPC or some latency (the node poll and
the periodic full scan find every job anyway).

The directory is written by Slurm's ``SlurmUser`` and read by root: files are opened
``O_NOFOLLOW``, only regular files, at most :data:`MAX_BYTES` each.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

MAX_BYTES = 4096
_NAME = re.compile(r"^\d+\.(\d+)\.(start|end)$")


@dataclass(frozen=True)
class Event:
    kind: str          # start | end
    job_id: int
    restart: int       # SLURM_JOB_RESTART_COUNT as the hook saw it (already the next one at a requeue)
    nodes: str = ""
    exit: int | None = None   # the job's wait status at an end (SLURM_JOB_EXIT_CODE); None: not known

    @property
    def routine(self) -> bool:
        """A start, or an end with wait status 0: nothing for slurm-ft to decide in a hurry (the
        daemon reads such jobs after the others, a bounded number per cycle). A hint only: a
        forged ``exit=0`` delays that job's handling by a few cycles, never changes it."""
        return self.kind == "start" or self.exit == 0


class EventSpool:
    """The events directory (created 0700 if missing; the hook's files in it)."""

    def __init__(self, directory: str, owner: tuple[int, int] | None = None):
        self.dir = directory
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            if owner is not None and os.geteuid() == 0:
                os.chown(directory, *owner)
        except OSError:
            pass          # read() reports nothing until the directory exists

    def read(self, limit: int = 10000) -> list[Event]:
        """The events waiting, oldest first (removed from the directory)."""
        try:
            names = sorted(e.name for e in os.scandir(self.dir) if _NAME.match(e.name))[:limit]
        except OSError:
            return []
        out = []
        for name in names:
            path = os.path.join(self.dir, name)
            text = ""
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        text = os.read(fd, MAX_BYTES).decode("ascii", "replace")
                finally:
                    os.close(fd)
            except OSError:
                pass
            try:
                os.unlink(path)
            except OSError:
                pass
            ev = parse(name, text)
            if ev is not None:
                out.append(ev)
        return out


def parse(name: str, text: str) -> Event | None:
    m = _NAME.match(name)
    if m is None:
        return None
    parts = text.split()
    restart = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0
    nodes = parts[3] if len(parts) > 3 and re.fullmatch(r"[A-Za-z0-9_.,\[\]-]{1,4096}", parts[3]) else ""
    status = next((p[5:] for p in parts[4:5] if p.startswith("exit=")), "")
    exit_status = int(status) if status.isdigit() and len(status) <= 10 else None
    return Event(m.group(2), int(m.group(1)), restart, "" if nodes == "-" else nodes, exit_status)
