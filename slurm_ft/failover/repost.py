"""Re-posting a verdict that a slurmctld state rollback erased from a node's mailbox field.

Run on a compute node, as root, by that node's prolog and epilog (and the hang watcher), inside
their mailbox posts (:mod:`slurm_ft.failover.mailbox`). slurmctld keeps the node's mailbox field
(``Extra``) in its own state; one that crashes and restarts from a save older than the post has
forgotten the record, and a daemon that had not read it yet never will (issue 20). The node keeps
what it posted, so it can post it again:

- **the sent ledger**: every record the node posted is kept in ``[node_state] dir``/
  ``posted-<node>.json`` (root-only, written temp-then-rename, opened ``O_NOFOLLOW``) until it is
  **confirmed**: seen in the field by a read made at least :data:`CONFIRM_S` seconds after it was
  posted. slurmctld saves a changed node record within seconds (Slurm's state save thread), so a
  confirmed record is in every state slurmctld can restart from: the ledger forgets it.
- **the check**: every post reads the field anyway (read-modify-write); before writing, the
  ledger's records missing from it are put back (:func:`plan`), in time order, within the field's
  bound (:func:`slurm_ft.failover.verdict.bounded`: a record the field would have pushed out by
  now is not re-posted). A prolog or epilog that posts nothing reads the field only when the
  ledger holds an unconfirmed record and the last read is :data:`RECHECK_S` old
  (:func:`due`: one ``open`` of a small file; no file, no cost), the prolog in its detached part.
- **idempotent at the daemon**: a re-posted record is byte for byte the record first posted (same
  ``job.attempt`` key, same time), and the daemon journals each ``(node, job.attempt)`` of a
  record once (``mailbox_seen``) and files it by its time (slurm_ft.journal.identity.record_for):
  a verdict the daemon had read before the rollback changes nothing, one it had not is read now.
- **journaled as such**: each re-post is an action ``repost`` in the node's journal
  (:func:`journal_reposts`), detail ``re-posted after a controller restart lost it ...``.

Ack is Slurm's own save, not a message from the daemon: the daemon never writes a node's field
(one writer per field) and there is no other channel to the node without a new service.
"""

from __future__ import annotations

import json
import os
import time

#: Seconds after a (re)post from which a read that finds the record in the field confirms it:
#: slurmctld has saved it (its state save follows a node change within seconds).
CONFIRM_S = 60.0
#: Seconds between two field reads made only for this check (a post reads the field anyway).
RECHECK_S = 5.0
#: A record never confirmed (its node ran no prolog/epilog since) is forgotten after this long.
MAX_AGE_S = 86400.0
#: Re-posts of one record at most (Slurm dropping it again and again must not loop).
MAX_REPOSTS = 5
#: Records the ledger holds at most (the newest; a field holds ``[failover] mailbox_keep``).
MAX_LEDGER = 64
#: The node journal action of a re-post.
ACTION = "repost"


def ledger_path(state_dir: str, node: str) -> str:
    return os.path.join(state_dir, f"posted-{node}.json")


def read_ledger(state_dir: str, node: str) -> dict:
    """``{"checked": epoch s, "records": [{"r": mailbox record, "posted": epoch s, "reposts": n}]}``;
    empty when there is none or it is not one (never raises: a damaged ledger loses re-posts,
    never a post)."""
    try:
        fd = os.open(ledger_path(state_dir, node), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {"checked": 0.0, "records": []}
    try:
        with os.fdopen(fd, "rb") as fh:
            data = json.loads(fh.read(1 << 20) or b"{}")
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    recs = [e for e in data.get("records") or [] if isinstance(e, dict) and isinstance(e.get("r"), str)
            and isinstance(e.get("posted"), (int, float)) and isinstance(e.get("reposts", 0), int)]
    checked = data.get("checked")
    return {"checked": float(checked) if isinstance(checked, (int, float)) else 0.0, "records": recs}


def write_ledger(state_dir: str, node: str, ledger: dict) -> None:
    """Write (or, when it holds no record, remove) the ledger. Raises OSError."""
    path = ledger_path(state_dir, node)
    if not ledger["records"]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"checked": ledger["checked"], "records": ledger["records"][-MAX_LEDGER:]}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def due(state_dir: str, node: str, now: float | None = None) -> bool:
    """Whether a prolog/epilog that posts nothing should read its field for lost records: the
    ledger holds a record and the last read is :data:`RECHECK_S` old. No ledger: one failed
    ``open``, nothing else (the common case)."""
    ledger = read_ledger(state_dir, node)
    now = time.time() if now is None else now
    return bool(ledger["records"]) and now - ledger["checked"] >= RECHECK_S


def pending(state_dir: str, node: str) -> bool:
    """Whether the node's outbox holds records or the sent ledger asks for a check (:func:`due`):
    what a passing prolog asks on its fast path (two ``open`` calls when there is nothing; no
    lock, no Slurm, no import beyond this module)."""
    try:
        os.close(os.open(os.path.join(state_dir, f"outbox-{node}.json"), os.O_RDONLY | os.O_NOFOLLOW))
        return True
    except OSError:
        return due(state_dir, node)


def remember(ledger: dict, records, now: float) -> dict:
    """``ledger`` with ``records`` (NodeVerdict) just posted (a record already held keeps its entry)."""
    have = {e["r"] for e in ledger["records"]}
    new = [{"r": r.encode(), "posted": now, "reposts": 0} for r in records if r.encode() not in have]
    return {"checked": now, "records": (ledger["records"] + new)[-MAX_LEDGER:]}


def plan(ledger: dict, current: list, keep: int, now: float, node: str = ""):
    """What to put back in a field that holds ``current`` (NodeVerdict, oldest first; read now):
    returns ``(reposts, ledger')``. ``reposts``: the ledger's records missing from ``current``
    that a field of ``keep`` records holding ``current`` and them (in time order,
    :func:`slurm_ft.failover.verdict.bounded`) keeps; ``ledger'``: without the records confirmed
    (in the field, posted :data:`CONFIRM_S` ago), pushed out by newer records, too old, or
    re-posted :data:`MAX_REPOSTS` times; a re-posted record's clock starts again. Pure."""
    from slurm_ft.failover.verdict import NodeVerdict, bounded

    present = {r.encode() for r in current}
    entries, lost = [], []
    for e in ledger["records"]:
        rec = NodeVerdict.decode(e["r"], node)
        if rec is None or now - rec.time > MAX_AGE_S:
            continue
        if e["r"] in present:
            if now - e["posted"] < CONFIRM_S:
                entries.append(e)          # not yet certainly saved by slurmctld: keep watching
            continue
        if e.get("reposts", 0) >= MAX_REPOSTS:
            continue
        lost.append((e, rec))
    merged = sorted([*current, *(rec for _, rec in lost)], key=lambda r: r.time)
    kept = {r.encode() for r in bounded(merged, keep)}
    reposts = []
    for e, rec in lost:
        if e["r"] in kept:
            reposts.append(rec)
            entries.append({**e, "posted": now, "reposts": e.get("reposts", 0) + 1})
    return reposts, {"checked": now, "records": entries}


def journal_reposts(cfg, node: str, records, log=None) -> None:
    """One ``repost`` action per re-posted record in ``node``'s journal (``JOB.ATTEMPT``'s row).
    Never raises: a journal that cannot take it is logged (the re-post itself is done)."""
    from slurm_ft.errors import SlurmFTError
    from slurm_ft.journal import open_node_journal

    try:
        with open_node_journal(cfg, node, spool=True, busy_timeout_s=1.0) as journal:
            for r in records:
                journal.record(r.job_id, r.attempt, ACTION, node, detail(r))
    except SlurmFTError as exc:
        if log is not None:
            log(f"re-post not journaled: {exc}")


def detail(rec) -> str:
    """The ``repost`` row's detail: what was re-posted and why."""
    return (f"re-posted {rec.verdict} ({rec.rule}) of {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(rec.time))}: "
            f"missing from the node's mailbox field (a slurmctld restart from older saved state lost it)")
