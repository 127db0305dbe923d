"""The daemon's inotify wake-up on the events directory (slurm_ft.failover.wake): real inotify on
a real directory, and the event-record parser under generated input."""

import os
import struct
import threading
import time

from hypothesis import given, settings, strategies as st

from slurm_ft.failover import wake


def _drop(directory, name, delay=0.05):
    def go():
        time.sleep(delay)
        tmp = os.path.join(directory, ".tmp")
        with open(tmp, "w") as fh:
            fh.write("end 5 0 n1 exit=9\n")
        os.rename(tmp, os.path.join(directory, name))
    t = threading.Thread(target=go)
    t.start()
    return t


def test_a_job_end_renamed_in_wakes_at_once(tmp_path):
    w = wake.EventWatch(str(tmp_path))
    assert w.fd is not None, w.why_not
    t = _drop(str(tmp_path), f"{time.time_ns()}.5.end")
    t0 = time.monotonic()
    assert w.wait(5.0) is True
    assert time.monotonic() - t0 < 2.0
    t.join()
    w.close()


def test_a_start_does_not_wake_and_the_timeout_holds(tmp_path):
    w = wake.EventWatch(str(tmp_path))
    t = _drop(str(tmp_path), f"{time.time_ns()}.5.start", delay=0.01)
    t0 = time.monotonic()
    assert w.wait(0.3) is False
    assert time.monotonic() - t0 >= 0.29
    t.join()
    w.close()


def test_without_a_directory_it_is_a_plain_sleep(tmp_path):
    slept = []
    for d in (None, str(tmp_path / "missing")):
        w = wake.EventWatch(d)
        assert w.fd is None and w.why_not
        assert w.wait(0.25, sleep=slept.append) is False
    assert slept == [0.25, 0.25]


def test_a_symlink_in_place_of_the_directory_is_not_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "events"
    link.symlink_to(real)
    w = wake.EventWatch(str(link))
    assert w.fd is None


def _record(name: bytes, pad: int) -> bytes:
    raw = name + b"\0" * pad
    return struct.pack("iIII", 1, wake.IN_MOVED_TO, 0, len(raw)) + raw


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="0123456789.endstarx-", max_size=30), st.integers(0, 7)), max_size=8),
       st.binary(max_size=40))
def test_records_parse_to_their_names_and_garbage_never_raises(items, tail):
    buf = b"".join(_record(n.encode(), pad) for n, pad in items)
    got = wake.names(buf)
    assert got == [n for n, _ in items]
    wake.names(buf + tail)                      # a truncated or garbage tail: no exception
    want = any(len(p := n.split(".")) == 3 and p[0].isdigit() and p[1].isdigit() and p[2] == "end"
               for n, _ in items)
    assert wake.wanted(got) is want
