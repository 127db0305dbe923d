"""Slurm versions and their requeue behaviour (slurm_ft/slurm/versions.py)."""

from __future__ import annotations

import pytest

from slurm_ft.slurm.versions import (
    EXPEDITE_CONF_KEY, EXPEDITE_CONF_WORD, has_expedited_requeue, parse_version, requeue_option, with_param)


@pytest.mark.parametrize("text,want", [
    ("slurm 22.05.8", (22, 5)),            # slurmctld -V on Debian 12
    ("slurm-wlm 26.05.5", (26, 5)),        # forky
    ("slurm 24.11.5\n", (24, 11)),
    ("25.11", (25, 11)),
    ("", None),
    ("slurm unknown", None),
])
def test_parse_version(text, want):
    assert parse_version(text) == want


@pytest.mark.parametrize("version,want", [
    ("slurm 22.05.8", False), ("24.11.5", False), ("25.05.3", False), ("25.11.0", True), ("slurm-wlm 26.05.5", True),
    ((25, 11), True), ((24, 11), False), (None, False), ("", False),
])
def test_expedited_requeue_from_25_11(version, want):
    assert has_expedited_requeue(version) is want


def test_requeue_option():
    assert requeue_option("22.05.8") == "--requeue"
    assert requeue_option("26.05.5") == "--requeue"
    assert requeue_option("26.05.5", expedite=True) == "--requeue=expedite"
    with pytest.raises(ValueError, match="no expedited requeue before 25.11"):
        requeue_option("24.11.5", expedite=True)


def test_the_switch_is_a_slurmctld_parameter():
    # measured on 26.05.5: the word in SchedulerParameters leaves --requeue=expedite refused
    assert (EXPEDITE_CONF_KEY, EXPEDITE_CONF_WORD) == ("SlurmctldParameters", "enable_expedited_requeue")


@pytest.mark.parametrize("value,word,want", [
    (None, "enable_expedited_requeue", "enable_expedited_requeue"),
    ("", "enable_expedited_requeue", "enable_expedited_requeue"),
    ("enable_configless", "enable_expedited_requeue", "enable_configless,enable_expedited_requeue"),
    ("enable_expedited_requeue,x", "enable_expedited_requeue", "x,enable_expedited_requeue"),
    ("batch_sched_delay=0,requeue_delay=120", "requeue_delay=5", "batch_sched_delay=0,requeue_delay=5"),
])
def test_with_param(value, word, want):
    assert with_param(value, word) == want
