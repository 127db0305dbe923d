"""Which slurm-ft daemon acts: the one on the host whose slurmctld is in control.

Runs inside ``slurm-ft daemon`` (root) on every ``SlurmctldHost`` of a cluster with a backup
controller. Leadership is Slurm's, not a second consensus system: the slurmctld in control
(primary, or a backup that took over after ``SlurmctldTimeout``) rewrites
``<StateSaveLocation>/heartbeat`` every ``min(SlurmctldTimeout / 4, 30)`` seconds, and a backup
takes control only once that file has gone stale (Slurm's ``src/slurmctld/heartbeat.c`` and
``backup.c``: it stops a backup from taking over while the primary still writes the shared state,
even when the network between the two is cut). The file is 16 bytes, two big-endian unsigned
64-bit numbers: the writer's clock (epoch seconds) and its index among the ``SlurmctldHost``
lines (0: primary, 1: first backup ...).

A daemon is **active** when that file names its own host's index and is fresh (younger than
``SlurmctldTimeout``, at least :data:`MIN_STALE_S`); otherwise it **stands by**, reading that
one local file each poll (no Slurm call). One file, one writer at a time: at most one host's
daemon reads itself as active for a given content of the file (tests/test_leader.py proves it
over every content). A cluster with one controller, or a daemon on a host that is not a
``SlurmctldHost``, is always active (as before this module); so is a daemon that could not learn
the controllers (no slurmctld answered ``scontrol show config``: no Slurm write could succeed
either). A missing, unreadable or malformed heartbeat with two or more controllers means standby
(fail safe): never two active daemons.

The facts (``SlurmctldHost[i]``, ``StateSaveLocation``, ``SlurmctldTimeout``) come from
``scontrol show config`` once at start (:func:`discover`). docs/architecture.md, "High
availability", has the design and the failure cases.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ft.errors import SlurmFTError
from slurm_ft.slurm.records import slurmctld_hosts

log = logging.getLogger("slurm_ft.daemon")

HEARTBEAT_NAME = "heartbeat"
#: Size of Slurm's heartbeat file: time and controller index, each a big-endian u64.
HEARTBEAT_BYTES = 16
#: Shortest staleness limit (seconds) whatever ``SlurmctldTimeout`` says.
MIN_STALE_S = 3.0
#: Slurm's default ``SlurmctldTimeout`` (seconds), used when ``scontrol show config`` lacks it.
DEFAULT_CTLD_TIMEOUT_S = 120.0
#: Seconds between two ``scontrol show config`` tries while no slurmctld answers.
DISCOVER_RETRY_S = 10.0

_SECONDS = re.compile(r"^\s*(\d+)")


@dataclass(frozen=True)
class Heartbeat:
    """Slurm's controller heartbeat: ``time`` (epoch seconds, the writer's clock) and ``index``
    (the writer's position among the ``SlurmctldHost`` lines, 0 = primary)."""

    time: int
    index: int


def parse_heartbeat(data: bytes) -> Heartbeat | None:
    """The heartbeat in ``data`` (the file's bytes), or None unless it is exactly
    :data:`HEARTBEAT_BYTES` long (a file cut short, or written by another program)."""
    if len(data) != HEARTBEAT_BYTES:
        return None
    t, index = struct.unpack(">QQ", data)
    return Heartbeat(t, index)


def read_heartbeat(state_dir: str | os.PathLike) -> Heartbeat | None:
    """Read ``<state_dir>/heartbeat`` (never following a symlink there). None when it is missing,
    unreadable or malformed: the caller stands by."""
    path = Path(state_dir) / HEARTBEAT_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT,):
            log.debug("leader: %s: %s", path, exc.strerror)
        return None
    try:
        data = os.read(fd, HEARTBEAT_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_heartbeat(data)


@dataclass(frozen=True)
class Controllers:
    """The cluster's controllers as ``scontrol show config`` lists them: ``hosts`` (names, in
    ``SlurmctldHost`` order), ``state_dir`` (``StateSaveLocation``, shared by all of them) and
    ``timeout_s`` (``SlurmctldTimeout``)."""

    hosts: tuple[str, ...]
    state_dir: str
    timeout_s: float = DEFAULT_CTLD_TIMEOUT_S

    @classmethod
    def from_config(cls, conf: dict[str, str]) -> "Controllers":
        """From a parsed ``scontrol show config`` (slurm_ft.slurm.parse_config): keys
        ``SlurmctldHost[0]`` = ``ctl(10.0.0.1)`` ..., ``StateSaveLocation``, ``SlurmctldTimeout``
        = ``6 sec``. Raises :class:`SlurmFTError` when no ``SlurmctldHost`` is listed."""
        hosts = tuple(name for name, _ in slurmctld_hosts(conf))
        if not hosts:
            raise SlurmFTError("scontrol show config lists no SlurmctldHost")
        m = _SECONDS.match(conf.get("SlurmctldTimeout", ""))
        return cls(hosts, conf.get("StateSaveLocation", "").strip(), float(m.group(1)) if m else DEFAULT_CTLD_TIMEOUT_S)

    def index_of(self, hostname: str) -> int | None:
        """This host's index among the controllers (short names compared), None if not one."""
        short = hostname.split(".", 1)[0]
        for i, h in enumerate(self.hosts):
            if h.split(".", 1)[0] == short:
                return i
        return None

    @property
    def stale_s(self) -> float:
        """Age (seconds) past which the heartbeat's writer no longer counts as in control."""
        return max(MIN_STALE_S, self.timeout_s)


def decide(controllers: Controllers, index: int | None, hb: Heartbeat | None, now: float) -> tuple[bool, str]:
    """(whether the daemon of controller ``index`` acts, why) given the heartbeat ``hb`` read at
    ``now``. Pure: see the module doc for the rules."""
    if len(controllers.hosts) < 2:
        return True, "one controller"
    if index is None:
        return True, "not a SlurmctldHost: leadership not checked"
    me = controllers.hosts[index]
    if hb is None:
        return False, f"no readable slurmctld heartbeat in {controllers.state_dir}"
    age = now - hb.time
    if hb.index != index:
        other = controllers.hosts[hb.index] if hb.index < len(controllers.hosts) else f"#{hb.index}"
        return False, f"slurmctld on {other} is in control (heartbeat {age:.0f} s old)"
    if age > controllers.stale_s:
        return False, f"the heartbeat of {me}'s slurmctld is {age:.0f} s old (SlurmctldTimeout " \
                      f"{controllers.timeout_s:g} s): not in control"
    return True, f"slurmctld on {me} (SlurmctldHost[{index}]) is in control"


class Leader:
    """Leadership of one daemon: :meth:`check` each cycle."""

    def __init__(self, controllers: Controllers, hostname: str | None = None, reader=read_heartbeat):
        self.controllers = controllers
        self.index = controllers.index_of(hostname or socket.gethostname())
        self.reader = reader
        self.active: bool | None = None     # None: not checked yet
        self.why = ""

    def check(self, now: float | None = None) -> tuple[bool, bool]:
        """(active now, changed since the last check: a takeover or a hand-over). Logs each change."""
        now = time.time() if now is None else now
        hb = self.reader(self.controllers.state_dir) if len(self.controllers.hosts) > 1 and \
            self.index is not None else None
        active, why = decide(self.controllers, self.index, hb, now)
        changed = active != self.active
        if changed:
            # a takeover (standby -> active) is worth a warning; the first look is not
            level = logging.WARNING if self.active is not None else logging.INFO
            log.log(level, "slurm-ft daemon %s: %s", "active" if active else "standing by", why)
        self.active, self.why = active, why
        return active, changed


def discover(slurm, hostname: str | None = None) -> Leader | None:
    """The :class:`Leader` of this host from ``scontrol show config``, or None when no slurmctld
    answers (the caller tries again later and, meanwhile, acts as with one controller: no Slurm
    write can succeed then anyway)."""
    show_config = getattr(slurm, "show_config", None)   # a stand-in Slurm may not model it
    if show_config is None:
        return None
    try:
        return Leader(Controllers.from_config(show_config()), hostname)
    except SlurmFTError as exc:
        log.debug("leader: controllers unknown: %s", exc)
        return None
