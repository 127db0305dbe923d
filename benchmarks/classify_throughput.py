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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved classify/grep pairs (median quoted)")
    ap.add_argument("--no-python-path", action="store_true", help="skip timing the pure-Python path")
    args = ap.parse_args()

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
