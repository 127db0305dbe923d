"""Benchmark: whole epilog process time, interpreter start included, as slurmd runs it.

Run (as root for the large-kernel-log part):
    python benchmarks/epilog_overhead.py [--runs N] [--kmsg-lines N] [--real-kmsg]

Each run is ``epilog/slurm-ft-epilog``, the checkout's wrapper the lab's slurmd runs (``/bin/sh``,
then ``.venv/bin/python -I -S`` with its start-up lines; ``--command module`` runs ``.venv/bin/python
-I -m slurm_ft.node.epilog`` instead, the entry before issue 24), with the environment slurmd gives it: ``SLURM_JOB_ID`` (a new id per run),
``SLURMD_NODENAME=n1``, ``SLURM_JOB_RESTART_COUNT=0``, ``SLURM_JOB_EXIT_CODE=0``,
``SLURM_JOB_GPUS=0``, ``SLURM_JOB_UID=0``, ``SLURM_SCRIPT_CONTEXT=epilog_slurmd``, and ``SLURM_FT_CONFIG`` naming a temporary TOML:
journal and node state under a temp dir, ``[nvml] backend = "fake"`` with the lab's 2-GPU
inventory for n1, ``[slurm] bin_dir`` holding a stub ``scontrol`` that logs its calls (no Slurm is
needed; with exit 0 the verdict is ``ok`` and Slurm is only called if the kernel log holds
hardware evidence for GPU 0: ``scontrol_calls`` says).  No prolog marker is left, so the epilog
reads its fallback window (the last hour of kernel log): the largest input it can get.

Two series, median of ``--runs`` each (after one unmeasured run that creates the journal):
* ``normal``: the machine's kernel log as it is;
* ``big_kmsg``: ``--kmsg-lines`` extra kernel-log records inside the window.  By default they go
  into a private copy of the kernel log (the current records plus the extra ones) bind-mounted
  over ``/dev/kmsg`` in a private mount namespace of this benchmark only: the machine's real
  ring buffer is untouched (20k lines would evict every earlier message of a small buffer,
  e.g. Xids a lab test just injected).  ``--real-kmsg`` writes them into the real ``/dev/kmsg``
  instead (batches of 10 per open, under the kernel's per-open rate limit).  Needs root;
  skipped with a note otherwise.

Prints ``name=value`` lines, the headline ``median_s=`` (the larger of the two medians) last; each
series also prints ``*_cpu_median_s`` (user + system seconds of a run: on a shared, loaded machine
the figure to compare two versions by).
Target (issue 22): <= 0.15 s, whatever the size of the kernel log.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_ft.journal import open_journal  # noqa: E402
from slurm_ft.lab.layout import inventory_gpus  # noqa: E402
from slurm_ft.nvml.fake import write_inventory  # noqa: E402

PYTHON = ROOT / ".venv" / "bin" / "python"
NOISE = (
    "IPv6: ADDRCONF(NETDEV_CHANGE): veth{n:x}: link becomes ready",
    'audit: type=1400 audit({t:.3f}:{n}): apparmor="STATUS" operation="profile_load" name="docker-default" pid={n}',
    "br-{n:x}: port 3(veth{n:x}) entered forwarding state",
    "nvidia-peermem nv_mem_get_pages:{n} DEBUG page size 65536",
    "EXT4-fs (nvme0n1p{b}): mounted filesystem with ordered data mode. Quota mode: none.",
    "usb 1-{b}: new high-speed USB device number {n} using xhci_hcd",
    "slurm-ft epilog_overhead filler {n}: eth0: renamed from veth{n:x}",
)


def setup(d: Path) -> tuple[Path, Path]:
    """Config, fake inventory, stub scontrol under ``d``; returns (config path, scontrol call log)."""
    write_inventory(str(d / "inv-n1.json"), "n1", inventory_gpus("n1"))
    bin_dir = d / "bin"
    bin_dir.mkdir()
    calls = d / "scontrol.calls"
    stub = bin_dir / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                    'if [ "$1" = show ]; then echo "NodeName=n1 State=IDLE Extra= Reason=(null)"; fi\nexit 0\n')
    stub.chmod(0o755)
    conf = d / "slurm-ft.toml"
    conf.write_text(f'''[journal]
path = "{d}/journal.db"
node_path = "{d}/node-{{node}}.db"
[node_state]
dir = "{d}/state"
log = "{d}/epilog.log"
[nvml]
backend = "fake"
inventory = "{d}/inv-{{node}}.json"
[slurm]
bin_dir = "{bin_dir}"
''')
    return conf, calls


#: ``--command``: what one run executes.
COMMANDS = {"wrapper": ["/bin/sh", str(ROOT / "epilog" / "slurm-ft-epilog")],
            "module": [str(PYTHON), "-I", "-m", "slurm_ft.node.epilog"]}


def series(conf: Path, runs: int, first_job: int, command: str = "wrapper") -> list[float]:
    """``runs`` epilog runs: their wall seconds; :data:`CPU` gets their CPU seconds (user + system,
    the run and the processes it waited for: a figure a loaded machine disturbs less than wall time)."""
    env = {"PATH": "/usr/bin:/bin", "SLURM_FT_CONFIG": str(conf), "SLURMD_NODENAME": "n1",
           "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_GPUS": "0", "SLURM_JOB_UID": "0",
           "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}  # slurmd sets it; the lab's Xid injector spares such processes
    times = []
    CPU.clear()
    for i in range(runs):
        env["SLURM_JOB_ID"] = str(first_job + i)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(COMMANDS[command], env=env, cwd="/",
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        CPU.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        if proc.returncode != 0:
            sys.exit(f"epilog exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return times


#: CPU seconds of the runs of the last :func:`series`.
CPU: list[float] = []


def filler(count: int, seed: int = 5) -> list[str]:
    rnd = random.Random(seed)
    return [rnd.choice(NOISE).format(n=rnd.randrange(1, 1 << 20), b=rnd.randrange(1, 9), t=time.time())
            for _ in range(count)]


def read_raw_kmsg() -> list[bytes]:
    """The current /dev/kmsg records, raw (``prio,seq,usec,flags;message``)."""
    out = []
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                rec = os.read(fd, 16 << 10)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue
            if not rec:
                break
            out.append(rec.split(b"\n", 1)[0])
    finally:
        os.close(fd)
    return out


def private_kmsg(d: Path, lines: list[str]) -> None:
    """Bind-mount a copy of the kernel log plus ``lines`` (stamped now) over /dev/kmsg, in a new
    private mount namespace of this process (inherited by the epilog runs, invisible elsewhere)."""
    recs = read_raw_kmsg()
    seq = int(recs[-1].split(b",")[1]) + 1 if recs else 0
    usec = int(time.monotonic() * 1e6)
    path = d / "kmsg"
    with open(path, "wb") as fh:
        for r in recs:
            fh.write(r + b"\n")
        for i, line in enumerate(lines):
            fh.write(b"6,%d,%d,-;%s\n" % (seq + i, usec + i, line.encode()))
    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWNS, MS_REC, MS_PRIVATE, MS_BIND = 0x00020000, 16384, 1 << 18, 4096
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(str(path).encode(), b"/dev/kmsg", None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --bind kmsg")


def real_kmsg(lines: list[str]) -> None:
    """Write ``lines`` into the real kernel log (10 per open: /dev/kmsg rate-limits each open file)."""
    for i in range(0, len(lines), 10):
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        try:
            for line in lines[i:i + 10]:
                os.write(fd, line.encode() + b"\n")
        finally:
            os.close(fd)


def kmsg_bytes_in_window() -> tuple[int, int]:
    from slurm_ft.classify.sources import read_kmsg

    lines = read_kmsg(time.monotonic() - 3600.0, max_bytes=1 << 30)
    return len(lines), sum(len(x) + 1 for x in lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=25)
    ap.add_argument("--kmsg-lines", type=int, default=20000)
    ap.add_argument("--command", choices=sorted(COMMANDS), default="wrapper",
                    help="wrapper: epilog/slurm-ft-epilog as slurmd runs it (default); module: python -I -m slurm_ft.node.epilog")
    ap.add_argument("--real-kmsg", action="store_true",
                    help="write the extra lines into the real /dev/kmsg (evicts older kernel messages)")
    args = ap.parse_args()
    if args.runs < 1:
        sys.exit("--runs must be >= 1")

    with tempfile.TemporaryDirectory(prefix="slurm-ft-epilog-bench-") as tmp:
        d = Path(tmp)
        conf, calls = setup(d)
        series(conf, 1, 1, args.command)  # creates and migrates the node journal (a node's journal already exists)
        n, b = kmsg_bytes_in_window()
        print(f"runs={args.runs}")
        print(f"command={' '.join(COMMANDS[args.command])}")
        print(f"normal_kmsg_lines={n}")
        print(f"normal_kmsg_bytes={b}")
        normal = series(conf, args.runs, 1000, args.command)
        print(f"normal_median_s={statistics.median(normal):.4f}")
        print(f"normal_min_s={min(normal):.4f}")
        print(f"normal_max_s={max(normal):.4f}")
        print(f"normal_cpu_median_s={statistics.median(CPU):.4f}")
        medians = [statistics.median(normal)]

        if os.geteuid() != 0:
            print("big_kmsg=skipped (not root: cannot add kernel-log records)")
        else:
            lines = filler(args.kmsg_lines)
            try:
                if args.real_kmsg:
                    real_kmsg(lines)
                    mode = "real_dev_kmsg"
                else:
                    private_kmsg(d, lines)
                    mode = "private_bind_mounted_copy"
            except OSError as exc:
                print(f"big_kmsg=skipped ({exc})")
            else:
                n, b = kmsg_bytes_in_window()
                print(f"big_kmsg_mode={mode}")
                print(f"big_kmsg_added_lines={args.kmsg_lines}")
                print(f"big_kmsg_lines={n}")
                print(f"big_kmsg_bytes={b}")
                big = series(conf, args.runs, 2000, args.command)
                print(f"big_kmsg_median_s={statistics.median(big):.4f}")
                print(f"big_kmsg_min_s={min(big):.4f}")
                print(f"big_kmsg_max_s={max(big):.4f}")
                print(f"big_kmsg_cpu_median_s={statistics.median(CPU):.4f}")
                medians.append(statistics.median(big))

        with open_journal(d / "node-n1.db") as j:
            rows = list(j.db.query("SELECT verdict, rule, action, count(*) AS n FROM verdicts GROUP BY 1, 2, 3"))
        print("verdicts=" + ",".join(f"{r['verdict']}/{r['rule']}/{r['action']}:{r['n']}" for r in rows))
        print(f"scontrol_calls={len(calls.read_text().splitlines()) if calls.exists() else 0}")
        print("target_s=0.15")
        print(f"median_s={max(medians):.4f}")


if __name__ == "__main__":
    main()
