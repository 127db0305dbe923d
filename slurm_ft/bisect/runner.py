"""Run bisect tests as Slurm jobs, and record and act on what they find.

Each test is one ``srun`` (its own allocation) on exactly its nodes, one task per node by default,
whole nodes with all their GPUs; the tests of a round run at the same time. Runs as the user who
starts ``slurm-ft bisect`` (an admin: root, to drain) with a fixed ``PATH`` and argv lists
(``slurm_ft.slurm``). The test is the admin's own command or the shipped one
(``python -m slurm_ft.bisect.collective``: health checks plus a collective): never a job's code.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
import threading
import time
from dataclasses import dataclass

from ..errors import SlurmCommandError, SlurmFTError
from ..slurm import compress_nodes
from .search import Outcome, Result, Round, Test

#: The shipped test: every node's health checks, then an all-reduce across the nodes' GPUs.
DEFAULT_TEST = "health+collective"
#: Bytes of a test's output kept for the record (its tail).
OUTPUT_TAIL = 2000
#: Seconds srun may wait for its allocation beyond the test's own time limit.
ALLOC_WAIT_S = 120.0
_JOBID = re.compile(r"srun: jobid (\d+)")


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
        return self.argv if self.argv else [sys.executable, "-m", "slurm_ft.bisect.collective"]

    def srun_args(self, nodes: tuple[str, ...], label: str) -> list[str]:
        minutes = max(1, math.ceil(self.timeout_s / 60))
        args = ["--verbose", f"--job-name=slurm-ft-bisect-{label}", f"--nodelist={compress_nodes(nodes)}",
                f"--nodes={len(nodes)}", f"--ntasks-per-node={self.tasks_per_node}", "--exclusive",
                f"--time={minutes}", "--kill-on-bad-exit=1"]
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


def run_test(slurm, spec: Spec, test: Test, label: str) -> Outcome:
    """One test as one ``srun``; passed when srun exits 0. Never raises for the test's failure: a
    refused allocation or a timeout is a failed test with the reason as detail."""
    try:
        proc = slurm.run("srun", *spec.srun_args(test.nodes, label), check=False,
                         timeout_s=spec.timeout_s + ALLOC_WAIT_S)
    except SlurmCommandError as exc:
        return Outcome(False, None, None, f"srun: {exc}", ran=False)
    m = _JOBID.search(proc.stderr or "")
    # no job id: srun refused before any allocation (usage, partition, node state), not a result
    return Outcome(proc.returncode == 0, int(m.group(1)) if m else None, proc.returncode,
                   _detail(proc.stdout or "", proc.stderr or ""), ran=m is not None)


def _detail(stdout: str, stderr: str) -> str:
    """The line that says most about a test: the last output line naming a failure, else the
    last output line, else srun's last error (cut to 300 characters)."""
    out = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    errs = [ln.strip() for ln in stderr.splitlines() if ln.strip() and (not ln.startswith("srun: ")
                                                                        or "error" in ln)]
    pick = next((ln for ln in reversed(out) if "FAIL" in ln), None) or (out[-1] if out else None) \
        or (errs[-1] if errs else "")
    return pick[-300:]


def run_round(slurm, spec: Spec, session: str, number: int, tests: list[Test], log=print) -> list[Outcome]:
    """The tests of one round, each in a thread (each is one blocking srun); outcomes in order."""
    outcomes: list[Outcome | None] = [None] * len(tests)

    def one(i: int) -> None:
        outcomes[i] = run_test(slurm, spec, tests[i], f"{session}-r{number}-{i + 1}")

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
        parts.append(f"{where} PASS ({job})" if o.passed else
                     f"{where} FAIL ({job}, exit {o.exit_code}{': ' + o.detail if o.detail else ''})")
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
    """``slurm-ft: bisect: <test> fails with n5 (round 3 of 3)``: names the test, as an admin must
    know what to rerun (cut to Slurm's 200 characters)."""
    from ..drain import LEADER
    last = next((r.number for r in reversed(result.rounds)
                 for t, o in zip(r.tests, r.outcomes) if culprit in t.suspects and not o.passed), len(result.rounds))
    return f"{LEADER} bisect: {spec.name} fails with {culprit} (round {last} of {len(result.rounds)})"[:200]
