"""Run bisect tests as Slurm jobs, and record and act on what they find.

Each test is one ``srun`` (its own allocation) on exactly its nodes, one task per node by default,
whole nodes with all their GPUs; the tests of a round run at the same time. Runs as the user who
starts ``slurm-ft bisect`` (an admin: root, to drain) with a fixed ``PATH`` and argv lists
(``slurm_ft.slurm``). The test is the admin's own command or the shipped one
(``python -I -m slurm_ft.bisect.collective``: health checks plus a collective): never a job's code.
Every test runs in ``/`` (``--chdir=/``) with only ``PATH``, ``LC_ALL`` and ``SLURM_CONF`` (plus
Slurm's own ``SLURM_*``) in its environment.

The shipped test's ranks meet over TCP (slurm_ft/bisect/meeting.py); :class:`Tickets` draws the
bisect's secret and hands it to each test's ranks on stdin through a root-only file
(``srun --input=FILE``, read by srun here and copied to every task): never argv or the
environment. A test whose meeting failed (a ``collective: NOT RUN`` line) is a test that did not
run: no verdict on its nodes, the bisect stops and drains nobody.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shlex
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from slurm_ft.errors import SlurmCommandError, SlurmFTError
from slurm_ft.slurm import compress_nodes
from slurm_ft.bisect.collective import NOT_RUN
from slurm_ft.bisect.meeting import Ticket
from slurm_ft.bisect.search import Outcome, Result, Round, Test

#: The shipped test: every node's health checks, then an all-reduce across the nodes' GPUs.
DEFAULT_TEST = "health+collective"
#: Bytes of a test's output kept for the record (its tail).
OUTPUT_TAIL = 2000
#: Seconds srun may wait for its allocation beyond the test's own time limit.
ALLOC_WAIT_S = 120.0
_JOBID = re.compile(r"srun: jobid (\d+)")
#: The environment a test gets: these of srun's own (``slurm_ft.slurm.Slurm`` sets them), nothing else.
TEST_ENV = "PATH,LC_ALL,SLURM_CONF"


class BisectError(SlurmFTError):
    """A bisect cannot start (unusable nodes, no test) or cannot go on."""


@dataclass
class Spec:
    """How to run one test. ``argv``: the program each task runs (None: the shipped test);
    ``name``: what drain reasons and the journal call the test."""

    argv: list[str] | None
    name: str
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    timeout_s: float = 600.0
    partition: str = ""

    @classmethod
    def from_cli(cls, test: str | None, **kw) -> "Spec":
        if not test:
            return cls(None, DEFAULT_TEST, **kw)
        try:
            argv = shlex.split(test)
        except ValueError as exc:
            raise BisectError(f"--test {test!r}: {exc}") from None
        if not argv:
            raise BisectError("--test: empty command")
        return cls(argv, test, **kw)

    def program(self) -> list[str]:
        """The argv each task runs: the admin's, or the shipped test under ``python -I`` (no
        ``PYTHON*`` variable, no user site, not the working directory on ``sys.path``)."""
        return self.argv if self.argv else [sys.executable, "-I", "-m", "slurm_ft.bisect.collective"]

    def srun_args(self, nodes: tuple[str, ...], label: str, ticket: str | None = None) -> list[str]:
        """srun's arguments for one test on ``nodes``; ``ticket``: the root-only file srun copies to
        every task's stdin (the shipped test's meeting ticket)."""
        minutes = max(1, math.ceil(self.timeout_s / 60))
        args = ["--verbose", f"--job-name=slurm-ft-bisect-{label}", f"--nodelist={compress_nodes(nodes)}",
                f"--nodes={len(nodes)}", f"--ntasks-per-node={self.tasks_per_node}", "--exclusive",
                f"--time={minutes}", "--kill-on-bad-exit=1", "--chdir=/", f"--export={TEST_ENV}"]
        if ticket is not None:
            args.append(f"--input={ticket}")
        if self.gpus_per_node:
            args.append(f"--gres=gpu:{self.gpus_per_node}")
        if self.partition:
            args.append(f"--partition={self.partition}")
        return [*args, "--", *self.program()]


def check_nodes(slurm, nodes: list[str]) -> dict[str, int]:
    """Every node must exist and be usable (not drained, down or failing); returns each node's GPU
    count (its ``gres`` ``gpu:N``). Raises :class:`BisectError` naming the unusable nodes."""
    known = {n.name: n for n in slurm.nodes()}
    missing = [n for n in nodes if n not in known]
    if missing:
        raise BisectError(f"no such node: {', '.join(missing)}")
    bad = []
    gpus: dict[str, int] = {}
    for name in nodes:
        node = known[name]
        states = [node.state.lower(), *(f.lower() for f in node.flags)]
        if node.drained or any(s.startswith(("down", "fail", "not_responding", "no_respond")) for s in states):
            bad.append(f"{name} ({'+'.join([node.state, *node.flags])}: {node.reason or 'no reason'})")
        m = re.search(r"gpu(?::[^:,(]+)?:(\d+)", str(node.raw.get("gres") or ""))
        gpus[name] = int(m.group(1)) if m else 0
    if bad:
        raise BisectError(f"nodes not usable for a test: {'; '.join(bad)} (resume them first, or leave them out)")
    return gpus


class Tickets:
    """One bisect's meeting secret (32 random bytes) and id, and the files that hand them to each
    test's ranks: one per test, mode 0600 in a fresh 0700 directory (``tempfile.mkdtemp``), removed
    when the bisect ends. Use as a context manager."""

    def __init__(self) -> None:
        self.key = secrets.token_bytes(32)
        self.bisect = secrets.token_hex(8)
        self.dir: str | None = None

    def __enter__(self) -> "Tickets":
        try:
            self.dir = tempfile.mkdtemp(prefix="slurm-ft-bisect-")
        except OSError as exc:
            raise BisectError(f"cannot make a directory for the meeting tickets: {exc}") from None
        return self

    def __exit__(self, *exc) -> None:
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def write(self, number: int, index: int, test: Test, tasks_per_node: int) -> str:
        """The ticket of test ``index`` (1-based) of round ``number``: its path. Raises ``OSError``."""
        ticket = Ticket(self.key, self.bisect, number, index, tuple(test.nodes), tasks_per_node)
        path = os.path.join(self.dir, f"r{number}-{index}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(ticket.line())
        return path


def run_test(slurm, spec: Spec, test: Test, label: str, ticket: str | None = None) -> Outcome:
    """One test as one ``srun``; passed when srun exits 0. Never raises for the test's failure: a
    refused allocation or a timeout is a failed test with the reason as detail. The shipped test
    reporting ``collective: NOT RUN`` (its meeting failed) is a test that did not run (``ran``
    False): no verdict on its nodes, whatever srun's exit status."""
    try:
        proc = slurm.run("srun", *spec.srun_args(test.nodes, label, ticket), check=False,
                         timeout_s=spec.timeout_s + ALLOC_WAIT_S)
    except SlurmCommandError as exc:
        return Outcome(False, None, None, f"srun: {exc}", ran=False)
    m = _JOBID.search(proc.stderr or "")
    out = proc.stdout or ""
    if spec.argv is None:
        not_run = [ln.strip() for ln in out.splitlines() if ln.startswith(NOT_RUN)]
        if not_run:
            return Outcome(False, int(m.group(1)) if m else None, proc.returncode, not_run[0][-300:], ran=False)
    # no job id: srun refused before any allocation (usage, partition, node state), not a result
    return Outcome(proc.returncode == 0, int(m.group(1)) if m else None, proc.returncode,
                   _detail(out, proc.stderr or ""), ran=m is not None)


def _detail(stdout: str, stderr: str) -> str:
    """The line that says most about a test: the last output line naming a failure, else the
    last output line, else srun's last error (cut to 300 characters)."""
    out = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    errs = [ln.strip() for ln in stderr.splitlines() if ln.strip() and (not ln.startswith("srun: ")
                                                                        or "error" in ln)]
    pick = next((ln for ln in reversed(out) if "FAIL" in ln), None) or (out[-1] if out else None) \
        or (errs[-1] if errs else "")
    return pick[-300:]


def run_round(slurm, spec: Spec, session: str, number: int, tests: list[Test], log=print,
              tickets: Tickets | None = None) -> list[Outcome]:
    """The tests of one round, each in a thread (each is one blocking srun); outcomes in order.
    ``tickets``: the bisect's (the shipped test needs one; None: a secret of this round's own).
    Raises :class:`BisectError` when a test did not run (no verdict on anyone)."""
    if tickets is None and spec.argv is None:
        with Tickets() as own:
            return run_round(slurm, spec, session, number, tests, log, own)
    outcomes: list[Outcome | None] = [None] * len(tests)
    try:
        paths = [tickets.write(number, i + 1, t, spec.tasks_per_node) if spec.argv is None else None
                 for i, t in enumerate(tests)]
    except OSError as exc:
        raise BisectError(f"round {number}: cannot write the meeting ticket: {exc}") from None

    def one(i: int) -> None:
        outcomes[i] = run_test(slurm, spec, tests[i], f"{session}-r{number}-{i + 1}", paths[i])

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(tests))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [o if o is not None else Outcome(False, detail="test thread died", ran=False) for o in outcomes]
    log(format_round(Round(number, tests, done), time.monotonic() - t0))
    for t, o in zip(tests, done):
        if not o.ran:
            # a test that never ran says nothing about its nodes: stop rather than blame them
            raise BisectError(f"round {number}: the test could not run on {compress_nodes(t.nodes)}: {o.detail}")
    return done


def format_round(r: Round, took_s: float | None = None) -> str:
    """``round 2 (31.2 s): n[1-2] PASS (job 7) | n[3-4] FAIL (job 8, exit 1: ...) | ...``"""
    parts = []
    for t, o in zip(r.tests, r.outcomes):
        where = compress_nodes(t.nodes)
        if t.suspects != t.nodes:
            where = f"{compress_nodes(t.suspects)}+{compress_nodes([n for n in t.nodes if n not in t.suspects])}"
        job = f"job {o.job_id}" if o.job_id else "no job"
        detail = f": {o.detail}" if o.detail else ""
        parts.append(f"{where} PASS ({job})" if o.passed else f"{where} FAIL ({job}, exit {o.exit_code}{detail})"
                     if o.ran else f"{where} NOT RUN ({job}{detail})")
    took = f" ({took_s:.1f} s)" if took_s is not None else ""
    return f"round {r.number}{took}: " + " | ".join(parts)


def summary(result: Result) -> str:
    if not result.reproduced:
        return f"the test passed on all {len(result.good)} nodes: nothing to find"
    parts = []
    if result.culprits:
        parts.append(f"culprit{'s' if len(result.culprits) > 1 else ''}: {', '.join(result.culprits)}")
    for combo in result.combinations:
        parts.append(f"fails only together: {compress_nodes(combo)} (no single node; not drained)")
    if result.stopped:
        parts.append(result.stopped)
    if not parts:
        parts.append("no culprit found")
    return f"{'; '.join(parts)} ({len(result.rounds)} rounds)"


def round_record(r: Round) -> dict:
    """One round as the journal keeps it (``bisect-round`` action detail, JSON)."""
    return {"round": r.number, "tests": [
        {"nodes": compress_nodes(t.nodes), "suspects": compress_nodes(t.suspects), "passed": o.passed,
         "job": o.job_id, "exit": o.exit_code, "detail": o.detail} for t, o in zip(r.tests, r.outcomes)]}


def journal_rounds(journal, job_id: int, attempt: int, spec: Spec, result: Result) -> None:
    """Every round, then the result, into the daemon journal under ``job_id`` (the job whose
    failure started the bisect, or the first test job's id for a bisect an admin started)."""
    for r in result.rounds:
        journal.record(job_id, attempt, "bisect-round", ",".join(compress_nodes(t.nodes) for t in r.tests),
                       json.dumps(round_record(r)))
    journal.record(job_id, attempt, "bisect", ",".join(result.culprits),
                   json.dumps({"test": spec.name, "summary": summary(result), "culprits": result.culprits,
                               "combinations": result.combinations, "rounds": len(result.rounds)}))


def drain_reason(spec: Spec, culprit: str, result: Result) -> str:
    """The drain reason of a bisect's culprit (slurm_ft.drain.reason.bisect_reason), with the last
    round whose failing test held it."""
    from slurm_ft.drain.reason import bisect_reason
    last = next((r.number for r in reversed(result.rounds)
                 for t, o in zip(r.tests, r.outcomes) if culprit in t.suspects and not o.passed), len(result.rounds))
    return bisect_reason(spec.name, culprit, last, len(result.rounds))
