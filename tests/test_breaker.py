"""Circuit breaker on node actions (slurm_ft.drain.breaker, docs/security.md attack 8)."""

from __future__ import annotations

import time

import pytest

from slurm_ft.drain import breaker
from slurm_ft.config import BreakerConfig, from_dict
from slurm_ft.drain import drain_node
from slurm_ft.errors import ConfigError
from slurm_ft.slurm import Node

NOW = time.time()


def _node(name, reason="", drained=False, changed=NOW - 10, parts=("gpu",)):
    return Node(name=name, state="idle", flags=["DRAIN"] if drained else [], reason=reason,
                reason_set_by_user="root", comment="", extra="",
                raw={"partitions": list(parts), "reason_changed_at": changed})


def _cluster(n, drained_by_us=(), old=(), admin=()):
    out = []
    for i in range(1, n + 1):
        name = f"n{i}"
        if name in drained_by_us:
            out.append(_node(name, "slurm-ft: Xid 79 on 0000:10:00 (job 1)", True))
        elif name in old:
            out.append(_node(name, "slurm-ft: Xid 79 (job 1)", True, changed=NOW - 7200))
        elif name in admin:
            out.append(_node(name, "maintenance", True))
        else:
            out.append(_node(name))
    return out


def test_limit_is_the_smaller_of_count_and_fraction():
    cfg = BreakerConfig(max_nodes=8, max_fraction=0.1, window_s=3600)
    assert breaker.limit_for(cfg, 3) == 1        # at least one node may always be drained
    assert breaker.limit_for(cfg, 50) == 5
    assert breaker.limit_for(cfg, 1000) == 8
    assert breaker.limit_for(BreakerConfig(max_nodes=0), 100) == 0


def test_opens_at_the_limit_and_counts_only_our_recent_drains():
    cfg = BreakerConfig(max_nodes=2, max_fraction=1.0, window_s=3600)
    nodes = _cluster(10, drained_by_us=("n1",), old=("n2", "n3"), admin=("n4", "n5"))
    assert not breaker.state(cfg, nodes, "n6", NOW).open      # 1 recent slurm-ft drain < 2
    nodes = _cluster(10, drained_by_us=("n1", "n2"))
    st = breaker.state(cfg, nodes, "n6", NOW)
    assert st.open and st.count == 2 and "circuit breaker open" in st.why
    assert breaker.state(cfg, nodes, "n1", NOW).count == 1  # re-draining n1 takes nothing more out


def test_per_partition():
    cfg = BreakerConfig(max_nodes=100, max_fraction=0.5, window_s=3600)
    nodes = [_node("a1", "slurm-ft: x", True, parts=("small",)), _node("a2", parts=("small",)),
             *[_node(f"b{i}", parts=("big",)) for i in range(10)]]
    assert breaker.state(cfg, nodes, "a2", NOW).open          # 1 of 2 drained, limit 1
    assert not breaker.state(cfg, nodes, "b1", NOW).open      # other partition untouched


class _Slurm:
    def __init__(self, nodes):
        self._nodes, self.drained = nodes, []

    def nodes(self):
        return self._nodes

    def show_node(self, node):
        return {"State": "IDLE", "Reason": ""}

    def drain(self, node, reason):
        self.drained.append(node)


def test_drain_node_stops_at_the_breaker():
    cfg = BreakerConfig(max_nodes=1, max_fraction=1.0, window_s=3600)
    s = _Slurm(_cluster(4, drained_by_us=("n1",)))
    out = drain_node(s, "n2", "slurm-ft: Xid 79 (job 2)", breaker=cfg)
    assert out.startswith("breaker-open") and s.drained == []
    assert drain_node(s, "n2", "slurm-ft: admin", breaker=None) == "drained"  # an admin's own command


def test_config_is_validated():
    for bad in ({"max_nodes": -1}, {"max_fraction": 0.0}, {"max_fraction": 1.5}, {"window_s": 0}):
        with pytest.raises(ConfigError):
            from_dict({"breaker": bad})
    with pytest.raises(ConfigError):
        from_dict({"breaker": {"max_node": 3}})
