"""Leadership among the daemons of a cluster with a backup controller (slurm_ft.failover.leader):
Slurm's own heartbeat file decides, one active daemon at most, fail safe."""

from __future__ import annotations

import logging
import os
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_ft.errors import SlurmCommandError
from slurm_ft.failover import leader as L
from slurm_ft.slurm import parse_config

#: ``scontrol show config`` of a cluster with a backup (the lines leader.py reads; 24.11 layout).
SHOW_CONFIG = """Configuration data as of 2026-12-02T03:00:00
SlurmctldHost[0]        = ctl(172.31.241.10)
SlurmctldHost[1]        = ctl2(172.31.241.9)
SlurmctldTimeout        = 6 sec
StateSaveLocation       = /ctld-state
"""


def _beat(t: int, index: int) -> bytes:
    return struct.pack(">QQ", t, index)


def _ctl(n=2, timeout=6.0, state="/s"):
    return L.Controllers(tuple(f"ctl{i or ''}" for i in range(n)), state, timeout)


def test_controllers_from_scontrol_show_config():
    c = L.Controllers.from_config(parse_config(SHOW_CONFIG))
    assert c.hosts == ("ctl", "ctl2") and c.state_dir == "/ctld-state" and c.timeout_s == 6.0
    assert c.index_of("ctl2") == 1 and c.index_of("ctl.example.org") == 0 and c.index_of("n1") is None


def test_heartbeat_file_is_read_as_slurm_writes_it(tmp_path):
    (tmp_path / "heartbeat").write_bytes(_beat(1_700_000_000, 1))
    assert L.read_heartbeat(tmp_path) == L.Heartbeat(1_700_000_000, 1)
    os.unlink(tmp_path / "heartbeat")
    assert L.read_heartbeat(tmp_path) is None
    (tmp_path / "elsewhere").write_bytes(_beat(1, 0))
    os.symlink(tmp_path / "elsewhere", tmp_path / "heartbeat")
    assert L.read_heartbeat(tmp_path) is None          # never through a symlink


def test_active_only_while_own_controller_writes_a_fresh_heartbeat():
    c = _ctl()
    now = 1000.0
    assert L.decide(c, 0, L.Heartbeat(999, 0), now)[0]
    assert not L.decide(c, 1, L.Heartbeat(999, 0), now)[0]           # backup stands by
    assert L.decide(c, 1, L.Heartbeat(999, 1), now)[0]               # backup took over
    assert not L.decide(c, 0, L.Heartbeat(999, 1), now)[0]           # old primary stands by
    assert not L.decide(c, 1, L.Heartbeat(900, 1), now)[0]           # stale: nobody in control
    assert not L.decide(c, 0, None, now)[0]                          # unreadable: fail safe
    assert L.decide(_ctl(1), 0, None, now)[0]                        # one controller: always
    assert L.decide(c, None, None, now)[0]                           # not a controller host


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.integers(1, 4), st.floats(0, 2**64, allow_nan=False),
       st.floats(1, 300, allow_nan=False))
def test_no_split_brain_for_any_heartbeat_content(data, n, now, timeout):
    """For any bytes in the shared heartbeat file, at most one controller's daemon is active
    (with two or more controllers), and reading never raises."""
    c = _ctl(n, timeout)
    hb = L.parse_heartbeat(data)
    active = [i for i in range(n) if L.decide(c, i, hb, now)[0]]
    assert len(active) <= 1 if n > 1 else active == [0]
    if len(data) != L.HEARTBEAT_BYTES:
        assert hb is None


class _Conf:
    def __init__(self, text=None):
        self.text = text

    def show_config(self):
        if self.text is None:
            raise SlurmCommandError("scontrol show config: Unable to contact slurm controller")
        return parse_config(self.text)


def test_leader_logs_takeover_and_handover(tmp_path, caplog):
    beat = tmp_path / "heartbeat"
    text = SHOW_CONFIG.replace("/ctld-state", str(tmp_path))
    lead = L.discover(_Conf(text), hostname="ctl2")
    beat.write_bytes(_beat(1000, 0))
    with caplog.at_level(logging.INFO, logger="slurm_ft.daemon"):
        assert lead.check(1001) == (False, True)
        assert lead.check(1002) == (False, False)
        beat.write_bytes(_beat(1010, 1))
        assert lead.check(1011) == (True, True)
        beat.write_bytes(_beat(1020, 0))
        assert lead.check(1021) == (False, True)
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING", "WARNING"]
    assert "ctl is in control" in caplog.records[0].getMessage()


def test_unknown_controllers_mean_none():
    assert L.discover(_Conf(None)) is None
    assert L.discover(_Conf("SlurmctldTimeout = 6 sec\n")) is None
