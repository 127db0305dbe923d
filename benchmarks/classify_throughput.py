"""Classifier throughput on a synthetic 1M-line kernel log + job stderr mix, against ``grep -E``.

Run:  python benchmarks/classify_throughput.py [--lines N] [--seed S] [--rounds R]

Builds a deterministic mix (70% kernel-log noise, 30% training-output noise, ~0.5% fault lines
drawn from the signature table's own examples and real Xid formats), then times, in ``R``
interleaved pairs (classify, grep, classify, grep, ...; the machine's speed may drift, so each
pair is compared on its own):

* ``classify(Evidence(kernel_lines=..., stderr_tail=...))`` end to end (join, encoding, the
  per-source ``grep -F`` prefilter of large inputs, scan, decision);
* every signature pattern (translated to POSIX ERE) through ``grep -E -i -c -f`` over the same
  text.

Quotes medians (and the median of the per-pair ratios).  Also times the pure-Python path once
(``prefilter="python"``, what small epilog inputs and the no-grep fallback use) and checks that
both paths give the same verdict, rule, action, Xids and evidence.  Prints ``name=value`` lines,
headline figure last.
Goal (issue 22): >= 2M lines/s and at most 1.5x grep -E.

``--epilog-window`` instead times ``classify`` at the largest input the epilog hands it (4 MiB of
``/dev/kmsg`` records, ``read_kmsg``'s bound, plus 2 x 64 KiB of job output; the hang watcher hands
the kernel part only), built from the labelled corpus's real kernel and stderr lines, on the
pure-Python path and on grep's candidate lines, interleaved, ``R`` runs each: whether the epilog
still needs grep (issue 21).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from slurm_ft.classify import Evidence, classify  # noqa: E402
from slurm_ft.classify import prefilter  # noqa: E402
from slurm_ft.classify.table import signatures  # noqa: E402

KERNEL_NOISE = (
    "[{t:>12.6f}] IPv6: ADDRCONF(NETDEV_CHANGE): veth{n:x}: link becomes ready",
    "[{t:>12.6f}] audit: type=1400 audit({t:.3f}:{n}): apparmor=\"STATUS\" operation=\"profile_load\" name=\"docker-default\" pid={n}",
    "[{t:>12.6f}] systemd-journald[{n}]: Data hash table of /var/log/journal/system.journal has a fill level at 75.0 ({n} of {n} items)",
    "[{t:>12.6f}] br-{n:x}: port 3(veth{n:x}) entered forwarding state",
    "[{t:>12.6f}] nvidia-peermem nv_mem_get_pages:{n} DEBUG page size 65536",
    "[{t:>12.6f}] NVRM: GPU at PCI:0000:{b:02x}:00: GPU-00000000-0000-0000-0000-0000000000{b:02x}",
    "[{t:>12.6f}] EXT4-fs (nvme0n1p{b}): mounted filesystem with ordered data mode. Quota mode: none.",
    "[{t:>12.6f}] usb 1-{b}: new high-speed USB device number {n} using xhci_hcd",
)
OUTPUT_NOISE = (
    "[rank{b}]: step {n} | loss 2.{n:04d} | lr 3.0e-04 | grad_norm 0.{n:03d} | tokens/s {n}",
    "INFO:torch.distributed.run:Using nproc_per_node={b}.",
    "Epoch {b}: 100%|##########| {n}/{n} [05:{b:02d}<00:00, 3.21it/s, loss=0.{n:04d}]",
    "node01:{n}:{n} [{b}] NCCL INFO Channel {b:02d}/32 :    0   1   2   3   4   5   6   7",
    "wandb: Syncing run {n:x} to https://wandb.example/project/runs/{n:x}",
)
FAULTS_KERNEL = (
    "[{t:>12.6f}] NVRM: Xid (PCI:0000:{b:02x}:00): 13, pid={n}, name=python, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address",
    "[{t:>12.6f}] NVRM: Xid (PCI:0000:{b:02x}:00): 31, pid={n}, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_00000000.",
    "[{t:>12.6f}] pcieport 0000:00:03.1: AER: Correctable error message received from 0000:00:00.0",
)


def build_mix(lines: int, seed: int) -> tuple[list[str], str]:
    """``(kernel_lines, stderr_text)`` totalling ``lines`` lines, deterministic for ``seed``."""
    rnd = random.Random(seed)
    examples = [s.example for s in signatures() if s.source in ("kernel", "output", "any")]
    kernel: list[str] = []
    output: list[str] = []
    t = 1000.0
    for i in range(lines):
        t += rnd.random() * 0.01
        n = rnd.randrange(1, 1 << 20)
        b = rnd.randrange(1, 9)
        r = rnd.random()
        if r < 0.003:
            kernel.append(rnd.choice(FAULTS_KERNEL).format(t=t, n=n, b=b))
        elif r < 0.005:
            (kernel if rnd.random() < 0.5 else output).append(rnd.choice(examples))
        elif r < 0.70:
            kernel.append(rnd.choice(KERNEL_NOISE).format(t=t, n=n, b=b))
        else:
            output.append(rnd.choice(OUTPUT_NOISE).format(t=t, n=n, b=b))
    return kernel, "\n".join(output) + "\n"


def to_ere(pattern: str) -> str:
    """Python regex -> POSIX ERE good enough for GNU grep (lookbehinds dropped)."""
    p = re.sub(r"\(\?<!.*?\)", "", pattern)
    p = p.replace("(?:", "(").replace(r"\d", "[0-9]")
    return p


def _grep_patterns() -> list[str]:
    pats = [to_ere(s.pattern) for s in signatures() if s.source in ("kernel", "output", "any", "xid", "sxid")]
    pats.append(r"\bS?Xid\b")
    return pats


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


#: The epilog's largest window: kernel log (``read_kmsg``'s default ``max_bytes``), then the job's
#: stderr and stdout tails (``slurm_ft.node.epilog.STDERR_TAIL_BYTES`` each).  The hang watcher
#: hands over the kernel part only.
WINDOW_KERNEL_BYTES = 4 << 20
WINDOW_OUTPUT_BYTES = 2 * (64 << 10)
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "classify",
                      "corpus_cases.jsonl")


def build_window(seed: int, fault_share: float) -> Evidence:
    """The epilog's Evidence at its largest: ``/dev/kmsg`` record bodies (kernel noise, and
    ``fault_share`` of the records drawn from the labelled corpus's kernel lines, their log
    tool's wrappers stripped) filling :data:`WINDOW_KERNEL_BYTES`, then job output (training
    noise and the corpus's stderr lines) filling :data:`WINDOW_OUTPUT_BYTES`; 8 GPUs on the node,
    2 of them the job's, exit status 1."""
    import json

    from slurm_ft.classify.parse import message_body

    rnd = random.Random(seed)
    k_faults: list[str] = []
    o_faults: list[str] = []
    with open(CORPUS, encoding="utf-8") as fh:
        for line in fh:
            case = json.loads(line)
            rows = [x for x in case["text"].splitlines() if x.strip()]
            if case["kind"] == "kernel_log":
                k_faults += [message_body(x.encode()).decode("utf-8", "replace") for x in rows]
            elif case["kind"] == "stderr":
                o_faults += rows
    kernel: list[str] = []
    size, t = 0, 1000.0
    while True:
        t += rnd.random() * 0.01
        n, b = rnd.randrange(1, 1 << 20), rnd.randrange(1, 9)
        rec = (rnd.choice(k_faults) if rnd.random() < fault_share else
               rnd.choice(KERNEL_NOISE).format(t=t, n=n, b=b).split("] ", 1)[1])
        if size + len(rec.encode()) + 1 > WINDOW_KERNEL_BYTES:
            break
        kernel.append(rec)
        size += len(rec.encode()) + 1
    output: list[str] = []
    size = 0
    while True:
        n, b = rnd.randrange(1, 1 << 20), rnd.randrange(1, 9)
        line = rnd.choice(o_faults) if rnd.random() < fault_share else rnd.choice(OUTPUT_NOISE).format(t=t, n=n, b=b)
        if size + len(line.encode()) + 1 > WINDOW_OUTPUT_BYTES:
            break
        output.append(line)
        size += len(line.encode()) + 1
    node = {f"0000:{b:02x}:00.0": b - 1 for b in range(1, 9)}
    return Evidence(kernel_lines=kernel, stderr_tail="\n".join(output) + "\n", exit_code=1,
                    job_bus_ids=frozenset(list(node)[:2]), node_bus_ids=node, kernel_records=True)


def window_main(rounds: int, seed: int) -> None:
    """Time ``classify`` at the epilog's largest window, a dense mix (every record a fault line:
    every line a candidate) and a typical one (0.5% fault records), per path, ``rounds``
    interleaved runs each; prints medians in seconds, wall clock and CPU (user + system, grep's
    processes included: on a shared, loaded machine the figure to compare by), the typical pure-
    Python wall median last (the headline: what the epilog would pay without grep)."""
    import resource

    from slurm_ft.classify.engine import classify as classify_with

    def cpu() -> float:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    headline = float("nan")
    for name, share in (("dense", 1.0), ("typical", 0.005)):
        ev = build_window(seed, share)
        size = sum(len(x.encode()) + 1 for x in ev.kernel_lines) + len(ev.stderr_tail.encode())
        wall: dict[str, list[float]] = {"python": [], "grep": []}
        used: dict[str, list[float]] = {"python": [], "grep": []}
        verdicts = {}
        for path in wall:
            verdicts[path] = classify_with(ev, prefilter=path).to_dict()  # warm-up
        for _ in range(max(1, rounds)):
            for path in wall:
                c0, t0 = cpu(), time.perf_counter()
                classify_with(ev, prefilter=path)
                wall[path].append(time.perf_counter() - t0)
                used[path].append(cpu() - c0)
        print(f"window_{name}_bytes={size}")
        print(f"window_{name}_kernel_records={len(ev.kernel_lines)}")
        print(f"window_{name}_rule={verdicts['python']['rule']}")
        print(f"window_{name}_paths_agree={str(verdicts['python'] == verdicts['grep']).lower()}")
        for path in wall:
            print(f"window_{name}_{path}_s_min_max={min(wall[path]):.3f},{max(wall[path]):.3f}")
            print(f"window_{name}_{path}_cpu_s_median={_median(used[path]):.3f}")
            print(f"window_{name}_{path}_s_median={_median(wall[path]):.3f}")
        headline = _median(wall["python"])
    print(f"window_python_s_median={headline:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved classify/grep pairs (median quoted)")
    ap.add_argument("--no-python-path", action="store_true", help="skip timing the pure-Python path")
    ap.add_argument("--epilog-window", action="store_true",
                    help="instead: time classify at the largest input the epilog and hang watcher hand it")
    args = ap.parse_args()
    if args.epilog_window:
        window_main(args.rounds, args.seed)
        return

    kernel, output = build_mix(args.lines, args.seed)
    total_lines = len(kernel) + output.count("\n")
    classify(Evidence(kernel_lines=kernel[:1000], stderr_tail=output[:10000]))  # load tables once

    used: list[bool] = []
    real_grep = prefilter.grep_line_starts

    def watched(*a, **kw):
        res = real_grep(*a, **kw)
        used.append(res is not None)
        return res

    grep = shutil.which("grep")
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "mix.log")
        pfile = os.path.join(tmp, "patterns")
        with open(log, "w", encoding="utf-8") as fh:
            fh.write("\n".join(kernel))
            fh.write("\n")
            fh.write(output)
        pats = _grep_patterns()
        with open(pfile, "w", encoding="utf-8") as fh:
            fh.write("\n".join(pats) + "\n")

        def run_grep() -> tuple[float, str]:
            t0 = time.perf_counter()
            proc = subprocess.run([grep, "-E", "-i", "-c", "-f", pfile, log], capture_output=True, text=True,
                                  env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
            return time.perf_counter() - t0, proc.stdout.strip() or proc.stderr.strip()[:100]

        verdict = classify(Evidence(kernel_lines=kernel, stderr_tail=output))  # warm-up (regexes compiled)
        if grep:
            run_grep()
        c_times: list[float] = []
        g_times: list[float] = []
        matched = "?"
        prefilter.grep_line_starts = watched
        try:
            for _ in range(max(1, args.rounds)):
                t0 = time.perf_counter()
                verdict = classify(Evidence(kernel_lines=kernel, stderr_tail=output))
                c_times.append(time.perf_counter() - t0)
                if grep:
                    g, matched = run_grep()
                    g_times.append(g)
        finally:
            prefilter.grep_line_starts = real_grep
    c_med = _median(c_times)
    rate = total_lines / c_med
    py_verdict, py_s = None, float("nan")
    if not args.no_python_path:
        t0 = time.perf_counter()
        py_verdict = classify(Evidence(kernel_lines=kernel, stderr_tail=output), prefilter="python")
        py_s = time.perf_counter() - t0

    print(f"lines={total_lines}")
    print(f"bytes={sum(len(x) + 1 for x in kernel) + len(output)}")
    print(f"verdict={verdict.verdict}")
    print(f"rule={verdict.rule}")
    print(f"prefilter={'grep' if used and all(used) else 'python'}")
    if py_verdict is not None:
        print(f"python_path_s={py_s:.3f}")
        print(f"paths_agree={str(py_verdict.to_dict() == verdict.to_dict()).lower()}")
    print(f"rounds={len(c_times)}")
    print(f"classify_s_median={c_med:.3f}")
    print(f"classify_s_min_max={min(c_times):.3f},{max(c_times):.3f}")
    if g_times:
        g_med = _median(g_times)
        print(f"grep_patterns={len(pats)}")
        print(f"grep_matched_lines={matched}")
        print(f"grep_s_median={g_med:.3f}")
        print(f"grep_lines_per_s={total_lines / g_med:.0f}")
        print(f"slowdown_vs_grep={_median([c / g for c, g in zip(c_times, g_times)]):.2f}")
    print(f"classify_lines_per_s={rate:.0f}")


if __name__ == "__main__":
    main()
