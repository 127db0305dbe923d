"""The hang stack's private channel (slurm_ft/hang/report.py): the hang watcher (root, node) sends a
hung attempt's stack frames to the history service on the controller in a MUNGE credential of
root; the service stores them as the job's ``hang-stack`` action row; ``ft-history`` shows them,
escaped, to whoever may see the job. Never through Slurm's node field, never a decision input.

The service here never touches the host's munged: credentials are :class:`FakeMunge`'s (as in
tests/test_history_service.py), passed as ``authenticate=``/``sign=``/``encode=``.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from unittest import mock

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft import config as config_mod
from slurm_ft.history import format as fmt
from slurm_ft.history import protocol as history_protocol
from slurm_ft.history import service as history_service
from slurm_ft.errors import SlurmCommandError
from slurm_ft.failover import machine as m
from slurm_ft.failover import policy
from slurm_ft.failover.jobspec import FtOptions
from slurm_ft.failover.marker import FRAME_CHARS, HANG_FRAMES, hang_summary
from slurm_ft.hang import report
from slurm_ft.hang import watcher as wt
from slurm_ft.hang.evidence import MAX_DUMPS
from slurm_ft.history.query import Selection, history
from slurm_ft.cli.history import command
from slurm_ft.history.service import Access, HistoryService, Server
from slurm_ft.journal import open_journal
from slurm_ft.slurm import Job
from slurm_ft.textsafe import terminal_safe

from test_history_service import NOW, FakeMunge  # noqa: E402  the same fake munged and clock

SUMMARY = hang_summary("n1", 62, 60, NOW - 90, 1, 1, 2)
DUMP = ("Thread 4242 (idle): \"MainThread\"\n"
        "    sleep (train.py:55)\n"
        "    <module> (train.py:29)\n")


def _journal(path: Path) -> Path:
    with open_journal(path) as j:
        for job, user in ((5, "alice"), (6, "bob")):
            j.upsert_job(job, name=f"job{job}", user=user, ft_enabled=1, retries=3, ft_state="failover-in-progress",
                         excluded_nodes="")
            j.upsert_attempt(job, 0, nodes="n[1-2]", start=NOW - 200, end=NOW - 50, state="FAILED")
            j.add_verdict(job, 0, "n1", "hang", "no-progress", [], [SUMMARY], action="retry", source="watcher")
            j.record(job, 0, "decide", detail="requeue: hang (no-progress) on n1")
    return path


@pytest.fixture
def db(tmp_path) -> Path:
    return _journal(tmp_path / "daemon.db")


def _service(path, auth=None) -> HistoryService:
    cfg = config_mod.from_dict({"journal": {"path": str(path)}})
    return HistoryService(cfg, authenticate=auth or FakeMunge(), sign=lambda p, uid: FakeMunge.make(0, p).decode(),
                          access=lambda: Access(True, "slurm"), clock=lambda: NOW)


def _body(raw: bytes) -> dict:
    proof, _, body = raw.partition(b"\n")
    assert proof == b"-" or proof.startswith(b"MUNGE:")
    reply = json.loads(body)
    assert reply["v"] == 1 and isinstance(reply["ok"], bool)
    return reply


def _payload(**over) -> bytes:
    q = {"service": "slurm-ft-hang", "v": 1, "job_id": 5, "attempt": 0, "node": "n1",
         "frames": [[4242, "python3", ["sleep (train.py:55)", "<module> (train.py:29)"]]],
         "beat": {"at": NOW - 90, "step": 1}}
    q.update(over)
    return json.dumps(q).encode()


def _stacks(path, job=5, attempt=0) -> list[dict]:
    with open_journal(path, readonly=True) as j:
        return [a for a in j.actions(job, attempt) if a["action"] == report.ACTION]


@pytest.fixture(autouse=True)
def _names(monkeypatch):
    """uids 1001/1002 are alice/bob on this 'controller'."""
    import pwd as pwd_mod
    real = pwd_mod.getpwuid

    class P:
        def __init__(self, name):
            self.pw_name = name

    def getpwuid(uid):
        return P({1001: "alice", 1002: "bob"}[uid]) if uid in (1001, 1002) else real(uid)
    monkeypatch.setattr(history_service.pwd, "getpwuid", getpwuid)


# ------------------------------------------------------------------------------ accepted, stored, shown
def test_a_roots_report_is_stored_and_ft_history_shows_the_frames(db):
    svc = _service(db)
    reply = _body(svc.handle(FakeMunge.make(0, _payload())))
    assert reply["ok"], reply
    (row,) = _stacks(db)
    assert (row["target"], row["status"], row["attempt"]) == ("n1", "done", 0)
    assert json.loads(row["detail"])["frames"] == [[4242, "python3", ["sleep (train.py:55)", "<module> (train.py:29)"]]]
    # root on the controller, the journal file: --detail and the chain view
    r = CliRunner().invoke(command, ["-j", "5", "--detail", "--journal", str(db)])
    assert r.exit_code == 0, r.output
    assert "    stack of pid 4242 (python3) on n1, innermost first:\n      sleep (train.py:55)\n" \
           "      <module> (train.py:29)" in r.output, r.output
    r = CliRunner().invoke(command, ["-j", "5", "--journal", str(db)])
    assert r.exit_code == 0, r.output
    assert f"  attempt 0: {SUMMARY}\n  attempt 0: stack of pid 4242 (python3) on n1, innermost first:\n" \
           f"  attempt 0:   sleep (train.py:55)\n" in r.output, r.output
    # the row decides nothing and reads as no action of its own
    assert history(open_journal(db, readonly=True), 5)["attempts"][0]["action"] == "requeue: hang (no-progress) on n1"


def test_the_owner_sees_the_frames_through_the_service_and_nobody_else(db):
    svc = _service(db)
    assert _body(svc.handle(FakeMunge.make(0, _payload())))["ok"]
    q = history_protocol.encode_query(Selection(job_ids=(), start=0.0, all_users=True))
    alice = _body(svc.handle(FakeMunge.make(1001, q)))
    (h,) = alice["jobs"]
    assert h["job_id"] == 5
    text = fmt.chain(h, detail=True)
    assert "stack of pid 4242 (python3) on n1, innermost first:" in text and "<module> (train.py:29)" in text
    bob = _body(svc.handle(FakeMunge.make(1002, q)))
    assert [j["job_id"] for j in bob["jobs"]] == [6]
    assert "train.py" not in json.dumps(bob)                        # job 6 has no stack; job 5 is not bob's


# ------------------------------------------------------------------------------ refused
def test_a_report_from_anyone_but_root_is_refused_and_logged(db, caplog):
    svc = _service(db)
    with caplog.at_level(logging.INFO, logger="slurm_ft.history.service"):
        reply = _body(svc.handle(FakeMunge.make(1001, _payload()), "10.0.0.9:4000"))
    assert not reply["ok"] and "only from root" in reply["error"] and "\n" not in reply["error"]
    assert _stacks(db) == []
    assert any(r.levelno == logging.INFO and "refused" in r.getMessage() and "10.0.0.9" in r.getMessage()
               for r in caplog.records)


BAD = {
    "extra field": dict(extra=1),
    "bool job id": dict(job_id=True),
    "string job id": dict(job_id="5"),
    "negative attempt": dict(attempt=-1),
    "node with a space": dict(node="n1 n2"),
    "node hostlist": dict(node="n[1-2]"),
    "node control": dict(node="n1\x1b"),
    "version 2": dict(v=2),
    "no frames": dict(frames=[]),
    "too many processes": dict(frames=[[i + 1, "p", ["f"]] for i in range(MAX_DUMPS + 1)]),
    "too many frames": dict(frames=[[1, "p", ["f"] * (HANG_FRAMES + 1)]]),
    "frame too long": dict(frames=[[1, "p", ["x" * (FRAME_CHARS + 1)]]]),
    "empty frame": dict(frames=[[1, "p", [""]]]),
    "pid zero": dict(frames=[[0, "p", ["f"]]]),
    "pid bool": dict(frames=[[True, "p", ["f"]]]),
    "comm not text": dict(frames=[[1, 7, ["f"]]]),
    "frame not text": dict(frames=[[1, "p", [7]]]),
    "process as dict": dict(frames=[{"pid": 1}]),
    "beat not a dict": dict(beat=5),
    "beat time nan": dict(beat={"at": float("nan"), "step": 1}),
    "beat step text": dict(beat={"at": 1.0, "step": "1"}),
    "unknown job": dict(job_id=99),
    "unknown attempt": dict(attempt=7),
    "node not of the attempt": dict(node="n9"),
}


@pytest.mark.parametrize("why", sorted(BAD))
def test_malformed_and_unknown_reports_are_refused(db, why):
    reply = _body(_service(db).handle(FakeMunge.make(0, _payload(**BAD[why]))))
    assert not reply["ok"] and reply["error"] and "\n" not in reply["error"] and "Traceback" not in reply["error"]
    # only a job or attempt the journal has not booked yet is worth another try
    assert reply.get("retry", False) is (why in ("unknown job", "unknown attempt")), reply
    assert _stacks(db) == []


def test_oversize_stale_replayed_and_garbled_reports_are_refused(db):
    auth = FakeMunge()
    svc = _service(db, auth)
    big = _payload(frames=[[1, "p", ["f"]]], pad="x" * report.MAX_REPORT)
    assert not _body(svc.handle(FakeMunge.make(0, big)))["ok"]       # the line itself is past MAX_REQUEST here
    with pytest.raises(ValueError, match="larger"):
        report.parse_report(big)
    old = _body(svc.handle(FakeMunge.make(0, _payload(), NOW - history_service.MAX_AGE_S - 5)))
    assert not old["ok"] and "ago" in old["error"]
    cred = FakeMunge.make(0, _payload())
    assert _body(svc.handle(cred))["ok"]
    again = _body(svc.handle(cred))
    assert not again["ok"] and "Replayed" in again["error"]
    for raw in (b'{"service": "slurm-ft-hang"', b'{"service": "slurm-ft-hang", "v": 1}', b"[\"slurm-ft-hang\"]",
                b'{"service": "slurm-ft-hang", "v": ' + b"[" * 5000 + b"]" * 5000 + b"}"):
        assert not _body(svc.handle(FakeMunge.make(0, raw)))["ok"]
    assert len(_stacks(db)) == 1


def test_reports_per_attempt_are_bounded(db, monkeypatch):
    monkeypatch.setattr(report, "MAX_PER_ATTEMPT", 3)
    svc = _service(db)
    oks = [_body(svc.handle(FakeMunge.make(0, _payload(beat={"at": NOW - i, "step": i}))))["ok"] for i in range(5)]
    assert oks == [True, True, True, False, False]
    assert len(_stacks(db)) == 3


# ------------------------------------------------------------------------------ any text: bounded, escaped
@pytest.fixture(scope="module")
def shared_db(tmp_path_factory) -> Path:
    return _journal(tmp_path_factory.mktemp("hang-stack") / "daemon.db")


_TEXT = st.one_of(st.text(min_size=1, max_size=200),
                  st.text(alphabet=st.sampled_from("\x1b[2J\x07\x00\r\n\u202e\ud800\\\"'|"), min_size=1, max_size=200),
                  st.just("\x1b]0;pwned\x07" * 40))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(comm=_TEXT, frames=st.lists(_TEXT, min_size=0, max_size=HANG_FRAMES + 1),
       more=st.integers(min_value=1, max_value=MAX_DUMPS + 1))
def test_any_frames_text_is_stored_bounded_and_shown_terminal_safe(shared_db, comm, frames, more):
    payload = _payload(frames=[[4242 + i, comm, frames] for i in range(more)])
    with mock.patch.object(report, "MAX_PER_ATTEMPT", 10 ** 9):
        reply = _body(_service(shared_db).handle(FakeMunge.make(0, payload)))
    if not reply["ok"]:
        assert reply["error"] and "\n" not in reply["error"]
        return
    row = _stacks(shared_db)[-1]
    assert len(row["detail"]) <= report.MAX_DETAIL
    stored = json.loads(row["detail"])["frames"]
    for _, name, fs in stored:
        assert name.isascii() and name.isprintable() and len(name) <= 32
        assert all(f.isascii() and f.isprintable() and len(f) <= FRAME_CHARS for f in fs)
    h = {"attempts": [{"attempt": 0, "verdicts": [], "actions": [row]}]}
    lines = fmt.hang_lines(h)
    assert len(lines) <= fmt.STACK_NODES * fmt.STACK_PROCS * (1 + fmt.STACK_FRAMES) + 1
    for line in lines:
        assert terminal_safe(line) == line and line.isprintable() and len(line) <= 400


@settings(max_examples=200, deadline=None)
@given(dump=st.text(max_size=600), comm=st.text(max_size=80), n=st.integers(1, MAX_DUMPS + 3),
       beat=st.one_of(st.none(), st.floats(allow_nan=True)), step=st.one_of(st.none(), st.integers(-5, 10 ** 20)))
def test_the_watchers_own_report_is_always_one_the_service_accepts(dump, comm, n, beat, step):
    payload = report.encode_report(5, 0, "n1", [(100 + i, comm, "Thread 1 (idle)\n  " + dump) for i in range(n)],
                                   beat, step)
    if payload is None:
        return
    r = report.parse_report(payload)
    assert len(payload) <= report.MAX_REPORT and len(r.frames) <= MAX_DUMPS


def test_stack_lines_read_any_row_defensively():
    for detail in (None, "", "x", "[]", '{"frames": 5}', '{"frames": [[1, "p"]]}', '{"frames": [[{}, [], [1, null]]]}',
                   json.dumps({"frames": [[1, "\x1b[2J", ["\x1b]0;x\x07", "\u202e"]]]})):
        row = {"action": report.ACTION, "status": "done", "target": "n1\x1b", "detail": detail}
        a = {"attempt": 0, "actions": [row]}
        for line in fmt.stack_lines(a):
            assert terminal_safe(line) == line


# ------------------------------------------------------------------------------ decides nothing
OPTS = FtOptions(True, 3, "USR1", 60)


def _slurm_job(state: str, restart: int = 0) -> Job:
    return Job.from_json({"job_id": 5, "name": "job5", "user_name": "alice", "job_state": state,
                          "state_reason": "NonZeroExitCode", "nodes": "n[1-2]", "restart_cnt": restart,
                          "exit_code": 256 if state != "RUNNING" else 0, "start_time": int(NOW - 200),
                          "end_time": int(NOW - 50), "priority": 10})


def _facts(path) -> m.Facts:
    """The facts the daemon reads of a job (slurm_ft.failover.daemon: its journal rows)."""
    with open_journal(path, readonly=True) as j:
        return m.Facts(5, row=j.job(5), actions=tuple(j.actions(5)), verdicts=tuple(j.node_verdicts(5)),
                       attempts=tuple(j.attempts(5)), opts=OPTS, seen_ended=NOW - 30)


@pytest.mark.parametrize("state,restart,decided", [("FAILED", 0, False), ("FAILED", 0, True), ("RUNNING", 0, False),
                                                   ("PENDING", 1, True), ("RUNNING", 1, True)])
def test_the_daemons_decision_is_the_same_with_and_without_the_row(tmp_path, state, restart, decided):
    plans = []
    for with_row in (False, True):
        path = tmp_path / f"{with_row}.db"
        with open_journal(path) as j:
            j.upsert_job(5, name="job5", user="alice", ft_enabled=1, retries=3, ft_state=policy.RUNNING,
                         excluded_nodes="")
            j.upsert_attempt(5, 0, nodes="n[1-2]", start=NOW - 200, end=NOW - 50, state="FAILED")
            j.add_verdict(5, 0, "n1", "hang", "no-progress", [], [SUMMARY], action="retry", source="watcher")
            if decided:
                j.record(5, 0, "failover", detail=json.dumps({"reason": "hang", "blamed": []}))
        if with_row:
            assert _body(_service(path).handle(FakeMunge.make(0, _payload())))["ok"]
        facts = _facts(path)
        assert any(a["action"] == report.ACTION for a in facts.actions) == with_row
        view = m.View(NOW, {}, config_mod.from_dict({}).failover, top_priority=100)
        plans.append(m.plan(_slurm_job(state, restart), facts, view))
    assert plans[0] == plans[1]


# ------------------------------------------------------------------------------ the watcher's send
class _Slurm:
    """A Slurm whose ``scontrol show config`` takes ``delay_s`` (then names ``ctl``)."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s

    def run(self, cmd, *args, timeout_s=None, **kw):
        if self.delay_s > (timeout_s or 1e9):
            time.sleep(timeout_s)
            raise SlurmCommandError(f"{cmd} timed out after {timeout_s:.1f} s")
        time.sleep(self.delay_s)

        class P:
            stdout = "SlurmctldHost[0]     = ctl(127.0.0.1)\n"
        return P()


def _cfg(endpoint: str = "", port: int = 6827):
    return config_mod.from_dict({"history": {"endpoint": endpoint, "port": port}})


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _encode(payload: bytes) -> str:
    return FakeMunge.make(0, payload).decode()


def _timed_send(cfg, slurm=None) -> tuple[bool, float, list[str]]:
    logs: list[str] = []
    t0 = time.monotonic()
    ok = report.send(cfg, slurm or _Slurm(), _payload(), logs.append, encode=_encode)
    return ok, time.monotonic() - t0, logs


def test_the_send_is_bounded_when_nothing_listens():
    ok, took, logs = _timed_send(_cfg(f"127.0.0.1:{_closed_port()}"))
    assert not ok and took < report.SEND_S + 0.5, took
    assert len(logs) == 1 and "not sent" in logs[0] and "\n" not in logs[0]


def test_the_send_is_bounded_when_the_port_accepts_and_never_answers():
    silent = socket.create_server(("127.0.0.1", 0), backlog=8)      # the kernel accepts; nobody answers
    try:
        ok, took, logs = _timed_send(_cfg(f"127.0.0.1:{silent.getsockname()[1]}"))
    finally:
        silent.close()
    assert not ok and report.SEND_S - 0.5 <= took < report.SEND_S + 0.5, took
    assert len(logs) == 1 and "not sent" in logs[0]


def test_the_send_is_bounded_when_scontrol_hangs():
    ok, took, logs = _timed_send(_cfg(port=_closed_port()), _Slurm(delay_s=30))
    assert not ok and took < report.SEND_S + 0.5, took
    assert logs and "not sent" in logs[0]


def test_the_watcher_sends_its_report_to_the_service(db, tmp_path):
    """End to end over a socket: the watcher's dumps -> the service -> the journal row -> ft-history."""
    svc = _service(db)
    srv = Server(svc, "127.0.0.1", 0, workers=2, read_s=2.0).start()
    try:
        cfg = config_mod.from_dict({"history": {"endpoint": f"127.0.0.1:{srv.address[1]}"},
                                    "node_state": {"dir": str(tmp_path / "state")},
                                    "hang": {"heartbeat_dir": str(tmp_path / "hb" / "{node}")}})
        logs: list[str] = []
        w = wt.Watcher(cfg, wt.Watch(5, 0, "n2", 1001, 1001, (0,), 60.0, 0.0), _Slurm(), logs.append)
        w.report_encode = _encode
        w.dumps, w.beat_at = [(777, "python3", DUMP), (778, "python3", "no stack dump: py-spy timed out")], NOW - 90
        t0 = time.monotonic()
        w.send_report(1)
        assert time.monotonic() - t0 < report.SEND_S + 0.5
    finally:
        srv.stop()
    assert any("hang report sent" in line for line in logs), logs
    (row,) = _stacks(db)
    assert row["target"] == "n2"
    r = CliRunner().invoke(command, ["-j", "5", "--detail", "--journal", str(db)])
    assert "stack of pid 777 (python3) on n2, innermost first:" in r.output and "stack of pid 778 (python3) on n2: " \
        "no frame" in r.output, r.output


def test_a_report_ahead_of_the_journal_is_sent_again_until_the_attempt_is_booked(db):
    """The watcher's report can reach the service before the daemon books the attempt (a loaded
    node, a busy controller): the service says ``retry``, the watcher tries again with a new
    credential (the fake munged, like munged, refuses a replayed one) and the report is stored;
    a refusal that would never pass is not tried again."""
    srv = Server(_service(db), "127.0.0.1", 0, workers=2, read_s=2.0).start()
    try:
        cfg = _cfg(f"127.0.0.1:{srv.address[1]}")
        late = _payload(attempt=1)           # attempt 1: not booked yet

        def book():
            time.sleep(1.2)
            with open_journal(db) as j:
                j.upsert_attempt(5, 1, nodes="n1", start=NOW - 10, state="FAILED")
        import threading
        booker = threading.Thread(target=book)
        booker.start()
        made = []

        def fresh(payload: bytes) -> str:        # munged makes each credential unique
            made.append(payload)
            return FakeMunge.make(0, payload, NOW - len(made)).decode()
        logs: list[str] = []
        ok = report.send(cfg, _Slurm(), late, logs.append, encode=fresh)
        booker.join()
        assert ok and len(logs) == 1 and "hang report sent" in logs[0] and "tries)" in logs[0], logs
        assert [r["attempt"] for r in _stacks(db, attempt=1)] == [1]
        logs.clear()
        t0 = time.monotonic()
        ok = report.send(cfg, _Slurm(), _payload(node="n9"), logs.append, encode=_encode)
        assert not ok and time.monotonic() - t0 < 1.0 and len(logs) == 1 and "tries" not in logs[0], logs
    finally:
        srv.stop()


def test_the_watcher_sends_nothing_without_a_frame(tmp_path):
    cfg = config_mod.from_dict({"history": {"endpoint": f"127.0.0.1:{_closed_port()}"}})
    logs: list[str] = []
    w = wt.Watcher(cfg, wt.Watch(5, 0, "n1", 1001, 1001, (0,), 60.0, 0.0), _Slurm(), logs.append)
    w.report_encode = lambda p: pytest.fail("nothing to send")
    w.dumps = [(777, "python3", "no stack dump: py-spy is not installed")]
    w.send_report(None)
    assert logs == ["hang report not sent: no stack frame to send"]


def test_a_send_that_raises_never_reaches_the_watcher(tmp_path):
    cfg = config_mod.from_dict({"history": {"endpoint": "127.0.0.1:1"}})
    logs: list[str] = []
    w = wt.Watcher(cfg, wt.Watch(5, 0, "n1", 1001, 1001, (0,), 60.0, 0.0), _Slurm(), logs.append)

    def boom(payload):
        raise RuntimeError("bug")
    w.report_encode = boom
    w.dumps = [(777, "python3", DUMP)]
    w.send_report(1)
    assert logs and "RuntimeError" in logs[-1]


def test_the_epilogs_sigterm_waits_for_the_send(tmp_path):
    """The job's end runs the epilog, whose backstop SIGTERMs the watcher (epilog_cleanup): a
    SIGTERM arriving mid-send takes effect only once the (bounded) send is over, and the outcome
    is logged first (a loaded lab lost the report mid-send before this)."""
    import signal
    import subprocess
    import sys
    import textwrap
    prog = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from slurm_ft import config as config_mod
        from slurm_ft.hang import watcher as wt
        cfg = config_mod.from_dict({{"history": {{"endpoint": "127.0.0.1:{_closed_port()}"}}}})
        class S:
            def run(self, *a, **k):
                raise AssertionError("no scontrol")
        w = wt.Watcher(cfg, wt.Watch(5, 0, "n1", 1001, 1001, (0,), 60.0, 0.0), S(), lambda m: print(m, flush=True))
        def encode(payload):
            os.kill(os.getpid(), signal.SIGTERM)       # the epilog's backstop, mid-send
            return "MUNGE:fake"
        w.report_encode = encode
        w.dumps = [(777, "python3", {DUMP!r})]
        w.send_report(1)
        print("after the send", flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=30)
    assert r.returncode == -signal.SIGTERM, (r.returncode, r.stdout, r.stderr)
    assert "hang report" in r.stdout and "after the send" not in r.stdout, (r.stdout, r.stderr)
