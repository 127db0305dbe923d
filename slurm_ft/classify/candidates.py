"""Candidate lines of a large input: ``grep -F`` per source and per piece, all running at once.

The engine's scans read kernel text with the ``kernel`` rows' keys and the job's output with the
``output`` rows' keys (``Policy.index``), and both look for ``xid``.  A line that holds none of
its own source's keys can match nothing there, so each source is searched for its own keys only
(GNU grep's multi-string search costs about in proportion to the number of keys: on the 88 MB
mix of ``benchmarks/classify_throughput.py``, 52 kernel keys over the kernel text plus 129 output
keys over the output take ~0.26 s of CPU where all 161 keys over both took ~0.29 s), and every
search runs in its own process at once: the kernel text is cut at line ends into pieces
(:data:`slurm_ft.classify.engine.KERNEL_PIECES`), so two cores share the work.

:class:`GrepRun` returns each source's candidate line starts, a superset of the lines the
pure-Python scan would examine, so the verdict is the same (``tests/test_classify_prefilter.py``,
``tests/test_classify_candidates.py``).  Every grep goes through
:func:`slurm_ft.classify.prefilter.grep_line_starts` (absolute path, argv list, ``LC_ALL=C``, a
memory file, a timeout) and any trouble there means None: the caller then runs the pure-Python
path.  Each grep waits in a thread of its own (no GIL held while it waits).
"""

from __future__ import annotations

import threading

from slurm_ft.classify import prefilter
from slurm_ft.classify.policy import Policy

#: Key every source is searched for as well: the Xid parsers read the lines holding it.
XID_KEY = b"xid"


def grep_keys(policy: Policy, source: str) -> list[bytes]:
    """The literal keys (lower-case bytes) the ``source`` scan (``kernel``/``output``) looks for,
    plus :data:`XID_KEY`, sorted."""
    return sorted(set(policy.index.get(source, {})) | {XID_KEY})


class _Background(threading.Thread):
    """``prefilter.grep_line_starts(chunks, keys)`` in a thread: the thread spends its time
    waiting on grep (no GIL held), so several greps run at once."""

    def __init__(self, chunks: tuple[bytes | memoryview, ...], keys: list[bytes]):
        super().__init__(name="slurm-ft-grep", daemon=True)
        self.chunks, self.keys = chunks, keys
        self.starts: list[int] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.starts = prefilter.grep_line_starts(self.chunks, self.keys)
        except BaseException as exc:  # handed to the caller, raised there
            self.error = exc

    def result(self) -> list[int] | None:
        self.join()
        if self.error is not None:
            raise self.error
        return self.starts


class GrepRun:
    """The greps of one classification, each text in its own process, all at once.

    ``add(source, text, base)`` starts a grep over ``text`` (a piece of the ``source`` text that
    begins ``base`` bytes into it) at once, in a thread; the caller goes on (starting the next)
    while grep works.  :meth:`result` waits for all of them and gives each source's line starts
    (ascending, offsets into the whole source text; pieces are added in text order without
    overlap), or None when any grep could not answer; an exception raised in a grep's thread is
    raised there.  An empty text starts nothing."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.runs: list[tuple[str, int, _Background]] = []

    def add(self, source: str, text: bytes | memoryview, base: int = 0) -> None:
        if not text:
            return
        run = _Background((text,), grep_keys(self.policy, source))
        run.start()
        self.runs.append((source, base, run))

    def result(self) -> dict[str, list[int]] | None:
        found: dict[str, list[tuple[int, list[int]]]] = {"kernel": [], "output": []}
        failed = False
        for source, base, run in self.runs:  # every thread is joined, even after a failure
            starts = run.result()
            if starts is None:
                failed = True
            else:
                found.setdefault(source, []).append((base, starts))
        if failed:
            return None
        out: dict[str, list[int]] = {}
        for source, parts in found.items():
            merged: list[int] = []
            for base, starts in sorted(parts, key=lambda p: p[0]):
                merged.extend([s + base for s in starts] if base else starts)
            out[source] = merged
        return out
