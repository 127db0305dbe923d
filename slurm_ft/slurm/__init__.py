"""The only place that runs Slurm commands (the Slurm layer's client; its records and parsers are
:mod:`.records`, re-exported here as the layer's API).

Every call is an argv list (never a shell), has a timeout, and raises :class:`SlurmCommandError`
with the command's stderr on failure. Output is parsed from ``--json`` where Slurm offers it
(``squeue --json``, ``sinfo --json``; 22.05 and 24.11 shapes both handled) and from
``scontrol ... -o`` one-line ``Key=Value`` records otherwise (``scontrol show job`` has no
``--json`` on 22.05).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import time
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Callable

from slurm_ft.errors import SlurmCommandError
from slurm_ft.slurm.indices import split_indices  # noqa: F401 - split_indices is public here too
from slurm_ft.slurm.records import (Job, Node, compress_nodes, parse_boot_time, parse_config, replace_comment_record,  # noqa: F401,E501
                      parse_gres, parse_kv_line, parse_slurm_conf, private_data, slurmctld_hosts, split_nodes)

#: Fixed PATH for every child: root code never trusts the caller's PATH.
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
log = logging.getLogger("slurm_ft.slurm")


@cache
def _reads() -> tuple[frozenset[str], frozenset[str]]:
    """(commands, scontrol verbs) that only read: ``slurm_ft/data/slurm_reads.toml``."""
    from slurm_ft.data import data_text

    table = tomllib.loads(data_text("slurm_reads.toml"))
    return frozenset(table["commands"]), frozenset(table["scontrol_verbs"])


def is_read(cmd: str, args) -> bool:
    """Whether ``cmd args...`` only reads Slurm's state: ``cmd`` is in the allowlist of
    ``slurm_reads.toml`` (``squeue``, ``sinfo``, ...) or is ``scontrol`` whose first non-option
    argument is a read verb (``show``, ``ping``, ...). Everything else is a write (an allowlist:
    a command nobody listed is a write)."""
    commands, verbs = _reads()
    if cmd in commands:
        return True
    if cmd != "scontrol":
        return False
    verb = next((a for a in args if not str(a).startswith("-")), "")
    return verb in verbs


def is_mailbox_post(cmd: str, args, field_name: str | None) -> bool:
    """``scontrol update NodeName=N <field_name>=...`` and nothing else: the epilog's and prolog's
    verdict post into the node mailbox field (``[failover] mailbox_field``, slurm_ft.failover.
    mailbox), slurm-ft's own channel to its daemon, which Slurm's scheduler never reads."""
    return (bool(field_name) and cmd == "scontrol" and len(args) == 3 and args[0] == "update"
            and str(args[1]).startswith("NodeName=") and str(args[2]).startswith(f"{field_name}="))


@dataclass
class Slurm:
    """Runs Slurm commands from ``bin_dir`` with ``timeout_s`` each.

    ``conf`` (a slurm.conf path) is passed as ``SLURM_CONF`` when set; otherwise the caller's
    ``SLURM_CONF`` (or Slurm's default) applies.

    **The observe gate.** Every Slurm command goes through :meth:`run`. With ``observe`` true
    (``[failover] mode = "observe"``) a command that is not a read (:func:`is_read`, an allowlist)
    is not run: it is handed to ``observer`` (the daemon journals it) or logged, appended to
    ``observed`` (argv lists) and answered as if Slurm had done it (rc 0, no output). The one
    write let through is the verdict post into the node mailbox field ``mailbox_field``
    (:func:`is_mailbox_post`), without which the daemon would observe nothing.
    """

    bin_dir: str = "/usr/bin"
    timeout_s: float = 10.0
    conf: str | None = None
    observe: bool = False
    mailbox_field: str | None = None
    observer: Callable[[list[str]], None] | None = field(default=None, repr=False)
    observed: list[list[str]] = field(default_factory=list, repr=False)
    _env: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        env = {"PATH": SAFE_PATH, "LC_ALL": "C"}
        conf = self.conf or os.environ.get("SLURM_CONF")
        if conf:
            env["SLURM_CONF"] = conf
        self._env = env

    @classmethod
    def from_config(cls, config) -> "Slurm":
        return cls(bin_dir=config.slurm.bin_dir, timeout_s=config.slurm.command_timeout_s,
                   observe=config.failover.mode == "observe", mailbox_field=config.failover.mailbox_field)

    # -- plumbing -----------------------------------------------------------------
    def run(self, cmd: str, *args: str, check: bool = True, timeout_s: float | None = None,
            as_user: tuple[int, int] | None = None) -> subprocess.CompletedProcess:
        """Run ``bin_dir/cmd args...``; returns the CompletedProcess (text). The observe gate
        (class docstring): in observe mode a write is recorded and answered rc 0, not run.

        ``as_user``: (uid, gid) to run it as (root only; no supplementary groups, cwd ``/``), e.g.
        a step inside a user's job, which Slurm refuses to root.
        Raises :class:`SlurmCommandError` on timeout, a missing binary, or (``check``) rc != 0.
        """
        if self.observe and not is_read(cmd, args) and not is_mailbox_post(cmd, args, self.mailbox_field):
            argv = [cmd, *map(str, args)]
            self.observed.append(argv)
            if self.observer is not None:
                self.observer(argv)
            else:
                log.info("observed (mode = observe, not run): %s", shlex.join(argv))
            return subprocess.CompletedProcess(argv, 0, "", "")
        return self._exec(cmd, *args, check=check, timeout_s=timeout_s, as_user=as_user)

    def _exec(self, cmd: str, *args: str, check: bool = True, timeout_s: float | None = None,
              as_user: tuple[int, int] | None = None) -> subprocess.CompletedProcess:
        """The one place a Slurm binary is started (only :meth:`run`, the gate, calls it)."""
        argv = [os.path.join(self.bin_dir, cmd), *args]
        who = {} if as_user is None else {"user": as_user[0], "group": as_user[1], "extra_groups": [], "cwd": "/"}
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, errors="replace",
                timeout=timeout_s or self.timeout_s, env=self._env, stdin=subprocess.DEVNULL, **who,
            )
        except FileNotFoundError:
            raise SlurmCommandError(f"{argv[0]}: not found (is Slurm installed?)") from None
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(f"{' '.join(argv)}: timed out after {timeout_s or self.timeout_s:g} s") from None
        if check and proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise SlurmCommandError(f"{' '.join(argv)}: rc={proc.returncode}: {msg[-1] if msg else ''}")
        return proc

    def _json(self, cmd: str, *args: str) -> dict:
        out = self.run(cmd, *args, "--json").stdout
        try:
            return json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmCommandError(f"{cmd} --json: unparsable output: {exc}") from None

    # -- queries --------------------------------------------------------------------
    def jobs(self) -> list["Job"]:
        """Every job slurmctld still knows (pending, running, and ended within MinJobAge)."""
        data = self._json("squeue", "--states=all")
        return [Job.from_json(j) for j in data.get("jobs", [])]

    def job(self, job_id: int) -> "Job | None":
        """One job, or None once slurmctld has forgotten it: ``scontrol show job J``, a single-job
        RPC (``squeue --jobs=J`` asks slurmctld for the whole queue; slurm_ft.slurm.jobinfo), or
        ``squeue --json`` when that text is ambiguous."""
        from slurm_ft.slurm.jobinfo import parse_show_job

        proc = self.run("scontrol", "show", "job", str(job_id), check=False)
        if proc.returncode != 0 and "Invalid job id" in proc.stderr:
            return None
        raw = parse_show_job(proc.stdout, job_id) if proc.returncode == 0 else None
        return Job.from_json(raw) if raw is not None else self._job_json(job_id)

    def _job_json(self, job_id: int) -> "Job | None":
        proc = self.run("squeue", "--json", "--states=all", f"--jobs={job_id}", check=False)
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return None
            raise SlurmCommandError(f"squeue --jobs={job_id}: {proc.stderr.strip()}")
        try:
            jobs = json.loads(proc.stdout).get("jobs", [])
        except json.JSONDecodeError as exc:
            raise SlurmCommandError(f"squeue --json: unparsable output: {exc}") from None
        for j in jobs:
            if int(j.get("job_id", -1)) == job_id:
                return Job.from_json(j)
        return None

    def nodes(self) -> list["Node"]:
        """Every node, one entry each: ``sinfo --json`` lists nodes on 22.05; from 23.02 it lists
        partition/state groups instead, and ``scontrol show nodes --json`` lists nodes."""
        data = self._json("sinfo", "--Node")
        if "nodes" not in data:
            data = self._json("scontrol", "show", "nodes")
        seen: dict[str, Node] = {}
        for n in data.get("nodes", []):
            node = Node.from_json(n)
            seen.setdefault(node.name, node)
        return list(seen.values())

    def job_comment(self, job_id: int) -> str:
        """The job's ``Comment`` (``squeue -o %k``: what the job's own user may read), "" when it
        has none. The one reader for the comment's writers: the checkpoint ack and the in-place
        restart record (slurm_ft.checkpoint.channel, slurm_ft.job.inplace)."""
        current = self.run("squeue", "-h", f"--jobs={job_id}", "-o", "%k").stdout.strip()
        return "" if current == "(null)" else current

    def show_config(self, timeout_s: float | None = None) -> dict[str, str]:
        """``scontrol show config`` as a dict of its ``Key = Value`` lines (first occurrence wins);
        ``timeout_s``: this call's bound (default: the client's)."""
        return parse_config(self.run("scontrol", "show", "config", timeout_s=timeout_s).stdout)

    def boot_time(self) -> float | None:
        """When the answering slurmctld started, epoch seconds: ``BOOT_TIME`` of ``scontrol show
        config`` (local time, ``2026-12-02T02:43:00``; 22.05 and 24.11), None when it prints none.
        A new value means slurmctld restarted (slurm_ft.failover.reconcile). One RPC."""
        return parse_boot_time(self.show_config().get("BOOT_TIME", ""))

    def private_data(self) -> set[str]:
        """Slurm's ``PrivateData`` flags, lower case (``{"jobs", "usage"}``; empty for ``none``)."""
        return private_data(self.show_config())

    def show_node(self, node: str) -> dict[str, str]:
        """``scontrol show node NODE -o`` as a dict (values are strings; ``Extra``/``Comment`` included)."""
        return parse_kv_line(self.run("scontrol", "show", "node", "-o", node).stdout)

    def job_gpus(self, job_id: int) -> dict[str, set[int]]:
        """GPU indices the job holds on each node: ``scontrol show job -d`` prints, per node group,
        ``Nodes=n[1-2] CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)``. Read from the job's anchored record's
        detail lines only (slurm_ft.slurm.jobinfo.gres_gpu_detail: no user-set value can add a GPU).
        {} when the job holds no GPU, is gone, or its record is ambiguous (then it owns none)."""
        from slurm_ft.slurm.jobinfo import gres_gpu_detail

        out = self.run("scontrol", "show", "job", "-d", str(job_id), check=False).stdout
        held: dict[str, set[int]] = {}
        for nodes, idx in (gres_gpu_detail(out, job_id) or {}).items():
            for node in split_nodes(nodes):
                held.setdefault(node, set()).update(split_indices(idx))
        return held

    # -- actions --------------------------------------------------------------------
    def update_job(self, job_id: int, **fields: str) -> None:
        """``scontrol update JobId=J Key=Value...`` (values are passed as separate argv items)."""
        self.run("scontrol", "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields.items()))

    def update_node(self, node: str, **fields: str) -> None:
        self.run("scontrol", "update", f"NodeName={node}", *(f"{k}={v}" for k, v in fields.items()))

    def requeue(self, job_id: int, hold: bool = False) -> None:
        self.run("scontrol", "requeuehold" if hold else "requeue", str(job_id))

    def release(self, job_id: int) -> None:
        self.run("scontrol", "release", str(job_id))

    def drain(self, node: str, reason: str) -> None:
        self.update_node(node, State="DRAIN", Reason=reason)

    def resume(self, node: str) -> None:
        self.update_node(node, State="RESUME")

    def wait_job(self, job_id: int, pred, timeout_s: float, interval_s: float = 0.1) -> "Job | None":
        """Poll until ``pred(job)`` is true; return the job, or None on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if job is not None and pred(job):
                return job
            if time.monotonic() >= deadline:
                return None
            time.sleep(interval_s)


def plugstack_lines(path: Path, include: Callable[[str], list[Path]] | None = None,
                    depth: int = 0) -> list[tuple[Path, str]]:
    """``[(file, line)]``: the non-comment lines of a ``plugstack.conf`` (spank(8)), ``include``
    lines among them, each followed by the lines of the files it includes (at most 4 levels
    deep). An unreadable file gives nothing. ``include(pattern) -> [Path]``: the files an
    ``include`` names; by default a glob on this host (``slurm-ft install --prefix`` resolves them
    under its prefix instead)."""
    import glob

    if include is None:
        def include(pattern: str) -> list[Path]:
            return [Path(p) for p in sorted(glob.glob(pattern))]
    if depth > 4:
        return []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    out: list[tuple[Path, str]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        out.append((Path(path), line))
        words = line.split()
        if words[0] == "include" and len(words) > 1:
            for inc in include(words[1]):
                out += plugstack_lines(inc, include, depth + 1)
    return out


def put_comment_record(slurm: Slurm, job_id: int, prefix: str, record: str) -> None:
    """The one writer of a job's comment records (the checkpoint ack, the in-place restarts): read
    the comment (:meth:`Slurm.job_comment`), replace the record that starts with ``prefix`` by
    ``record`` (:func:`slurm_ft.slurm.records.replace_comment_record`), write it back (``scontrol
    update JobId=J Comment=...``, as the job's own user may; held back like every write in observe
    mode). ``slurm``: a client. Raises SlurmCommandError."""
    slurm.update_job(job_id, Comment=replace_comment_record(slurm.job_comment(job_id), prefix, record))
