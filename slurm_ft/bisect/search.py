"""Which node makes a multi-node test fail: the search, pure (no Slurm, no I/O).

Adaptive group testing in rounds; every test of a round runs at the same time (each a Slurm job on
its own nodes), so the cost that matters is the number of rounds, not of jobs:

1. **confirm** (optional): the whole node set runs the test once; if it passes there is nothing
   to find.
2. **split**: while no node is known good, the failing set is cut into as many groups as the
   test's minimum node count allows (``min_nodes``, 2 for a collective: pairs), each a test.
   Groups that pass are known good; a failing group is the next suspect set.
3. **isolate**: once good nodes are known, each suspect is tested with good nodes padding its
   test up to ``min_nodes`` (a suspect and a known-good partner); when there are not enough good
   nodes for every suspect at once, suspects are grouped as finely as the good nodes allow.
   A suspect that fails with good partners is a **culprit**.

If every group of a failing set passes (the failure needs several of its nodes together), the
set is tried again in halves; if both halves pass too, the search stops there and reports the
set as a failing **combination** (no single node: a link between them, say); nothing is drained.

Six nodes with one bad node take three rounds: confirm (6 nodes), pairs (3 tests), the two
suspects each with a good partner (2 tests). In general: 1 + 1 + ceil(log_k) rounds, where k is
how finely the good nodes let the suspects be split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass(frozen=True)
class Test:
    """One test of a round: the nodes it runs on; ``suspects`` are the nodes it judges (the rest
    are known-good padding)."""

    __test__ = False            # not a pytest test class

    nodes: tuple[str, ...]
    suspects: tuple[str, ...]


@dataclass
class Outcome:
    """What running a :class:`Test` gave: ``passed``, and for the record the Slurm job id, exit
    code and a short detail (the test's last output line)."""

    passed: bool
    job_id: int | None = None
    exit_code: int | None = None
    detail: str = ""
    ran: bool = True           # False: the test never started (no allocation): no verdict on its nodes


@dataclass
class Round:
    number: int
    tests: list[Test]
    outcomes: list[Outcome] = field(default_factory=list)


@dataclass
class Result:
    """``culprits``: nodes that failed the test with known-good partners (sorted);
    ``combinations``: node sets that fail together although each smaller group passed;
    ``good``: nodes that passed; ``reproduced``: False when the whole set passed (confirm)."""

    rounds: list[Round]
    culprits: list[str]
    combinations: list[list[str]]
    good: list[str]
    reproduced: bool = True
    stopped: str = ""          # why the search stopped early ("" when it finished)


RunRound = Callable[[int, list[Test]], list[Outcome]]


def split(items: Sequence[str], parts: int) -> list[list[str]]:
    """``items`` in ``parts`` contiguous groups whose sizes differ by at most one (order kept)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, i = [], 0
    for p in range(parts):
        n = size + (1 if p < extra else 0)
        out.append(list(items[i:i + n]))
        i += n
    return out


def _parts_for(n: int, min_nodes: int, good: int, coarse: bool) -> int:
    """How many groups to cut ``n`` suspects into, given ``good`` known-good nodes for padding
    each group up to ``min_nodes``: the most that fit (singletons when possible). With no good
    node every group must reach ``min_nodes`` by itself; ``coarse``: halves only."""
    if n <= 1:
        return 1
    if coarse:
        return 2
    for k in range(n, 1, -1):
        largest = -(-n // k)
        smallest = n // k
        pad = max(0, min_nodes - smallest)
        if pad == 0 and smallest >= min_nodes:
            return k
        if good and k * pad <= good and largest + pad >= min_nodes:
            return k
    return 2 if n >= 2 else 1


def plan(failing: list[list[str]], good: list[str], min_nodes: int, coarse: set[tuple[str, ...]]) -> list[Test]:
    """The tests of the next round: each failing set split (see :func:`_parts_for`), each group
    padded with distinct known-good nodes up to ``min_nodes`` while they last."""
    tests: list[Test] = []
    pool = list(good)
    for fs in failing:
        k = _parts_for(len(fs), min_nodes, len(pool), tuple(fs) in coarse)
        for group in split(fs, k):
            pad = []
            while len(group) + len(pad) < min_nodes and pool:
                pad.append(pool.pop(0))
            tests.append(Test(tuple(group) + tuple(pad), tuple(group)))
    return tests


def bisect(nodes: Sequence[str], run_round: RunRound, *, min_nodes: int = 2, confirm: bool = True,
           max_rounds: int = 12) -> Result:
    """Find the node(s) of ``nodes`` that make the test fail. ``run_round(number, tests)`` runs the
    tests of one round (at the same time) and returns one :class:`Outcome` per test, in order.
    ``min_nodes``: nodes a test needs to be meaningful (a collective: 2); a test with fewer runs
    only when no known-good node can pad it. ``confirm``: start with the whole set (round 1)."""
    nodes = list(dict.fromkeys(nodes))
    rounds: list[Round] = []
    good: list[str] = []
    culprits: list[str] = []
    combos: list[list[str]] = []
    coarse: set[tuple[str, ...]] = set()

    def run(tests: list[Test]) -> list[Outcome]:
        r = Round(len(rounds) + 1, tests)
        r.outcomes = list(run_round(r.number, tests))
        if len(r.outcomes) != len(tests):
            raise ValueError(f"round {r.number}: {len(r.outcomes)} outcomes for {len(tests)} tests")
        rounds.append(r)
        return r.outcomes

    if confirm:
        (whole,) = run([Test(tuple(nodes), tuple(nodes))])
        if whole.passed:
            return Result(rounds, [], [], nodes, reproduced=False)
    failing: list[list[str]] = [nodes] if len(nodes) > 1 else []
    if len(nodes) == 1:
        culprits = nodes if confirm else []
    while failing:
        if len(rounds) >= max_rounds:
            return Result(rounds, sorted(culprits), combos, sorted(good), stopped=f"round limit {max_rounds} reached; "
                          f"still suspect: {', '.join(n for fs in failing for n in fs)}")
        tests = plan(failing, good, min_nodes, coarse)
        outcomes = run(tests)
        by_set: dict[tuple[str, ...], list[tuple[Test, Outcome]]] = {}
        for fs in failing:
            by_set[tuple(fs)] = [(t, o) for t, o in zip(tests, outcomes) if set(t.suspects) <= set(fs)]
        nxt: list[list[str]] = []
        for fs, results in by_set.items():
            bad = [t for t, o in results if not o.passed]
            passed = [n for t, o in results if o.passed for n in t.suspects]
            if bad:
                good += [n for n in passed if n not in good]
                for t in bad:
                    if len(t.suspects) == 1:
                        culprits.append(t.suspects[0])
                    else:
                        nxt.append(list(t.suspects))
            elif len(results) > 2 and fs not in coarse:
                coarse.add(fs)          # each group passed: try halves of the same set
                nxt.append(list(fs))
            else:
                combos.append(list(fs))  # halves pass, the whole fails: a combination
        failing = nxt
    return Result(rounds, sorted(set(culprits)), combos, sorted(good))
