"""Large inputs: GNU ``grep -F`` picks the candidate lines, Python classifies only those.

The pure-Python scan (:func:`slurm_ft.classify.engine.scan`) makes one ``bytes.find`` pass over
the lower-cased text per literal key of the policy; its cost grows with the number of keys.
``grep -F -i`` finds every line holding *any* key in one pass (Aho-Corasick-like multi-string
search).  :func:`grep_line_starts` returns those lines' start offsets; the engine then runs the
very same scan, Xid parser and regexes on exactly those lines.  Since every line the Python scan
would examine holds a key, it is among grep's lines: the verdict is identical (``tests/
test_classify_prefilter.py`` checks this on the corpus and on a synthetic mix).

grep is only worth starting for large inputs (:data:`GREP_MIN_BYTES`, one threshold for every
caller: the epilog, the hang watcher, ``slurm-ft run``, ``slurm-ft classify``).  Any trouble — grep missing, an error exit,
a timeout, a key that cannot be passed as an argument — returns None and the caller uses the
pure-Python path.  grep runs by absolute path with an argv list, ``LC_ALL=C`` (bytes; ``-i``
folds ASCII only, exactly like ``bytes.lower``), no ``$PATH``, reading a memory file (``memfd``),
never a path a user names.
"""

from __future__ import annotations

import os

#: grep locations tried, in order (never $PATH).
GREP_PATHS = ("/usr/bin/grep", "/bin/grep")
#: Inputs (kernel text + job output, bytes) at least this large go through grep; smaller stay in
#: Python: on 20,000 kernel records (1.4 MB) grep's lines take 12 ms where the pure-Python scan
#: takes 42 ms, while below ~100 KB starting grep costs more than it saves
#: (benchmarks/epilog_overhead.py); at the epilog's largest window (4 MiB of kernel records and
#: 2 x 64 KiB of output) 0.103 s against 0.334 s (benchmarks/classify_throughput.py --epilog-window).
GREP_MIN_BYTES = 128 << 10
#: Seconds allowed: a base plus one second per this many bytes (grep scans >100 MB/s).
GREP_TIMEOUT_BASE_S = 10.0
GREP_BYTES_PER_S = 4 << 20


def _grep() -> str | None:
    for path in GREP_PATHS:
        if os.access(path, os.X_OK):
            return path
    return None


def _memory_file():
    """An anonymous read/write file: a memfd where Linux offers one, else an unlinked temp file."""
    if hasattr(os, "memfd_create"):
        try:
            return os.fdopen(os.memfd_create("slurm-ft-classify"), "w+b")
        except OSError:
            pass
    import tempfile

    return tempfile.TemporaryFile()


def grep_line_starts(chunks: list[bytes] | tuple[bytes, ...], keys: list[bytes] | tuple[bytes, ...]) -> list[int] | None:
    """Start offsets (ascending) of the lines of ``b"".join(chunks)`` that hold any of ``keys``
    (lower-case; matched case-insensitively on ASCII letters), or None when grep cannot answer.

    Lines are separated by ``\\n`` only (``-a``: NUL bytes and invalid UTF-8 are plain bytes)."""
    grep = _grep()
    if grep is None or not keys or not all(keys):
        return None
    argv = [grep, "-a", "-b", "-F", "-i"]
    for key in keys:
        argv += ["-e", key]
    total = sum(len(c) for c in chunks)
    import subprocess  # local: the small-input path never needs it

    try:
        with _memory_file() as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            fh.seek(0)
            proc = subprocess.run(argv, stdin=fh, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"}, close_fds=True,
                                  timeout=GREP_TIMEOUT_BASE_S + total / GREP_BYTES_PER_S)
    except (OSError, ValueError, subprocess.SubprocessError):  # ValueError: a NUL byte in a key
        return None
    if proc.returncode == 1:
        return []
    if proc.returncode != 0:
        return None
    starts: list[int] = []
    out = proc.stdout
    pos = 0
    end = len(out)
    try:
        while pos < end:
            colon = out.index(b":", pos)
            starts.append(int(out[pos:colon]))
            nl = out.find(b"\n", colon)
            pos = end if nl == -1 else nl + 1
    except ValueError:  # not grep -b output after all
        return None
    return starts
