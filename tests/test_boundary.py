"""The never-raises boundary at the top of each root entry point (slurm_ft.node.boundary): an
unexpected error in the prolog, the epilog, the hang watcher or the ctld hook is logged with its
traceback to the node log, said once in syslog, counted for ``slurm_ft_internal_errors_total``,
and the hook exits as ``[node_state] on_internal_error`` says (``pass``: 0, ``drain``: 1). The
prolog's deliberate drain on a failing health check is not an internal error and is unchanged."""

from __future__ import annotations

import shutil
import subprocess
import syslog
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from slurm_ft import config as config_mod
from slurm_ft.node import boundary
from slurm_ft.node import epilog
from slurm_ft.node import prolog
from slurm_ft.errors import ConfigError
from slurm_ft.hang import watcher
from slurm_ft.health.result import CheckResult
from slurm_ft.lab.layout import repo_root


class Boom(RuntimeError):
    pass


def _site(tmp_path: Path, mode: str) -> dict[str, str]:
    """A config under ``tmp_path`` with ``on_internal_error = mode``; the hook's environment."""
    cfg = tmp_path / f"slurm-ft-{mode}.toml"
    cfg.write_text(f'[node_state]\ndir = "{tmp_path}/state"\nlog = "{tmp_path}/node-{{node}}.log"\n'
                   f'on_internal_error = "{mode}"\n')
    return {"SLURM_FT_CONFIG": str(cfg), "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1",
            "SLURM_JOB_RESTART_COUNT": "0", "PATH": "/usr/bin:/bin"}


@pytest.fixture
def syslogged(monkeypatch):
    lines = []
    monkeypatch.setattr(syslog, "openlog", lambda *a, **k: None)
    monkeypatch.setattr(syslog, "syslog", lambda prio, line: lines.append((prio, line)))
    return lines


def _raiser(exc):
    def boom(*a, **k):
        raise exc
    return boom


def _count(tmp_path, hook):
    return boundary.read_counts(str(tmp_path / "state")).get(hook, 0)


def _assert_reported(tmp_path, syslogged, hook, exc_name):
    text = (tmp_path / "node-n1.log").read_text()
    assert "INTERNAL ERROR" in text and "Traceback (most recent call last)" in text and exc_name in text
    (prio, line), = syslogged
    assert prio == syslog.LOG_ERR and "\n" not in line and f"slurm-ft {hook}: internal error {exc_name}" in line
    assert _count(tmp_path, hook) == 1


@pytest.mark.parametrize("mode, status", [("pass", 0), ("drain", 1)])
def test_prolog_unexpected_error(tmp_path, monkeypatch, syslogged, mode, status):
    monkeypatch.setattr(prolog, "write_start_marker", _raiser(Boom("marker\nforged line")))
    assert prolog.run(_site(tmp_path, mode)) == status
    _assert_reported(tmp_path, syslogged, "prolog", "Boom")


@pytest.mark.parametrize("mode, status", [("pass", 0), ("drain", 1)])
def test_epilog_unexpected_error(tmp_path, monkeypatch, syslogged, mode, status):
    monkeypatch.setattr(epilog, "pop_start_marker", _raiser(KeyError("marker")))
    assert epilog.run(_site(tmp_path, mode)) == status
    _assert_reported(tmp_path, syslogged, "epilog", "KeyError")


@pytest.mark.parametrize("mode, status", [("pass", 0), ("drain", 1)])
def test_hang_watcher_unexpected_error(tmp_path, monkeypatch, syslogged, mode, status):
    env = _site(tmp_path, mode)
    monkeypatch.setattr(watcher, "window_of", _raiser(ZeroDivisionError("x")))
    argv = ["--job", "42", "--node", "n1", "--config", env["SLURM_FT_CONFIG"]]
    assert watcher.main(argv) == status
    text = (tmp_path / "node-n1.log").read_text()
    assert "hang-watch" in text and "ZeroDivisionError" in text and "Traceback" in text
    assert _count(tmp_path, "hang-watcher") == 1 and len(syslogged) == 1


def test_an_error_before_the_config_is_known_uses_the_environments_config(tmp_path, monkeypatch, syslogged):
    """start_script itself fails: the boundary loads the config the environment names."""
    monkeypatch.setattr(prolog, "start_script", _raiser(MemoryError()))
    assert prolog.run(_site(tmp_path, "drain")) == 1
    _assert_reported(tmp_path, syslogged, "prolog", "MemoryError")


def test_no_config_at_all_passes(tmp_path, monkeypatch, syslogged):
    monkeypatch.setattr(prolog, "start_script", _raiser(Boom()))
    monkeypatch.setattr(config_mod, "DEFAULT_PATH", tmp_path / "none.toml")
    assert prolog.run({"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1"}) == 0
    assert len(syslogged) == 1


def test_system_exit_and_keyboard_interrupt_are_not_swallowed(tmp_path, monkeypatch, syslogged):
    monkeypatch.setattr(prolog, "write_start_marker", _raiser(SystemExit(3)))
    with pytest.raises(SystemExit) as e:
        prolog.run(_site(tmp_path, "pass"))
    assert e.value.code == 3
    monkeypatch.setattr(prolog, "write_start_marker", _raiser(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        prolog.run(_site(tmp_path, "pass"))
    assert syslogged == [] and _count(tmp_path, "prolog") == 0


def _failing_check(monkeypatch, act):
    from slurm_ft.failover import mailbox
    from slurm_ft import health
    from slurm_ft.health import actions
    posted = []
    from slurm_ft.health.scope import Scope
    monkeypatch.setattr(prolog, "health_scope", lambda *a: Scope(("row_remap",), 1, "a GPU node"))
    monkeypatch.setattr(health, "run_checks", lambda cfg, node, **kw: [CheckResult("row_remap", "fail", 0, "GPU0 row "
                                                                                   "remap pending")])
    monkeypatch.setattr(actions, "journal_results", lambda *a, **k: None)
    monkeypatch.setattr(actions, "act_on_node", act)
    monkeypatch.setattr(mailbox, "post", lambda *a, **k: posted.append(a))
    return posted


@pytest.mark.parametrize("mode", ["pass", "drain"])
def test_the_deliberate_drain_on_a_failing_check_is_unchanged(tmp_path, monkeypatch, syslogged, mode):
    posted = _failing_check(monkeypatch, lambda *a: "drained")
    assert prolog.run(_site(tmp_path, mode)) == 1
    assert len(posted) == 1 and syslogged == [] and _count(tmp_path, "prolog") == 0


def test_a_bug_while_draining_for_a_failing_check_still_refuses_the_job(tmp_path, monkeypatch, syslogged):
    """The check failed: a bug while acting on it is reported, and the job still does not start
    on that GPU, whatever on_internal_error says."""
    _failing_check(monkeypatch, _raiser(AttributeError("bug")))
    assert prolog.run(_site(tmp_path, "pass")) == 1
    assert _count(tmp_path, "prolog") == 1 and "AttributeError" in syslogged[0][1]


def test_on_internal_error_is_validated():
    assert config_mod.Config().node_state.on_internal_error == "pass"
    with pytest.raises(ConfigError, match="node_state.on_internal_error"):
        config_mod.from_dict({"node_state": {"on_internal_error": "ignore"}})
    with pytest.raises(ConfigError, match="node_state.on_internal_error"):
        config_mod.from_dict({"node_state": {"on_internal_error": 1}})


# ------------------------------------------------------------------------------ generative
_BASES = [Exception, BaseException, RuntimeError, ValueError, OSError, MemoryError, RecursionError, LookupError,
          ArithmeticError, GeneratorExit, StopIteration, UnicodeError, AssertionError, ImportError, TimeoutError]
#: Points of the prolog's body an exception may come from.
_POINTS = ["start_script", "write_start_marker", "health_gate", "start_hang_watch", "note"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from(_BASES), point=st.sampled_from(_POINTS), mode=st.sampled_from(["pass", "drain"]),
       message=st.text(max_size=40), raise_in_str=st.booleans())
def test_any_exception_anywhere_in_the_prolog_is_caught(tmp_path_factory, base, point, mode, message, raise_in_str):
    assume(not (point == "write_start_marker" and issubclass(base, OSError)))   # expected: logged, job starts
    tmp = tmp_path_factory.mktemp("b")
    attrs = {"__str__": _raiser(ValueError("unprintable"))} if raise_in_str else {}
    exc_type = type("Injected", (base,), attrs)
    lines = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(syslog, "openlog", lambda *a, **k: None)
        mp.setattr(syslog, "syslog", lambda prio, line: lines.append(line))
        mp.setattr(prolog, point, _raiser(exc_type(message)))
        mp.setattr(prolog, "health_gate", _raiser(exc_type(message)) if point == "health_gate" else lambda *a: 0)
        rc = prolog.run(_site(tmp, mode))
    assert rc == boundary.EXIT[mode]
    assert len(lines) == 1 and "\n" not in lines[0] and boundary.read_counts(str(tmp / "state")) == {"prolog": 1}
    shutil.rmtree(tmp)


@settings(max_examples=60, deadline=None)
@given(base=st.sampled_from(_BASES), mode=st.sampled_from(["pass", "drain"]))
def test_any_exception_in_the_epilog_and_watcher_is_caught(tmp_path_factory, base, mode):
    tmp = tmp_path_factory.mktemp("b")
    exc_type = type("Injected", (base,), {})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(syslog, "openlog", lambda *a, **k: None)
        mp.setattr(syslog, "syslog", lambda prio, line: None)
        mp.setattr(epilog, "pop_start_marker", _raiser(exc_type("e")))
        mp.setattr(watcher, "window_of", _raiser(exc_type("w")))
        env = _site(tmp, mode)
        assert epilog.run(env) == boundary.EXIT[mode]
        assert watcher.main(["--job", "1", "--node", "n1", "--config", env["SLURM_FT_CONFIG"]]) == boundary.EXIT[mode]
    assert boundary.read_counts(str(tmp / "state")) == {"epilog": 1, "hang-watcher": 1}
    shutil.rmtree(tmp)


def test_concurrent_hooks_lose_no_count(tmp_path):
    """Several hooks failing at once on a node (a bad slurm-ft release): every error is counted."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=lambda: [boundary.bump(str(tmp_path), "epilog") for _ in range(20)])
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert boundary.read_counts(str(tmp_path)) == {"epilog": 80}


# ------------------------------------------------------------------------------ the ctld hook (sh)
HOOK = repo_root() / "contrib" / "slurm-ft-ctld-event"


def test_ctld_hook_exits_0_whatever_fails(tmp_path):
    """A failing command anywhere in the hook, or a signal, still exits 0 (a failing
    PrologSlurmctld would requeue the job)."""
    text = HOOK.read_text()
    anchor = "dir=${SLURM_FT_EVENTS_DIR"
    assert text.count(anchor) == 1
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_COMMENT": "ft:retries=3",
           "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld", "SLURM_FT_EVENTS_DIR": str(tmp_path)}
    for injected in ("exit 7", "false || exit 3", "kill -TERM $$", "set -e; false", "${UNSET_VAR?boom}"):
        broken = tmp_path / "hook"
        broken.write_text(text.replace(anchor, injected + "\n" + anchor))
        for sh in ("/bin/sh", shutil.which("bash") or "/bin/sh"):
            p = subprocess.run([sh, str(broken)], env=env, capture_output=True, timeout=10)
            assert p.returncode == 0, (injected, sh, p.stderr)
    p = subprocess.run(["/bin/sh", str(HOOK)], env=env, capture_output=True, timeout=10)
    assert p.returncode == 0 and len(list(tmp_path.glob("*.42.start"))) == 1


# ------------------------------------------------------------------------------ the prolog/epilog wrappers (sh)
# A crash before Python reaches @root_entry (an import error of a broken venv or a bad upgrade, a
# missing interpreter, a signal) is answered by the wrapper slurmd runs: the Python entry says a
# deliberate refusal with boundary.EXIT_DRAIN, everything else non-zero follows on_internal_error.
SAFE_PATH = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
KINDS = ["prolog", "epilog"]
FLAVOURS = ["checkout", "installed"]


def _wrapper(tmp: Path, kind: str, flavour: str, python: str) -> Path:
    """The ``kind`` wrapper under ``tmp``: the checkout's (``<tmp>/prolog/slurm-ft-prolog``, its
    Python a link ``<tmp>/.venv/bin/python`` -> ``python``) or as ``slurm-ft install`` renders it
    (``PYTHON=python``); first on its PATH a ``logger`` that appends its arguments to ``<tmp>/syslog``."""
    from slurm_ft.admin import assets
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "logger").write_text(f'#!/bin/sh\necho "$*" >> "{tmp}/syslog"\n')
    (bindir / "logger").chmod(0o755)
    if flavour == "checkout":
        text = (repo_root() / kind / f"slurm-ft-{kind}").read_text()
        venv = tmp / ".venv" / "bin"
        venv.mkdir(parents=True, exist_ok=True)
        (venv / "python").unlink(missing_ok=True)
        (venv / "python").symlink_to(python)
        path = tmp / kind / f"slurm-ft-{kind}"
        path.parent.mkdir(exist_ok=True)
    else:
        text = assets.render_wrapper(kind, python, f"/usr/local/libexec/slurm-ft/slurm-ft-{kind}")
        path = tmp / f"slurm-ft-{kind}"
    assert text.count(SAFE_PATH) == 1
    path.write_text(text.replace(SAFE_PATH, f"PATH={bindir}:/usr/sbin:/usr/bin:/sbin:/bin"))
    path.chmod(0o755)
    return path


def _fake_python(tmp: Path, body: str) -> str:
    path = tmp / "fake-python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def _run_wrapper(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", str(path)], env=env, capture_output=True, text=True, timeout=60)


def _syslog(tmp: Path) -> list[str]:
    try:
        return (tmp / "syslog").read_text().splitlines()
    except FileNotFoundError:
        return []


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["pass", "drain"])
def test_a_python_that_cannot_import_slurm_ft_is_answered_by_the_wrapper(tmp_path, kind, flavour, mode):
    """A real interpreter without slurm_ft (a broken venv, a bad upgrade): ``-m slurm_ft.<kind>``
    dies before the boundary (Python's status 1). The wrapper logs one syslog line and exits as
    on_internal_error says: 0 under ``pass`` (no cluster-wide drain), 1 under ``drain``."""
    import sys
    base = getattr(sys, "_base_executable", "") or shutil.which("python3")
    if subprocess.run([base, "-I", "-c", "import slurm_ft"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip(f"{base} imports slurm_ft: no interpreter without it here")
    p = _run_wrapper(_wrapper(tmp_path, kind, flavour, base), _site(tmp_path, mode))
    assert p.returncode == boundary.EXIT[mode], p.stderr
    assert "No module named" in p.stderr
    (line,) = _syslog(tmp_path)
    assert line.startswith(f"-p daemon.err -t slurm-ft slurm-ft {kind}: ") and "status 1," in line
    assert f"on_internal_error = {mode}" in line


@settings(max_examples=150, deadline=None)
@given(status=st.integers(0, 255), kind=st.sampled_from(KINDS), flavour=st.sampled_from(FLAVOURS),
       mode=st.sampled_from(["pass", "drain"]))
def test_the_wrapper_maps_every_exit_status(tmp_path_factory, status, kind, flavour, mode):
    """0 -> 0; boundary.EXIT_DRAIN (a deliberate refusal/drain) -> 1 whatever the policy; any other
    status is a crash before the boundary -> on_internal_error (0 or 1), said in syslog."""
    tmp = tmp_path_factory.mktemp("w")
    path = _wrapper(tmp, kind, flavour, _fake_python(tmp, 'exit "$FAKE_STATUS"'))
    p = _run_wrapper(path, {**_site(tmp, mode), "FAKE_STATUS": str(status)})
    want = 0 if status == 0 else 1 if status == boundary.EXIT_DRAIN else boundary.EXIT[mode]
    assert p.returncode == want, (status, p.stderr)
    lines = _syslog(tmp)
    assert len(lines) == (0 if status in (0, boundary.EXIT_DRAIN) else 1), lines
    shutil.rmtree(tmp)


@pytest.mark.parametrize("mode", ["pass", "drain"])
@pytest.mark.parametrize("crash", ["signal", "missing"])
def test_a_signal_or_a_missing_interpreter_follows_on_internal_error(tmp_path, crash, mode):
    python = _fake_python(tmp_path, "kill -KILL $$") if crash == "signal" else "/nonexistent/slurm-ft/bin/python"
    for kind in KINDS:
        p = _run_wrapper(_wrapper(tmp_path, kind, "installed", python), _site(tmp_path, mode))
        assert p.returncode == boundary.EXIT[mode], (kind, p.stderr)
    lines = _syslog(tmp_path)
    assert len(lines) == 2 and all(("status 137," if crash == "signal" else "status 127,") in x for x in lines), lines


def test_a_deliberate_drain_exits_1_under_pass(tmp_path):
    """The prolog process refusing a job (a failing GPU check) exits EXIT_DRAIN: still 1."""
    assert boundary.process_status(0) == 0 and boundary.process_status(1) == boundary.EXIT_DRAIN == 3
    path = _wrapper(tmp_path, "prolog", "checkout", _fake_python(tmp_path, f"exit {boundary.EXIT_DRAIN}"))
    p = _run_wrapper(path, _site(tmp_path, "pass"))
    assert p.returncode == 1 and _syslog(tmp_path) == []


def test_the_installed_wrapper_runs_the_real_prolog_and_epilog(tmp_path):
    """The real interpreter of this venv through the installed wrapper: a job with nothing to
    check passes (0), no syslog line."""
    import sys
    for kind in KINDS:
        p = _run_wrapper(_wrapper(tmp_path, kind, "installed", sys.executable), _site(tmp_path, "drain"))
        assert p.returncode == 0, (kind, p.stderr)
    assert _syslog(tmp_path) == []


@settings(max_examples=100, deadline=None)
@given(value=st.sampled_from(["pass", "drain"]), quote=st.sampled_from(['"', "'"]),
       before=st.sampled_from(["", " ", "\t", "  "]), around=st.sampled_from(["=", " = ", "\t=  ", " ="]),
       comment=st.sampled_from(["", "  # site policy", " #x", "\t"]), beside=st.booleans())
def test_the_wrapper_reads_the_policy_the_config_loader_reads(tmp_path_factory, value, quote, before, around,
                                                              comment, beside):
    """The crash path reads ``on_internal_error`` from the file slurm-ft would load
    (``SLURM_FT_CONFIG``, else ``slurm-ft.toml`` beside ``SLURM_CONF``), in every spelling of the
    plain line; the wrapper and slurm_ft.config agree."""
    tmp = tmp_path_factory.mktemp("c")
    cfg = tmp / "etc" / "slurm-ft.toml"
    cfg.parent.mkdir()
    cfg.write_text(f'[journal]\npath = "{tmp}/j.db"\n\n[node_state]\ndir = "{tmp}/state"\n'
                   f"{before}on_internal_error{around}{quote}{value}{quote}{comment}\n")
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"}
    env.update({"SLURM_CONF": str(tmp / "etc" / "slurm.conf")} if beside else {"SLURM_FT_CONFIG": str(cfg)})
    assert config_mod.load(env=env).node_state.on_internal_error == value
    p = _run_wrapper(_wrapper(tmp, "epilog", "installed", _fake_python(tmp, "exit 1")), env)
    assert p.returncode == boundary.EXIT[value]
    shutil.rmtree(tmp)
