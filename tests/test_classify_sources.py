"""Evidence sources: /dev/kmsg records, dmesg fallback, root-safe reading of job output."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from slurm_ft.classify import sources
from slurm_ft.classify.sources import read_kmsg, read_tail_safely
from slurm_ft.errors import EvidenceError

FIXTURES = Path(__file__).parent / "fixtures" / "classify"


def test_read_kmsg_record_format_and_time_filter():
    msgs = read_kmsg(200.0, path=str(FIXTURES / "kmsg_records.txt"))
    assert len(msgs) == 3
    assert msgs[0].startswith("NVRM: Xid (PCI:0000:07:00): 48")
    assert not any(m.startswith(" ") or "SUBSYSTEM=" in m for m in msgs)
    assert read_kmsg(1e9, path=str(FIXTURES / "kmsg_records.txt")) == []


def test_read_kmsg_keeps_newest_within_max_bytes():
    msgs = read_kmsg(0.0, path=str(FIXTURES / "kmsg_records.txt"), max_bytes=100)
    assert msgs == ["usb 1-1: new high-speed USB device number 2 using xhci_hcd"]


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="no readable /dev/kmsg")
def test_read_real_kmsg():
    """The real kernel log of this machine (read-only, non-blocking: returns at EAGAIN)."""
    assert isinstance(read_kmsg(0.0), list)
    import time
    assert read_kmsg(time.monotonic() + 3600) == []


def test_dmesg_fallback(tmp_path, monkeypatch):
    fake = tmp_path / "dmesg"
    fake.write_text("#!/bin/sh\necho '[  100.000000] old line'\necho '[  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid=1'\necho 'no stamp'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sources, "DMESG_PATHS", (str(fake),))
    msgs = read_kmsg(200.0, path=str(tmp_path / "missing"))
    assert msgs == ["NVRM: Xid (PCI:0000:07:00): 48, pid=1"]


def test_dmesg_failure_and_absence_raise(tmp_path, monkeypatch):
    fake = tmp_path / "dmesg"
    fake.write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sources, "DMESG_PATHS", (str(fake),))
    with pytest.raises(EvidenceError, match="not permitted"):
        read_kmsg(0.0, path=str(tmp_path / "missing"))
    monkeypatch.setattr(sources, "DMESG_PATHS", (str(tmp_path / "nope"),))
    with pytest.raises(EvidenceError, match="no dmesg"):
        read_kmsg(0.0, path=str(tmp_path / "missing"))


def test_tail_reads_last_bytes_and_replaces_bad_utf8(tmp_path):
    p = tmp_path / "slurm-1.out"
    p.write_bytes(b"first line\n" + b"x" * 100 + b"\nCUDA out of memory \xff\xfe\n")
    uid = os.getuid()
    assert read_tail_safely(str(p), expected_uid=uid).startswith("first line")
    tail = read_tail_safely(str(p), expected_uid=uid, max_bytes=40)
    assert tail == "CUDA out of memory \ufffd\ufffd\n"
    assert read_tail_safely(str(p), expected_uid=None, max_bytes=0) == ""


def test_tail_refuses_symlink(tmp_path):
    target = tmp_path / "secret"
    target.write_text("root:$6$hash\n")
    link = tmp_path / "slurm-1.out"
    link.symlink_to(target)
    with pytest.raises(EvidenceError, match="symbolic link"):
        read_tail_safely(str(link), expected_uid=os.getuid())
    with pytest.raises(EvidenceError, match="uid is unknown"):       # no read without the job's uid
        read_tail_safely(str(target), expected_uid=None)


def test_tail_refuses_wrong_owner(tmp_path):
    p = tmp_path / "slurm-1.out"
    p.write_text("hello\n")
    # as root the reader becomes that uid, which may not even enter pytest's 0700 directory
    with pytest.raises(EvidenceError, match="owned by uid|Permission denied"):
        read_tail_safely(str(p), expected_uid=os.getuid() + 12345)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to chown")
def test_tail_refuses_hardlink_to_root_file_when_run_as_root(tmp_path):
    """A user hard-links /etc/shadow-like root files into the output path: the owner check stops it."""
    import tempfile
    tmp_path = Path(tempfile.mkdtemp(prefix="slurm-ft-tail-", dir="/tmp"))   # uid 1000 must enter it
    os.chmod(tmp_path, 0o755)
    root_file = tmp_path / "shadow"
    root_file.write_text("root:$6$hash\n")
    user_dir = tmp_path / "home"
    user_dir.mkdir()
    os.link(root_file, user_dir / "slurm-1.out")
    with pytest.raises(EvidenceError, match="owned by uid 0"):
        read_tail_safely(str(user_dir / "slurm-1.out"), expected_uid=1000)
    (user_dir / "mine.out").write_text("ok\n")
    os.chown(user_dir / "mine.out", 1000, 1000)
    assert read_tail_safely(str(user_dir / "mine.out"), expected_uid=1000) == "ok\n"
    shutil.rmtree(tmp_path)


def test_tail_refuses_fifo_directory_and_missing(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(EvidenceError, match="not a regular file"):
        read_tail_safely(str(fifo), expected_uid=os.getuid())
    with pytest.raises(EvidenceError):
        read_tail_safely(str(tmp_path), expected_uid=os.getuid())
    with pytest.raises(EvidenceError, match="cannot open"):
        read_tail_safely(str(tmp_path / "missing"), expected_uid=os.getuid())


def test_tail_unreadable(tmp_path):
    if os.getuid() == 0 or shutil.which("true") is None:
        pytest.skip("root reads everything")
    p = tmp_path / "x"
    p.write_text("x")
    p.chmod(0)
    with pytest.raises(EvidenceError, match="cannot open"):
        read_tail_safely(str(p), expected_uid=os.getuid())
    p.chmod(stat.S_IRUSR)
