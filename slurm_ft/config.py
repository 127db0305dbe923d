"""One typed config for every slurm-ft process, loaded from TOML, strict.

Lookup order (first that exists wins):
  1. ``$SLURM_FT_CONFIG``
  2. ``slurm-ft.toml`` beside ``$SLURM_CONF`` (so a cluster's config travels with slurm.conf,
     like gres.conf; the lab uses this)
  3. ``/etc/slurm-ft/slurm-ft.toml``
  4. built-in defaults

Unknown keys and bad values raise :class:`ConfigError` naming the key.
Sections owned by a sub-package (``[classify]``, ``[health]``) are validated by that package's
``from_config(table)`` at load time, so a typo there is also an error at load time.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_ft.errors import ConfigError

DEFAULT_PATH = Path("/etc/slurm-ft/slurm-ft.toml")


@dataclass(frozen=True)
class JournalConfig:
    #: The daemon's journal (controller host).
    path: str = "/var/lib/slurm-ft/journal.db"
    #: Each compute node's own journal; ``{node}`` is replaced by the Slurm node name.
    node_path: str = "/var/lib/slurm-ft/node-{node}.db"
    #: Unix group allowed to read the daemon's journal (``ft-history`` for non-root users); ""
    #: = root only. Node journals are always root-only (0600): they hold job output excerpts.
    read_group: str = ""


@dataclass(frozen=True)
class FailoverConfig:
    #: ``act`` (default): carry out decisions. ``observe``: classify, journal, report and log every
    #: decision slurm-ft would take (drain, requeue, exclusion, priority, StartTime, hold/release,
    #: checkpoint signals, prolog refusals) and change nothing in Slurm: every Slurm write goes
    #: through one gate (:class:`slurm_ft.slurm.Slurm`, ``observe``) that journals it as observed.
    mode: str = "act"
    #: Retries (requeues after a hardware verdict) per job unless the job asks otherwise.
    retries: int = 3
    #: Site maximum for a job's own ``--ft-retries`` (larger requests are refused at submit by
    #: job_submit.lua and clamped by the daemon).
    max_retries: int = 10
    #: Retries a job gets for verdicts that blame no node (``infra``, ``hang``, and ``unknown``
    #: when output alone hinted at hardware but the trusted checks found nothing), counted in
    #: its budget as well; 0 = such verdicts are never retried.
    unblamed_retries: int = 1
    #: Total run time (seconds, all attempts together) after which a job is no longer retried
    #: for a verdict that blames no node; 0 = no bound. Stops a job from winning fresh time
    #: limits by printing infra-looking lines.
    unblamed_max_runtime_s: int = 86400
    #: A failed-over job gets a priority this far above the highest pending or running job
    #: (``scontrol update Priority=``), so it runs before jobs already waiting; 0 keeps Slurm's.
    priority_boost: int = 1000
    #: Highest priority slurm-ft ever gives a job (0 = Slurm's maximum). A failed-over job goes
    #: ``priority_boost`` above the highest job *not* boosted by slurm-ft, never above this.
    priority_ceiling: int = 0
    #: Requeues per job for evacuations (an admin's ``scontrol requeue``, ``slurm-ft drain
    #: --checkpoint``, a health-check evacuation): not faults, never taken from ``retries``;
    #: past this bound an evacuated job is left to run to its end on the draining node.
    max_evacuations: int = 10
    #: Requeues per job at its time limit after an exit checkpoint (``timeout`` once used up).
    #: Not faults, never taken from ``retries``; 0 = ft jobs simply end at their time limit.
    #: A ``saved`` ack is the job's own word: each one buys at most one more time limit, so the
    #: bound caps what a job that lies gets (3x its wall time at the default).
    max_continuations: int = 2
    #: An attempt with no root cause on any node (only ``unknown`` verdicts, e.g. every rank saw
    #: a peer vanish) is retried once elsewhere without a drain (within ``unblamed_retries``)
    #: when true; ends ``failed`` when false.
    retry_unknown: bool = False
    #: What a failover does when excluding the blamed node leaves the job unable to run
    #: (pinned with ``-w``, a feature only that node has, too few nodes): ``hold`` (held with a
    #: reason saying so; an admin or the owner decides) or ``relax`` (drop the blamed node from
    #: the job's required node list where that suffices; otherwise held).
    unsatisfiable: str = "hold"
    #: Drain the node blamed by a hardware verdict.
    drain: bool = True
    #: Seconds between daemon cycles (a cycle with nothing to do asks Slurm nothing).
    poll_interval_s: float = 0.5
    #: Directory where slurm-ft's PrologSlurmctld/EpilogSlurmctld hook
    #: (``contrib/slurm-ft-ctld-event``) drops "ft job started/ended" events; the daemon wakes on
    #: them (docs/architecture.md, "Event flow"). "" = no hook: faults are found by the node poll.
    events_dir: str = "/run/slurm-ft/events"
    #: Seconds between full reconciliations (every job, one light ``squeue -o`` listing); 0 = every cycle.
    scan_interval_s: float = 60.0
    #: Seconds between reads of the node records (mailboxes, health drains, lost nodes) when no
    #: event asks for one sooner.
    node_poll_s: float = 5.0
    #: Node field used as the per-node verdict mailbox (see docs/architecture.md).
    mailbox_field: str = "Extra"
    #: Verdict records kept per node mailbox (oldest dropped first).
    mailbox_keep: int = 16
    #: The hand-off (slurm_ft.node.handoff): seconds the epilog of a 1-node ft job that posted a
    #: hardware verdict waits for the daemon to requeue the job before it exits, and the daemon
    #: decides such a failover while the job is COMPLETING. Pays only where slurmctld makes a
    #: requeued job eligible when its epilogs end (Slurm >= 25.11 with
    #: ``SchedulerParameters=requeue_delay=-1``): it then starts in the epilog-complete RPC.
    #: 0 = off (the default: elsewhere it makes the job eligible later).
    handoff_wait_s: float = 0.0
    #: ``slurm-ft health --act`` (HealthCheckProgram) resumes a node slurm-ft drained once every
    #: check passes. Off by default: an admin decides when a drained node comes back.
    auto_resume: bool = False


@dataclass(frozen=True)
class BreakerConfig:
    """Circuit breaker on node actions: slurm-ft never takes more than ``max_nodes`` nodes, nor
    more than ``max_fraction`` of a partition's nodes, out of service by itself within
    ``window_s`` seconds. Past that it stops draining (jobs still fail over, without a drain),
    says so loudly (log, report, AdminComment) and stays open until ``slurm-ft breaker reset``."""
    max_nodes: int = 8
    max_fraction: float = 0.1
    window_s: float = 3600.0


@dataclass(frozen=True)
class SlurmConfig:
    #: Seconds before any Slurm command is abandoned.
    command_timeout_s: float = 10.0
    #: Directory holding the Slurm commands (fixed: root code never searches $PATH).
    bin_dir: str = "/usr/bin"


@dataclass(frozen=True)
class NvmlConfig:
    #: ``real`` (pynvml on the driver) or ``fake`` (inventory JSON, for labs and tests).
    backend: str = "real"
    #: Fake backend only: inventory file; ``{node}`` is replaced by the node name.
    inventory: str = ""


@dataclass(frozen=True)
class NodeStateConfig:
    #: Root-owned directory where the prolog leaves per-job markers for the epilog.
    dir: str = "/var/lib/slurm-ft/jobs"
    #: Log file of the prolog/epilog/hang watcher (``{node}`` replaced); its directory is created
    #: (root's, 0750) when missing; "" = stderr only (slurmd's log, at its debug level).
    log: str = "/var/log/slurm-ft/node.log"
    #: How a root hook (prolog, epilog, hang watcher) exits after an *unexpected* error of
    #: slurm-ft's own (a bug; see slurm_ft.node.boundary): ``pass`` (exit 0: the job runs / the node
    #: stays in service; the error is logged with its traceback, to syslog and counted in
    #: ``slurm_ft_internal_errors_total``) or ``drain`` (exit 1: Slurm drains the node with
    #: "Prolog error"/"Epilog error"). A failing health check drains either way.
    on_internal_error: str = "pass"


@dataclass(frozen=True)
class HangConfig:
    """Hang detection for jobs submitted with ``--ft-hang-timeout`` (docs/hang.md): one watcher
    per job and node, started by the prolog, reading the job's heartbeats (or, without them, the
    growth of its output file and its GPUs' utilisation)."""
    #: Seconds after the job starts on a node before its hang window opens (model loading, data
    #: preparation): a job is never found hung before ``grace_s`` + its ``--ft-hang-timeout``.
    grace_s: float = 1800.0
    #: Seconds between two looks of a watcher; a hang is found at most this long after the window
    #: has passed. Each look reads a few small files: about 1 ms of CPU.
    poll_s: float = 30.0
    #: Root-owned directory that holds one heartbeat directory per job (``{node}`` replaced by the
    #: node name; the lab puts it in the lab directory). Keep it on a local filesystem (tmpfs).
    heartbeat_dir: str = "/run/slurm-ft/heartbeat"
    #: Longest a ``saving`` report pauses the window (seconds; 0 = as long as the save lasts).
    save_max_s: float = 7200.0
    #: For jobs without heartbeats: GPU utilisation (percent, NVML) at or above which a look counts
    #: as progress; output growth counts too. 0 = utilisation never counts.
    busy_util_pct: int = 5
    #: py-spy executable for the stack dumps ("" = next to this Python, then /usr/local/bin,
    #: /usr/bin); it must be root's and not writable by others. Runs as the job's user.
    py_spy: str = ""
    #: Seconds each stack dump may take.
    dump_timeout_s: float = 20.0
    #: Seconds between SIGTERM and SIGKILL when a hung job's processes are ended.
    kill_wait_s: float = 10.0
    #: Seconds between a watcher's checks with Slurm (``scontrol show job``) that the job still
    #: runs on its node (the epilog's removal of the start marker is seen at every look).
    slurm_check_s: float = 300.0
    #: End a hung job (true) or only record the verdict and evidence (false: trying it out).
    act: bool = True


@dataclass(frozen=True)
class BisectConfig:
    """``slurm-ft bisect`` (docs/bisect.md): find the node that makes a multi-node test fail."""
    #: The daemon starts a bisect on the nodes of a multi-node job that failed with an ``infra`` or
    #: ``unknown`` verdict and blamed no node. Off by default: a bisect takes those nodes for a while.
    auto: bool = False
    #: Seconds each test job may run (``srun --time``, rounded up to minutes, and a local timeout).
    test_timeout_s: float = 600.0
    #: Partition for the test jobs ("" = Slurm's default).
    partition: str = ""
    #: Drain the node(s) a bisect finds (with a reason naming the test).
    drain: bool = True


@dataclass(frozen=True)
class NotifyConfig:
    """``[notify]``: tell a job's owner of each failover and of a give-up (off by default;
    slurm_ft.failover.owner)."""
    #: Mail through Slurm's own ``MailProg`` to jobs that asked for mail (``--mail-type`` FAIL,
    #: REQUEUE, END or ALL; to ``--mail-user`` or the job's user).
    mail: bool = False
    #: A site webhook: an ``http(s)://`` URL the daemon POSTs one JSON event to; "" = none.
    webhook: str = ""
    #: Seconds one mail or webhook call may take (the daemon waits for it).
    timeout_s: float = 5.0


@dataclass(frozen=True)
class HistoryConfig:
    """``[history]``: the history service (slurm_ft/history/service.py), through which an ordinary
    user's ``ft-history`` on a login node reads their own jobs' history with a MUNGE credential."""
    #: The daemon runs the history service (a child process, on the controller host).
    serve: bool = True
    #: TCP port the service listens on and ``ft-history`` connects to.
    port: int = 6827
    #: Address the service listens on ("" = every address of the controller host).
    listen: str = ""
    #: Where ``ft-history`` asks: ``host:port`` (comma-separated to try several); "" = each
    #: ``SlurmctldHost`` of ``scontrol show config``, in order, at ``port``.
    endpoint: str = ""
    #: Seconds ``ft-history`` waits for an answer (the service gives a request as long).
    timeout_s: float = 30.0
    #: Queries the service answers at once (more wait; past 4x this many, "busy").
    workers: int = 4


@dataclass(frozen=True)
class RemediateConfig:
    """``[remediate]``: break-fix remediation of the nodes slurm-ft drained for hardware (off by
    default; slurm_ft.remediate, docs/drain-report.md "Break-fix remediation"). Once no job runs on
    the node: the repair the Xid catalog calls for (GPU reset or ``scontrol reboot``), then the
    trusted checks (``slurm-ft health --act`` as HealthCheckProgram), resume only on a pass."""
    enabled: bool = False
    #: A node needing more than this many repairs within ``window_s`` stays drained (``slurm-ft: rma:``).
    max_repairs: int = 3
    #: Seconds over which repairs are counted for the RMA rule (default 30 days).
    window_s: float = 2592000.0
    #: Use a GPU reset where the catalog says a reset is enough (else always a reboot).
    reset: bool = True
    #: Seconds a repair may take (reboot, reset, checks) before it counts as failed.
    repair_timeout_s: float = 900.0
    #: ``nvidia-smi`` for the GPU reset and persistence mode (absolute: root never searches $PATH).
    nvidia_smi: str = "/usr/bin/nvidia-smi"
    #: NVIDIA's bug-report script, run after a failed reset ("" = never); skipped when absent.
    bug_report: str = "/usr/bin/nvidia-bug-report.sh"
    #: Where the bug reports go (root-only directory, made 0700 if missing).
    bug_report_dir: str = "/var/lib/slurm-ft/bug-reports"


@dataclass(frozen=True)
class Config:
    journal: JournalConfig = field(default_factory=JournalConfig)
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    nvml: NvmlConfig = field(default_factory=NvmlConfig)
    node_state: NodeStateConfig = field(default_factory=NodeStateConfig)
    hang: HangConfig = field(default_factory=HangConfig)
    bisect: BisectConfig = field(default_factory=BisectConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    remediate: RemediateConfig = field(default_factory=RemediateConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    #: Raw ``[classify]`` table, validated by ``slurm_ft.classify``.
    classify: dict[str, Any] = field(default_factory=dict)
    #: Raw ``[health]`` table, validated by ``slurm_ft.health``.
    health: dict[str, Any] = field(default_factory=dict)
    #: Where this config came from (None: built-in defaults).
    source: str | None = None

    def node_journal_path(self, node: str) -> str:
        return self.journal.node_path.replace("{node}", node)

    def heartbeat_root(self, node: str) -> str:
        """The directory holding the per-job heartbeat directories on ``node`` ([hang] heartbeat_dir)."""
        return self.hang.heartbeat_dir.replace("{node}", node)

    def nvml_inventory_path(self, node: str) -> str:
        return self.nvml.inventory.replace("{node}", node)


_SECTIONS = {
    "journal": JournalConfig,
    "failover": FailoverConfig,
    "breaker": BreakerConfig,
    "slurm": SlurmConfig,
    "nvml": NvmlConfig,
    "node_state": NodeStateConfig,
    "hang": HangConfig,
    "bisect": BisectConfig,
    "notify": NotifyConfig,
    "remediate": RemediateConfig,
    "history": HistoryConfig,
}
_RAW_SECTIONS = ("classify", "health")


def _check_value(where: str, value: Any, default: Any) -> Any:
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not kind:
        raise ConfigError(f"{where}: expected {kind.__name__}, got {value!r}")
    return value


def _validate(cfg: Config) -> None:
    f = cfg.failover
    if f.retries < 0:
        raise ConfigError(f"failover.retries: must be 0 (never requeue) or more, got {f.retries}")
    if f.retries > 100:
        raise ConfigError(f"failover.retries: at most 100, got {f.retries}")
    if not 0 <= f.max_retries <= 100:
        raise ConfigError(f"failover.max_retries: must be 0..100, got {f.max_retries}")
    if f.retries > f.max_retries:
        raise ConfigError(f"failover.retries: {f.retries} exceeds failover.max_retries {f.max_retries}")
    if f.unblamed_retries < 0:
        raise ConfigError(f"failover.unblamed_retries: must be >= 0, got {f.unblamed_retries}")
    if f.unblamed_max_runtime_s < 0:
        raise ConfigError(f"failover.unblamed_max_runtime_s: must be >= 0, got {f.unblamed_max_runtime_s}")
    if f.priority_ceiling < 0:
        raise ConfigError(f"failover.priority_ceiling: must be >= 0, got {f.priority_ceiling}")
    b = cfg.breaker
    if b.max_nodes < 0:
        raise ConfigError(f"breaker.max_nodes: must be >= 0, got {b.max_nodes}")
    if not 0.0 < b.max_fraction <= 1.0:
        raise ConfigError(f"breaker.max_fraction: must be in (0, 1], got {b.max_fraction}")
    if b.window_s <= 0:
        raise ConfigError(f"breaker.window_s: must be > 0, got {b.window_s}")
    if f.max_evacuations < 0:
        raise ConfigError(f"failover.max_evacuations: must be >= 0, got {f.max_evacuations}")
    if f.max_continuations < 0:
        raise ConfigError(f"failover.max_continuations: must be >= 0, got {f.max_continuations}")
    if f.mode not in ("act", "observe"):
        raise ConfigError(f"failover.mode: must be 'act' or 'observe', got {f.mode!r}")
    if f.unsatisfiable not in ("hold", "relax"):
        raise ConfigError(f"failover.unsatisfiable: must be 'hold' or 'relax', got {f.unsatisfiable!r}")
    if f.mailbox_keep < 1:
        raise ConfigError(f"failover.mailbox_keep: must be >= 1, got {f.mailbox_keep}")
    if f.priority_boost < 0:
        raise ConfigError(f"failover.priority_boost: must be >= 0, got {f.priority_boost}")
    if f.poll_interval_s <= 0:
        raise ConfigError("failover.poll_interval_s: must be > 0")
    if f.scan_interval_s < 0:
        raise ConfigError(f"failover.scan_interval_s: must be >= 0, got {f.scan_interval_s}")
    if f.node_poll_s <= 0:
        raise ConfigError(f"failover.node_poll_s: must be > 0, got {f.node_poll_s}")
    if not 0 <= f.handoff_wait_s <= 30:
        raise ConfigError(f"failover.handoff_wait_s: must be between 0 and 30, got {f.handoff_wait_s}")
    if f.mailbox_field not in ("Extra", "Comment"):
        raise ConfigError(f"failover.mailbox_field: Extra or Comment, got {f.mailbox_field!r}")
    if cfg.nvml.backend not in ("real", "fake"):
        raise ConfigError(f"nvml.backend: real or fake, got {cfg.nvml.backend!r}")
    if cfg.nvml.backend == "fake" and not cfg.nvml.inventory:
        raise ConfigError("nvml.inventory: required when nvml.backend = 'fake'")
    if cfg.node_state.on_internal_error not in ("pass", "drain"):
        raise ConfigError(f"node_state.on_internal_error: 'pass' or 'drain', got {cfg.node_state.on_internal_error!r}")
    if cfg.node_state.log and not os.path.isabs(cfg.node_state.log):
        raise ConfigError(f"node_state.log: must be an absolute path or \"\", got {cfg.node_state.log!r}")
    if cfg.slurm.command_timeout_s <= 0:
        raise ConfigError("slurm.command_timeout_s: must be > 0")
    if cfg.notify.webhook and not cfg.notify.webhook.startswith(("http://", "https://")):
        raise ConfigError(f"notify.webhook: an http:// or https:// URL or \"\", got {cfg.notify.webhook!r}")
    if cfg.notify.timeout_s <= 0:
        raise ConfigError("notify.timeout_s: must be > 0")
    hs = cfg.history
    if not 1 <= hs.port <= 65535:
        raise ConfigError(f"history.port: must be 1..65535, got {hs.port}")
    if hs.timeout_s <= 0:
        raise ConfigError(f"history.timeout_s: must be > 0, got {hs.timeout_s}")
    if not 1 <= hs.workers <= 64:
        raise ConfigError(f"history.workers: must be 1..64, got {hs.workers}")
    if hs.endpoint:
        try:
            parse_endpoints(hs.endpoint, hs.port)
        except ValueError as exc:
            raise ConfigError(f"history.endpoint: {exc}") from None
    rm = cfg.remediate
    if not 1 <= rm.max_repairs <= 100:
        raise ConfigError(f"remediate.max_repairs: must be 1..100, got {rm.max_repairs}")
    if rm.window_s <= 0 or rm.repair_timeout_s <= 0:
        raise ConfigError("remediate.window_s and remediate.repair_timeout_s: must be > 0")
    for key in ("nvidia_smi", "bug_report", "bug_report_dir"):
        value = getattr(rm, key)
        if value and not os.path.isabs(value):
            raise ConfigError(f"remediate.{key}: must be an absolute path (root never searches $PATH), got {value!r}")
    h = cfg.hang
    for key in ("poll_s", "dump_timeout_s", "slurm_check_s"):
        if getattr(h, key) <= 0:
            raise ConfigError(f"hang.{key}: must be > 0, got {getattr(h, key)}")
    for key in ("grace_s", "save_max_s", "kill_wait_s"):
        if getattr(h, key) < 0:
            raise ConfigError(f"hang.{key}: must be >= 0, got {getattr(h, key)}")
    if not 0 <= h.busy_util_pct <= 100:
        raise ConfigError(f"hang.busy_util_pct: must be 0..100, got {h.busy_util_pct}")
    if not os.path.isabs(h.heartbeat_dir.replace("{node}", "n")):
        raise ConfigError(f"hang.heartbeat_dir: must be an absolute path, got {h.heartbeat_dir!r}")
    if h.py_spy and not os.path.isabs(h.py_spy):
        raise ConfigError(f"hang.py_spy: must be an absolute path (root never searches $PATH), got {h.py_spy!r}")
    if cfg.bisect.test_timeout_s <= 0:
        raise ConfigError(f"bisect.test_timeout_s: must be > 0, got {cfg.bisect.test_timeout_s}")


def from_dict(data: dict[str, Any], source: str | None = None) -> Config:
    """Build a :class:`Config` from a parsed TOML table.

    Raises :class:`ConfigError` for unknown sections/keys or values of the wrong type.
    """
    kwargs: dict[str, Any] = {"source": source}
    for name, value in data.items():
        if name in _RAW_SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"[{name}]: must be a table")
            kwargs[name] = value
            continue
        section = _SECTIONS.get(name)
        if section is None:
            raise ConfigError(f"unknown section [{name}] (known: {', '.join([*_SECTIONS, *_RAW_SECTIONS])})")
        if not isinstance(value, dict):
            raise ConfigError(f"[{name}]: must be a table")
        defaults = section()
        known = {f.name for f in dataclasses.fields(section)}
        values = {}
        for key, v in value.items():
            if key not in known:
                raise ConfigError(f"unknown key {name}.{key} (known: {', '.join(sorted(known))})")
            values[key] = _check_value(f"{name}.{key}", v, getattr(defaults, key))
        kwargs[name] = section(**values)
    cfg = Config(**kwargs)
    _validate(cfg)
    _validate_subsections(cfg)
    return cfg


def _validate_subsections(cfg: Config) -> None:
    """Let the sub-packages reject typos in their own sections at load time."""
    if cfg.classify:
        from slurm_ft.classify import policy as classify_policy  # local: keeps epilog start-up lean

        classify_policy.from_config(cfg.classify)
    if cfg.health:
        from slurm_ft.health import config as health_config

        health_config.from_config(cfg.health)


#: A host as the history service's endpoints name it: a name, an IPv4 address, an IPv6 address
#: (bracketed or not).
HOST_RE = re.compile(r"[A-Za-z0-9_.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]|[0-9A-Fa-f:.]{2,45}")


def parse_endpoints(text: str, default_port: int) -> list[tuple[str, int]]:
    """``host[:port][,host[:port]...]`` (an IPv6 address in brackets: ``[::1]:6827``) as
    ``[(host, port)]``. Raises ValueError naming the bad item."""
    out = []
    for item in text.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\[[^\]]*\]|[^:]*)(?::([0-9]{1,5}))?", item)
        if not item or m is None or not HOST_RE.fullmatch(m.group(1)):
            raise ValueError(f"{item!r} is not host:port")
        port = int(m.group(2)) if m.group(2) else default_port
        if not 1 <= port <= 65535:
            raise ValueError(f"{item!r}: port must be 1..65535")
        out.append((m.group(1).strip("[]"), port))
    return out


def trusted_bin_dir(cfg) -> str:
    """``[slurm] bin_dir`` of a config only root can change; else the default. A user's own
    ``--config``/``$SLURM_FT_CONFIG`` must not pick the ``scontrol`` that answers PrivateData."""
    default = SlurmConfig().bin_dir
    if cfg is None or cfg.source is None:
        return default if cfg is None else cfg.slurm.bin_dir
    try:
        st = os.stat(cfg.source)
    except OSError:
        return default
    return cfg.slurm.bin_dir if st.st_uid == 0 and not st.st_mode & 0o022 else default


def find_path(env: dict[str, str] | None = None) -> Path | None:
    """Return the config file to load per the lookup order above, or None for defaults."""
    env = os.environ if env is None else env
    explicit = env.get("SLURM_FT_CONFIG")
    if explicit:
        return Path(explicit)
    slurm_conf = env.get("SLURM_CONF")
    if slurm_conf:
        beside = Path(slurm_conf).parent / "slurm-ft.toml"
        if beside.is_file():
            return beside
    if DEFAULT_PATH.is_file():
        return DEFAULT_PATH
    return None


def load(path: str | os.PathLike | None = None, env: dict[str, str] | None = None) -> Config:
    """Load the config from ``path`` or the lookup order. Raises :class:`ConfigError`."""
    p = Path(path) if path is not None else find_path(env)
    if p is None:
        return Config()
    try:
        with open(p, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except PermissionError:
        raise ConfigError(f"{p}: permission denied") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    try:
        return from_dict(data, source=str(p))
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
