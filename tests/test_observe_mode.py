"""Observe-only rollout (``[failover] mode = "observe"``, issue 24): slurm-ft decides, journals and
logs every action it would take and changes nothing in Slurm.

Proven structurally: (1) every Slurm command of the package goes through one gate,
``Slurm.run`` (a source scan: no other code path names a Slurm binary to start it); (2) the gate
lets through only reads from an allowlist (``slurm_reads.toml``) and the mailbox post (a
generative test over command lines nobody listed); (3) the existing failover scenarios, run on the
in-memory Slurm in observe mode, leave Slurm exactly as a world without slurm-ft's daemon, while
the journal holds each would-be action."""

from __future__ import annotations

import ast
import inspect
import pathlib
import subprocess
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_ft import config as config_mod
from slurm_ft.failover.observe import OBSERVED, command_line, command_target
from slurm_ft.slurm import Slurm, is_read
from fake_slurm import FakeJob, FakeNode

from daemon_world import USER, WIDE_BREAKER, World, XID79

OBSERVE = '[failover]\nmode = "observe"\n'
PKG = pathlib.Path(__file__).resolve().parent.parent / "slurm_ft"

#: Every public method of the client, by what it does to Slurm: a new method must be placed here.
WRITES = {"update_job", "update_node", "requeue", "release", "drain", "resume"}
READS = {"jobs", "job", "nodes", "show_config", "private_data", "show_node", "job_gpus", "wait_job"}
SLURM_BINARIES = {"scontrol", "scancel", "srun", "sbatch", "salloc", "sacctmgr", "strigger", "squeue", "sinfo",
                  "sacct", "sdiag", "sprio", "sshare", "sstat", "sreport", "sattach", "sbcast"}


# ------------------------------------------------------------------ the gate, in the client
class _Recorder(Slurm):
    """A real client whose executor records instead of running (``_exec``: behind the gate)."""

    def _exec(self, cmd, *args, **kw):
        self.executed.append([cmd, *args])
        out = '{"jobs": [], "nodes": []}' if "--json" in args else ""
        return subprocess.CompletedProcess([cmd, *args], 0, out, "")


def _recorder(**kw) -> _Recorder:
    s = _Recorder(**kw)
    s.executed = []
    return s


def _commands(fn) -> list[tuple]:
    """The Slurm commands a client method passes to ``self.run`` / ``self._json``, as constant
    tuples (a non-constant command is ``("?",)``), and the client methods it calls."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                and n.func.value.id == "self":
            if n.func.attr in ("run", "_json", "_exec"):
                consts = []
                for a in n.args:
                    if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
                        break
                    consts.append(a.value)
                out.append(tuple(consts) if consts else ("?",))
            elif n.func.attr in WRITES:
                out.append(("write:" + n.func.attr,))
    return out


def test_every_client_method_is_a_read_or_a_gated_write():
    """Each public method of the client either is one of :data:`WRITES` (held back in observe
    mode, below) or runs only commands the read allowlist names: a method added later that
    writes without being listed fails here."""
    methods = {n: f for n, f in inspect.getmembers(Slurm, inspect.isfunction) if not n.startswith("_")}
    assert WRITES <= set(methods) and READS <= set(methods)
    for name, fn in methods.items():
        if name in WRITES or name in ("run", "from_config"):
            continue
        for cmd in _commands(fn):
            assert cmd != ("?",) and not cmd[0].startswith("write:"), (name, cmd)
            assert is_read(cmd[0], cmd[1:]), (name, cmd)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_every_write_method_is_held_back_in_observe_mode(name):
    s = _recorder(observe=True, mailbox_field="Extra")
    args = {"update_job": (12,), "update_node": ("n1",), "requeue": (12,), "release": (12,),
            "drain": ("n1", "slurm-ft: test"), "resume": ("n1",)}[name]
    kwargs = {"update_job": {"Priority": "5"}, "update_node": {"State": "DRAIN"}}.get(name, {})
    getattr(s, name)(*args, **kwargs)
    assert s.executed == [] and len(s.observed) == 1
    act = _recorder(observe=False)
    getattr(act, name)(*args, **kwargs)
    assert act.executed == s.observed     # the same command, held back instead of run


@pytest.mark.parametrize("name", sorted(READS - {"wait_job"}))
def test_read_methods_only_read(name):
    s = _recorder(observe=True)
    getattr(s, name)(*{"job": (12,), "show_node": ("n1",), "job_gpus": (12,)}.get(name, ()))
    assert s.observed == [] and s.executed and all(is_read(c[0], c[1:]) for c in s.executed)


_word = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=0, max_size=12)


@settings(max_examples=300, deadline=None)
@given(cmd=st.one_of(st.sampled_from(sorted(SLURM_BINARIES)), _word),
       args=st.lists(st.one_of(st.sampled_from(["show", "update", "hold", "-o", "--json", "NodeName=n1",
                                                 "Extra=x", "JobId=3", "requeue", "ping"]), _word), max_size=5))
def test_observe_gate_runs_only_reads_and_the_mailbox_post(cmd, args):
    s = _recorder(observe=True, mailbox_field="Extra")
    proc = s.run(cmd, *args)
    ran = bool(s.executed)
    mailbox = cmd == "scontrol" and len(args) == 3 and args[0] == "update" and args[1].startswith("NodeName=") \
        and args[2].startswith("Extra=")
    assert ran == (is_read(cmd, args) or mailbox)
    assert ran != bool(s.observed)
    assert proc.returncode == 0
    if cmd == "scontrol" and args and args[0] in ("update", "hold", "requeue") and not mailbox:
        assert not ran
    if cmd not in ("squeue", "sinfo", "sacct", "sdiag", "sprio", "sshare", "sstat", "scontrol"):
        assert not ran                      # an unlisted command is a write


def test_from_config_sets_the_gate(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(OBSERVE)
    s = Slurm.from_config(config_mod.load(p))
    assert s.observe and s.mailbox_field == "Extra"
    p.write_text("[failover]\nmode = 'act'\n")
    assert not Slurm.from_config(config_mod.load(p)).observe
    p.write_text("[failover]\nmode = 'dry-run'\n")
    with pytest.raises(config_mod.ConfigError, match="failover.mode"):
        config_mod.load(p)


def _starts_it(node, parents) -> bool:
    """Whether a string naming a Slurm binary is used to *start* it other than through the
    client: an element of an argv list/tuple, part of a path (``os.path.join``, ``/``, ``+``, an
    f-string), or an argument of ``subprocess.*`` / ``os.exec*`` / ``os.spawn*`` / ``Popen``.
    As the command of a client call (``x.run("scontrol", ...)``, ``self._json("sinfo", ...)``)
    it goes through the gate; compared with, a set member, a label, it starts nothing."""
    par = parents.get(node)
    if isinstance(par, ast.Call) and par.args and par.args[0] is node and isinstance(par.func, ast.Attribute) \
            and par.func.attr in ("run", "_json") \
            and not (isinstance(par.func.value, ast.Name) and par.func.value.id in ("subprocess", "os")):
        return False
    while par is not None:
        if isinstance(par, (ast.List, ast.Tuple, ast.JoinedStr, ast.BinOp)):
            return True
        if isinstance(par, ast.Call):
            name = ast.unparse(par.func)
            return name.startswith(("subprocess.", "os.exec", "os.spawn", "os.path.join", "Path", "pathlib."))\
                or name.endswith(("Popen", "run", "check_output", "call", "join"))
        if isinstance(par, (ast.Assign, ast.AugAssign, ast.NamedExpr)):
            return True                     # a name for it could reach an argv unseen: not allowed
        if isinstance(par, (ast.Compare, ast.Set, ast.Dict, ast.Subscript, ast.AnnAssign, ast.keyword,
                            ast.arguments, ast.Return, ast.IfExp)):
            return False
        par = parents.get(par)
    return False


def test_no_code_path_starts_a_slurm_command_but_the_gate():
    """Every place the package names a Slurm binary is the client's gate (``Slurm.run``) or a
    call through it; so in observe mode no code path can change Slurm. ``lab/`` (the test
    cluster's own driver) and ``data/client/`` (the stdlib-only
    job-side client: it runs inside the job as its owner and writes only that job's own comment,
    what the owner may do with ``scontrol`` anyway) are not slurm-ft's actions."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(("lab/", "data/client/")) or rel == "slurm/__init__.py":
            continue
        src = path.read_text()
        tree = ast.parse(src)
        assert "shell=True" not in src, rel
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        lines = src.splitlines()
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            path_tail = any(node.value.endswith(f"/{b}") for b in SLURM_BINARIES)
            if path_tail or (node.value in SLURM_BINARIES and _starts_it(node, parents)):
                bad.append(f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert bad == []
    # and the client itself starts a binary in one place only, behind the gate
    tree = ast.parse((PKG / "slurm" / "__init__.py").read_text())
    spawners = [f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                and any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "subprocess"
                        and n.attr in ("run", "Popen", "call", "check_call", "check_output") for n in ast.walk(f))]
    assert spawners == ["_exec"]
    run_src = inspect.getsource(Slurm.run)
    assert "self._exec(" in run_src and "self.observe" in run_src


def _scan(src: str) -> list[str]:
    tree = ast.parse(src)
    parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and (n.value in SLURM_BINARIES and _starts_it(n, parents)
                 or any(n.value.endswith(f"/{b}") for b in SLURM_BINARIES))]


@pytest.mark.parametrize("src", ['subprocess.run(["scancel", "1"])', 'subprocess.Popen(("srun", "-N1"))',
                                 'os.path.join(d, "scontrol")', 'x = "sbatch"', 'p = f"{d}/scontrol"',
                                 'os.execv("/usr/bin/scontrol", a)', 'argv = [b + "scontrol", "hold"]'])
def test_the_source_scan_finds_a_command_started_around_the_gate(src):
    assert _scan(src)


@pytest.mark.parametrize("src", ['slurm.run("scontrol", "hold", "1")', 'self._json("sinfo", "--Node")',
                                 'ok = cmd == "srun"', 'FORWARDERS = {"srun", "mpirun"}', 'st.get("sinfo", [])'])
def test_the_source_scan_lets_the_gate_and_data_be(src):
    assert _scan(src) == []


def test_command_target():
    assert command_target(["scontrol", "update", "JobId=12", "Priority=3"]) == (12, "12")
    assert command_target(["scontrol", "update", "NodeName=n1", "State=DRAIN"]) == (None, "n1")
    assert command_target(["scontrol", "requeue", "7"]) == (7, "7")
    assert command_target(["srun", "--jobid=9", "--overlap"]) == (9, "9")


# ------------------------------------------------------------------ the failover scenarios, observed
def _snapshot(w) -> tuple:
    """Slurm's state as slurm-ft could change it (not the mailbox: the epilogs' channel)."""
    t0 = w.t0
    jobs = tuple((j.job_id, j.state, j.restart, j.priority, tuple(sorted(j.excluded)), tuple(j.required), j.held,
                  j.reason, j.admin_comment, round(j.eligible - t0, 3), tuple(j.nodes), j.comment)
                 for j in sorted(w.slurm.jobs_by_id.values(), key=lambda j: j.job_id))
    nodes = tuple((n.name, n.state, n.drain, n.reason, n.down) for n in w.slurm.node_recs.values())
    return jobs, nodes


def _xid79(w):
    jid = w.start()
    w.step()
    w.slurm.end(jid, "FAILED", 1, verdicts={w.job(jid).nodes[0]: XID79}, epilogs=True)
    w.step(n=12)
    return jid


def _user_error(w):
    jid = w.start()
    w.step()
    w.slurm.end(jid, "FAILED", 1, verdicts={w.job(jid).nodes[0]: USER}, epilogs=True)
    w.step(n=12)
    return jid


def _node_fail(w):
    jid = w.start()
    w.step()
    w.slurm.node_fail(w.job(jid).nodes[0])
    w.step(n=12)
    return jid


def _health_evacuation(w):
    jid = w.start()
    w.step()
    w.slurm.drain_by_node(w.job(jid).nodes[0], "slurm-ft: ecc_volatile_uncorrected: GPU0 3 uncorrected")
    w.step(dt=2.0, n=6)
    w.step(dt=30.0, n=4)                  # past --ft-ckpt-wait without an ack
    return jid


def _prolog_refusal(w):
    jid = w.start()
    w.slurm.prolog_fail(jid)
    w.step(n=12)
    return jid


def _pinned_failover(w):
    jid = w.start(required=["n1"])
    w.step()
    w.slurm.end(jid, "FAILED", 1, verdicts={"n1": XID79}, epilogs=True)
    w.step(n=12)
    return jid


#: scenario -> what the journal must show slurm-ft would have done (Slurm command fragments)
SCENARIOS = {
    "xid79": (_xid79, ["State=DRAIN", "scontrol requeue", "ExcNodeList=", "Priority="]),
    "user-error": (_user_error, []),
    "node-fail": (_node_fail, ["State=DRAIN", "ExcNodeList=", "Priority="]),
    "health-evacuation": (_health_evacuation, ["srun --jobid=", "scontrol requeue"]),
    "prolog-refusal": (_prolog_refusal, ["ExcNodeList=", "StartTime=now"]),
    "pinned-failover": (_pinned_failover, ["State=DRAIN", "scontrol requeue", "scontrol hold"]),
}


class _NoDaemon(World):
    """The same world without slurm-ft's daemon: what Slurm does by itself."""

    def step(self, dt: float = 0.5, n: int = 1) -> None:
        for _ in range(n):
            self.clock.advance(dt)
            self.slurm.schedule()


def _world(cls, tmp, failover, monkeypatch):
    """``failover``: extra keys of the world's ``[failover]`` table (the breaker table follows it)."""
    w = cls(tmp, nodes=4, breaker=f"{failover}\n{WIDE_BREAKER}", monkeypatch=monkeypatch)
    w.t0 = w.clock()
    return w


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_observe_mode_changes_nothing_in_slurm_and_journals_each_would_be_action(name, tmp_path, monkeypatch):
    scenario, expected = SCENARIOS[name]
    (tmp_path / "plain").mkdir()
    (tmp_path / "observe").mkdir()
    (tmp_path / "act").mkdir()
    plain = _world(_NoDaemon, tmp_path / "plain", "", monkeypatch)
    scenario(plain)
    observe = _world(World, tmp_path / "observe", 'mode = "observe"', monkeypatch)
    jid = scenario(observe)
    # Slurm ends exactly as without slurm-ft's daemon, and nothing but reads reached it
    assert _snapshot(observe) == _snapshot(plain)
    assert all(is_read(c.cmd, c.args) for c in observe.slurm.calls)
    with observe.journal() as j:
        rows = j.actions(jid)
    commands = [r["detail"] for r in rows if r["action"] == "observed"]
    assert all(r["status"] == OBSERVED for r in rows if r["action"] == "observed")
    assert [command_line(c) for c in observe.slurm.observed] == commands
    for fragment in expected:
        assert any(fragment in c for c in commands), (fragment, commands)
    assert not [r for r in rows if r["status"] == "done"]      # nothing is said to be done
    # ... and what it would have done is what act mode does
    act = _world(World, tmp_path / "act", "", monkeypatch)
    scenario(act)
    acted = [" ".join((c.cmd, *c.args)) for c in act.slurm.calls if not is_read(c.cmd, c.args)
             and not (c.args and str(c.args[-1]).startswith("Extra="))]
    for fragment in expected:
        assert any(fragment in c for c in acted), (fragment, acted)
    if name == "user-error":
        assert observe.ft_state(jid) == act.ft_state(jid) == "user-error"


def test_observed_decisions_are_said_so_in_ft_history(tmp_path, monkeypatch):
    from slurm_ft.history.query import history, render_table

    w = _world(World, tmp_path, 'mode = "observe"', monkeypatch)
    jid = _xid79(w)
    with w.journal() as j:
        h = history(j, jid)
    text = render_table(h)
    assert h["observed"] and "observed only: [failover] mode = observe, nothing done in Slurm" in text
    assert "observed: would drain n1" in h["attempts"][0]["action"]
    assert "observed: would requeue" in h["attempts"][0]["action"]
    assert not [x for a in h["attempts"] for x in a["actions"] if x["status"] == "done"]


def test_fake_records_are_the_fakes(tmp_path):
    # the scenario snapshot covers every field of the fake's records that slurm-ft may write
    assert {"priority", "excluded", "required", "held", "admin_comment", "eligible", "comment"} <= \
        set(FakeJob.__dataclass_fields__)
    assert {"drain", "reason", "state"} <= set(FakeNode.__dataclass_fields__)


# ------------------------------------------------------------------ node side: prolog, epilog drain, health --act
def _observing(monkeypatch):
    s = _recorder(observe=True, mailbox_field="Extra")
    monkeypatch.setattr("slurm_ft.slurm.Slurm.from_config", classmethod(lambda cls, c: s))
    return s


def _node_cfg(tmp_path, mode="observe"):
    p = tmp_path / "slurm-ft.toml"
    p.write_text(f'[journal]\npath = "{tmp_path}/d.db"\nnode_path = "{tmp_path}/node-{{node}}.db"\n'
                 f'[failover]\nmode = "{mode}"\nauto_resume = true\n')
    return config_mod.load(p)


def test_prolog_observes_its_refusal_and_lets_the_job_start(tmp_path, monkeypatch):
    from slurm_ft.node import prolog
    from slurm_ft.health.result import CheckResult
    from slurm_ft.node.job import NodeJob

    s = _observing(monkeypatch)
    failing = [CheckResult("row_remap", "fail", 0, "GPU0 row remap pending", None, "")]
    monkeypatch.setattr("slurm_ft.health.run_checks", lambda cfg, node, *a, **k: failing)
    lines = []
    job = NodeJob(7, "n1", 0, 1000, (0,), None, None, None, None, None)
    assert prolog.health_gate(_node_cfg(tmp_path), job, lines.append) == 0
    assert all(is_read(c[0], c[1:]) for c in s.executed)
    assert [c[:3] for c in s.observed] == [["scontrol", "update", "NodeName=n1"]]
    assert any("would refuse job 7" in x for x in lines), lines


def test_drain_and_resume_are_observed(tmp_path, monkeypatch):
    from slurm_ft.drain import drain_node
    from slurm_ft.health.actions import act_on_node
    from slurm_ft.health.result import CheckResult

    s = _recorder(observe=True)
    assert drain_node(s, "n1", "slurm-ft: Xid 79 GPU 0000:10:00 (job 3)") == "observed"
    s.show_node = lambda node: {"State": "IDLE+DRAIN", "Reason": "slurm-ft: row_remap: GPU0"}
    ok = [CheckResult("row_remap", "pass", 0, "ok", None, "")]
    assert act_on_node(_node_cfg(tmp_path), "n1", ok, s, lambda m: None) == "observed"
    assert all(is_read(c[0], c[1:]) for c in s.executed)
    assert [c[:4] for c in s.observed] == [["scontrol", "update", "NodeName=n1", "State=DRAIN"],
                                           ["scontrol", "update", "NodeName=n1", "State=RESUME"]]
