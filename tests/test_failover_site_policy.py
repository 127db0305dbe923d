"""Site policy users cannot exceed (docs/security.md attack 3): unblamed retries, run-time bound,
non-ratcheting priority with a ceiling."""

from __future__ import annotations

import pytest

from slurm_ft.config import from_dict
from slurm_ft.errors import ConfigError
from slurm_ft.failover import policy, steps


def _v(node, verdict, rule):
    return {"node": node, "verdict": verdict, "rule": rule, "xids": []}


SITE = policy.SitePolicy(unblamed_retries=1, unblamed_max_runtime_s=3600)


def _decide(verdicts, **kw):
    args = dict(slurm_state="FAILED", failovers_done=0, retries=5, verdicts=verdicts, job_nodes=["n1"],
                seconds_since_end=10, site=SITE)
    args.update(kw)
    return policy.decide(**args)


def test_unblamed_verdicts_get_the_site_allowance_only():
    for v in (_v("n1", "infra", "rank-connection-lost"), _v("n1", "hang", "hung-task"),
              _v("n1", "unknown", "unverified:cuda-ecc-uncorrectable")):
        d = _decide([v])
        assert d.kind == "failover" and d.blamed_nodes == () and d.unblamed
        d = _decide([v], unblamed_done=1, failovers_done=1)
        assert d.kind == policy.MAX_RETRIES and "site allows 1" in d.reason


def test_alternating_signatures_do_not_reset_the_count():
    first = _decide([_v("n1", "infra", "rank-connection-lost")])
    second = _decide([_v("n2", "infra", "nccl-watchdog-timeout")], unblamed_done=1, failovers_done=1)
    assert first.kind == "failover" and second.kind == policy.MAX_RETRIES


def test_unblamed_retries_stop_after_the_runtime_bound():
    d = _decide([_v("n1", "infra", "storage-eio")], runtime_s=4000)
    assert d.kind == policy.MAX_RETRIES and "site bound" in d.reason


def test_hardware_is_not_limited_by_the_unblamed_allowance():
    d = _decide([_v("n1", "hardware", "xid-79")], unblamed_done=9, failovers_done=1, runtime_s=10 ** 6)
    assert d.kind == "failover" and d.blamed_nodes == ("n1",)


def test_plain_unknown_is_not_retried():
    assert _decide([_v("n1", "unknown", "sigkill-text")]).kind == policy.FAILED


def test_priority_never_ratchets_and_respects_the_ceiling():
    class J:
        def __init__(self, job_id, priority, state="PENDING"):
            self.job_id, self.priority, self.state = job_id, priority, state
    jobs = [J(1, 100), J(2, 5000), J(3, 1100, "RUNNING")]
    # job 2 was boosted by slurm-ft earlier: it does not count as "the highest waiting job"
    top = steps.top_priority(jobs, boosted={2})
    assert top == 1100
    assert steps.boosted_priority(top, 1000) == 2100
    assert steps.boosted_priority(top, 1000, ceiling=1500) == 1500
    assert steps.boosted_priority(top, 0) == 0


def test_site_limits_are_validated():
    for bad in ({"max_retries": 101}, {"retries": 5, "max_retries": 3}, {"unblamed_retries": -1},
                {"unblamed_max_runtime_s": -5}, {"priority_ceiling": -1}, {"mailbox_keep": 0}):
        with pytest.raises(ConfigError):
            from_dict({"failover": bad})
