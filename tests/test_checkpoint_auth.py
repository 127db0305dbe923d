"""The checkpoint HTTP channel is authenticated: only holders of the job's secret (its own processes,
root) may notify or read the status. The attack is done for real: the server runs as one uid, the
attacker as another (tests run as root and drop privileges in child processes)."""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import site
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from slurm_ft.checkpoint import auth, http
from slurm_ft.checkpoint.helper import ExitCheckpoint
from slurm_ft.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
JOB_UID, ATTACKER_UID = 65534, 65533


def _serve(ckpt, start=9500):
    for port in range(start, 10000):
        try:
            ckpt.serve_http(port)
            return port
        except OSError:
            continue
    pytest.skip("no free port in 9500..9999")


def _raw(port, method="POST", path=http.NOTIFY, headers=None, data=b"{}"):
    """(status code, headers, JSON body) without raising on 4xx."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data if method == "POST" else None,
                                 method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.load(exc)


@pytest.fixture
def served(tmp_path):
    env = {"SLURM_FT_RUNTIME_DIR": str(tmp_path), "SLURM_JOB_ID": "77"}
    saved = []
    ckpt = ExitCheckpoint(lambda s: saved.append(s) or f"/ckpt/{s}", report=False, env=env)
    port = _serve(ckpt)
    yield ckpt, port, env, saved
    ckpt.uninstall()


# -- in-process: the protocol ----------------------------------------------------------------------

def test_unauthenticated_and_wrong_secret_are_refused_and_do_not_save(served, caplog):
    ckpt, port, env, saved = served
    caplog.set_level(logging.WARNING, logger="slurm_ft.checkpoint.http")
    code, headers, body = _raw(port)
    assert code == 401 and headers["WWW-Authenticate"].startswith("Bearer") and "status" not in body
    assert _raw(port, headers={"Authorization": "Bearer " + "0" * 64})[0] == 403
    assert _raw(port, headers={"Authorization": "Basic " + env[auth.ENV_TOKEN]})[0] == 401
    assert _raw(port, headers={"Authorization": "Bearer " + env[auth.ENV_TOKEN][:-1]})[0] == 403
    assert _raw(port, "GET", http.STATUS)[0] == 401
    assert _raw(port, "GET", http.STATUS, {"Authorization": "Bearer x" * 40})[0] == 403
    assert not ckpt.requested and not ckpt.poll(1) and saved == [] and ckpt.status()["status"] == "idle"
    assert sum("refused" in r.getMessage() for r in caplog.records) == 6
    assert env[auth.ENV_TOKEN] not in caplog.text  # the secret is never logged


def test_the_jobs_secret_is_accepted(served):
    ckpt, port, env, saved = served
    token = env[auth.ENV_TOKEN]  # exported for children of the serving process
    assert auth.valid_token(token) and len(token) == 64
    code, _, body = _raw(port, headers={"Authorization": f"bearer {token}"})
    assert code == 200 and body["accepted"] and body["status"] == "notified"
    assert ckpt.poll(5) and saved == [5]
    assert http.status(port, env=env)["status"] == "saved"  # from the token file


def test_refusal_log_escapes_control_characters(served, caplog):
    _, port, _, _ = served
    caplog.set_level(logging.WARNING, logger="slurm_ft.checkpoint.http")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /v1/preempt/notify?\x1b[2J\x07\xff HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.0 401")
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "\\x1b[2J\\x07\\xff" in line and "\x1b" not in line and "\x07" not in line


def test_bad_content_length_is_a_400_not_a_traceback(served, capfd):
    ckpt, port, env, _ = served
    code, _, _ = _raw(port, headers={"Authorization": f"Bearer {env[auth.ENV_TOKEN]}", "Content-Length": "x"},
                      data=None)
    assert code == 400 and not ckpt.requested
    assert "Traceback" not in capfd.readouterr().err


def test_token_file_and_dirs_are_private_and_removed_on_stop(served):
    ckpt, port, env, _ = served
    path = Path(ckpt.token_path)
    assert path == Path(env["SLURM_FT_RUNTIME_DIR"]) / f"slurm-ft-{os.geteuid()}" / "job-77" / f"notify-{port}.token"
    for p, mode in ((path, 0o600), (path.parent, 0o700), (path.parent.parent, 0o700)):
        st = p.lstat()
        assert stat.S_IMODE(st.st_mode) == mode and st.st_uid == os.geteuid()
    assert path.read_text().strip() == env[auth.ENV_TOKEN]
    ckpt.uninstall()
    assert not path.exists() and not path.parent.exists()


def test_secret_chosen_by_the_job_and_malformed_secret(tmp_path):
    env = {"SLURM_FT_RUNTIME_DIR": str(tmp_path), auth.ENV_TOKEN: "a" * 40}
    ckpt = ExitCheckpoint(lambda s: None, report=False, env=env)
    port = _serve(ckpt)
    try:
        assert http.status(port, token="a" * 40)["status"] == "idle"
    finally:
        ckpt.uninstall()
    with pytest.raises(ConfigError):
        ExitCheckpoint(lambda s: None, report=False, env={**env, auth.ENV_TOKEN: "short"}).serve_http(9500)


@pytest.mark.parametrize("header, want", [(None, 401), ("", 401), ("Bearer", 401), ("Bearer  ", 401),
                                          ("Token abc", 401), ("Bearer wrong", 403), ("Bearer t\u00e9", 403),
                                          ("Bearer " + "k" * 40, None), ("BEARER  " + "k" * 40 + " ", None)])
def test_check_bearer(header, want):
    assert auth.check_bearer(header, "k" * 40) == want


def test_refusal_log_is_rate_limited(caplog):
    t = [0.0]
    limited = http._RefusalLog(burst=3, window_s=60, clock=lambda: t[0])
    caplog.set_level(logging.WARNING, logger="slurm_ft.checkpoint.http")
    for _ in range(10):
        limited("refused %d", 1)
    t[0] = 61.0
    limited("refused %d", 2)
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["refused 1"] * 3 + [msgs[3], "refused 2"] and "7 more refused" in msgs[3]


def test_client_never_sends_the_secret_off_the_node():
    with pytest.raises(ConfigError):
        http.notify(9000, "8.8.8.8", token="k" * 40)


# -- the token path: symlinks, other owners, open modes ------------------------------------------

def _server_for(base):
    env = {"SLURM_FT_RUNTIME_DIR": str(base), "SLURM_JOB_ID": "5"}
    return ExitCheckpoint(lambda s: None, report=False, env=env), env


def test_planted_symlink_at_user_dir_is_refused(tmp_path):
    victim = tmp_path / "attacker-owned"
    victim.mkdir(mode=0o700)
    base = tmp_path / "base"
    base.mkdir()
    (base / f"slurm-ft-{os.geteuid()}").symlink_to(victim)
    ckpt, env = _server_for(base)
    with pytest.raises(ConfigError, match="symlink"):
        _serve(ckpt)
    assert list(victim.iterdir()) == [] and auth.ENV_TOKEN not in env and ckpt.token_path is None


def test_planted_symlink_at_token_file_is_refused(tmp_path):
    ckpt, env = _server_for(tmp_path)
    port = _serve(ckpt)
    loc = auth.TokenLocation.for_port(port, env=env)
    ckpt.uninstall()
    job_dir = tmp_path / f"slurm-ft-{os.geteuid()}" / "job-5"
    job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = tmp_path / "target"
    target.write_text("keep")
    (job_dir / loc.name).symlink_to(target)
    with pytest.raises(ConfigError, match="symlink"):
        auth.write_token(loc, auth.new_token())
    assert target.read_text() == "keep"
    with pytest.raises(auth.TokenError, match="symlink"):  # the client does not follow it either
        auth.read_token(loc)


@pytest.mark.parametrize("how", ["other-owner", "open-mode"])
def test_user_dir_of_another_owner_or_open_mode_is_refused(tmp_path, how):
    user_dir = tmp_path / f"slurm-ft-{os.geteuid()}"
    user_dir.mkdir(mode=0o700)
    if how == "other-owner":
        os.chown(user_dir, ATTACKER_UID, ATTACKER_UID)
    else:
        user_dir.chmod(0o755)
    ckpt, _ = _server_for(tmp_path)
    with pytest.raises(ConfigError, match="refusing a directory"):
        _serve(ckpt)


def test_token_file_reader_refuses_loose_or_foreign_files(tmp_path):
    f = tmp_path / "t"
    f.write_text("k" * 40)
    f.chmod(0o644)
    with pytest.raises(auth.TokenError, match="0600"):
        auth.read_token_file(str(f), os.geteuid())
    f.chmod(0o600)
    assert auth.read_token_file(str(f), os.geteuid()) == "k" * 40
    with pytest.raises(auth.TokenError, match="0600"):
        auth.read_token_file(str(f), ATTACKER_UID)
    (tmp_path / "link").symlink_to(f)
    with pytest.raises(auth.TokenError, match="symlink"):
        auth.read_token_file(str(tmp_path / "link"), os.geteuid())


# -- for real: server as one uid, attacker as another ---------------------------------------------

SERVER = r"""
import os, sys, threading
from slurm_ft.checkpoint.helper import ExitCheckpoint
ckpt = ExitCheckpoint(lambda step: f"/ckpt/{step}", report=False)
for port in range(9700, 10000):
    try:
        ckpt.serve_http(port)
        break
    except OSError:
        continue
token_path = ckpt.token_path
print("READY", port, token_path, flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
step = 0
while not stop.wait(0.02):
    step += 1
    if ckpt.poll(step):
        print("SAVED", step, ckpt.status()["source"], flush=True)
ckpt.uninstall()
print("STOPPED", os.path.exists(token_path), flush=True)
"""

ATTACK = r"""
import json, os, socket, sys, urllib.request, urllib.error
from slurm_ft.checkpoint import auth, http
port, token_path, server_pid = int(sys.argv[1]), sys.argv[2], sys.argv[3]
out = {"uid": os.getuid()}

def code(method, path, headers):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}" if method == "POST" else None,
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code

out["post_no_auth"] = code("POST", http.NOTIFY, {})
out["post_wrong"] = code("POST", http.NOTIFY, {"Authorization": "Bearer " + auth.new_token()})
out["get_no_auth"] = code("GET", http.STATUS, {})
with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
    s.sendall(b"POST /v1/preempt/notify?\x1b]0;pwned\x07 HTTP/1.0\r\n\r\n")
    out["raw"] = s.recv(12).decode()
for name, path in (("read_token_file", token_path), ("read_environ", f"/proc/{server_pid}/environ")):
    try:
        open(path, "rb").read()
        out[name] = "read!"
    except OSError as exc:
        out[name] = type(exc).__name__
try:
    http.notify(port, uid=%(job_uid)d)
    out["client_as_job"] = "accepted!"
except Exception as exc:
    out["client_as_job"] = type(exc).__name__
print(json.dumps(out))
"""


def _as(uid):
    return dict(user=uid, group=uid, extra_groups=[])


@pytest.fixture
def shared_tmp():
    """A sticky, world-writable runtime base like /tmp (pytest's tmp_path is closed to other uids)."""
    base = tempfile.mkdtemp(prefix="slurm-ft-auth-test-")
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _child_env(base):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PYTEST", "PYTHON"))}
    path = os.pathsep.join([str(ROOT), *site.getsitepackages()])  # the package and its dependencies
    return {**env, "PYTHONPATH": path, "SLURM_FT_RUNTIME_DIR": base, "SLURM_JOB_ID": "4242",
            "HOME": "/nonexistent"}


def _unprivileged_python(env):
    """An interpreter the unprivileged uids can run with this package importable, or None
    (``sys.executable`` may live under a home directory closed to them)."""
    for exe in dict.fromkeys([sys.executable, shutil.which("python3"), "/usr/bin/python3"]):
        if not exe:
            continue
        try:
            probe = subprocess.run([exe, "-c", f"import sys, click, slurm_ft.checkpoint.http; "
                                    f"assert sys.version_info[:2] == {tuple(sys.version_info[:2])}"],
                                   env=env, cwd="/", capture_output=True, timeout=60, **_as(JOB_UID))
        except OSError:
            continue
        if probe.returncode == 0:
            return exe
    return None


def _lines(proc):
    """A queue of the child's stdout lines (split), filled by a reader thread."""
    q = queue.Queue()
    threading.Thread(target=lambda: [q.put(line.split()) for line in proc.stdout], daemon=True).start()
    return q


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
def test_another_uid_cannot_notify_the_job_but_the_job_and_root_can(shared_tmp):
    env = _child_env(shared_tmp)
    python = _unprivileged_python(env)
    if python is None:
        pytest.skip("no Python interpreter with this package that an unprivileged uid can run")
    server = subprocess.Popen([python, "-c", SERVER], env=env, cwd="/", stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **_as(JOB_UID))
    try:
        lines = _lines(server)
        ready, port, token_path = lines.get(timeout=30)
        assert ready == "READY", ready
        port = int(port)
        assert os.stat(token_path).st_uid == JOB_UID

        # the attacker: another uid on the same node
        attack = subprocess.run([python, "-c", ATTACK % {"job_uid": JOB_UID}, str(port), token_path,
                                 str(server.pid)], env=env, cwd="/", capture_output=True, text=True, timeout=60,
                                **_as(ATTACKER_UID))
        assert attack.returncode == 0, attack.stderr
        got = json.loads(attack.stdout)
        assert got == {"uid": ATTACKER_UID, "post_no_auth": 401, "post_wrong": 403, "get_no_auth": 401,
                       "raw": "HTTP/1.0 401", "read_token_file": "PermissionError",
                       "read_environ": "PermissionError", "client_as_job": "TokenError"}
        # nothing was saved, nothing was even requested (root reads the status with the job's secret)
        root_env = {"SLURM_FT_RUNTIME_DIR": shared_tmp, "SLURM_JOB_ID": "4242"}
        assert http.status(port, uid=JOB_UID, env=root_env)["status"] == "idle"
        # root without the secret is refused too
        assert _raw(port)[0] == 401

        # the job's own process (a sibling, not a child: it reads the token file)
        own = subprocess.run([python, "-m", "slurm_ft.checkpoint", "notify", "--port", str(port)],
                             env=env, cwd="/", capture_output=True, text=True, timeout=60, **_as(JOB_UID))
        assert own.returncode == 0, own.stderr
        assert json.loads(own.stdout)["accepted"]
        assert lines.get(timeout=30)[0] == "SAVED"

        # root, with the job's secret from its token file
        assert http.notify(port, uid=JOB_UID, job=4242, env={"SLURM_FT_RUNTIME_DIR": shared_tmp})["accepted"]
        assert lines.get(timeout=30)[0] == "SAVED"
        assert http.status(port, uid=JOB_UID, env=root_env)["status"] == "saved"

        server.stdin.close()
        assert lines.get(timeout=30) == ["STOPPED", "False"]
        assert not os.path.exists(token_path)
        err = server.stderr.read()
        server.wait(timeout=20)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    refusals = [line for line in err.splitlines() if "refused" in line]
    assert len(refusals) == 5 and "Traceback" not in err  # 4 from the attacker, 1 from root without it
    raw_line = next(line for line in refusals if "pwned" in line)
    assert "\\x1b]0;pwned\\x07" in raw_line and "\x1b" not in err and "\x07" not in err
