"""Start, stop and inspect the lab cluster: munge + slurmctld + N slurmd on this host.

Facts this relies on are in ``shared/SLURM_LAB_NOTES.md`` (several slurmd on one host by port,
fake gres device files, the fast requeue path). Survives being killed: ``up`` ignores stale pid
files, sockets and state; it only ever signals pids it recorded itself *and* that still have the
start time and command it recorded (so a recycled pid is never killed).

Directory safety: the default lab directory sits in world-writable ``/var/tmp``, where any user
may create ``slurm-ft-lab`` first (or a symlink by that name). Root code acts on the lab
directory only once :func:`check_lab_dir` has found it a real directory, owned by root, not
writable by group or others, under parents only root can change, holding only root-owned
entries and no symlinks; ``lab up`` creates it itself (``mkdir`` 0755) when missing. Files the
lab writes are opened with ``O_NOFOLLOW``. ``jobs/`` (job output of any lab user) is 1777 (sticky).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ft import pathtrust
from slurm_ft.errors import LabError
from slurm_ft.slurm import SAFE_PATH
from slurm_ft.lab import accounting as acct
from slurm_ft.lab import layout as L
from slurm_ft.lab import spank as lab_spank
from slurm_ft.lab.layout import Layout

SBIN = "/usr/sbin"
#: Snapshots of slurmctld's state a lab keeps (``lab snapshot-ctld``).
SNAPSHOTS_KEPT = 20
BIN = "/usr/bin"


# --------------------------------------------------------------------------------- processes
def _proc_start(pid: int) -> str | None:
    """Kernel start time (clock ticks since boot) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return fields[19]


def _alive(rec: dict) -> bool:
    return _proc_start(rec["pid"]) == rec["start"]


@dataclass
class Proc:
    name: str
    pid: int
    start: str

    def as_dict(self) -> dict:
        return {"name": self.name, "pid": self.pid, "start": self.start}


# --------------------------------------------------------------------------------- directory safety
def _ancestors_safe(path: Path) -> None:
    """Every directory above ``path`` must be root's, and not replaceable by others: not writable
    by group or others unless sticky (``/tmp``, ``/var/tmp``): :data:`slurm_ft.pathtrust.ROOT_DIR`.
    Raises :class:`LabError`, or the OSError of a directory that cannot be looked at."""
    found = pathtrust.check_above(path, pathtrust.ROOT_DIR)
    if found is None:
        return
    d = found.path
    if found.why == pathtrust.MISSING:
        raise LabError(f"{d}: does not exist; create the directory above the lab first")
    if found.exc is not None:
        raise found.exc
    if found.why in (pathtrust.SYMLINK, pathtrust.KIND):
        raise LabError(f"{d}: not a plain directory; refusing to put the lab under it")
    if found.why == pathtrust.OWNER:
        raise LabError(f"{d}: owned by uid {found.uid}, not root; a root-run lab needs a directory "
                       f"only root can change (use --dir)")
    raise LabError(f"{d}: writable by group or others without the sticky bit; refusing to put the "
                   f"lab under it (use --dir)")


def check_lab_dir(path: Path, *, create: bool = False) -> bool:
    """Verify the lab directory before root acts on it; with ``create`` make it (0755) if missing.
    Returns False if it does not exist (and ``create`` is off). Raises :class:`LabError` for a
    symlink, a non-directory, a directory not owned by root or writable by group/others (sticky
    or not), an unsafe parent (:func:`_ancestors_safe`), or an entry in it that is a symlink or not
    root's (:data:`slurm_ft.pathtrust.ROOT_ENTRY`)."""
    _ancestors_safe(path)
    if create:
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        else:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchmod(fd, 0o755)  # mkdir's mode is cut by the umask
            finally:
                os.close(fd)
    found = pathtrust.check(path, pathtrust.Rule(frozenset({0}), 0o022, sticky=False, kind=pathtrust.DIR))
    fix = "remove it (or use --dir DIR) and run `slurm-ft lab up` again"
    if found is not None:
        if found.why == pathtrust.MISSING:
            return False
        if found.exc is not None:
            raise found.exc
        if found.why == pathtrust.SYMLINK:
            raise LabError(f"{path}: the lab directory is a symlink; refusing to follow it as root: {fix}")
        if found.why == pathtrust.KIND:
            raise LabError(f"{path}: the lab directory is not a directory: {fix}")
        if found.why == pathtrust.OWNER:
            raise LabError(f"{path}: the lab directory is owned by uid {found.uid}, not root; refusing to run "
                           f"root daemons from it: {fix}")
        raise LabError(f"{path}: the lab directory is writable by group or others (mode "
                       f"{found.perms}); refusing: {fix}")
    with os.scandir(path) as entries:
        for e in entries:
            est = e.stat(follow_symlinks=False)
            why = pathtrust.judge(est, pathtrust.ROOT_ENTRY)
            if why is not None:
                what = "a symlink" if why == pathtrust.SYMLINK else f"owned by uid {est.st_uid}"
                raise LabError(f"{path / e.name}: {what} in the lab directory (only root writes there); "
                               f"refusing: {fix}")
    return True


def _open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LabError(f"{path}: is a symlink; the lab never writes through one") from None
        raise


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` (created ``mode``, truncated), never through a symlink."""
    with os.fdopen(_open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as fh:
        fh.write(text)


def _make_dir(path: Path, mode: int = 0o755) -> None:
    """``mkdir -p``-like for a directory inside the verified lab directory: a real directory
    (never a symlink) with ``mode``."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    fd = _open_nofollow(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _spawn(name: str, argv: list[str], log: Path, env: dict[str, str], user: str | None = None) -> Proc:
    with os.fdopen(_open_nofollow(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True, close_fds=True, user=user, group=user,
                             extra_groups=[] if user else None)
    for _ in range(50):
        start = _proc_start(p.pid)
        if start:
            return Proc(name, p.pid, start)
        time.sleep(0.01)
    raise LabError(f"{name} exited at once; log tail:\n{tail(log)}")


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _port_owner(port: int) -> str:
    try:
        out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True,
                             timeout=5, env={"PATH": SAFE_PATH}).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out or "unknown process"


# --------------------------------------------------------------------------------- config files
#: The lab's ``PrologFlags`` (``SLURM_FT_LAB_PROLOG_FLAGS`` overrides it, e.g. to compare ``Alloc``).
DEFAULT_PROLOG_FLAGS = "Alloc,NoHold"


def prolog_flags() -> str:
    """The lab's ``PrologFlags=`` value: ``$SLURM_FT_LAB_PROLOG_FLAGS`` if set (letters and commas
    only, else :class:`LabError`), else :data:`DEFAULT_PROLOG_FLAGS`."""
    value = os.environ.get("SLURM_FT_LAB_PROLOG_FLAGS", DEFAULT_PROLOG_FLAGS)
    if not value or not all(c.isalpha() or c == "," for c in value):
        raise LabError(f"SLURM_FT_LAB_PROLOG_FLAGS={value!r}: expected flags like Alloc,NoHold")
    return value


def render_slurm_conf(lay: Layout, nodes: list[str], repo: Path, extra: list[str] | tuple = ()) -> str:
    host = socket.gethostname().split(".")[0]
    d = lay.dir
    lines = [
        "# Written by `slurm-ft lab up`; regenerated on every fresh start.",
        "ClusterName=slurmftlab",
        f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={lay.ctld_port}", f"SlurmdPort={lay.port_base + 200}",
        "AuthType=auth/munge", "CryptoType=crypto/munge",
        f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid", f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log", f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        *acct.slurm_conf_lines(lay), "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none", "MpiDefault=none",
        "ReturnToService=2", "SlurmdTimeout=10", "InactiveLimit=0", "KillWait=5", "MinJobAge=600",
        "SlurmdParameters=config_overrides",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
        "GresTypes=gpu",
        f"Prolog={repo}/prolog/slurm-ft-prolog", f"Epilog={repo}/epilog/slurm-ft-epilog",
        f"PrologFlags={prolog_flags()}", "PrologEpilogTimeout=60",
        # ft job started/ended -> the daemon's events directory (contrib/slurm-ft-ctld-event)
        f"PrologSlurmctld={d}/ctld-event", f"EpilogSlurmctld={d}/ctld-event",
        # `scontrol reboot` restarts that node's slurmd and heals its fake GPUs (slurm_ft/lab/reboot.py)
        f"RebootProgram={d}/reboot-node",
        *extra,  # SPANK plugin, cli_filter, job_submit (lab/spank.py)
    ]
    for i, n in enumerate(nodes, start=1):
        lines.append(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={lay.slurmd_port(n)} "
                     f"CPUs=4 RealMemory=4000 Gres=gpu:{L.GPUS_PER_NODE} State=UNKNOWN")
    lines.append(f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_gres_conf(lay: Layout, nodes: list[str]) -> str:
    last = L.GPUS_PER_NODE - 1
    return "".join(f"NodeName={n} Name=gpu File={lay.dev_dir(n)}/nvidia[0-{last}]\n" for n in nodes)


def render_ft_conf(lay: Layout) -> str:
    return ft_conf_text("lab cluster (written by `slurm-ft lab up`)", str(lay.dir), 3)


def ft_conf_text(what: str, root: str, max_nodes: int) -> str:
    """slurm-ft.toml of a lab (native or Docker) whose files all live under ``root`` (``journal/``,
    ``log/``, ``nvml/``, ``nodestate/``, ``events/``, ``heartbeat/``); ``what`` names it in the
    header, ``max_nodes``: the breaker's allowance (every node of the lab)."""
    return f"""# slurm-ft config of the {what}.
[journal]
path = "{root}/journal/daemon.db"
node_path = "{root}/journal/node-{{node}}.db"

[nvml]
backend = "fake"
inventory = "{root}/nvml/{{node}}.json"

[node_state]
dir = "{root}/nodestate"
log = "{root}/log/node-{{node}}.log"

[slurm]
command_timeout_s = 10.0

[failover]
poll_interval_s = 0.2
events_dir = "{root}/events"

[breaker]
# a {max_nodes}-node lab: the tests drain every node in turn (a real site keeps the defaults, docs/security.md)
max_nodes = {max_nodes}
max_fraction = 1.0

[health]
expected_gpus = {L.GPUS_PER_NODE}
nvml_timeout_s = 5.0

[hang]
# short windows for the lab's tests (a real site keeps the defaults: docs/hang.md); heartbeats per
# node, since the nodes of a native lab share one host's /run
grace_s = 5.0
poll_s = 2.0
kill_wait_s = 3.0
slurm_check_s = 30.0
heartbeat_dir = "{root}/heartbeat/{{node}}"
"""


# --------------------------------------------------------------------------------- the lab
class Lab:
    """One lab cluster rooted at ``dir``."""

    def __init__(self, dir: str | os.PathLike = L.DEFAULT_DIR, port_base: int | None = None):
        """``port_base``: None = the one this lab was last started with (default 16800)."""
        p = Path(os.path.abspath(dir))
        lay = Layout(p.parent.resolve() / p.name)  # the lab dir itself is checked, never followed
        if port_base is None:
            port_base = self._read_state_at(lay).get("port_base", L.DEFAULT_PORT_BASE)
        self.lay = Layout(lay.dir, port_base)
        self.repo = L.repo_root()

    @staticmethod
    def _read_state_at(lay: Layout) -> dict:
        try:
            return json.loads(lay.state_file.read_text())
        except (OSError, ValueError):
            return {}

    # state file --------------------------------------------------------------
    def _read_state(self) -> dict:
        return self._read_state_at(self.lay)

    def _trusted_state(self) -> dict:
        """The state file, only from a verified lab directory: its pids are what root signals."""
        if not check_lab_dir(self.lay.dir):
            return {}
        return self._read_state()

    def _write_state(self, state: dict) -> None:
        tmp = self.lay.state_file.with_suffix(".tmp")
        write_file(tmp, json.dumps(state, indent=1))
        os.replace(tmp, self.lay.state_file)

    def nodes(self) -> list[str]:
        return self._read_state().get("nodes", [])

    def env(self) -> dict[str, str]:
        env = self.lay.env()
        env["PATH"] = f"{Path(sys.executable).parent}:{SAFE_PATH}"
        return env

    def _slurm_env(self) -> dict[str, str]:
        return {"PATH": SAFE_PATH, "SLURM_CONF": str(self.lay.slurm_conf), "LC_ALL": "C"}

    # status --------------------------------------------------------------------
    def processes(self) -> list[dict]:
        """Recorded processes with an ``alive`` flag."""
        return [{**p, "alive": _alive(p)} for p in self._read_state().get("procs", [])]

    def status(self) -> dict:
        state = self._read_state()
        procs = self.processes()
        info = {"dir": str(self.lay.dir), "repo": state.get("repo"), "nodes": state.get("nodes", []),
                "processes": procs, "running": bool(procs) and all(p["alive"] for p in procs)}
        if info["running"]:
            try:
                out = subprocess.run([f"{BIN}/sinfo", "-N", "-h", "-o", "%N %T %E"], capture_output=True,
                                     text=True, timeout=10, env=self._slurm_env()).stdout
                info["sinfo"] = out.strip().splitlines()
            except (OSError, subprocess.TimeoutExpired):
                info["sinfo"] = []
        return info

    # up --------------------------------------------------------------------------
    def up(self, nodes: int = 3, daemon: bool = True, log=print) -> dict:
        """Start the lab (idempotent). Raises :class:`LabError` with the daemon's log tail."""
        if os.geteuid() != 0:
            raise LabError("the lab runs Slurm daemons as root: run as root")
        if not 1 <= nodes <= L.MAX_LAB_NODES:
            raise LabError(f"--nodes must be 1..{L.MAX_LAB_NODES}, got {nodes}")
        check_lab_dir(self.lay.dir, create=True)  # before its state file is trusted or anything is written
        for exe in (f"{SBIN}/slurmctld", f"{SBIN}/slurmd", f"{SBIN}/munged", f"{BIN}/sinfo"):
            if not os.access(exe, os.X_OK):
                raise LabError(f"{exe} missing: install Debian's slurmctld slurmd slurm-client munge (make setup)")
        if acct.missing_executables():
            raise LabError(f"{', '.join(acct.missing_executables())} missing: install Debian's {acct.PACKAGES} "
                           f"(make setup)")
        want = L.node_names(nodes)
        state = self._read_state()
        procs = self.processes()
        if (procs and all(p["alive"] for p in procs) and state.get("nodes") == want
                and state.get("repo") == str(self.repo) and bool(state.get("daemon")) == daemon
                and state.get("port_base", L.DEFAULT_PORT_BASE) == self.lay.port_base
                and state.get("accounting") and not self.hook_leftovers() and self._healthy(want)):
            log(f"lab already up in {self.lay.dir} ({', '.join(want)})")
            return self.status()
        leftovers = self.hook_leftovers() if procs else []
        if leftovers:
            log(f"restarting the lab in {self.lay.dir}: its slurm.conf still has {', '.join(leftovers)} "
                f"(a test's setting, not taken back)")
        elif any(p["alive"] for p in procs):
            log(f"restarting the lab in {self.lay.dir} (it ran from {state.get('repo')} with nodes "
                f"{','.join(state.get('nodes', []))}); its journals and job outputs go to {self.lay.dir}/archive/")
        if procs:
            self.down(log=lambda *_: None)
        self._fresh_files(want, log)
        started: list[Proc] = []
        state = {"repo": str(self.repo), "nodes": want, "daemon": daemon, "procs": [], "started_at": time.time(),
                 "port_base": self.lay.port_base, "accounting": True}
        self._write_state(state)
        try:
            munge = self._ensure_munge()
            if munge:
                started.append(munge)
            self._check_ports(want)
            env = self._slurm_env()
            started += self._start_accounting(state, started)
            started.append(_spawn("slurmctld", [f"{SBIN}/slurmctld", "-D", "-i", "-f", str(self.lay.slurm_conf)],
                                  self.lay.log("slurmctld.stdout"), env))
            self._record(state, started)
            self._wait(lambda: self._ping(), 20, "slurmctld", self.lay.log("slurmctld"))
            for n in want:
                started.append(_spawn(f"slurmd-{n}", [f"{SBIN}/slurmd", "-D", "-f", str(self.lay.slurm_conf), "-N", n],
                                      self.lay.log(f"slurmd-{n}.stdout"), env))
            self._record(state, started)
            self._wait(lambda: self._healthy(want), 30, "slurmd", self.lay.log(f"slurmd-{want[0]}"))
            if daemon:
                started.append(self._spawn_daemon())
                self._record(state, started)
        except Exception:
            self.down(log=lambda *_: None)
            raise
        log(f"lab up in {self.lay.dir}: {', '.join(want)} (export SLURM_CONF={self.lay.slurm_conf})")
        return self.status()

    def _start_accounting(self, state: dict, started: list[Proc]) -> list[Proc]:
        """MariaDB, then slurmdbd on it (``lab/accounting.py``); slurmctld registers with it."""
        db = _spawn("mariadbd", acct.mariadbd_argv(self.lay), self.lay.log("mariadbd.stdout"), {"PATH": SAFE_PATH})
        self._record(state, started + [db])
        self._wait(lambda: acct.db_ready(self.lay), 60, "mariadbd", self.lay.log("mariadbd"))
        dbd = _spawn("slurmdbd", acct.slurmdbd_argv(), self.lay.log("slurmdbd.stdout"),
                     acct.slurmdbd_env(self.lay, self._slurm_env()))
        self._record(state, started + [db, dbd])
        self._wait(lambda: acct.dbd_ready(self.lay), 30, "slurmdbd", self.lay.log("slurmdbd"))
        return [db, dbd]

    def _spawn_daemon(self) -> Proc:
        return _spawn("slurm-ft-daemon", [sys.executable, "-m", "slurm_ft.cli.main", "daemon"],
                      self.lay.log("daemon"), {**self.env(), "PYTHONUNBUFFERED": "1"})

    def daemon_stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the lab's requeue daemon (SIGTERM, or e.g. SIGKILL to test crash safety)."""
        state = self._trusted_state()
        for p in state.get("procs", []):
            if p["name"] == "slurm-ft-daemon" and _alive(p):
                if sig == signal.SIGTERM:
                    self._stop(p)
                else:
                    os.kill(p["pid"], sig)
                    while _alive(p):
                        _reap(p["pid"])
                        time.sleep(0.01)
        state["procs"] = [p for p in state.get("procs", []) if p["name"] != "slurm-ft-daemon"]
        self._write_state(state)

    def daemon_start(self) -> None:
        """(Re)start the lab's requeue daemon with the current code."""
        self.daemon_stop()
        state = self._read_state()
        state["procs"] = state.get("procs", []) + [self._spawn_daemon().as_dict()]
        state["daemon"] = True
        self._write_state(state)

    def slurmd_kill(self, node: str) -> None:
        """SIGKILL node ``node``'s slurmd (its slurmstepd and job tasks survive, as on a real node
        whose slurmd dies or whose network drops): Slurm marks it DOWN after SlurmdTimeout."""
        state = self._trusted_state()
        for p in state.get("procs", []):
            if p["name"] == f"slurmd-{node}" and _alive(p):
                os.kill(p["pid"], signal.SIGKILL)
                while _alive(p):
                    _reap(p["pid"])
                    time.sleep(0.01)

    def slurmd_start(self, node: str, rebooted: bool = False) -> None:
        """Start node ``node``'s slurmd again (after :meth:`slurmd_kill`); ``rebooted``: with
        ``-b`` (slurmd reports the node rebooted: the lab's RebootProgram, slurm_ft/lab/reboot.py)."""
        state = self._trusted_state()
        procs = [p for p in state.get("procs", []) if p["name"] != f"slurmd-{node}" or _alive(p)]
        if not any(p["name"] == f"slurmd-{node}" for p in procs):
            procs.append(_spawn(f"slurmd-{node}", [f"{SBIN}/slurmd", *(["-b"] if rebooted else []), "-D", "-f",
                                                   str(self.lay.slurm_conf), "-N", node],
                                self.lay.log(f"slurmd-{node}.stdout"), self._slurm_env()).as_dict())
        state["procs"] = procs
        self._write_state(state)

    # reboots and health checks (issue 26, slurm_ft/lab/reboot.py) ---------------------------
    def sticky_path(self, node: str) -> Path:
        """Marker file: ``node``'s fake GPU fault survives a lab reboot (the RMA path)."""
        return self.lay.dir / "nvml" / f"{node}.survives-reboot"

    def sticky_fault(self, node: str, on: bool) -> None:
        """Make ``node``'s fake GPU faults survive (``on``) or not survive a lab reboot."""
        check_lab_dir(self.lay.dir)
        if on:
            write_file(self.sticky_path(node), "the fake GPU fault survives a reboot\n")
        else:
            try:
                os.unlink(self.sticky_path(node))
            except FileNotFoundError:
                pass

    #: The lines :meth:`health_check` adds to slurm.conf: slurmd runs the program at start (after a
    #: reboot, before it registers) only with an interval > 0; 65535 s (the most 22.05 accepts)
    #: keeps it to that start.
    HEALTH_CHECK_LINES = ("HealthCheckProgram={dir}/health-check", "HealthCheckInterval=65535")

    def health_check(self, on: bool) -> None:
        """Add (``on``) or remove ``slurm-ft health --act`` as the lab's HealthCheckProgram and
        ``scontrol reconfigure``. Off by default: lab tests that restart a slurmd do not expect it."""
        check_lab_dir(self.lay.dir)
        want = [ln.format(dir=self.lay.dir) for ln in self.HEALTH_CHECK_LINES]
        lines = [ln for ln in self.lay.slurm_conf.read_text().splitlines() if ln not in want]
        write_file(self.lay.slurm_conf, "\n".join(lines + (want if on else [])) + "\n")
        subprocess.run([f"{BIN}/scontrol", "reconfigure"], capture_output=True, timeout=30, env=self._slurm_env(),
                       check=False)

    def private_data(self, flags: str | None) -> None:
        """Set Slurm's ``PrivateData=flags`` (e.g. ``"jobs"``) in the lab's slurm.conf, or remove the
        line (None: Slurm's default, ``none``), and ``scontrol reconfigure``. Off by default; a test
        that sets it removes it in a ``finally``, and ``up`` restarts a lab left with it
        (:meth:`hook_leftovers`). The history service reads PrivateData every ``ACCESS_TTL_S``:
        restart the daemon (:meth:`daemon_start`) for it to see the change at once. Raises
        :class:`LabError` for flags other than letters and commas, or a failed reconfigure."""
        if flags is not None and not all(f.isalpha() for f in flags.split(",")):
            raise LabError(f"PrivateData={flags!r}: expected flags like jobs,usage")
        check_lab_dir(self.lay.dir)
        lines = [ln for ln in self.lay.slurm_conf.read_text().splitlines() if not ln.startswith("PrivateData=")]
        write_file(self.lay.slurm_conf, "\n".join(lines + ([f"PrivateData={flags}"] if flags else [])) + "\n")
        proc = subprocess.run([f"{BIN}/scontrol", "reconfigure"], capture_output=True, text=True, timeout=30,
                              env=self._slurm_env(), check=False)
        if proc.returncode != 0:
            raise LabError(f"scontrol reconfigure failed: {proc.stderr.strip() or proc.stdout.strip()}")

    #: slurm.conf settings only a test hook adds (:meth:`private_data`, :meth:`health_check`).
    HOOK_SETTINGS = ("PrivateData=", "HealthCheckProgram=", "HealthCheckInterval=")

    def hook_leftovers(self) -> list[str]:
        """Lines of the lab's slurm.conf that a test hook added and did not take back (its test was
        killed before its ``finally``); ``slurm.conf.local`` lines do not count."""
        local = self.lay.dir / "slurm.conf.local"
        try:
            keep = {ln.strip() for ln in local.read_text().splitlines()} if not local.is_symlink() else set()
        except OSError:
            keep = set()
        try:
            lines = self.lay.slurm_conf.read_text().splitlines()
        except OSError:
            return []
        return [ln for ln in lines if ln.startswith(self.HOOK_SETTINGS) and ln.strip() not in keep]

    # controller crashes (issue 20) ---------------------------------------------------------
    @property
    def snapshot_dir(self) -> Path:
        """Where :meth:`snapshot_ctld` keeps copies of slurmctld's StateSaveLocation."""
        return self.lay.dir / "ctld-snapshots"

    def snapshot_ctld(self) -> Path:
        """Copy slurmctld's StateSaveLocation (``<lab>/state``) as it is now to
        ``<lab>/ctld-snapshots/<epoch ns>`` (the newest :data:`SNAPSHOTS_KEPT` are kept), for a later
        ``restart_ctld(lose_state_s=...)``. Returns the snapshot's directory."""
        check_lab_dir(self.lay.dir)
        _make_dir(self.snapshot_dir, 0o700)
        dest = self.snapshot_dir / str(time.time_ns())
        shutil.copytree(self.lay.dir / "state", dest, symlinks=True)
        for old in sorted(self._snapshots())[:-SNAPSHOTS_KEPT]:
            shutil.rmtree(self.snapshot_dir / str(old), ignore_errors=True)
        return dest

    def _snapshots(self) -> list[int]:
        """Snapshot times (epoch ns) of this lab incarnation (taken after its ``lab up``)."""
        since = self._read_state().get("started_at", 0) * 1e9
        try:
            names = os.listdir(self.snapshot_dir)
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in names if n.isdigit() and int(n) >= since)

    def restart_ctld(self, lose_state_s: float | None = None, log=print) -> float:
        """Crash and restart slurmctld alone: ``kill -9``, then (with ``lose_state_s``) put back
        StateSaveLocation as it was ``lose_state_s`` seconds ago (the newest :meth:`snapshot_ctld`
        at least that old), the way a crash that lost its last writes leaves it; start it with the
        same arguments as ``lab up`` and wait until ``scontrol ping`` answers. slurmd, slurmdbd and
        the jobs' processes keep running. Returns when slurmctld answered (epoch seconds).
        Raises :class:`LabError` (no such snapshot, slurmctld not coming back: its log tail)."""
        state = self._trusted_state()
        snap = None
        if lose_state_s is not None:
            limit = (time.time() - lose_state_s) * 1e9
            older = [t for t in self._snapshots() if t <= limit]
            if not older:
                raise LabError(f"no snapshot of slurmctld's state {lose_state_s:g} s old in {self.snapshot_dir}: "
                               f"take one first with `slurm-ft lab snapshot-ctld`")
            snap = self.snapshot_dir / str(older[-1])
        for p in state.get("procs", []):
            if p["name"] == "slurmctld" and _alive(p):
                os.kill(p["pid"], signal.SIGKILL)
                while _alive(p):
                    _reap(p["pid"])
                    time.sleep(0.01)
        if snap is not None:
            target = self.lay.dir / "state"
            shutil.rmtree(target)
            shutil.copytree(snap, target, symlinks=True)
            log(f"slurmctld state put back as it was {(time.time_ns() - int(snap.name)) / 1e9:.1f} s ago")
        self._wait(lambda: _port_free(self.lay.ctld_port), 30, "slurmctld port", self.lay.log("slurmctld"))
        ctld = _spawn("slurmctld", [f"{SBIN}/slurmctld", "-D", "-i", "-f", str(self.lay.slurm_conf)],
                      self.lay.log("slurmctld.stdout"), self._slurm_env())
        state["procs"] = [p for p in state.get("procs", []) if p["name"] != "slurmctld"] + [ctld.as_dict()]
        self._write_state(state)
        self._wait(self._ping, 60, "slurmctld", self.lay.log("slurmctld"))
        log("slurmctld restarted")
        return time.time()

    def _record(self, state: dict, started: list[Proc]) -> None:
        state["procs"] = [p.as_dict() for p in started]
        self._write_state(state)

    def _fresh_files(self, nodes: list[str], log=print) -> None:
        """A new cluster incarnation: fresh Slurm state; old journals archived, never deleted."""
        from slurm_ft.nvml import fake as fake_nvml

        d = self.lay.dir
        check_lab_dir(d, create=True)  # up() checked it too; _fresh_files never runs on an unchecked dir
        archive = d / "archive" / time.strftime("%Y%m%dT%H%M%S")
        for keep in (self.lay.journal_dir, self.lay.jobs_dir, self.lay.log_dir):  # job ids restart at 1
            if keep.is_dir() and not keep.is_symlink() and any(keep.iterdir()):
                _make_dir(d / "archive")
                _make_dir(archive)
                os.rename(keep, archive / keep.name)  # same directory tree: a rename, never a copy
        for sub in ("state", "spool", "run", "dev", "nvml", "nodestate", "accounting"):  # accounting: job ids restart
            shutil.rmtree(d / sub, ignore_errors=True)
        for sub in ("state", "run", "log", "journal", "nvml", "nodestate", "spool", "dev"):
            _make_dir(d / sub)
        shutil.rmtree(d / "events", ignore_errors=True)
        _make_dir(d / "events", 0o700)
        write_file(d / "ctld-event", f"#!/bin/sh\nSLURM_FT_EVENTS_DIR={d}/events exec "
                                     f"{self.repo}/contrib/slurm-ft-ctld-event\n", 0o755)
        write_file(d / "reboot-node", f"#!/bin/sh\n# the lab's RebootProgram (slurmd runs it as root)\n"
                                      f"exec {sys.executable} -m slurm_ft.lab.reboot --dir {d}\n", 0o755)
        write_file(d / "health-check", f"#!/bin/sh\n# the lab's HealthCheckProgram (slurmd, root; SLURMD_NODENAME "
                                       f"set by slurmd): Lab.health_check(True)\nSLURM_CONF={self.lay.slurm_conf} "
                                       f"SLURM_FT_CONFIG={self.lay.ft_conf} PATH={SAFE_PATH} exec {sys.executable} "
                                       f"-m slurm_ft.cli.main health --act\n", 0o755)
        _make_dir(d / "jobs", 0o1777)  # every lab user's job output; sticky: nobody replaces another's
        for n in nodes:
            _make_dir(d / "spool" / n)
            dev = self.lay.dev_dir(n)
            _make_dir(dev)
            for g in range(L.GPUS_PER_NODE):
                os.mknod(dev / f"nvidia{g}", 0o666 | 0o020000, os.makedev(1, 3))
            fake_nvml.write_inventory(str(self.lay.inventory(n)), n, L.inventory_gpus(n))
        write_file(self.lay.ft_conf, render_ft_conf(self.lay))
        from slurm_ft import config as ft_config  # job_submit.lua gets the lab's [failover] retry limits

        so = lab_spank.write_files(self.lay.dir, self.repo, log=log,
                                   failover=ft_config.load(self.lay.ft_conf).failover)
        local = d / "slurm.conf.local"   # a benchmark's own lines (MaxJobCount=...), kept across fresh starts
        extra = [ln.strip() for ln in local.read_text().splitlines() if ln.strip() and not ln.startswith("#")] \
            if local.is_file() and not local.is_symlink() else []
        write_file(self.lay.slurm_conf, render_slurm_conf(self.lay, nodes, self.repo,
                                                          [*lab_spank.slurm_conf_lines(self.lay.dir, so), *extra]))
        write_file(self.lay.gres_conf, render_gres_conf(self.lay, nodes))
        _make_dir(self.lay.acct_dir, 0o700)  # the database and its socket: root only
        write_file(self.lay.slurmdbd_conf, acct.render_slurmdbd_conf(self.lay), 0o600)
        acct.install_db(self.lay)

    def _ensure_munge(self) -> Proc | None:
        """Use a working munged if there is one; else start one (and return it as ours)."""
        if self._munge_ok():
            return None
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        os.chmod("/run/munge", 0o755)
        log = self.lay.log("munged")
        fd = _open_nofollow(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # munge's log, in root's log/
        try:
            shutil.chown(fd, "munge", "munge")
        finally:
            os.close(fd)
        proc = _spawn("munged", [f"{SBIN}/munged", "--foreground", "--force"], log, {"PATH": SAFE_PATH}, user="munge")
        self._wait(self._munge_ok, 10, "munged", log)
        return proc

    @staticmethod
    def _munge_ok() -> bool:
        try:
            cred = subprocess.run([f"{BIN}/munge", "-n"], capture_output=True, timeout=5, env={"PATH": SAFE_PATH})
            if cred.returncode != 0:
                return False
            back = subprocess.run([f"{BIN}/unmunge"], input=cred.stdout, capture_output=True, timeout=5,
                                  env={"PATH": SAFE_PATH})
            return back.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _check_ports(self, nodes: list[str]) -> None:
        ports = [self.lay.ctld_port, self.lay.dbd_port] + [self.lay.slurmd_port(n) for n in nodes]
        for port in ports:
            if not _port_free(port):
                raise LabError(f"port {port} is taken by {_port_owner(port)}; the lab needs ports "
                               f"{ports[0]}, {ports[1]} and {ports[2]}-{ports[-1]} (use --port-base to move it)")

    def _ping(self) -> bool:
        try:
            out = subprocess.run([f"{BIN}/scontrol", "ping"], capture_output=True, text=True, timeout=5,
                                 env=self._slurm_env())
        except (OSError, subprocess.TimeoutExpired):
            return False
        return "UP" in out.stdout

    def _healthy(self, nodes: list[str]) -> bool:
        try:
            out = subprocess.run([f"{BIN}/sinfo", "-N", "-h", "-o", "%N %t"], capture_output=True, text=True,
                                 timeout=5, env=self._slurm_env())
        except (OSError, subprocess.TimeoutExpired):
            return False
        if out.returncode != 0:
            return False
        states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
        bad = ("down", "unk", "fail", "inval", "npc", "boot")
        return all(n in states and not any(states[n].startswith(b) for b in bad) for n in nodes)

    def _wait(self, ok, timeout_s: float, what: str, log: Path) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ok():
                return
            for p in self.processes():
                if not p["alive"] and p["name"].startswith(what):
                    raise LabError(f"{p['name']} died while starting; log tail ({log}):\n{tail(log)}")
            time.sleep(0.2)
        raise LabError(f"{what} did not come up within {timeout_s:g} s; log tail ({log}):\n{tail(log)}")

    # down ------------------------------------------------------------------------
    def down(self, log=print) -> None:
        """Stop the processes this lab started (by recorded pid and start time) and their jobs."""
        state = self._trusted_state()
        procs = [p for p in state.get("procs", []) if _alive(p)]
        rank = {"slurm-ft-daemon": 0, "slurmctld": 2, "slurmdbd": 3, "mariadbd": 4}
        order = sorted(procs, key=lambda p: rank.get(p["name"], 1 if p["name"].startswith("slurmd-") else 5))
        stepds = self._stepds()
        for p in order:
            self._stop(p)
        for pid in stepds:
            _kill_tree(pid)
        state["procs"] = []
        if self.lay.state_file.parent.exists():
            self._write_state(state)
        log(f"lab down ({len(procs)} processes stopped)")

    def _stepds(self) -> list[int]:
        """slurmstepd processes of this lab (their command line names our slurm.conf's spool)."""
        spool = str(self.lay.dir / "spool")
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmd = fh.read().split(b"\0")
                exe = os.readlink(f"/proc/{entry}/exe")
            except OSError:
                continue
            if exe.endswith("slurmstepd") or (cmd and cmd[0].endswith(b"slurmstepd")):
                try:
                    cwd = os.readlink(f"/proc/{entry}/cwd")
                except OSError:
                    cwd = ""
                if cwd.startswith(spool) or any(spool.encode() in c for c in cmd):
                    found.append(int(entry))
        return found

    @staticmethod
    def _stop(p: dict, grace_s: float = 5.0) -> None:
        try:
            os.kill(p["pid"], signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _alive(p):
            _reap(p["pid"])
            time.sleep(0.05)
        if _alive(p):
            try:
                os.kill(p["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(p["pid"])


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _kill_tree(pid: int) -> None:
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
