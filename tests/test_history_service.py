"""The history service (slurm_ft/history/service.py, slurm_ft/history/client.py): ordinary users'
``ft-history`` answered by the controller for the uid MUNGE vouches for.

Generative: any request bytes, any query a user can forge, any answer a port can send -> a
refusal or an answer, never an exception, and never a job of another user under
``PrivateData=jobs``. Real parts: real SQLite journals, real MUNGE (the host's munged, or a
private one started here), real sockets, the real service process started as the daemon starts it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft import config as config_mod
from slurm_ft.history import client as history_client
from slurm_ft.history import protocol as history_protocol
from slurm_ft.history import service as history_service
from slurm_ft.slurm import munge
from slurm_ft.history.query import Selection
from slurm_ft.cli.history import command
from slurm_ft.history.client import ServiceError, controllers, parse_endpoints
from slurm_ft.history.service import Access, HistoryService, Server, parse_query, viewer_for
from slurm_ft.journal import open_journal
from slurm_ft.slurm.munge import Credential, MungeError

NOW = time.time()
#: job -> owner as Slurm recorded it; 7 has no owner on record (a verdict only)
OWNERS = {5: "alice", 6: "bob", 8: "alice", 9: "1002", 10: "root"}
UIDS = {"alice": 1001, "bob": 1002}


def _journal(path: Path) -> Path:
    with open_journal(path) as j:
        for job, user in OWNERS.items():
            j.upsert_job(job, name=f"job{job}", user=user, ft_enabled=1, retries=2, ft_state="failed-over",
                         excluded_nodes="")
            j.upsert_attempt(job, 0, nodes="n1", start=NOW - 100, end=NOW - 50, state="FAILED")
            j.add_verdict(job, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:10:00"}],
                          [f"NVRM: Xid (PCI:0000:10:00): 79, job {job} \x1b[2J"])
            j.upsert_attempt(job, 1, nodes="n2", start=NOW - 40, state="RUNNING")
        j.add_verdict(7, 0, "n2", "user", "cuda-oom", [], [])
    return path


@pytest.fixture(scope="module")
def journal_path(tmp_path_factory) -> Path:
    return _journal(tmp_path_factory.mktemp("hs") / "daemon.db")


class FakeMunge:
    """``MUNGE:<uid>:<encode time>:<payload hex>`` credentials, each decoded once (as munged)."""

    def __init__(self):
        self.seen = set()

    @staticmethod
    def make(uid: int, payload: bytes, at: float = NOW) -> bytes:
        return f"MUNGE:{uid}:{int(at)}:{payload.hex()}".encode()

    def __call__(self, text: str) -> Credential:
        parts = text.split(":")
        if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
            raise MungeError("munge: Invalid credential", 14)
        if text in self.seen:
            raise MungeError("munge: Replayed credential", 17)
        self.seen.add(text)
        try:
            payload = bytes.fromhex(parts[3])
        except ValueError:
            raise MungeError("munge: Invalid credential", 14) from None
        return Credential(int(parts[1]), int(parts[1]), payload, int(parts[2]))


def _service(journal_path, private=True, auth=None, sign=None) -> HistoryService:
    cfg = config_mod.from_dict({"journal": {"path": str(journal_path)}})
    sign = sign or (lambda payload, uid: FakeMunge.make(0, payload).decode())   # never the host's munged
    return HistoryService(cfg, authenticate=auth or FakeMunge(), sign=sign, access=lambda: Access(private, "slurm"),
                          clock=lambda: NOW)


def _body(raw: bytes) -> dict:
    """The JSON of an answer (after its proof line)."""
    proof, _, body = raw.partition(b"\n")
    assert proof == b"-" or proof.startswith(b"MUNGE:")
    return json.loads(body)


def _query(**kw) -> bytes:
    sel = Selection(**{"start": 0.0, **kw})
    return history_protocol.encode_query(sel)


def _ask(svc, uid, payload, at=NOW) -> dict:
    reply = _body(svc.handle(FakeMunge.make(uid, payload, at)))
    assert reply["v"] == 1 and isinstance(reply["ok"], bool)
    return reply


@pytest.fixture(autouse=True)
def _names(monkeypatch):
    """uids 1001/1002 are alice/bob on this 'controller'."""
    import pwd as pwd_mod
    real = pwd_mod.getpwuid

    class P:
        def __init__(self, name):
            self.pw_name = name

    def getpwuid(uid):
        for name, u in UIDS.items():
            if uid == u:
                return P(name)
        return real(uid)
    monkeypatch.setattr(history_service.pwd, "getpwuid", getpwuid)


# ------------------------------------------------------------------------------ who sees what
def test_owner_sees_own_jobs_by_default_and_only_them(journal_path):
    svc = _service(journal_path)
    alice = _ask(svc, 1001, _query())
    assert alice["ok"] and alice["user"] == "alice"
    assert sorted(h["job_id"] for h in alice["jobs"]) == [5, 8]
    ev = alice["jobs"][0]["attempts"][0]["verdicts"][0]["evidence"]
    assert ev and "Xid" in ev[0]                                   # the evidence lines travel
    bob = _ask(svc, 1002, _query(all_users=True))
    assert sorted(h["job_id"] for h in bob["jobs"]) == [6, 9]       # 9 is recorded under bob's uid


def test_another_users_job_reads_like_an_unknown_one(journal_path):
    svc = _service(journal_path)
    other = _ask(svc, 1001, _query(job_ids=("6",)))
    unknown = _ask(svc, 1001, _query(job_ids=("99",)))
    assert other["ok"] and other["jobs"] == [] and unknown["jobs"] == []
    assert other["error"].replace("job 6", "job N") == unknown["error"].replace("job 99", "job N")
    assert "not yours" in other["error"]


def test_root_and_slurm_user_see_all_and_no_private_data_shows_all(journal_path):
    svc = _service(journal_path)
    assert len(_ask(svc, 0, _query(all_users=True))["jobs"]) == len(OWNERS)
    assert _ask(svc, 1001, _query(job_ids=("6",), all_users=True))["jobs"] == []
    open_svc = _service(journal_path, private=False)
    assert [h["job_id"] for h in _ask(open_svc, 1001, _query(job_ids=("6",)))["jobs"]] == [6]
    assert viewer_for(1002, Access(True, "bob")).sees_all            # bob is SlurmUser


def test_stale_future_and_replayed_credentials_are_refused(journal_path):
    auth = FakeMunge()
    svc = _service(journal_path, auth=auth)
    old = _body(svc.handle(FakeMunge.make(1001, _query(), NOW - history_service.MAX_AGE_S - 5)))
    assert not old["ok"] and "ago" in old["error"]
    future = _body(svc.handle(FakeMunge.make(1001, _query(), NOW + 3600)))
    assert not future["ok"] and "future" in future["error"]
    cred = FakeMunge.make(1001, _query())
    assert _body(svc.handle(cred))["ok"]
    again = _body(svc.handle(cred))
    assert not again["ok"] and "Replayed" in again["error"]


def test_a_credential_made_for_something_else_is_refused(journal_path):
    svc = _service(journal_path)
    for payload in (b"", b"{}", b'{"service": "slurm", "v": 1}', json.dumps({"service": "slurm-ft-history",
                                                                             "v": 2}).encode()):
        reply = _ask(svc, 1001, payload)
        assert not reply["ok"] and reply["error"]


# ------------------------------------------------------------------------------ generative
_words = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
_json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | _words
_json = st.recursive(_json_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_words, inner,
                                                                                                max_size=4),
                     max_leaves=12)
_job_items = st.sampled_from(["5", "6", "7", "8", "9", "10", "99", "6_1", "6_[0-3]", "5,6", "0", "x", "6.0", "",
                              "4294967296"]) | _words
_queries = st.fixed_dictionaries(
    {"service": st.just("slurm-ft-history"), "v": st.just(1)},
    optional={"jobs": st.lists(_job_items, max_size=5) | _json,
              "users": st.none() | st.lists(st.sampled_from(["alice", "bob", "1002", "root", "0", "slurm", "a b",
                                                             "\x1b", ""]) | _words, max_size=4) | _json,
              "all_users": st.booleans() | _json, "start": st.floats() | st.integers() | _json,
              "end": st.none() | st.floats() | _json,
              "states": st.lists(st.sampled_from(["running", "FAILED", "F", "failed-over", "nope"]), max_size=3),
              "duplicates": st.booleans(), "accounts": st.none() | st.lists(_words, max_size=2),
              "extra": _json})


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(query=_queries)
def test_forged_queries_never_leak_another_users_job(journal_path, query):
    svc = _service(journal_path)
    reply = _ask(svc, 1001, json.dumps(query).encode())
    if reply["ok"]:
        assert all(h["user"] == "alice" for h in reply["jobs"]), reply
    else:
        assert isinstance(reply["error"], str) and "Traceback" not in reply["error"]


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=st.binary(max_size=300) | st.builds(lambda p: b"MUNGE:" + p, st.binary(max_size=200)) |
       st.builds(lambda uid, p: FakeMunge.make(uid, p), st.integers(0, 2 ** 32 - 1), st.binary(max_size=200)))
def test_garbled_requests_never_crash_the_service(journal_path, request):
    svc = _service(journal_path)
    reply = _body(svc.handle(request))
    assert reply["v"] == 1 and isinstance(reply["ok"], bool)
    if reply["ok"]:                              # a well-formed query by some uid: only what it may see
        uid = int(request.split(b":")[1])
        mine = {u for u, n in UIDS.items() if n == uid} | {str(uid)}
        assert uid == 0 or all(h["user"] in mine for h in reply["jobs"])


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=400) | _json.map(lambda v: json.dumps(v).encode()))
def test_parse_query_raises_only_bad_request(payload):
    try:
        parse_query(payload)
    except history_protocol.BadRequest:
        pass


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_parse_endpoints_raises_only_value_error(text):
    try:
        for host, port in parse_endpoints(text, 6827):
            assert host and 1 <= port <= 65535
    except ValueError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(proof=st.binary(max_size=80) | st.just(b"-"), reply=_json | st.fixed_dictionaries(
    {"v": st.just(1), "ok": st.just(True), "jobs": st.lists(st.dictionaries(_words, _json, max_size=6) | _json,
                                                          max_size=3), "error": _json, "warnings": _json}))
def test_an_answer_without_roots_proof_is_never_shown(proof, reply):
    try:
        history_client._decode(proof + b"\n" + json.dumps(reply).encode(), "ctl:6827", b"MUNGE:req", FakeMunge())
    except ServiceError:
        return
    raise AssertionError("accepted an answer without a valid proof")


def test_the_proof_binds_root_the_request_and_the_answer(journal_path):
    svc = _service(journal_path)
    request = FakeMunge.make(1001, _query())
    raw = svc.handle(request)
    answer = history_client._decode(raw, "ctl:6827", request, FakeMunge())
    assert [h["job_id"] for h in answer.jobs] == [5, 8]
    proof, _, body = raw.partition(b"\n")
    for bad in (raw.replace(b'"alice"', b'"mallory"'),                                    # tampered
                proof + b"\n" + body.replace(b'"ok":true', b'"ok":true ', 1),
                FakeMunge.make(1001, history_protocol.proof_payload(request, body)) + b"\n" + body,   # not root
                raw):                                                                    # another request
        with pytest.raises(ServiceError, match="not shown"):
            history_client._decode(bad, "ctl:6827", request if bad is not raw else FakeMunge.make(1001, b"x"),
                                   FakeMunge())


def test_endpoints_and_controllers():
    assert parse_endpoints("ctl1:7000, ctl2,[::1]:9", 6827) == [("ctl1", 7000), ("ctl2", 6827), ("::1", 9)]
    for bad in ("", "a:0", "a:99999", "a b", "a;rm", "a:b:c"):
        with pytest.raises(ValueError):
            parse_endpoints(bad, 6827)
    conf = {"SlurmctldHost[0]": "vm(127.0.0.1)", "SlurmctldHost[1]": "backup", "SlurmctldHost": "x"}
    assert controllers(conf, 6827) == [("127.0.0.1", 6827), ("backup", 6827)]
    assert controllers({"SlurmctldHost": "ctl(10.0.0.1),ctl2"}, 1) == [("10.0.0.1", 1), ("ctl2", 1)]
    with pytest.raises(config_mod.ConfigError, match="history.endpoint"):
        config_mod.from_dict({"history": {"endpoint": "a b"}})
    with pytest.raises(config_mod.ConfigError, match="history.port"):
        config_mod.from_dict({"history": {"port": 0}})


def test_wanted_only_for_users_who_cannot_read_the_journal(journal_path, tmp_path):
    assert not history_client.wanted(str(journal_path), False, uid=0)
    assert not history_client.wanted(str(journal_path), True, uid=1001)
    assert history_client.wanted(str(tmp_path / "no-such.db"), False, uid=1001)


# ------------------------------------------------------------------------------ the socket
def _server(journal_path, workers=2, read_s=5.0, svc=None) -> Server:
    return Server(svc or _service(journal_path), "127.0.0.1", 0, workers=workers, read_s=read_s).start()


def _raw(addr, data: bytes | None, timeout=20.0) -> dict:
    with socket.create_connection(addr, timeout=timeout) as s:
        if data is not None:
            s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return _body(out)


def test_socket_limits(journal_path):
    srv = _server(journal_path, read_s=0.5)
    try:
        assert _raw(srv.address, FakeMunge.make(1001, _query()) + b"\n")["ok"]
        slow = _raw(srv.address, None)                               # sends nothing: cut off
        assert not slow["ok"] and "no request line" in slow["error"]
        big = _raw(srv.address, b"MUNGE:" + b"A" * (history_protocol.MAX_REQUEST + 10))
        assert not big["ok"]
    finally:
        srv.stop()


def test_busy_when_every_slot_is_taken(journal_path):
    gate = threading.Event()
    svc = _service(journal_path)
    real = svc.handle
    svc.handle = lambda req, peer="?": (gate.wait(30), real(req, peer))[1]
    srv = _server(journal_path, workers=1, svc=svc)
    held = []
    try:
        for i in range(4):                                            # 4 x workers slots, all taken
            s = socket.create_connection(srv.address, timeout=30)
            s.sendall(FakeMunge.make(1001, _query(), NOW - i) + b"\n")
            held.append(s)
        deadline = time.monotonic() + 20
        while srv._slots._value and time.monotonic() < deadline:
            time.sleep(0.01)
        busy = _raw(srv.address, FakeMunge.make(1001, _query()) + b"\n")
        assert not busy["ok"] and "busy" in busy["error"]
        gate.set()
        for s in held:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            assert _body(data)["ok"]
    finally:
        gate.set()
        for s in held:
            s.close()
        srv.stop()


# ------------------------------------------------------------------------------ real MUNGE
@pytest.fixture(scope="module")
def munge_socket():
    """The socket of a working munged: the host's (None) or a private one started here (root)."""
    if not munge.available():
        pytest.skip("libmunge is not installed (make setup installs munge)")
    try:
        munge.decode(munge.encode(b"probe"))
        yield None
        return
    except MungeError:
        pass
    if os.geteuid() != 0 or not Path("/usr/sbin/munged").exists():
        pytest.skip("no munged running and cannot start one (needs root and munged)")
    d = Path(tempfile.mkdtemp(prefix="ft-munge-"))
    d.chmod(0o711)
    (d / "key").write_bytes(os.urandom(1024))
    (d / "key").chmod(0o400)
    sock = str(d / "socket")
    proc = subprocess.Popen(["/usr/sbin/munged", "--foreground", "--force", f"--socket={sock}",
                             f"--key-file={d / 'key'}", f"--log-file={d / 'log'}", f"--pid-file={d / 'pid'}",
                             f"--seed-file={d / 'seed'}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                munge.encode(b"probe", socket=sock)
                break
            except MungeError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("the private munged did not start")
                time.sleep(0.05)
        yield sock
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def test_real_munge_credentials(journal_path, munge_socket):
    decode = lambda text: munge.decode(text, socket=munge_socket)   # noqa: E731
    svc = _service(journal_path, auth=decode,
                   sign=lambda payload, uid: munge.encode(payload, socket=munge_socket, decoder_uid=uid))
    svc.clock = time.time
    cred = munge.encode(_query(all_users=True), socket=munge_socket).encode()
    root = _body(svc.handle(cred))
    assert root["ok"] and root["user"] == "root" and len(root["jobs"]) == len(OWNERS)
    replay = _body(svc.handle(cred))
    assert not replay["ok"] and "Replayed" in replay["error"]
    forged = cred[:-12] + (b"A" * 12 if not cred.endswith(b"A" * 12) else b"B" * 12)
    assert not _body(svc.handle(forged))["ok"]
    # another uid: the credential made by uid 1001 (setpriv) is alice's, whatever the query says
    if os.geteuid() == 0 and shutil.which("setpriv"):
        argv = ["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups", "/usr/bin/munge", "-s",
                _query(users=frozenset({"bob"}), all_users=True).decode()]
        if munge_socket:
            argv[5:5] = ["-S", munge_socket]
        made = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert made.returncode == 0, made.stderr
        alice = _body(svc.handle(made.stdout.strip().encode()))
        assert alice["ok"] and alice["user"] == "alice" and alice["jobs"] == []


def test_ft_history_through_the_service(journal_path, munge_socket, monkeypatch, tmp_path):
    svc = _service(journal_path, auth=lambda text: munge.decode(text, socket=munge_socket),
                   sign=lambda payload, uid: munge.encode(payload, socket=munge_socket, decoder_uid=uid))
    svc.clock = time.time
    srv = _server(journal_path, svc=svc)
    cfg = tmp_path / "ft.toml"
    cfg.write_text(f'[journal]\npath = "{tmp_path / "none.db"}"\n[history]\nendpoint = "127.0.0.1:{srv.address[1]}"\n')
    monkeypatch.setattr(history_client, "wanted", lambda path, explicit, uid=None: not explicit)
    real_encode, real_decode = munge.encode, munge.decode
    monkeypatch.setattr(munge, "encode", lambda payload, socket=None, decoder_uid=None:
                        real_encode(payload, socket=munge_socket, decoder_uid=decoder_uid))
    monkeypatch.setattr(munge, "decode", lambda text, socket=None: real_decode(text, socket=munge_socket))
    try:
        out = CliRunner().invoke(command, ["--config", str(cfg), "-j", "5", "--detail"])
        assert out.exit_code == 0, out.output
        assert "Job 5 (job5)" in out.output and "\x1b" not in out.output and "n1 hardware (xid-79)" in out.output
        nodes = CliRunner().invoke(command, ["--config", str(cfg), "-N", "n1", "-S", "2000-01-01"])
        assert nodes.exit_code == 0, nodes.output
        assert "Job 5 (job5)" in nodes.output and "did not send" not in nodes.output, nodes.output
        assert "No drains or repairs of n1 in the time window." in nodes.output    # the service's node part
        missing = CliRunner().invoke(command, ["--config", str(cfg), "-j", "99"])
        assert missing.exit_code == 1 and "job 99 is not in the journal" in missing.output
        assert "Traceback" not in missing.output
    finally:
        srv.stop()
    down = CliRunner().invoke(command, ["--config", str(cfg), "-j", "5"])
    assert down.exit_code == 1 and "no slurm-ft history service answered" in down.output
    assert "Traceback" not in down.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_daemon_starts_and_stops_the_service_process(journal_path, munge_socket, tmp_path):
    port = _free_port()
    cfg_file = tmp_path / "ft.toml"
    cfg_file.write_text(f'[journal]\npath = "{journal_path}"\n[history]\nlisten = "127.0.0.1"\nport = {port}\n'
                        f'endpoint = "127.0.0.1:{port}"\n')
    cfg = config_mod.load(cfg_file)
    with history_service.serving(cfg) as sup:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the service did not listen within 60 s"
                assert sup.proc is None or sup.proc.poll() is None, "the service process exited"
                time.sleep(0.1)
        if munge_socket is None:                                   # the child decodes with the host's munged
            answer = history_client.ask(cfg, Selection(job_ids=(5,)))
            assert [h["job_id"] for h in answer.jobs] == [5]
        proc = sup.proc
    assert proc.poll() is not None
    with history_service.serving(cfg_file and config_mod.from_dict({"history": {"serve": False}})) as none:
        assert none is None
