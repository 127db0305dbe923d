"""Verdict transport from compute nodes to the daemon, through Slurm itself.

A node epilog cannot annotate the job (slurmctld answers ``Job has already finished``), but it can
set a field of its own *node* record (``Extra`` by default), which the daemon reads with one
``sinfo --json`` per cycle. The field holds a bounded list of records, newest last:

    slurm-ft/1;<rec>;<rec>;...      rec = job.attempt,verdict,rule,xids,exit,time
    xids = 79@0000:10:00+48@0000:11:00   (percent-encoded fields)

Each node's field is written only by that node's epilogs, serialised by a local ``flock``, so the
read-modify-write never loses a record; the daemon never writes it (it remembers what it has
consumed in its own journal), so there is no writer race across hosts. No shared filesystem, no new
network service: see docs/architecture.md.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import quote, unquote

HEADER = "slurm-ft/1"


@dataclass(frozen=True)
class Record:
    job_id: int
    attempt: int
    verdict: str
    rule: str
    xids: tuple[tuple[int, str], ...]   # (xid, bus id)
    exit_code: int | None
    time: float                          # epoch seconds

    @property
    def key(self) -> str:
        return f"{self.job_id}.{self.attempt}"

    def encode(self) -> str:
        xids = "+".join(f"{x}@{quote(b or '', safe=':')}" for x, b in self.xids)
        ec = "" if self.exit_code is None else str(self.exit_code)
        return ",".join([self.key, quote(self.verdict, safe=""), quote(self.rule, safe="-_."), xids, ec,
                         f"{self.time:.1f}"])

    @classmethod
    def decode(cls, text: str) -> "Record | None":
        """Parse one record; None if it is malformed (a node field is not trusted input)."""
        parts = text.split(",")
        if len(parts) != 6:
            return None
        key, verdict, rule, xids, ec, t = parts
        try:
            job, attempt = (int(v) for v in key.split("."))
            pairs = []
            for item in filter(None, xids.split("+")):
                x, _, b = item.partition("@")
                pairs.append((int(x), unquote(b)))
            return cls(job, attempt, unquote(verdict), unquote(rule), tuple(pairs),
                       int(ec) if ec else None, float(t))
        except ValueError:
            return None


def parse(field: str) -> list[Record]:
    """All well-formed records in a node field; [] if the field is not ours."""
    if not field.startswith(HEADER + ";"):
        return []
    return [r for r in (Record.decode(p) for p in field.split(";")[1:] if p) if r is not None]


def render(records: list[Record], keep: int) -> str:
    return ";".join([HEADER, *(r.encode() for r in records[-keep:])])


@contextmanager
def _node_lock(lock_dir: str, node: str):
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(lock_dir, f"mailbox-{node}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def publish(slurm, node: str, record: Record, *, field: str = "Extra", keep: int = 16, lock_dir: str) -> None:
    """Append ``record`` to ``node``'s mailbox field (read-modify-write under a local lock).

    Raises :class:`SlurmCommandError` if Slurm refuses.
    """
    with _node_lock(lock_dir, node):
        current = slurm.show_node(node).get(field, "")
        records = [*parse(current), record]
        slurm.update_node(node, **{field: render(records, keep)})


def post(cfg, slurm, node: str, job_id: int, attempt: int, verdict: str, rule: str, xids=(),
         exit_code: int | None = None) -> None:
    """Publish a verdict for ``node`` with the config's mailbox settings (prolog and epilog)."""
    publish(slurm, node, new_record(job_id, attempt, verdict, rule, xids, exit_code),
            field=cfg.failover.mailbox_field, keep=cfg.failover.mailbox_keep, lock_dir=cfg.node_state.dir)


def new_record(job_id: int, attempt: int, verdict: str, rule: str, xids, exit_code: int | None) -> Record:
    return Record(job_id, attempt, verdict, rule, tuple(xids), exit_code, time.time())
