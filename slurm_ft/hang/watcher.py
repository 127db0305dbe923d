"""The hang watcher: one small root process per hang-watched job and node.

**Started** by the node prolog (``slurm_ft.node.prolog``) for a job whose SPANK environment asks for
hang detection (``SPANK_FT_HANG_TIMEOUT``, from ``sbatch --ft-hang-timeout``): the prolog makes
the job's heartbeat directory (:mod:`slurm_ft.hang.heartbeat`) and starts
``python -m slurm_ft.hang.watcher`` in a session of its own, detached from slurmd (no inherited
descriptors), so it survives slurmd restarting (``KillMode=process`` in Debian's slurmd unit) and
never holds up the prolog. The window itself comes from the job's admin_comment record, fixed at
submit (``hang_timeout``); the SPANK variable is only the job's hint that there is one.

**Looks** every ``[hang] poll_s`` (30 s; the lab 2 s): the job's heartbeats (progress = a
heartbeat file's sequence changed; a ``saving`` beat pauses the window up to ``[hang]
save_max_s``); for jobs with no heartbeat at all, the growth of their output file (a descriptor
opened as the job's user at start) and their GPUs' utilisation (NVML, at or above ``[hang]
busy_util_pct`` counts as busy). Each look costs about a millisecond of CPU.

**Window.** No verdict before ``grace_s`` (``[hang] grace_s``, 30 min: model loading, data
preparation) + the job's ``--ft-hang-timeout`` after the job started on the node; then a hang is
the window passing with no progress: ``now - max(last progress, start + grace_s) >= timeout``.
Detection latency: the timeout plus at most one ``poll_s``.

**On a hang** it records a verdict for this attempt on this node: ``hang`` (rule
``no-progress``), or ``hardware`` when this node's kernel log since the job started holds a
trusted hardware record for the job's GPUs (the hang's cause; then that node is blamed). The
evidence: the window and grace, the last heartbeat (step, age, pid) or the output's last growth,
GPU utilisation, and a ``py-spy dump`` of every local rank (run as the job's user; said so when
py-spy is missing). The verdict goes to the node journal and to the node's mailbox (the daemon's
usual path: ``policy.decide`` requeues a ``hang`` within the retry budget and the site's
unblamed retries, blaming no node). Then (``[hang] act``) it ends the job's processes on this
node (SIGTERM, then SIGKILL after ``[hang] kill_wait_s``): all of them, so the job ends and is
requeued; only the step's tasks when the in-place wrapper (``slurm-ft run``) marked the
directory, so the wrapper restarts the step in the same allocation (and the window starts over,
grace included). Last, the stack's top frames go to the controller's journal by a private
channel (:mod:`slurm_ft.hang.report`: the history service, root's MUNGE credential; never
Slurm's node field), best effort, in at most 10 s, for ``ft-history`` to show the job's owner.

**Ends** when the prolog's start marker is gone (the epilog removed it), or when Slurm says the
job no longer runs this attempt here (asked every ``[hang] slurm_check_s``), removing the
heartbeat directory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field

from slurm_ft.node.boundary import note, root_entry
from slurm_ft import pathtrust
from slurm_ft.errors import ConfigError, SlurmFTError
from slurm_ft.hang import heartbeat as hb

RULE = "no-progress"


# ------------------------------------------------------------------------------ the state machine
@dataclass
class Sample:
    """One look: the heartbeats by file name, the output file's size (None: not watched), GPU
    utilisation by index (percent)."""

    beats: dict[str, hb.Beat] = field(default_factory=dict)
    output_size: int | None = None
    util: dict[int, int] = field(default_factory=dict)


class Progress:
    """Whether the job progresses, from successive :class:`Sample` s. Pure (clock passed in):
    ``start`` (monotonic s) the job's start on the node, ``window_s`` the job's hang timeout,
    ``grace_s`` before the window opens, ``save_max_s`` the longest pause a ``saving`` beat buys
    (0: unbounded), ``busy_util_pct`` GPU utilisation that counts (0: never)."""

    def __init__(self, start: float, window_s: float, grace_s: float, save_max_s: float = 0.0,
                 busy_util_pct: int = 0):
        self.window_s, self.grace_s, self.save_max_s, self.busy = window_s, grace_s, save_max_s, busy_util_pct
        self.restart(start)

    def restart(self, start: float) -> None:
        """A fresh window (a new job start, or a step restarted in place: grace again)."""
        self.opens = start + self.grace_s
        self.last = start
        self.heartbeats = False
        self.seq: dict[str, int] = {}
        self.size: int | None = None
        self.saving = False
        self.latest: hb.Beat | None = None
        self.last_growth: float | None = None
        self.util: dict[int, int] = {}

    def observe(self, now: float, s: Sample) -> bool:
        """Take one look at time ``now``; returns whether it showed progress (or a save)."""
        progressed = saving = False
        if s.beats:
            self.heartbeats = True
        if self.heartbeats:
            for name, b in s.beats.items():
                if self.seq.get(name) != b.seq:
                    progressed = True
                if b.saving and (not self.save_max_s or now - b.since <= self.save_max_s):
                    saving = True
                if self.latest is None or b.mono > self.latest.mono:
                    self.latest = b
            self.seq = {n: b.seq for n, b in s.beats.items()}
        else:
            if s.output_size is not None and self.size is not None and s.output_size != self.size:
                progressed = True
                self.last_growth = now
            if s.output_size is not None:
                self.size = s.output_size
            if self.busy and any(u >= self.busy for u in s.util.values()):
                progressed = True
        self.util = dict(s.util)
        self.saving = saving
        if progressed or saving:
            self.last = now
        return progressed or saving

    def quiet_s(self, now: float) -> float:
        """Seconds without progress that count (never before the window opens)."""
        return max(0.0, now - max(self.last, self.opens))

    def hung(self, now: float) -> bool:
        return self.quiet_s(now) >= self.window_s


# ------------------------------------------------------------------------------ what is watched
@dataclass
class Watch:
    job_id: int
    attempt: int
    node: str
    uid: int
    gid: int
    gpus: tuple[int, ...] | None
    window_s: float
    started_mono: float
    stdout: str | None = None        # the job's output path (expanded), None: not watched
    conf: str | None = None          # SLURM_CONF of the stepds that are this cluster's (the lab)


def window_of(slurm, job_id: int) -> tuple[float | None, int | None, int | None, str]:
    """(hang timeout s or None, uid, gid, why) from the job's admin_comment record (fixed at
    submit, docs/ft-token.md); None when the job has none or Slurm cannot tell."""
    from slurm_ft.failover.jobspec import from_admin_comment
    try:
        job = slurm.job(job_id)
    except SlurmFTError as exc:
        return None, None, None, f"job {job_id} unknown to Slurm ({exc})"
    if job is None:
        return None, None, None, f"job {job_id} unknown to Slurm"
    try:
        opts = from_admin_comment(job.admin_comment)
    except ConfigError as exc:
        return None, None, None, f"bad admin_comment record: {exc}"
    uid, gid = job.raw.get("user_id"), job.raw.get("group_id")
    if opts is None or not opts.hang_timeout_s:
        return None, uid, gid, "no --ft-hang-timeout in the job's submit-time record"
    return float(opts.hang_timeout_s), uid, gid, ""


def _marker(cfg, w: Watch) -> str:
    return os.path.join(cfg.node_state.dir, f"{w.job_id}.{w.node}.json")


def pid_file(cfg, job_id: int, node: str) -> str:
    """Where a watcher notes its pid (root-only ``[node_state] dir``): ``hang-<job>.<node>.pid``."""
    return os.path.join(cfg.node_state.dir, f"hang-{job_id}.{node}.pid")


# ------------------------------------------------------------------------------ the loop
class Watcher:
    def __init__(self, cfg, w: Watch, slurm, log, *, clock=time.monotonic, sleep=time.sleep):
        self.cfg, self.w, self.slurm, self.log, self.clock, self.sleep = cfg, w, slurm, log, clock, sleep
        self.progress = Progress(w.started_mono, w.window_s, cfg.hang.grace_s, cfg.hang.save_max_s,
                                 cfg.hang.busy_util_pct)
        self.dir = hb.job_dir(cfg.heartbeat_root(w.node), w.job_id)
        self.dir_fd: int | None = None
        self.out_fd: int | None = None
        self.ended = False
        self.verdicts: list = []
        self.looks = 0
        self._output_tries = 0
        self.dumps: list[tuple[int, str, str]] = []     # (pid, name, py-spy dump) of the last hang
        self.beat_at: float | None = None                # its last heartbeat (epoch s)

    def open(self) -> None:
        try:
            self.dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            self.log(f"heartbeat directory {self.dir} not usable ({exc.strerror}): watching output/GPUs only")
        self._open_output()

    #: Looks during which a missing output file is tried again (Slurm creates it when the batch
    #: step starts, a moment after the prolog started the watcher).
    OUTPUT_TRIES = 30

    def _open_output(self) -> None:
        if not self.w.stdout or self.out_fd is not None or self._output_tries >= self.OUTPUT_TRIES:
            return
        from slurm_ft.hang.evidence import open_as_user
        self._output_tries += 1
        self.out_fd = open_as_user(self.w.stdout, self.w.uid, self.w.gid)

    def sample(self) -> Sample:
        from slurm_ft.hang.evidence import gpu_utilisation
        self._open_output()
        beats = {}
        if self.dir_fd is not None:
            try:
                beats = hb.read_dir(self.dir_fd, self.w.uid)
            except OSError:
                beats = {}
        size = None
        if self.out_fd is not None:
            try:
                size = os.fstat(self.out_fd).st_size
            except OSError:
                size = None
        util = {} if beats or self.progress.heartbeats else gpu_utilisation(self.cfg, self.w.node, self.w.gpus)
        return Sample(beats, size, util)

    def still_here(self, check_slurm: bool) -> bool:
        if not os.path.exists(_marker(self.cfg, self.w)):
            return False
        if not check_slurm:
            return True
        try:
            job = self.slurm.job(self.w.job_id)
        except SlurmFTError:
            return True         # Slurm busy or restarting: keep watching
        if job is None:
            return False
        from slurm_ft.slurm import split_nodes
        try:
            nodes = split_nodes(job.nodes)
        except SlurmFTError:
            nodes = [self.w.node]
        return job.state in ("RUNNING", "COMPLETING") and job.restart_count == self.w.attempt and self.w.node in nodes

    def run(self) -> str:
        """Watch until the job leaves the node; returns why it stopped."""
        self.open()
        next_check = self.clock() + self.cfg.hang.slurm_check_s
        while True:
            self.sleep(self.cfg.hang.poll_s)
            now = self.clock()
            check = now >= next_check
            if check:
                next_check = now + self.cfg.hang.slurm_check_s
            if not self.still_here(check):
                return "the job left the node"
            if self.ended:
                continue
            self.looks += 1
            self.progress.observe(now, self.sample())
            if self.progress.hung(now):
                self.on_hang(now)

    # ---------------------------------------------------------------------------- a hang
    def evidence(self, now: float, procs) -> list[str]:
        """The verdict's evidence lines (node journal); also keeps ``self.dumps`` ((pid, name,
        dump) per process) and ``self.beat_at`` (the last heartbeat, epoch s) for the owner's
        block and the mailbox summary."""
        from slurm_ft.failover.marker import utc
        from slurm_ft.hang.evidence import MAX_DUMPS, find_py_spy, stack_dump
        p, w = self.progress, self.w
        lines = [f"hang watcher on {w.node}: no progress for {p.quiet_s(now):.0f} s (window {w.window_s:.0f} s, "
                 f"after a grace of {self.cfg.hang.grace_s:.0f} s; looked every {self.cfg.hang.poll_s:g} s)"]
        self.dumps, self.beat_at = [], None
        if p.latest is not None:
            b = p.latest
            self.beat_at = time.time() - max(0.0, now - b.mono)      # the watcher's clocks, not the job's wall
            lines.append(f"last heartbeat: step {b.step}, {now - b.mono:.0f} s ago, pid {b.pid}, at {utc(self.beat_at)}"
                         + (f", saving for {now - b.since:.0f} s" if b.saving else ""))
        else:
            grew = f"last grew {now - p.last_growth:.0f} s ago" if p.last_growth else "did not grow while watched"
            lines.append(f"no heartbeat (the job does not use slurm_ft.checkpoint); output "
                         f"{'not watched' if self.out_fd is None else grew}")
        util = p.util or self._util()
        lines.append("GPU utilisation: " + (", ".join(f"GPU{g} {u}%" for g, u in sorted(util.items()))
                                            or "not available"))
        beat_pids = {b.pid for b in (p.latest and [p.latest] or [])}
        if self.dir_fd is not None:
            try:
                beat_pids |= {b.pid for b in hb.read_dir(self.dir_fd, w.uid).values()}
            except OSError:
                pass
        from slurm_ft.hang.procs import roots
        mine = {q.pid: q for q in procs}
        ranks = [mine[pid] for pid in sorted(beat_pids) if pid in mine] or \
            [q for q in roots(procs) if q.comm.startswith("python")] or roots(procs)
        py_spy = find_py_spy(self.cfg.hang.py_spy)
        if not ranks:
            lines.append("no process of the job found on this node")
        for q in ranks[:MAX_DUMPS]:
            dump = stack_dump(py_spy, q.pid, w.uid, w.gid, self.cfg.hang.dump_timeout_s)
            self.dumps.append((q.pid, q.comm, dump))
            lines.append(f"stack of pid {q.pid} ({q.comm}, step {q.step}):\n{dump}")
            if py_spy is None:
                break
        return lines

    def _util(self) -> dict[int, int]:
        from slurm_ft.hang.evidence import gpu_utilisation
        return gpu_utilisation(self.cfg, self.w.node, self.w.gpus)

    def on_hang(self, now: float) -> None:
        from slurm_ft.hang.procs import pin, scan
        w = self.w
        procs = scan(w.job_id, conf=w.conf, node=w.node, uid=w.uid)
        # pinned now: the evidence below (stack dumps, Slurm, the journal) can take minutes, and
        # a pid of this scan may by then belong to another process (slurm_ft.hang.procs, "Pinning")
        pinned = {q.pid: q for q in pin(procs)} if self.cfg.hang.act else {}
        try:
            self._on_hang(now, procs, pinned)
        finally:
            for q in pinned.values():
                q.close()

    def _on_hang(self, now: float, procs, pinned) -> None:
        import dataclasses

        from slurm_ft.failover import mailbox
        from slurm_ft.failover.marker import HANG_ACTIONS, hang_summary, top_frames
        from slurm_ft.failover.verdict import NodeVerdict
        from slurm_ft.journal import open_node_journal
        from slurm_ft.hang.evidence import kernel_verdict
        from slurm_ft.hang.procs import tasks
        w = self.w
        inplace = self.dir_fd is not None and hb.inplace_marked(self.dir_fd, w.uid)
        lines = self.evidence(now, procs)
        kv = kernel_verdict(self.cfg, w.node, w.gpus, w.started_mono - 1.0)
        if kv is not None and kv.verdict == "hardware" and kv.action == "drain_node":
            v = NodeVerdict.from_classified(kv, job_id=w.job_id, attempt=w.attempt, node=w.node, exit_code=None,
                                            time=time.time(), source="watcher")
            v = NodeVerdict(v.job_id, v.attempt, v.verdict, v.rule, v.xids, None, v.time, w.node,
                            (*lines[:1], *kv.evidence, *lines[1:]), v.action, "watcher")
        else:
            v = NodeVerdict(w.job_id, w.attempt, "hang", RULE, (), None, time.time(), w.node, tuple(lines), "retry",
                            "watcher")
        p, beat = self.progress, self.progress.latest
        step = beat.step if beat is not None else None
        v = dataclasses.replace(v, summary=hang_summary(
            w.node, p.quiet_s(now), w.window_s, self.beat_at, step, len(self.dumps),
            sum(len(top_frames(d)) for _, _, d in self.dumps)))
        self.verdicts.append(v)
        self.log(f"verdict {v.verdict} ({v.rule}): {lines[0]}")
        try:
            with open_node_journal(self.cfg, w.node, spool=True, busy_timeout_s=1.0) as j:
                j.add_node_verdict(v)
        except SlurmFTError as exc:
            self.log(f"verdict not journaled ({exc})")
        try:
            if not mailbox.post_verdict(self.cfg, self.slurm, v):
                self.log("verdict not posted (Slurm refused); kept in this node's outbox")
        except SlurmFTError as exc:
            self.log(f"verdict not posted: {exc}")
        if not self.cfg.hang.act:
            self.tell_owner(now, HANG_ACTIONS["observe"])
            self.log("[hang] act = false: the job is left running")
            self.ended = True
            self.send_report(step)
            return
        self.tell_owner(now, HANG_ACTIONS["inplace" if inplace else "requeue"])
        targets = [pinned[q.pid] for q in (tasks(procs) if inplace else procs) if q.pid in pinned]
        self.log(f"ending {'the step tasks' if inplace else 'the job processes'} on {w.node}: "
                 f"{', '.join(str(q.pid) for q in targets) or 'none found'}")
        # the processes' end ends the job, whose epilog SIGTERMs a watcher still here (its backstop,
        # epilog_cleanup), possibly before the report below: held back until the report is sent
        with sigterm_held():
            end_processes(targets, self.cfg.hang.kill_wait_s, self.sleep)
            if inplace and targets:
                self.progress.restart(self.clock())      # the wrapper restarts the step: grace again
            else:
                self.ended = True
            self.send_report(step)      # after the processes are ended: the job's end never waits for it

    #: ``encode`` for :func:`slurm_ft.hang.report.send` (tests; None: MUNGE, for root alone).
    report_encode = None

    def send_report(self, step: int | None) -> None:
        """The stack frames to the controller's journal by the private channel
        (:mod:`slurm_ft.hang.report`: never Slurm's node field), best effort, at most
        :data:`slurm_ft.hang.report.SEND_S` seconds; the outcome goes to the node log only."""
        from slurm_ft.hang import report
        # the job's end runs the epilog, whose backstop SIGTERMs a watcher still here
        # (epilog_cleanup): the send (bounded) finishes first, then a pending SIGTERM ends us
        # (seen on a loaded lab: the report was lost mid-send, nothing logged)
        with sigterm_held():
            try:
                payload = report.encode_report(self.w.job_id, self.w.attempt, self.w.node, self.dumps, self.beat_at,
                                               step)
                if payload is None:
                    self.log("hang report not sent: no stack frame to send")
                    return
                report.send(self.cfg, self.slurm, payload, self.log, encode=self.report_encode)
            except Exception as exc:          # best effort: never keeps the watcher from going on
                self.log(f"hang report not sent: {type(exc).__name__}: {exc}")

    def tell_owner(self, now: float, action: str) -> None:
        """Append the hang block (:func:`slurm_ft.failover.marker.hang_block`: ``slurm-ft: hang
        on n1: ...``, the last heartbeat's time, the top frames of each dumped process) to the
        job's output, as the job's user (:func:`slurm_ft.node.userfile.append_line`: no symlink
        followed, only the user's own regular file, 2 s at most). A refusal is logged; the job's
        end does not wait for it."""
        try:
            self._tell_owner(now, action)
        except Exception as exc:          # best effort: never keeps the hung job from being ended
            self.log(f"hang block not written: {type(exc).__name__}: {exc}")

    def _tell_owner(self, now: float, action: str) -> None:
        from slurm_ft.failover.marker import hang_block
        from slurm_ft.failover.owner import job_outputs
        from slurm_ft.node.userfile import UserFileError, append_line
        w, beat = self.w, self.progress.latest
        # the prolog knows the output path only where slurmd tells it; else Slurm's expanded StdOut/StdErr
        paths = [w.stdout] if w.stdout else job_outputs(self.slurm, w.job_id)[2]
        if not paths:
            self.log("hang block not written: the job's output path is not known")
            return
        block = hang_block(w.node, self.progress.quiet_s(now), w.window_s, self.beat_at,
                           beat.step if beat is not None else None, self.dumps, action)
        for path in paths:
            try:
                append_line(path, w.uid, w.gid, block.encode("ascii", "replace"))
            except UserFileError as exc:
                self.log(f"hang block not written to the job's output: {exc}")

    def close(self) -> None:
        for fd in (self.dir_fd, self.out_fd):
            if fd is not None:
                os.close(fd)
        self.dir_fd = self.out_fd = None
        remove_dir(self.dir)


def end_processes(targets, wait_s: float, sleep=time.sleep) -> None:
    """SIGTERM ``targets`` (:class:`slurm_ft.hang.procs.Pinned`, pinned at the scan), then
    SIGKILL those still alive after ``wait_s``; a process that exited is never signalled again,
    and a pid reused by another process is never signalled at all."""
    from slurm_ft.hang.procs import end_pinned
    end_pinned(list(targets), wait_s, sleep)


# ------------------------------------------------------------------------------ the prolog's part
def secure_root(path: str) -> None:
    """Create ``path`` (0755) if missing and check it: a real directory owned by root, not
    writable by group or others unless sticky, and so is every directory above it (else a user
    could swap it): :data:`slurm_ft.pathtrust.ROOT_DIR` along the whole chain. Raises
    :class:`ConfigError`, or the OSError of a name that cannot be looked at."""
    os.makedirs(path, mode=0o755, exist_ok=True)
    found = pathtrust.check_chain(os.path.abspath(path), pathtrust.ROOT_DIR)
    if found is None:
        return
    if found.exc is not None:
        raise found.exc
    if found.why in (pathtrust.SYMLINK, pathtrust.KIND):
        raise ConfigError(f"{found.path}: not a plain directory; refusing to keep heartbeats under it")
    raise ConfigError(f"{found.path}: must be root's and not writable by others ([hang] heartbeat_dir)")


def make_job_dir(root: str, job_id: int, uid: int, gid: int) -> str:
    """The job's heartbeat directory, fresh (an earlier attempt's is removed): created by root in
    the root-owned ``root``, then given to the job's user (0700) through its descriptor."""
    secure_root(root)
    path = hb.job_dir(root, job_id)
    remove_dir(path)
    os.mkdir(path, 0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def remove_dir(path: str) -> None:
    """Remove a job's heartbeat directory (shutil.rmtree works through descriptors and never
    follows a link the job planted)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def sigterm_held():
    """SIGTERM held pending (blocked) in this thread for the block, delivered when it ends
    (nested blocks keep it held until the outermost ends)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def epilog_cleanup(cfg, job_id: int, node: str) -> bool:
    """The epilog's backstop for a watcher that did not end with its job (killed, or slurmd
    restarted under it): remove the job's heartbeat directory and SIGTERM the watcher named in
    its root-only pid file, only while ``/proc/<pid>/cmdline`` is still that job's watcher (a
    recycled pid is left alone). Returns whether a watcher was signalled; never raises."""
    remove_dir(hb.job_dir(cfg.heartbeat_root(node), job_id))
    pidf = pid_file(cfg, job_id, node)
    try:
        fd = os.open(pidf, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as fh:
            pid = int(fh.read(32).strip() or 0)
        os.unlink(pidf)
    except (OSError, ValueError):
        return False
    try:          # pin the pid first, then check what it is: the check then holds for the signal
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read(4096).split(b"\0")
        if b"slurm_ft.hang.watcher" not in argv or bytes(str(job_id), "ascii") not in argv:
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
    except OSError:
        return False
    finally:
        os.close(pidfd)
    return True


def wanted(env: dict) -> bool:
    """The job's hint that it asked for hang detection (``SPANK_FT_HANG_TIMEOUT``, user-set:
    the window itself is read from the submit-time record)."""
    value = env.get("SPANK_FT_HANG_TIMEOUT", "")
    return value.isdigit() and int(value) > 0


def start(cfg, job, env: dict, log) -> int | None:
    """From the prolog: make the job's heartbeat directory and start the watcher detached.
    Returns the watcher's pid, or None when the job asked for nothing. Raises ``OSError`` /
    :class:`ConfigError` (the prolog logs them; a job is never refused for it)."""
    if not wanted(env) or job.uid is None:
        return None
    import pwd
    try:
        gid = pwd.getpwuid(job.uid).pw_gid
    except KeyError:
        gid = job.uid
    make_job_dir(cfg.heartbeat_root(job.node), job.job_id, job.uid, gid)
    argv = [sys.executable, "-I", "-m", "slurm_ft.hang.watcher", "--job", str(job.job_id), "--node", job.node,
            "--attempt", str(job.attempt), "--started-mono", f"{time.monotonic():.3f}"]
    if job.gpus is not None:
        argv += ["--gpus", ",".join(map(str, job.gpus))]
    if cfg.source:
        argv += ["--config", cfg.source]
    from slurm_ft.node.output_pattern import expand_output_pattern
    out = expand_output_pattern(job.stdout, job) if job.stdout else None
    if out:
        argv += ["--stdout", out]
    child_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    for key in ("SLURM_CONF", "SLURM_FT_CONFIG"):
        if env.get(key):
            child_env[key] = env[key]
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True, start_new_session=True, env=child_env, cwd="/")
    log(f"hang watcher started (pid {p.pid})")
    return p.pid


# ------------------------------------------------------------------------------ entry point
@root_entry("hang-watcher")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slurm_ft.hang.watcher", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", type=int, required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--attempt", type=int, default=0)
    ap.add_argument("--gpus", default="")
    ap.add_argument("--stdout", default=None)
    ap.add_argument("--started-mono", type=float, default=None)
    ap.add_argument("--config", default=None)
    a = ap.parse_args(argv)
    from slurm_ft import config as config_mod
    from slurm_ft.node.job import NodeJob
    from slurm_ft.node.log import NodeLog
    from slurm_ft.slurm import Slurm
    cfg = config_mod.load(a.config)
    job = NodeJob(a.job, a.node, a.attempt, None, None, None, None, None, None, None)
    log = NodeLog("hang-watch", job, cfg.node_state.log)
    note(cfg=cfg, node=a.node, log=log)
    slurm = Slurm.from_config(cfg)
    for _ in range(10):        # the job record may lag the prolog by a moment
        window, uid, gid, why = window_of(slurm, a.job)
        if window is not None or uid is not None:
            break
        time.sleep(1.0)
    if window is None or uid is None:
        log(f"not watching: {why}")
        remove_dir(hb.job_dir(cfg.heartbeat_root(a.node), a.job))
        return 0
    gpus = tuple(int(g) for g in a.gpus.split(",") if g.strip().isdigit()) if a.gpus else None
    w = Watch(a.job, a.attempt, a.node, uid, gid if gid is not None else uid, gpus, window,
              a.started_mono if a.started_mono is not None else time.monotonic(), a.stdout,
              os.environ.get("SLURM_CONF"))
    pidf = pid_file(cfg, a.job, a.node)
    try:
        fd = os.open(pidf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{os.getpid()}\n")
    except OSError:
        pidf = ""
    watcher = Watcher(cfg, w, slurm, log)
    log(f"watching: window {window:.0f} s after a grace of {cfg.hang.grace_s:.0f} s, a look every "
        f"{cfg.hang.poll_s:g} s")
    try:
        why = watcher.run()
    finally:
        watcher.close()
        if pidf:
            try:
                os.unlink(pidf)
            except OSError:
                pass
    log(f"stopped: {why} ({watcher.looks} looks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
