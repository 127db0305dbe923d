"""``slurm-ft doctor``: is slurm-ft set up right on this node or controller? One line per check,
``OK``/``WARN``/``FAIL``/``SKIP``, each FAIL and WARN with the fix (docs/install.md).

Roles: ``node`` (a compute node: the wrappers slurmd runs and the Python they run, node journal
and state directories, NVML), ``controller`` (job_submit.lua and Slurm's Lua plugin, the daemon
journal, the daemon's heartbeat); ``all`` for a host that is both. Slurm's settings are read
with ``scontrol show config`` (what slurmctld runs with), or from slurm.conf when slurmctld does
not answer. Everything the checks look at is in :class:`Env`, so tests give fake text and files.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from slurm_ft.admin import assets
from slurm_ft.failover import daemonlock
from slurm_ft.errors import SlurmFTError
from slurm_ft.admin.install import untrusted
from slurm_ft.slurm import parse_slurm_conf, plugstack_lines, slurmctld_hosts

ROLES = ("node", "controller")
STATUSES = ("OK", "WARN", "FAIL", "SKIP")
_NULL = ("", "(null)", "none")


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:<4} {self.name:<13} {self.detail}" + (f" -- fix: {self.fix}" if self.fix else "")

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass
class Env:
    """What the checks read. ``conf``: Slurm's settings with lower-case keys (``prolog``,
    ``prologflags``, ``jobsubmitplugins``, ...); ``conf_dir``: slurm.conf's directory."""

    roles: frozenset[str]
    cfg: object | None
    cfg_error: str | None
    conf: dict[str, str]
    conf_source: str
    conf_dir: Path
    host: str
    now: float = field(default_factory=time.time)
    #: (node name) -> (ok, text): can NVML be initialised and the GPUs counted
    nvml_probe: Callable[[str], tuple[bool, str]] | None = None
    #: (python, module) -> None when ``python -I -c 'import module'`` works, else the error
    python_probe: Callable[[str, str], str | None] | None = None
    #: (node name) -> slurm_ft.health.scope.NodeFacts: what Slurm's node record says it has
    node_facts: Callable[[str], object] | None = None
    #: () -> None when the epilog's kernel-log read works on this host, else why not
    kernel_log_probe: Callable[[], str | None] | None = None


# -------------------------------------------------------------------------------- Slurm config
def lower_keys(conf: dict[str, str]) -> dict[str, str]:
    """``scontrol show config`` (:meth:`slurm_ft.slurm.Slurm.show_config`) with lower-case keys."""
    out: dict[str, str] = {}
    for k, v in conf.items():
        out.setdefault(k.lower(), v)
    return out


def _values(v: str | None) -> list[str]:
    return [] if v is None or v.strip().lower() in _NULL else [x.strip() for x in v.split(",") if x.strip()]


def controller_hosts(conf: dict[str, str]) -> list[str]:
    """Short host names of ``SlurmctldHost`` (``SlurmctldHost[0] = ctl(10.0.0.1)``, or the
    slurm.conf forms ``ctl(10.0.0.1)`` / ``ControlMachine``)."""
    return list(dict.fromkeys(name.split(".")[0] for name, _ in slurmctld_hosts(conf)))


# ------------------------------------------------------------------------------------ checks
def check_config(env: Env) -> list[Check]:
    if env.cfg_error:
        return [Check("config", "FAIL", env.cfg_error, "correct the key it names (docs/configuration.md)")]
    src = getattr(env.cfg, "source", None)
    if src is None:
        return [Check("config", "WARN", "no slurm-ft.toml found: built-in defaults",
                      f"slurm-ft install --only config ({assets.CONFIG_PATH}), the same file on every host")]
    return [Check("config", "OK", f"{src} is valid")]


def check_slurm_config(env: Env) -> list[Check]:
    if not env.conf:
        return [Check("slurm-config", "FAIL", f"cannot read Slurm's configuration ({env.conf_source})",
                      "start slurmctld, or give --slurm-conf FILE")]
    if env.conf_source.startswith("scontrol"):
        return [Check("slurm-config", "OK", f"read with scontrol show config (slurm.conf in {env.conf_dir})")]
    return [Check("slurm-config", "WARN", f"slurmctld did not answer; read {env.conf_source}",
                  "start slurmctld (then `scontrol reconfigure` after editing slurm.conf)")]


def _wrapper_python(text: str, wrapper: Path) -> str | None:
    """The Python a wrapper runs: ``PYTHON=...`` of an installed wrapper, or the checkout's
    ``../.venv/bin/python`` of prolog/slurm-ft-prolog."""
    m = re.search(r"^PYTHON=(.+)$", text, re.M)
    if m:
        try:
            words = shlex.split(m.group(1))
        except ValueError:
            return None
        return words[0] if words else None
    if '$here/../.venv/bin/python' in text:
        return str(Path(os.path.realpath(wrapper)).parent.parent / ".venv" / "bin" / "python")
    return None


def _script_check(env: Env, key: str, kind: str) -> list[Check]:
    name, setting = kind, {"prolog": "Prolog", "epilog": "Epilog"}[kind]
    want = f"{assets.LIBEXEC_DIR}/slurm-ft-{kind}"
    paths = _values(env.conf.get(key))
    if not paths:
        return [Check(name, "FAIL", f"{setting}= is not set: slurm-ft never sees a job",
                      f"slurm.conf: {setting}={want}" + ("  PrologFlags=Alloc,NoHold" if kind == "prolog" else ""))]
    files = [Path(f) for p in paths for f in (sorted(glob.glob(p)) or [p])]
    if "node" not in env.roles:
        if any(f.name == f"slurm-ft-{kind}" for f in files):
            return [Check(name, "OK", f"{setting}={','.join(paths)} (the file is checked on the nodes)")]
        return [Check(name, "FAIL", f"{setting}={','.join(paths)} does not name slurm-ft-{kind}",
                      f"slurm.conf: {setting}={want}")]
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        if f"slurm_ft.node.{kind}" not in text:
            if re.search(rf"\bslurm_ft\.{kind}\b", text):    # a wrapper written before the node/ room
                return [Check(name, "FAIL", f"{f} runs slurm_ft.{kind}, which is slurm_ft.node.{kind} since "
                                            f"this version: every job here fails its {kind}",
                              "slurm-ft install --only wrappers (from the venv slurm-ft runs in), docs/install.md")]
            continue
        problems = []
        bad = untrusted(f)
        if bad:
            problems.append(f"{bad} (root runs it)")
        if not os.access(f, os.X_OK):
            problems.append(f"{f} is not executable")
        py = _wrapper_python(text, f)
        if py is None:
            problems.append(f"{f}: no PYTHON= line")
        elif not os.access(py, os.X_OK):
            problems.append(f"{py} (the Python it runs) is missing: every job here drains the node")
        else:
            bad = untrusted(py)
            if bad:
                problems.append(f"{bad} (the Python root runs)")
            elif env.python_probe is not None:
                err = env.python_probe(py, f"slurm_ft.node.{kind}")
                if err:
                    problems.append(f"{py} cannot import slurm_ft.node.{kind}: {err}")
        if problems:
            return [Check(name, "FAIL", "; ".join(problems),
                          "slurm-ft install --only wrappers (from the venv slurm-ft runs in), docs/install.md")]
        return [Check(name, "OK", f"{setting}={f} runs {py}")]
    return [Check(name, "FAIL", f"{setting}={','.join(paths)}: no slurm-ft {kind} there on this host",
                  f"slurm-ft install --only wrappers; slurm.conf: {setting}={want}")]


def check_prolog(env: Env) -> list[Check]:
    out = _script_check(env, "prolog", "prolog")
    flags = [f.lower() for f in _values(env.conf.get("prologflags"))]
    if "alloc" in flags and ("nohold" in flags or {"contain", "x11"} & set(flags)):
        out.append(Check("prolog-flags", "OK", f"PrologFlags={env.conf.get('prologflags')}"))
    elif "alloc" in flags:
        # Alloc without NoHold: srun polls for the prolog's end (0.1 s, then 0.3-1.1 s later), which
        # costs most jobs 0.2-1 s; NoHold lets slurmd hold the step instead (docs/architecture.md,
        # "Per-job cost"). Not with Contain or X11 (slurm.conf(5)): those keep the poll.
        out.append(Check("prolog-flags", "WARN",
                         f"PrologFlags={env.conf.get('prologflags')}: srun polls for the prolog's end, about "
                         f"0.2 s (22.05) to 1 s (24.11) added to every job",
                         "slurm.conf: PrologFlags=Alloc,NoHold (unless you need Contain or X11, which NoHold "
                         "cannot be combined with)"))
    else:
        out.append(Check("prolog-flags", "FAIL",
                         f"PrologFlags={env.conf.get('prologflags') or '(unset)'}: the prolog runs only at the "
                         f"first step, too late for the GPU checks and the start marker",
                         "slurm.conf: PrologFlags=Alloc,NoHold (or Alloc,Contain where pam_slurm_adopt needs "
                         "Contain)"))
    return out


def check_epilog(env: Env) -> list[Check]:
    return _script_check(env, "epilog", "epilog")


def _has_lua(v: str | None) -> bool:
    return any(p.lower() in ("lua", "job_submit/lua", "cli_filter/lua") for p in _values(v))


def _plugin_dirs(env: Env) -> list[str]:
    return [d for d in (env.conf.get("plugindir") or "").split(":") if d]


def check_job_submit(env: Env) -> list[Check]:
    name = "job-submit"
    if not _has_lua(env.conf.get("jobsubmitplugins")):
        return [Check(name, "FAIL", f"JobSubmitPlugins={env.conf.get('jobsubmitplugins') or '(unset)'}: ft options "
                      f"are not checked nor fixed at submit, and the daemon acts on no job",
                      "slurm.conf: JobSubmitPlugins=lua (with job_submit.lua beside slurm.conf)")]
    out = []
    dirs = _plugin_dirs(env)
    if dirs and not any(os.path.exists(os.path.join(d, "job_submit_lua.so")) for d in dirs):
        out.append(Check("lua", "FAIL", f"job_submit_lua.so is not in PluginDir {':'.join(dirs)}",
                         "apt-get install slurm-wlm-basic-plugins (Debian), or build Slurm with Lua"))
    elif dirs:
        out.append(Check("lua", "OK", f"job_submit_lua.so in {':'.join(dirs)}"))
    path = env.conf_dir / "job_submit.lua"
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return out + [Check(name, "FAIL", f"{path}: {exc.strerror}", "slurm-ft install --only lua")]
    if "slurm-ft:submitted" not in text:
        return out + [Check(name, "FAIL", f"{path} is not slurm-ft's job_submit.lua",
                            "merge slurm-ft's into it (slurm-ft install --only lua writes "
                            "job_submit.lua.slurm-ft-new), docs/install.md")]
    m_max = re.search(r"^local MAX_RETRIES = (\d+)", text, re.M)
    m_def = re.search(r"^local DEFAULT_RETRIES = (\d+)", text, re.M)
    f = getattr(env.cfg, "failover", None)
    if f is not None and m_max and m_def and (int(m_max.group(1)), int(m_def.group(1))) != (f.max_retries, f.retries):
        return out + [Check(name, "FAIL", f"{path} has max_retries={m_max.group(1)} retries={m_def.group(1)}, "
                            f"the config max_retries={f.max_retries} retries={f.retries}",
                            "slurm-ft install --only lua (renders the config's limits), then scontrol reconfigure")]
    return out + [Check(name, "OK", f"JobSubmitPlugins=lua, {path} is slurm-ft's")]


def check_cli_filter(env: Env) -> list[Check]:
    name = "cli-filter"
    if not _has_lua(env.conf.get("clifilterplugins")):
        return [Check(name, "FAIL", f"CliFilterPlugins={env.conf.get('clifilterplugins') or '(unset)'}: "
                      f"sbatch --ft jobs lose their output on requeue (no --open-mode=append)",
                      "slurm.conf: CliFilterPlugins=lua (cli_filter.lua beside slurm.conf on submit hosts)")]
    path = env.conf_dir / "cli_filter.lua"
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return [Check(name, "FAIL", f"{path}: {exc.strerror}", "slurm-ft install --only lua")]
    if "slurm_cli_pre_submit" not in text or "open-mode" not in text:
        return [Check(name, "WARN", f"{path} is not slurm-ft's cli_filter.lua", "merge slurm-ft's, docs/install.md")]
    return [Check(name, "OK", f"CliFilterPlugins=lua, {path}")]


def check_plugstack(env: Env) -> list[Check]:
    name = "plugstack"
    conf_value = env.conf.get("plugstackconfig")
    path = Path(conf_value) if conf_value and conf_value.lower() not in _NULL else env.conf_dir / "plugstack.conf"
    lines = [(f, ln) for f, ln in plugstack_lines(path)
             if ln.split()[0] != "include" and "slurm_ft_spank.so" in ln]
    fix = (f"slurm-ft install --only spank; make -C {assets.SPANK_SRC_DIR} install; "
           f"plugstack.conf: include {env.conf_dir}/plugstack.conf.d/*.conf")
    if not lines:
        return [Check(name, "FAIL", f"{path} loads no slurm_ft_spank.so: sbatch --ft is an unknown option", fix)]
    where, line = lines[0]
    words = line.split()
    so = words[1] if len(words) > 1 and words[0] in ("optional", "required") else words[0]
    if not os.path.exists(so):
        return [Check(name, "FAIL", f"{where} names {so}, which is not on this host",
                      f"make -C {assets.SPANK_SRC_DIR} install (on every submit host and node)")]
    return [Check(name, "OK", f"{where}: {line}")]


def _journal_check(name: str, path: Path) -> Check:
    from slurm_ft.journal import open_journal
    if path.exists():
        if not os.access(path, os.R_OK | os.W_OK):
            return Check(name, "FAIL", f"{path} is not readable and writable by this user", "run doctor as root")
        try:
            with open_journal(path, readonly=True) as j:
                jobs = j.db.execute("SELECT count(*) FROM jobs").fetchone()[0]
                dead = j.dead_letter_count()
        except Exception as exc:  # noqa: BLE001 - a corrupt or foreign file is a FAIL, never a traceback
            return Check(name, "FAIL", f"{path}: {exc}", "see the error (move the file aside only when it says "
                                                         "corrupted; the writer makes a new one)")
        if dead:   # spooled writes the database refused (slurm_ft.journal.store.Journal.flush)
            return Check(name, "WARN", f"{path} ({jobs} jobs): {dead} spooled write(s) refused and set aside "
                         f"in its dead_letters table", f"sqlite3 {path} 'SELECT * FROM dead_letters'; "
                         f"report them, then delete the rows")
        return Check(name, "OK", f"{path} ({jobs} jobs)")
    d = path.parent
    while not d.exists() and d != d.parent:
        d = d.parent
    if not os.access(d, os.W_OK):
        return Check(name, "FAIL", f"{path} does not exist and {d} is not writable", "run as root; check [journal]")
    return Check(name, "OK", f"{path} not created yet (the first writer creates it)")


def _writable_check(name: str, path: Path) -> Check:
    """Whether the journal's storage takes writes now (slurm_ft.journal.trouble): a full disk, a
    read-only remount or an I/O error named as such; rows waiting in its spool."""
    from slurm_ft.journal import trouble
    t = trouble.check_writable(path, write_test=os.geteuid() == 0)
    if t is not None:
        return Check(name, "FAIL", f"{path}: {t}; failovers go on, its rows wait in the daemon's memory", t.advice)
    waiting = trouble.waiting_rows(path)
    if waiting:
        return Check(name, "WARN", f"{path}: {waiting} row(s) wait in {path}.spool",
                     "the daemon applies them each cycle; is it running? (slurm-ft doctor: daemon)")
    return Check(name, "OK", f"{path.parent} takes writes")


def check_journals(env: Env) -> list[Check]:
    if env.cfg is None:
        return [Check("journal", "SKIP", "no valid config")]
    out = []
    if "controller" in env.roles:
        out.append(_journal_check("journal", Path(env.cfg.journal.path)))
        out.append(_writable_check("journal-writable", Path(env.cfg.journal.path)))
    if "node" in env.roles:
        out.append(_journal_check("node-journal", Path(env.cfg.node_journal_path(env.host))))
        out.append(_writable_check("node-journal-writable", Path(env.cfg.node_journal_path(env.host))))
        d = Path(env.cfg.node_state.dir)
        bad = untrusted(d) if d.exists() else None
        if bad:
            out.append(Check("node-state", "FAIL", f"{bad}: the prolog/epilog markers must be root's",
                             f"chown root:root {d}; chmod 0700 {d}"))
        else:
            out.append(Check("node-state", "OK", f"{d}" + ("" if d.exists() else " (created by the first prolog)")))
    return out


def check_daemon(env: Env) -> list[Check]:
    if env.cfg is None:
        return [Check("daemon", "SKIP", "no valid config")]
    path = env.cfg.journal.path
    poll = env.cfg.failover.poll_interval_s
    state, age = daemonlock.staleness(path, poll, env.now)
    fix = "systemctl status slurm-ft-daemon; journalctl -u slurm-ft-daemon; systemctl enable --now slurm-ft-daemon"
    if state == "missing":
        return [Check("daemon", "FAIL", f"no heartbeat at {daemonlock.heartbeat_path(path)}: the daemon has not run "
                      f"on this journal", fix)]
    if state == "stale":
        return [Check("daemon", "FAIL", daemonlock.down_warning(path, poll, env.now), fix)]
    hb = daemonlock.read_heartbeat(path) or {}
    if not hb.get("ok", True):
        since = env.now - hb["last_ok"] if isinstance(hb.get("last_ok"), (int, float)) else None
        when = f"for {since:.0f} s" if since is not None else "since it started"
        return [Check("daemon", "WARN", f"pid {hb.get('pid')} runs, but its cycles fail {when}",
                      "journalctl -u slurm-ft-daemon (Slurm unreachable? journal unwritable?)")]
    return [Check("daemon", "OK", f"pid {hb.get('pid')}, last cycle {age:.1f} s ago")]


def health_scope(env: Env):
    """The prolog's decision for this host (slurm_ft.health.scope.decide) from ``env.node_facts``:
    a Scope, None when not probed, or the ConfigError text of a bad ``[health]`` table."""
    if env.cfg is None or env.node_facts is None:
        return None
    from slurm_ft.errors import ConfigError
    from slurm_ft.health.config import from_config
    from slurm_ft.health.scope import decide
    try:
        return decide(env.node_facts(env.host), from_config(env.cfg.health))
    except ConfigError as exc:
        return str(exc)


def check_health_scope(env: Env) -> list[Check]:
    """Which health checks the prolog runs on this host, and what a FAIL of one does."""
    scope = health_scope(env)
    if scope is None:
        return [Check("health", "SKIP", "no valid config" if env.cfg is None else "Slurm's node record not probed")]
    if isinstance(scope, str):
        return [Check("health", "FAIL", scope, "correct [health] (docs/health-checks.md)")]
    if not scope.checks:
        return [Check("health", "OK", f"{scope.why}: the prolog passes every job here")]
    if getattr(getattr(env.cfg, "failover", None), "mode", "act") == "observe":
        effect = "is journaled as an observed drain; the job still starts here ([failover] mode = observe)"
    else:
        effect = "drains this node and the prolog refuses the job (it runs elsewhere)"
    return [Check("health", "OK", f"{scope.why}: nvml_responsive, {', '.join(scope.checks)}; a FAIL of any "
                  f"{effect}")]


def check_nvml(env: Env) -> list[Check]:
    if env.cfg is None or env.nvml_probe is None:
        return [Check("nvml", "SKIP", "no valid config" if env.cfg is None else "not probed")]
    scope = health_scope(env)
    if scope is not None and not isinstance(scope, str) and not scope.checks:
        return [Check("nvml", "SKIP", scope.why)]
    ok, text = env.nvml_probe(env.host)
    if ok:
        return [Check("nvml", "OK", text)]
    return [Check("nvml", "FAIL", f"FAIL nvml_responsive: {text}: the prolog will drain this node at its next job",
                  "install/load the NVIDIA driver (nvidia-smi must work as root); [nvml] in the config; on a node "
                  "without GPUs: no gres/gpu in its Slurm record, or [health] exclude_nodes")]


def check_kernel_log(env: Env) -> list[Check]:
    """Can the epilog read the kernel log here (its trusted Xid evidence)? Without it (a container,
    no CAP_SYSLOG, ``kernel.dmesg_restrict`` and no dmesg) a GPU lost mid-job is found only by the
    trusted checks the epilog then runs for a failed GPU job (slurm_ft.node.epilog.verify_untrusted)."""
    if env.kernel_log_probe is None:
        return [Check("kernel-log", "SKIP", "not probed")]
    scope = health_scope(env)
    if scope is not None and not isinstance(scope, str) and not scope.checks:
        return [Check("kernel-log", "SKIP", scope.why)]
    why = env.kernel_log_probe()
    if why is None:
        return [Check("kernel-log", "OK", "the epilog reads the kernel log (Xid records)")]
    return [Check("kernel-log", "WARN", f"kernel log unreadable: GPU faults are found only by the trusted checks "
                  f"({why})", "run slurmd where root can read /dev/kmsg (outside a container, or with CAP_SYSLOG "
                  "and kernel.dmesg_restrict=0); docs/health-checks.md")]


#: First Slurm release with expedited requeue (``--requeue=expedite``; release notes of 25.11).
EXPEDITE_SINCE = (25, 11)
#: The parameter that turns it on; sites set it in ``SlurmctldParameters`` (SchedMD's GCP controller
#: module) or ``SchedulerParameters`` (some vendors' guides): both are looked at.
EXPEDITE_KEY = "enable_expedited_requeue"


def slurm_version(conf: dict[str, str]) -> tuple[int, int] | None:
    """(major, minor) of ``SLURM_VERSION`` in ``scontrol show config`` (``22.05.8`` -> (22, 5)),
    None when the settings came from slurm.conf (it holds no version) or the text is odd."""
    m = re.match(r"\s*(\d+)\.(\d+)", conf.get("slurm_version") or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_failover_path(env: Env) -> list[Check]:
    """The Slurm version and which failover path a hardware fault takes on this cluster:
    slurm-ft's (the daemon requeues with ExcNodeList, priority and the retry budget), only
    observed (``[failover] mode = observe``), and whether Slurm's own expedited requeue (>= 25.11)
    is on beside it. A job submitted with ``--requeue=expedite`` is requeued by slurmctld itself
    onto its previous nodes, when the epilog fails or a node fails (Slurm 25.11 release notes);
    an ft job never is: ``cli_filter.lua`` replaces ``--requeue=expedite`` by a bare ``--requeue``."""
    text = (env.conf.get("slurm_version") or "").strip() or "unknown (settings read from slurm.conf)"
    mode = getattr(getattr(env.cfg, "failover", None), "mode", "act")
    path = ("slurm-ft observes only: decisions journaled, nothing changed in Slurm ([failover] mode = observe)"
            if mode == "observe" else "slurm-ft failover (the daemon requeues with ExcNodeList, priority and the "
            "retry budget)")
    version = slurm_version(env.conf)
    params = ",".join(env.conf.get(k) or "" for k in ("slurmctldparameters", "schedulerparameters"))
    expedite = EXPEDITE_KEY in {p.strip().split("=", 1)[0] for p in params.split(",")}
    if version is not None and version < EXPEDITE_SINCE:
        return [Check("failover-path", "OK", f"Slurm {text}; {path}; no expedited requeue before 25.11")]
    if not expedite:
        return [Check("failover-path", "OK", f"Slurm {text}; {path}; Slurm's expedited requeue is off "
                      f"(--requeue=expedite is refused at submit)")]
    return [Check("failover-path", "OK", f"Slurm {text}; {path}; Slurm's expedited requeue is on: ft jobs still take "
                  "slurm-ft's path (cli_filter.lua submits them with a bare --requeue, replacing =expedite, so a "
                  "job is never requeued twice); other jobs with --requeue=expedite are requeued by slurmctld onto "
                  "their previous nodes")]


def check_handoff(env: Env) -> list[Check]:
    """Whether the epilog's hand-off (``[failover] handoff_wait_s``, slurm_ft.node.handoff) pays
    on this Slurm: it does only where slurmctld makes a requeued job eligible the moment its
    epilogs end, Slurm >= 25.11 with ``SchedulerParameters=requeue_delay=-1`` (the job then
    starts in the epilog-complete RPC: 1.55 -> 0.68 s on the 26.05 lab, docs/architecture.md
    "Fault to RUNNING"); elsewhere it makes the job eligible later. Off: nothing to say."""
    wait = getattr(getattr(env.cfg, "failover", None), "handoff_wait_s", 0) or 0
    if wait <= 0:
        return []
    version = slurm_version(env.conf)
    params = [p.strip() for p in (env.conf.get("schedulerparameters") or "").split(",")]
    immediate = any(p.startswith("requeue_delay=") and p.split("=", 1)[1].strip().lstrip("-").isdigit()
                    and int(p.split("=", 1)[1]) < 0 for p in params)
    if version is not None and version >= EXPEDITE_SINCE and immediate:
        return [Check("handoff", "OK", f"hand-off on ({wait:g} s) with requeue_delay < 0: a failed 1-node ft job "
                      "is requeued while its epilog runs and starts in the epilog-complete RPC")]
    why = ("Slurm before 25.11 has no requeue_delay" if version is not None and version < EXPEDITE_SINCE
           else "SchedulerParameters has no requeue_delay=-1")
    return [Check("handoff", "WARN", f"hand-off on ({wait:g} s) but {why}: a requeued job is eligible only after "
                  "its requeue delay, so the hand-off makes it eligible later, not sooner",
                  "set [failover] handoff_wait_s = 0, or (Slurm >= 25.11) add requeue_delay=-1 to "
                  "SchedulerParameters; docs/architecture.md, \"Fault to RUNNING\"")]


NODE_CHECKS = (check_prolog, check_epilog, check_plugstack, check_cli_filter, check_journals, check_health_scope,
               check_nvml, check_kernel_log)
CONTROLLER_CHECKS = (check_prolog, check_epilog, check_job_submit, check_cli_filter, check_plugstack,
                     check_journals, check_daemon, check_failover_path, check_handoff)


def run(env: Env) -> list[Check]:
    """Every check for ``env.roles``, in a fixed order, each once."""
    out = check_config(env) + check_slurm_config(env)
    done: list = []
    for role in ROLES:
        if role not in env.roles:
            continue
        for fn in NODE_CHECKS if role == "node" else CONTROLLER_CHECKS:
            if fn not in done:
                done.append(fn)
    for fn in sorted(done, key=lambda f: [*NODE_CHECKS, *CONTROLLER_CHECKS].index(f)):
        if not env.conf and fn not in (check_journals, check_daemon, check_nvml, check_health_scope, check_kernel_log):
            out.append(Check(fn.__name__.removeprefix("check_").replace("_", "-"), "SKIP", "no Slurm configuration"))
            continue
        out += fn(env)
    return out


def failed(checks: list[Check]) -> bool:
    return any(c.status == "FAIL" for c in checks)


# ------------------------------------------------------------------------- the real environment
def python_probe(python: str, module: str) -> str | None:
    """None when ``python -I -c 'import MODULE'`` works (as slurmd would run it), else the error."""
    try:
        r = subprocess.run([python, "-I", "-c", f"import {module}"], capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if r.returncode == 0:
        return None
    lines = (r.stderr or r.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {r.returncode}"


def nvml_probe_for(cfg) -> Callable[[str], tuple[bool, str]]:
    """NVML init and GPU count under the health checks' deadline (``[health] nvml_timeout_s``)."""
    def probe(node: str) -> tuple[bool, str]:
        from slurm_ft.health import run_checks
        try:
            results = run_checks(cfg, node, only=["gpu_count"])
        except SlurmFTError as exc:
            return False, str(exc)
        nvml = [r for r in results if r.check == "nvml_responsive"]
        if nvml and nvml[0].status == "fail":
            return False, nvml[0].measurement
        count = [r for r in results if r.check == "gpu_count"]
        return True, (nvml[0].measurement if nvml else "NVML answered") + (
            f"; {count[0].measurement}" if count else "")
    return probe


def kernel_log_probe() -> str | None:
    """None when the epilog's kernel-log read (slurm_ft.classify.sources.read_kmsg: /dev/kmsg, else
    dmesg) works for this process, else the reason. Run doctor as root, as slurmd runs the epilog."""
    from slurm_ft.classify.sources import read_kmsg
    try:
        read_kmsg(time.monotonic())
    except SlurmFTError as exc:
        return str(exc)
    return None


def node_facts_probe_for(cfg) -> Callable[[str], object]:
    """``node -> NodeFacts`` from ``scontrol show node -o NODE`` (asked every time: doctor is no
    prolog); a node Slurm does not answer for has ``gpus=None``."""
    def probe(node: str):
        from slurm_ft.health.scope import NodeFacts, record_facts, scontrol_lookup
        try:
            record = scontrol_lookup(cfg)(node)
            if record.get("NodeName") != node:
                raise SlurmFTError(f"no Slurm node named {node}")
            gpus, partitions = record_facts(record)
        except SlurmFTError as exc:
            return NodeFacts(node, None, (), 0, f"unknown: {exc}")
        return NodeFacts(node, gpus, partitions, 0, "scontrol")
    return probe


def slurm_settings(slurm_conf: str | None, cfg) -> tuple[dict[str, str], str, Path]:
    """(settings with lower-case keys, where they came from, slurm.conf's directory): ``scontrol
    show config`` unless ``slurm_conf`` is given, else (or when slurmctld does not answer) the
    slurm.conf file ($SLURM_CONF, /etc/slurm/slurm.conf)."""
    if slurm_conf is None:
        from slurm_ft.config import SlurmConfig
        from slurm_ft.slurm import Slurm
        try:
            s = Slurm.from_config(cfg) if cfg is not None else Slurm(bin_dir=SlurmConfig().bin_dir)
            conf = lower_keys(s.show_config())
        except SlurmFTError as exc:
            conf, why = {}, str(exc)
        else:
            where = conf.get("slurm_conf") or os.environ.get("SLURM_CONF") or f"{assets.SLURM_CONF_DIR}/slurm.conf"
            return conf, "scontrol show config", Path(where).parent
        slurm_conf = os.environ.get("SLURM_CONF") or f"{assets.SLURM_CONF_DIR}/slurm.conf"
    else:
        why = ""
    path = Path(slurm_conf)
    try:
        return parse_slurm_conf(path.read_text(errors="replace")), str(path), path.parent
    except OSError as exc:
        return {}, f"{path}: {exc.strerror}" + (f"; scontrol: {why}" if why else ""), path.parent


def default_roles(conf: dict[str, str], host: str) -> frozenset[str]:
    """``controller`` on a SlurmctldHost, else ``node``."""
    return frozenset({"controller"}) if host in controller_hosts(conf) else frozenset({"node"})


def short_host() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
