"""Verdict transport from compute nodes to the daemon, through Slurm itself.

A node epilog cannot annotate the job (slurmctld answers ``Job has already finished``), but it can
set a field of its own *node* record (``Extra`` by default), which the daemon reads with
``sinfo --json`` (after a job end, and every ``[failover] node_poll_s``). The field holds a
bounded list of records (:class:`slurm_ft.failover.verdict.NodeVerdict`), newest last, in two
pools so that failing jobs never push a hardware verdict out (:func:`bounded`):

    slurm-ft/1;<rec>;<rec>;...      rec = job.attempt,verdict,rule,xids,exit,time[,summary]
    xids = 79@0000:10:00+48@0000:11:00   (percent-encoded fields)

Each node's field is written only by that node's epilogs, serialised by a local ``flock``, so the
read-modify-write never loses a record; the daemon never writes it (it remembers what it has
consumed in its own journal), so there is no writer race across hosts. A post Slurm refuses
waits in the node's outbox for the next prolog/epilog there (:func:`post_verdict`). No shared
filesystem, no new network service: see docs/architecture.md.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager

from slurm_ft.errors import SlurmFTError
from slurm_ft.failover import repost
from slurm_ft.failover.verdict import NodeVerdict, bounded

HEADER = "slurm-ft/1"


#: A mailbox record is the typed verdict (slurm_ft.failover.verdict), without its node: the node
#: is the field's owner.
Record = NodeVerdict


def parse(field: str, node: str = "") -> list[NodeVerdict]:
    """All well-formed records in ``node``'s field; [] if the field is not ours."""
    if not field.startswith(HEADER + ";"):
        return []
    return [r for r in (NodeVerdict.decode(p, node) for p in field.split(";")[1:] if p) if r is not None]


def render(records: list[Record], keep: int) -> str:
    """The field text of ``records`` (oldest first) bounded by :func:`bounded`."""
    return ";".join([HEADER, *(r.encode() for r in bounded(records, keep))])


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
        _publish_locked(slurm, node, [record], field, keep)


#: Tries of one post before the record goes to the node's outbox, and the pause between them.
POST_TRIES, POST_PAUSE_S = 3, 0.5


def post(cfg, slurm, node: str, job_id: int, attempt: int, verdict: str, rule: str, xids=(),
         exit_code: int | None = None) -> None:
    """Publish a verdict for ``node`` with the config's mailbox settings (prolog and epilog)."""
    post_verdict(cfg, slurm, new_record(job_id, attempt, verdict, rule, xids, exit_code).on(node))


def post_verdict(cfg, slurm, v: NodeVerdict, *, sleep=time.sleep, log=None) -> bool:
    """Publish ``v`` (for ``v.node``), after whatever this node's outbox still holds. A post Slurm
    refuses (slurmctld restarting, a timeout) is retried :data:`POST_TRIES` times, then kept in
    the node's **outbox** (``[node_state] dir``/``outbox-<node>.json``, root-only) and sent by the
    next prolog or epilog on this node: a verdict is never dropped. Records of this node's sent
    ledger that a slurmctld state rollback erased from the field are put back in the same write
    (slurm_ft.failover.repost). Returns True when everything is posted."""
    kw = dict(field=cfg.failover.mailbox_field, keep=cfg.failover.mailbox_keep, lock_dir=cfg.node_state.dir)
    with _node_lock(cfg.node_state.dir, v.node):
        waiting = [*_outbox_read(cfg.node_state.dir, v.node), v]
        for attempt in range(POST_TRIES):
            try:
                back = _publish_locked(slurm, v.node, waiting, kw["field"], kw["keep"], state_dir=cfg.node_state.dir)
                _outbox_write(cfg.node_state.dir, v.node, [])
                _journal_reposts(cfg, v.node, back, log)
                return True
            except SlurmFTError:
                if attempt + 1 < POST_TRIES:
                    sleep(POST_PAUSE_S)
        _outbox_write(cfg.node_state.dir, v.node, waiting)
        return False


def flush_outbox(cfg, slurm, node: str, log=None) -> bool:
    """Post what this node's outbox holds (an epilog with nothing of its own to post calls it;
    the prolog too, in its detached part, when :func:`slurm_ft.failover.repost.pending`); with an empty outbox, read the
    field only when the sent ledger asks for a check (:func:`slurm_ft.failover.repost.due`) and
    put back what a slurmctld state rollback erased. True when the outbox is empty."""
    state_dir = cfg.node_state.dir
    with _node_lock(state_dir, node):
        waiting = _outbox_read(state_dir, node)
        if not waiting and not repost.due(state_dir, node):     # one open() when neither
            return True
        try:
            back = _publish_locked(slurm, node, waiting, cfg.failover.mailbox_field, cfg.failover.mailbox_keep,
                                   state_dir=state_dir)
        except SlurmFTError:
            return False
        _outbox_write(state_dir, node, [])
        _journal_reposts(cfg, node, back, log)
        return True


def check_node(cfg, node: str, log) -> None:
    """When :func:`pending`: post ``node``'s outbox and put back what a rollback erased
    (:func:`flush_outbox`). For a hook with nothing of its own to post:
    the prolog's detached part, ``slurm-ft health --act`` (Slurm's ``HealthCheckProgram``, which
    also runs on an idle or drained node). Never raises: trouble is logged, tried again next time."""
    if not repost.pending(cfg.node_state.dir, node):
        return
    from slurm_ft.errors import SlurmFTError
    from slurm_ft.slurm import Slurm
    try:
        if not flush_outbox(cfg, Slurm.from_config(cfg), node, log=log):
            log("mailbox not checked (Slurm refused); tried again at the next prolog/epilog")
    except (SlurmFTError, OSError) as exc:
        log(f"mailbox not checked: {exc}")


def _publish_locked(slurm, node: str, records: list[NodeVerdict], field: str, keep: int, *,
                    state_dir: str | None = None) -> list[NodeVerdict]:
    """Read ``node``'s field, add ``records``, write it (under the node lock). With ``state_dir``
    (the node's own hooks): also put back what the sent ledger says a rollback erased, and keep
    the ledger. Returns the records put back. Raises :class:`SlurmFTError` if Slurm refuses (the
    ledger is then unchanged)."""
    current = parse(slurm.show_node(node).get(field, ""))
    back: list[NodeVerdict] = []
    ledger = None
    if state_dir is not None:
        now = time.time()
        back, ledger = repost.plan(repost.read_ledger(state_dir, node), current, keep, now, node)
        if back:
            current = sorted([*current, *back], key=lambda r: r.time)
    have = {r.encode() for r in current}
    fresh = [r for r in records if r.encode() not in have]
    if fresh or back:
        slurm.update_node(node, **{field: render([*current, *fresh], keep)})
    if ledger is not None:
        try:
            repost.write_ledger(state_dir, node, repost.remember(ledger, fresh, time.time()))
        except OSError:
            pass        # the post is made; only a later re-post of it is lost
    return back


def _journal_reposts(cfg, node: str, records: list[NodeVerdict], log) -> None:
    if not records:
        return
    if log is not None:
        log(f"re-posted {len(records)} verdict(s) missing from {node}'s mailbox field (a slurmctld state "
            f"rollback): {', '.join(r.key for r in records)}")
    repost.journal_reposts(cfg, node, records, log)


def _outbox_path(lock_dir: str, node: str) -> str:
    return os.path.join(lock_dir, f"outbox-{node}.json")


def _outbox_read(lock_dir: str, node: str) -> list[NodeVerdict]:
    try:
        fd = os.open(_outbox_path(lock_dir, node), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    with os.fdopen(fd) as fh:
        out = []
        for line in fh:
            v = NodeVerdict.decode(line.strip(), node)
            if v is not None:
                out.append(v)
        return out


def _outbox_write(lock_dir: str, node: str, records: list[NodeVerdict]) -> None:
    path = _outbox_path(lock_dir, node)
    if not records:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(r.encode() + "\n" for r in records))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def new_record(job_id: int, attempt: int, verdict: str, rule: str, xids, exit_code: int | None) -> NodeVerdict:
    return NodeVerdict(job_id, attempt, verdict, rule, tuple(xids), exit_code, time.time())
