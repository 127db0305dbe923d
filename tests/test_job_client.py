"""Issue 25: the job-side client (slurm_ft/data/client/slurm_ft_job.py) needs nothing but the
standard library, and what it writes is what the root-side readers read.

* structurally: every module the file imports is in ``sys.stdlib_module_names`` (ast, not a list
  of known bad imports), and it runs under ``python -I -S`` (no site-packages, no slurm_ft on the
  path) on this Python and, where present, Python 3.8;
* end to end: such a process, imported by path, gets the checkpoint signal, saves, acks through
  ``squeue``/``scontrol`` (small fakes that keep the comment in a file) and beats into a real
  heartbeat directory; the root side's own readers (``channel.find``, ``heartbeat.read_dir``) read
  what it wrote;
* generatively: every ack field value the client accepts is read back identically by the root
  side's parser (time to its one decimal, path cut to MAX_PATH), or the client refuses it
  (:class:`ClientError`); every heartbeat step it accepts is read back, else ``heartbeat`` says False.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft import config as config_mod
from slurm_ft.checkpoint import channel, helper
from slurm_ft.data.client import slurm_ft_job as job
from slurm_ft.failover import jobspec
from slurm_ft.hang import heartbeat as hb

CLIENT = Path(job.__file__)
PY38 = Path.home() / ".pyenv/versions/3.8.18/bin/python3.8"
PYTHONS = [sys.executable] + ([str(PY38)] if PY38.is_file() else [])


# ------------------------------------------------------------------------------ stdlib only
def _imported_modules(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the client is one file: no relative imports"
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            raise AssertionError("no dynamic imports in the client")
    return out


def test_every_import_of_the_client_is_the_standard_library():
    mods = _imported_modules(ast.parse(CLIENT.read_text()))
    assert mods and mods <= set(sys.stdlib_module_names), mods - set(sys.stdlib_module_names)


def test_the_client_parses_as_python_3_8():
    ast.parse(CLIENT.read_text(), feature_version=(3, 8))


def test_the_client_and_the_root_side_share_their_constants():
    assert job.CKPT_SIGNALS == jobspec.CKPT_SIGNALS and job.DEFAULT_CKPT_SIGNAL == jobspec.DEFAULT_CKPT_SIGNAL
    assert job.DEFAULT_HEARTBEAT_DIR == config_mod.from_dict({}).hang.heartbeat_dir
    assert job.DEFAULT_CONFIG == str(config_mod.DEFAULT_PATH)
    # one implementation: slurm-ft's names are the client's
    assert channel.Ack is job.Ack and channel.find is job.find and channel.merge is job.merge
    assert hb.heartbeat is job.heartbeat and hb.Writer is job.Writer and hb.MAGIC is job.MAGIC
    assert issubclass(helper.ExitCheckpoint, job.ExitCheckpoint) and issubclass(channel.Reporter, job.Reporter)
    for v in ("USR1", "sigusr2", "12", " hup "):
        assert job.parse_signal(v) == jobspec.parse_signal(v)


# ------------------------------------------------------------------------------ end to end, -I -S
JOB_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, sys.argv[1])
    import slurm_ft_job as ft
    assert "slurm_ft" not in sys.modules and not any("site-packages" in p for p in sys.path)
    saved = []

    @ft.exit_checkpoint
    def save(step):
        saved.append(step)
        return "/ckpt/step %d,a=b.pt" % step

    with save:
        for step in range(5):
            if step == 3:
                os.kill(os.getpid(), signal.SIGUSR2)
            if save.poll(step):
                waited = save.wait_for_requeue(timeout=0.05)   # nobody requeues here: bounded
    print(json.dumps({"saved": saved, "status": save.status(), "waited": waited,
                      "hb": ft.heartbeat(4), "signal": save.signal_name}))
""")

FAKE_SQUEUE = '#!/bin/sh\nif [ -s "$FAKE_COMMENT" ]; then cat "$FAKE_COMMENT"; echo; else echo "(null)"; fi\n'
FAKE_SCONTROL = ('#!/bin/sh\nprintf "%s\\n" "$*" >> "$FAKE_LOG"\n[ "$1" = update ] || exit 2\n'
                 'printf "%s" "${3#Comment=}" > "$FAKE_COMMENT"\n')


@pytest.mark.parametrize("python", PYTHONS)
def test_isolated_job_saves_acks_and_beats_for_the_root_side(tmp_path, python):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("squeue", FAKE_SQUEUE), ("scontrol", FAKE_SCONTROL)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    comment = tmp_path / "comment"
    comment.write_text("ft:retries=2,ckpt_signal=USR2 my note")
    hbroot = tmp_path / "hb" / "n1"
    (hbroot / "77").mkdir(parents=True, mode=0o700)
    script = tmp_path / "train.py"
    script.write_text(JOB_SCRIPT)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "FAKE_COMMENT": str(comment), "FAKE_LOG": str(tmp_path / "log"),
           "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1", "SLURMD_NODENAME": "n1", "SLURM_PROCID": "0",
           "SLURM_FT_CKPT_SIGNAL": "USR2", "SLURM_FT_HEARTBEAT_DIR": str(tmp_path / "hb" / "{node}")}
    r = subprocess.run([python, "-I", "-S", str(script), str(CLIENT.parent)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["saved"] == [3] and out["signal"] == "USR2" and out["waited"] is False and out["hb"] is True
    assert out["status"]["status"] == "saved" and out["status"]["source"] == "signal"
    # the daemon's reader: the ack of attempt 1, step 3, the path exactly; the user's words kept
    ack = channel.find(comment.read_text())
    assert (ack.state, ack.attempt, ack.step, ack.path) == ("saved", 1, 3, "/ckpt/step 3,a=b.pt")
    assert comment.read_text().startswith("ft:retries=2,ckpt_signal=USR2 my note ")
    assert jobspec.from_comment(comment.read_text(), 3).retries == 2
    calls = (tmp_path / "log").read_text().splitlines()
    assert len(calls) == 2 and all(c.startswith("update JobId=77 Comment=") for c in calls)  # saving, saved
    # the hang watcher's reader: this process's beat, step 4, not saving
    fd = os.open(hbroot / "77", os.O_RDONLY | os.O_DIRECTORY)
    try:
        beats = hb.read_dir(fd, os.geteuid())
    finally:
        os.close(fd)
    (beat,) = beats.values()
    assert beat.step == 4 and not beat.saving and beat.seq >= 7


def test_isolated_job_outside_slurm_does_nothing_and_never_fails(tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(CLIENT.parent)!r}); import slurm_ft_job as ft\n"
            "s = ft.exit_checkpoint(lambda step: None)\n"
            "assert s.reporter is None and not s.poll(1) and not ft.heartbeat(1) and not ft.mark_inplace()\n"
            "s.request(); assert s.poll(2) and s.status()['status'] == 'saved'\n"
            "try:\n    ft.exit_checkpoint(lambda s: None, signal='KILL')\nexcept ValueError: print('refused')\n")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], env={"PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "refused", r.stderr


def test_heartbeat_dir_follows_the_site_config_then_the_default(tmp_path):
    conf = tmp_path / "ft.toml"
    conf.write_text(f'[hang]\nheartbeat_dir = "{tmp_path}/x/{{node}}"\n')
    (tmp_path / "x" / "n2" / "9").mkdir(parents=True)
    env = {"SLURM_JOB_ID": "9", "SLURMD_NODENAME": "n2", "SLURM_FT_CONFIG": str(conf)}
    assert job.heartbeat_dir(env) == str(tmp_path / "x" / "n2" / "9")
    assert job.heartbeat_dir({**env, "SLURM_FT_HEARTBEAT_DIR": "relative/{node}"}) is None
    assert job.heartbeat_dir({"SLURM_JOB_ID": "x9", "SLURMD_NODENAME": "n2"}) is None


# ------------------------------------------------------------------------------ generative
STATE = st.sampled_from(job.STATES) | st.text(max_size=8)
INT = st.integers(min_value=-(2 ** 70), max_value=2 ** 70) | st.booleans() | st.none() | st.floats()
TIME = st.floats(allow_nan=True, allow_infinity=True) | st.integers(min_value=-10, max_value=2 ** 40)
PATH = st.none() | st.text(max_size=job.MAX_PATH + 40) | st.text(alphabet=st.characters(), max_size=20)
WORDS = st.lists(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12), max_size=4)


@settings(max_examples=300, deadline=None)
@given(STATE, INT, INT, TIME, PATH, WORDS)
def test_an_ack_the_client_writes_is_read_back_identically_or_refused(state, attempt, step, t, path, words):
    ack = job.Ack(state, attempt, step, t, path)
    try:
        word = ack.encode()
    except job.ClientError:
        return
    assert attempt is not None and attempt >= 0 and math.isfinite(t) and state in job.STATES
    comment = " ".join(w for w in words)
    merged = job.merge(comment, ack)
    got = channel.find(merged)                      # the daemon's reader
    want = channel.Ack(state, attempt, step, float("%.1f" % t), path[:job.MAX_PATH] if path else None)
    assert got == want, (word, got, want)
    assert merged.count(job.PREFIX) == 1 and word in merged.split()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(min_value=-(2 ** 70), max_value=2 ** 70), saving=st.booleans())
def test_a_beat_the_client_writes_is_read_back_identically_or_refused(tmp_path, monkeypatch, step, saving):
    d = tmp_path / "hb" / "n3" / "31"
    d.mkdir(parents=True, exist_ok=True)
    env = {"SLURM_JOB_ID": "31", "SLURMD_NODENAME": "n3", "SLURM_FT_HEARTBEAT_DIR": str(tmp_path / "hb" / "{node}")}
    monkeypatch.setattr(job, "_writer", None)
    ok = job.heartbeat(step, saving, env=env)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        beats = hb.read_dir(fd, os.geteuid())
    finally:
        os.close(fd)
    fits = -(2 ** 63) <= step < 2 ** 63
    assert ok == fits
    if fits:
        beat = beats[f"{os.getpid()}.hb"]
        assert (beat.step, beat.saving, beat.pid) == (step, saving, os.getpid())
        assert (beat.since > 0) == saving


def test_the_guides_no_python_report_is_read_by_the_daemon(tmp_path):
    """docs/user-guide.md "No Python": its shell lines, run verbatim with the same squeue/scontrol
    fakes, leave an ack the daemon's reader takes, the comment's other words kept."""
    guide = (Path(__file__).resolve().parents[1] / "docs/user-guide.md").read_text()
    part = guide[guide.index("2. **The report**"):]
    block = part[part.index("```sh\n") + 6:part.index("   ```\n", part.index("```sh\n"))]
    script = textwrap.dedent(block)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("squeue", FAKE_SQUEUE), ("scontrol", FAKE_SCONTROL)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    comment = tmp_path / "comment"
    for before in ("ft:retries=2 note slurm-ft-ckpt:state=saving,attempt=3,t=1.0", ""):
        comment.write_text(before)
        env = {"PATH": f"{bindir}:/usr/bin:/bin", "FAKE_COMMENT": str(comment), "FAKE_LOG": str(tmp_path / "log"),
               "SLURM_JOB_ID": "88", "SLURM_RESTART_COUNT": "3"}
        r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        after = comment.read_text()
        ack = channel.find(after)
        assert (ack.state, ack.attempt, ack.step, ack.path) == ("saved", 3, 120, "/ckpt/120.pt"), after
        assert after.split()[:-1] == [w for w in before.split() if not w.startswith(job.PREFIX)]
