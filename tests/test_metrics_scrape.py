"""A metrics scrape runs the expensive part (the daemon journal scan, ``sinfo``) at most once per
``SCRAPE_TTL_S`` whatever the scrape rate, and concurrent scrapes share one computation (issue
27: every unauthenticated scrape ran ``sinfo`` and a full journal scan as root). A fake clock,
never sleeps."""

from __future__ import annotations

import threading

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from slurm_ft import config as config_mod
from slurm_ft.node import boundary
from slurm_ft.admin import metrics
from slurm_ft.slurm import Node


class CountingSlurm:
    def __init__(self, gate: threading.Event | None = None):
        self.calls, self.gate = 0, gate

    def nodes(self):
        self.calls += 1
        if self.gate is not None:
            self.gate.wait(10)
        return [Node(name="n1", state="idle", flags=["DRAIN"], reason="slurm-ft: Xid 79 (job 1)",
                     reason_set_by_user="root", comment="", extra="", raw={})]


def _setup(tmp_path, monkeypatch):
    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "journal.db")},
                                "node_state": {"dir": str(tmp_path / "state")}})
    scans = []
    real = metrics.journal_counts
    monkeypatch.setattr(metrics, "journal_counts", lambda j: scans.append(1) or real(j))
    from slurm_ft.journal import open_journal
    with open_journal(tmp_path / "journal.db") as j:
        j.upsert_job(1, name="a", user="u", ft_enabled=1, retries=3, ft_state="running")
    return cfg, scans


def _scrape(collector) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return generate_latest(reg).decode()


def test_scrapes_within_the_ttl_share_one_computation(tmp_path, monkeypatch):
    cfg, scans = _setup(tmp_path, monkeypatch)
    now = [1000.0]
    slurm = CountingSlurm()
    c = metrics.JournalCollector(cfg, slurm, clock=lambda: now[0])
    for k in range(50):
        now[0] = 1000.0 + k * 0.29          # 50 scrapes within 14.3 s
        text = _scrape(c)
        assert "slurm_ft_nodes_out_of_service" in text and "slurm_ft_journal_readable 1.0" in text
    assert (slurm.calls, len(scans), c.cache.computations) == (1, 1, 1)
    now[0] = 1000.0 + metrics.SCRAPE_TTL_S            # 15 s after the first: recomputed
    _scrape(c)
    assert (slurm.calls, len(scans)) == (2, 2)
    now[0] += 1.0
    _scrape(c)
    assert slurm.calls == 2
    now[0] = 0.0                                       # a clock that went back: recompute, never stuck
    _scrape(c)
    assert slurm.calls == 3


def test_concurrent_scrapes_wait_for_one_computation(tmp_path, monkeypatch):
    cfg, scans = _setup(tmp_path, monkeypatch)
    gate = threading.Event()
    slurm = CountingSlurm(gate)
    c = metrics.JournalCollector(cfg, slurm, clock=lambda: 5.0)
    out = []
    threads = [threading.Thread(target=lambda: out.append(_scrape(c))) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(20)
    assert len(out) == 8 and all("slurm_ft_slurm_up 1.0" in t for t in out)
    assert (slurm.calls, len(scans)) == (1, 1)


def test_internal_errors_counter_is_exposed(tmp_path, monkeypatch):
    cfg, _ = _setup(tmp_path, monkeypatch)
    boundary.bump(cfg.node_state.dir, "prolog")
    boundary.bump(cfg.node_state.dir, "prolog")
    text = _scrape(metrics.JournalCollector(cfg, None))
    assert 'slurm_ft_internal_errors_total{hook="prolog"} 2.0' in text
    assert 'slurm_ft_internal_errors_total{hook="epilog"} 0.0' in text
