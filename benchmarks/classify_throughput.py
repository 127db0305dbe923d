"""Classifier throughput on a synthetic 1M-line kernel log + job stderr mix, against ``grep -E``.

Run:  python benchmarks/classify_throughput.py [--lines N] [--seed S]

Builds a deterministic mix (70% kernel-log noise, 30% training-output noise, ~0.5% fault lines
drawn from the signature table's own examples and real Xid formats), times
``classify(Evidence(kernel_lines=..., stderr_tail=...))`` end to end (join, encoding, the
``grep -F`` prefilter of large inputs, scan, decision; best of 3), then runs every signature
pattern (translated to POSIX ERE) through ``grep -E -i -c -f`` over the same text (best of 3).
Also times the pure-Python path once (``prefilter="python"``, what small epilog inputs and the
no-grep fallback use) and checks that both paths give the same verdict, rule, action, Xids and
evidence.  Prints ``name=value`` lines, headline figure last.
Goal: >= 200k lines/s and within 3x of grep.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=3)
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

    prefilter.grep_line_starts = watched
    best = float("inf")
    try:
        for _ in range(3):
            t0 = time.perf_counter()
            verdict = classify(Evidence(kernel_lines=kernel, stderr_tail=output))
            best = min(best, time.perf_counter() - t0)
    finally:
        prefilter.grep_line_starts = real_grep
    rate = total_lines / best
    t0 = time.perf_counter()
    py_verdict = classify(Evidence(kernel_lines=kernel, stderr_tail=output), prefilter="python")
    py_s = time.perf_counter() - t0

    print(f"lines={total_lines}")
    print(f"bytes={sum(len(x) + 1 for x in kernel) + len(output)}")
    print(f"verdict={verdict.verdict}")
    print(f"rule={verdict.rule}")
    print(f"prefilter={'grep' if used and all(used) else 'python'}")
    print(f"python_path_s={py_s:.3f}")
    print(f"paths_agree={str(py_verdict.to_dict() == verdict.to_dict()).lower()}")
    print(f"classify_s={best:.3f}")

    grep = shutil.which("grep")
    if grep:
        pats = [to_ere(s.pattern) for s in signatures() if s.source in ("kernel", "output", "any", "xid", "sxid")]
        pats.append(r"\bS?Xid\b")
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "mix.log")
            pfile = os.path.join(tmp, "patterns")
            with open(log, "w", encoding="utf-8") as fh:
                fh.write("\n".join(kernel))
                fh.write("\n")
                fh.write(output)
            with open(pfile, "w", encoding="utf-8") as fh:
                fh.write("\n".join(pats) + "\n")
            gbest = float("inf")
            matched = "?"
            for _ in range(3):
                t0 = time.perf_counter()
                proc = subprocess.run([grep, "-E", "-i", "-c", "-f", pfile, log], capture_output=True, text=True,
                                      env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
                gbest = min(gbest, time.perf_counter() - t0)
                matched = proc.stdout.strip() or proc.stderr.strip()[:100]
        grate = total_lines / gbest
        print(f"grep_patterns={len(pats)}")
        print(f"grep_matched_lines={matched}")
        print(f"grep_s={gbest:.3f}")
        print(f"grep_lines_per_s={grate:.0f}")
        print(f"slowdown_vs_grep={best / gbest:.2f}")
    print(f"classify_lines_per_s={rate:.0f}")


if __name__ == "__main__":
    main()
