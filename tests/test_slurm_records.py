"""One parser of the controllers (slurm_ft.slurm.records.slurmctld_hosts) for the daemon's
leadership, doctor's host roles and the history service's endpoints (issue 21: three copies)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from slurm_ft.admin.doctor import controller_hosts
from slurm_ft.failover.leader import Controllers
from slurm_ft.history.client import controllers
from slurm_ft.slurm import parse_config, parse_slurm_conf, slurmctld_hosts

SHOW_22 = "SlurmctldHost[0]       = ctl(10.0.0.1)\nSlurmctldHost[1]       = backup.example\nStateSaveLocation = /s\n"


def test_every_shape_gives_the_same_controllers_in_order():
    want = [("ctl", "10.0.0.1"), ("backup.example", "backup.example")]
    assert slurmctld_hosts(parse_config(SHOW_22)) == want
    assert slurmctld_hosts({"SlurmctldHost[1]": "backup.example", "SlurmctldHost[0]": "ctl(10.0.0.1)"}) == want
    assert slurmctld_hosts(parse_slurm_conf("SlurmctldHost=ctl(10.0.0.1),backup.example\n")) == want
    assert slurmctld_hosts({"ControlMachine": "ctl(10.0.0.1)", "BackupController": "backup.example"}) == want
    assert slurmctld_hosts({"SlurmctldHost[0]": "(null)", "SlurmctldHost[1]": "b"}) == [("b", "b")]
    assert slurmctld_hosts({}) == [] and slurmctld_hosts({"SlurmctldHost": ""}) == []


def test_the_three_users_read_it_alike():
    conf = parse_config(SHOW_22)
    assert Controllers.from_config(conf).hosts == ("ctl", "backup.example")
    assert controllers(conf, 6827) == [("10.0.0.1", 6827), ("backup.example", 6827)]
    assert controller_hosts({k.lower(): v for k, v in conf.items()}) == ["ctl", "backup"]


@given(st.dictionaries(st.sampled_from(["SlurmctldHost", "SlurmctldHost[0]", "slurmctldhost[7]", "ControlMachine",
                                        "BackupController", "Other"]) | st.text(max_size=20),
                       st.text(max_size=60), max_size=6))
def test_never_raises_and_names_only_what_the_entries_hold(conf):
    joined = ",".join(str(v) for v in conf.values())
    for name, addr in slurmctld_hosts(conf):
        assert name and addr and name == name.strip() and addr == addr.strip()
        assert name in joined and addr in joined
