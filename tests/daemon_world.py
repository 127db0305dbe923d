"""A daemon against the in-memory Slurm (tests/fake_slurm.py) with real journals under a
temporary directory, on a fake clock: the world the daemon's unit and stateful tests drive."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from slurm_ft import config as config_mod
from slurm_ft.failover.daemon import Daemon
from slurm_ft.journal import open_journal
from fake_slurm import FakeClock, FakeEvents, FakeSlurm

XID79 = ("hardware", "xid-79", ((79, "0000:10:00"),))
USER = ("user", "python-traceback", ())
INFRA = ("infra", "nccl-timeout", ())


#: The ``[breaker]`` of the daemon tests: wide open, so that only tests about it meet it.
WIDE_BREAKER = """[breaker]
max_nodes = 1000
max_fraction = 1.0
"""


def write_config(tmp: Path, extra: str = "", breaker: str | None = None) -> Path:
    """``breaker``: the ``[breaker]`` table (default :data:`WIDE_BREAKER`; ``""``: the shipped
    defaults)."""
    path = tmp / "slurm-ft.toml"
    path.write_text(f"""
[journal]
path = "{tmp}/journal/daemon.db"
node_path = "{tmp}/journal/node-{{node}}.db"
[node_state]
dir = "{tmp}/nodestate"
[failover]
poll_interval_s = 0.5
{WIDE_BREAKER if breaker is None else breaker}
{extra}
""")
    return path


class World:
    """FakeSlurm + config + daemon; ``step()`` = time passes, Slurm schedules, the daemon cycles."""

    def __init__(self, tmp: Path, nodes: int = 4, extra_config: str = "", monkeypatch=None, events: bool = True,
                 breaker: str | None = None, **slurm_kw):
        self.tmp = Path(tmp)
        self.clock = FakeClock(time.time())
        if monkeypatch is not None:   # code that reads the wall clock directly sees the fake one
            monkeypatch.setattr(time, "time", self.clock)
        self.cfg = config_mod.load(write_config(self.tmp, extra_config, breaker))
        self.slurm = FakeSlurm(nodes, self.clock, **slurm_kw)
        self.events = FakeEvents(self.slurm) if events else None
        self.daemon = self.new_daemon()

    def new_daemon(self) -> Daemon:
        try:
            return Daemon(self.cfg, self.slurm, clock=self.clock, events=self.events)
        except TypeError:   # a daemon without an injectable clock (before issue 14)
            return Daemon(self.cfg, self.slurm)

    def restart_daemon(self) -> None:
        try:
            self.daemon.journal.close()
        except Exception:
            pass
        self.daemon = self.new_daemon()

    def step(self, dt: float = 0.5, n: int = 1) -> None:
        for _ in range(n):
            self.clock.advance(dt)
            self.slurm.schedule()
            self.daemon.cycle()

    def start(self, **kw) -> int:
        jid = self.slurm.submit(**kw)
        self.slurm.schedule()
        assert self.slurm.jobs_by_id[jid].state == "RUNNING" or kw.get("hold"), self.slurm.jobs_by_id[jid]
        return jid

    def job(self, jid):
        return self.slurm.jobs_by_id[jid]

    def journal(self):
        """The daemon journal as a reader sees it (what the daemon has written to the database)."""
        return open_journal(self.cfg.journal.path, readonly=True)

    def ft_state(self, jid) -> str | None:
        with self.journal() as j:
            row = j.job(jid)
        return row and row["ft_state"]

    def lock(self, path: str | None = None) -> sqlite3.Connection:
        """Another process holds BEGIN IMMEDIATE on a journal (a reader taking a write lock)."""
        conn = sqlite3.connect(path or self.cfg.journal.path, timeout=0.1, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        return conn
