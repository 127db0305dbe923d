"""Which health checks run on a node: decided from what Slurm says the node has, and the admin's
scope in ``[health]`` (docs/health-checks.md, "Which nodes are checked").

Two halves:

- :func:`decide` (pure): :class:`NodeFacts` + :class:`~slurm_ft.health.config.HealthConfig` ->
  :class:`Scope` (the checks to run, the GPU count to expect, why). GPU checks run only on a node
  whose Slurm record has ``gres/gpu``; a node whose record has none gets no check at all, so it
  can never be drained for a GPU reason, whatever NVML says (or fails to say).
- :func:`node_facts` (I/O): the node's Slurm record (``Gres=``, ``Partitions=`` of ``scontrol show
  node -o NODE``), cached per node under ``[node_state] dir`` for ``[health] scope_cache_s``
  seconds so a prolog asks slurmctld at most once per node per that time.

Facts come from Slurm (slurmctld's node record) and from the prolog environment slurmd builds
(``SLURM_JOB_GPUS``, ``SLURM_JOB_PARTITION``); nothing a job writes or sets is read.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable

from slurm_ft.health.config import HealthConfig

#: Cache file of a node's Slurm record under ``[node_state] dir``.
CACHE_NAME = "slurm-node-{node}.json"
#: Seconds the prolog waits for ``scontrol show node`` before going on without the record.
LOOKUP_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class NodeFacts:
    """What Slurm says about one node.

    ``gpus``: the ``gres/gpu`` count of its Slurm record (0: none); None when the record could
    not be had (slurmctld did not answer, no cache). ``partitions``: its partitions (from the
    record; else the job's ``SLURM_JOB_PARTITION``). ``job_gpus``: GPUs the job being started
    holds on this node (``SLURM_JOB_GPUS``, set by slurmd from the allocation): more than 0
    proves the node has ``gres/gpu`` even without its record. ``source``: where ``gpus`` came from
    (``scontrol``, ``cache``, ``stale cache``, ``unknown: <why>``)."""

    node: str
    gpus: int | None
    partitions: tuple[str, ...] = ()
    job_gpus: int = 0
    source: str = "scontrol"


@dataclass(frozen=True)
class Scope:
    """The decision: ``checks`` to run (names from ``CHECK_NAMES``, run order; ``()`` = none, NVML
    is not touched and the prolog passes), ``expected_gpus`` for ``gpu_count`` (0 = at least
    one), ``why`` in words (logged by the prolog, printed by doctor)."""

    checks: tuple[str, ...]
    expected_gpus: int
    why: str

    @property
    def gpu_checks(self) -> bool:
        return bool(self.checks)


def _in(node: str, hostlist: str) -> bool:
    from slurm_ft.slurm import split_nodes  # ClusterShell only when a hostlist is configured

    return node in split_nodes(hostlist)


def decide(facts: NodeFacts, cfg: HealthConfig) -> Scope:
    """Which checks run on ``facts.node`` (see the module doc). In order:

    1. ``[health] exclude_nodes`` names the node, ``nodes`` is set and does not, or ``partitions``
       is set and the node is in none of them: no checks;
    2. ``[health] checks`` (minus ``skip``) is empty: no checks;
    3. Slurm's record has no ``gres/gpu``: no checks;
    4. the record is unknown: checks only when the job holds GPUs here (slurmd says so), else none;
    5. otherwise every enabled check, expecting ``expected_gpus_by_node[node]`` if set, else the
       record's ``gres/gpu`` count, else ``[health] expected_gpus``.

    Pure; raises :class:`~slurm_ft.errors.HostlistError` only for a malformed hostlist in ``cfg``
    (``from_config`` has rejected those already)."""
    node = facts.node
    if cfg.exclude_nodes and _in(node, cfg.exclude_nodes):
        return Scope((), 0, f"no GPU checks on this node ([health] exclude_nodes = {cfg.exclude_nodes})")
    if cfg.nodes and not _in(node, cfg.nodes):
        return Scope((), 0, f"no GPU checks on this node (not in [health] nodes = {cfg.nodes})")
    if cfg.partitions and not set(cfg.partitions) & set(facts.partitions):
        return Scope((), 0, f"no GPU checks on this node (partitions {','.join(facts.partitions) or 'unknown'} "
                            f"not in [health] partitions = {','.join(cfg.partitions)})")
    enabled = cfg.enabled
    if not enabled:
        return Scope((), 0, "no GPU checks on this node ([health] checks is empty)")
    if facts.gpus == 0:
        return Scope((), 0, "no GPU checks on this node (Slurm: no gres/gpu)")
    if facts.gpus is None:
        if facts.job_gpus <= 0:
            return Scope((), 0, f"no GPU checks for this job (Slurm's node record {facts.source}; "
                                f"the job holds no GPU here)")
        return Scope(enabled, cfg.expected_for(node),
                     f"{len(enabled)} GPU checks (Slurm's node record {facts.source}; the job holds "
                     f"{facts.job_gpus} GPU(s) here)")
    expected = cfg.expected_gpus_by_node.get(node, facts.gpus)
    return Scope(enabled, expected, f"{len(enabled)} GPU checks, expecting {expected} GPU(s) "
                                    f"(Slurm: gres/gpu:{facts.gpus}, {facts.source})")


# ------------------------------------------------------------------------------ the node record
def _cache_path(state_dir: str, node: str) -> str:
    return os.path.join(state_dir, CACHE_NAME.format(node=node))


def read_cache(state_dir: str, node: str) -> tuple[float, int, tuple[str, ...]] | None:
    """``(time written, gres/gpu count, partitions)`` from the node's cache file, or None when
    there is none or it is not the shape :func:`write_cache` writes. Opened ``O_NOFOLLOW``."""
    try:
        fd = os.open(_cache_path(state_dir, node), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            data = json.loads(fh.read(4096))
        at, gpus, parts = data["at"], data["gpus"], data["partitions"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (not isinstance(at, (int, float)) or isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0
            or not isinstance(parts, list) or not all(isinstance(p, str) for p in parts)):
        return None
    return float(at), gpus, tuple(parts)


def write_cache(state_dir: str, node: str, gpus: int, partitions: tuple[str, ...], now: float) -> None:
    """Write the node's cache file (root-only 0600, temp-then-rename, ``O_NOFOLLOW``).
    Raises OSError."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = _cache_path(state_dir, node)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"at": now, "gpus": gpus, "partitions": list(partitions)}, fh)
    os.replace(tmp, path)


def record_facts(record: dict[str, str]) -> tuple[int, tuple[str, ...]]:
    """``(gres/gpu count, partitions)`` of a parsed ``scontrol show node -o`` record
    (:func:`slurm_ft.slurm.parse_kv_line`). Raises SlurmCommandError on an unreadable ``Gres=``."""
    from slurm_ft.slurm import parse_gres

    gpus = parse_gres(record.get("Gres")).get("gpu", 0)
    parts = record.get("Partitions", "")
    partitions = tuple(p for p in parts.split(",") if p and p not in ("(null)", "None"))
    return gpus, partitions


def node_facts(state_dir: str, node: str, *, ttl_s: float, job_gpus: int = 0, job_partition: str = "",
               lookup: Callable[[str], dict[str, str]], now: float | None = None,
               log: Callable[[str], None] = lambda m: None) -> NodeFacts:
    """The node's :class:`NodeFacts`: the cache under ``state_dir`` when younger than ``ttl_s``,
    else ``lookup(node)`` (a parsed ``scontrol show node -o`` record, :func:`scontrol_lookup`)
    written back to the cache; when the lookup fails, a stale cache, else ``gpus=None``. Never raises; problems go to ``log``."""
    from slurm_ft.errors import SlurmFTError

    now = time.time() if now is None else now
    cached = read_cache(state_dir, node)
    job_parts = (job_partition,) if job_partition else ()
    if cached is not None and 0 <= now - cached[0] < ttl_s:
        return NodeFacts(node, cached[1], cached[2] or job_parts, job_gpus, "cache")
    try:
        record = lookup(node)
        if record.get("NodeName") != node:
            raise ValueError(f"scontrol show node {node}: record of {record.get('NodeName')!r}")
        gpus, partitions = record_facts(record)
    except (SlurmFTError, ValueError, OSError) as exc:
        log(f"node record not read: {exc}")
        if cached is not None:
            return NodeFacts(node, cached[1], cached[2] or job_parts, job_gpus, "stale cache")
        return NodeFacts(node, None, job_parts, job_gpus, "unknown: slurmctld did not answer")
    try:
        write_cache(state_dir, node, gpus, partitions, now)
    except OSError as exc:
        log(f"node record not cached: {exc}")
    return NodeFacts(node, gpus, partitions or job_parts, job_gpus, "scontrol")


def scontrol_lookup(config) -> Callable[[str], dict[str, str]]:
    """``node -> parsed scontrol show node -o NODE`` with ``config``'s Slurm commands and a
    timeout of at most :data:`LOOKUP_TIMEOUT_S`. Raises SlurmCommandError when it fails."""
    def lookup(node: str) -> dict[str, str]:
        from slurm_ft.slurm import Slurm, parse_kv_line

        timeout = min(LOOKUP_TIMEOUT_S, config.slurm.command_timeout_s)
        proc = Slurm.from_config(config).run("scontrol", "show", "node", "-o", node, timeout_s=timeout)
        return parse_kv_line(proc.stdout)
    return lookup
