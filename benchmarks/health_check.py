"""Benchmark: whole-prolog health check time on an 8-GPU fake node, interpreter start included.

Run: ``python benchmarks/health_check.py [--runs N] [--hang-timeout S]``
Prints ``name=value`` lines, the headline ``median_s=`` last. Target (issue 4): median <= 1 s.

Measures, each as a fresh ``python`` process (what a Prolog pays):
- ``prolog_*``: ``from slurm_ft.health import run_checks`` + config load + all checks, default
  isolation (subprocess worker) -- the headline;
- ``thread_*``: the same with ``[health] isolation = "thread"``;
- ``cli_*``: ``slurm-ft health --json`` through the click command;
- ``hung_*``: a driver hung in nvmlInit, bounded by ``nvml_timeout_s`` (the worst case).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_ft.nvml import fake  # noqa: E402

PROLOG = ("import sys; from slurm_ft.config import load; from slurm_ft.health import run_checks, unhealthy; "
          "r = run_checks(load(), 'n1'); sys.exit(1 if unhealthy(r) else 0)")
CLI = "import sys; from slurm_ft.cli.health import health_command; health_command(['--json', '--node', 'n1'])"


def write_config(d: Path, **health: object) -> Path:
    lines = ["[nvml]", 'backend = "fake"', f'inventory = "{d}/{{node}}.json"', "[health]", "expected_gpus = 8"]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in health.items()]
    path = d / f"conf-{len(list(d.glob('conf-*')))}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def time_runs(code: str, conf: Path, runs: int, want_rc: int) -> list[float]:
    env = {**os.environ, "SLURM_FT_CONFIG": str(conf), "PYTHONPATH": str(ROOT)}
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
        out.append(time.perf_counter() - t0)
        if proc.returncode != want_rc:
            raise SystemExit(f"unexpected exit {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return out


def report(name: str, times: list[float]) -> None:
    print(f"{name}_runs={len(times)}")
    print(f"{name}_min_s={min(times):.3f}")
    print(f"{name}_max_s={max(times):.3f}")
    print(f"{name}_median_s={statistics.median(times):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--hang-timeout", type=float, default=2.0, help="nvml_timeout_s for the hung-driver runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        inv = d / "n1.json"
        fake.write_inventory(str(inv), "n1", [{"index": i} for i in range(8)])
        default = write_config(d)
        thread = write_config(d, isolation="thread")
        print("gpus=8")
        print(f"python={sys.version.split()[0]}")
        baseline = time_runs("pass", default, args.runs, 0)
        print(f"interpreter_median_s={statistics.median(baseline):.3f}")
        report("thread", time_runs(PROLOG, thread, args.runs, 0))
        report("cli", time_runs(CLI, default, args.runs, 0))
        hung_conf = write_config(d, nvml_timeout_s=args.hang_timeout)
        fake.set_node_field(str(inv), "nvml_hang_s", str(args.hang_timeout * 10))
        hung = time_runs(PROLOG, hung_conf, 3, 1)
        print(f"hung_nvml_timeout_s={args.hang_timeout}")
        report("hung", hung)
        fake.set_node_field(str(inv), "nvml_hang_s", "0")
        prolog = time_runs(PROLOG, default, args.runs, 0)
        report("prolog", prolog)
        print(f"median_s={statistics.median(prolog):.3f}")


if __name__ == "__main__":
    main()
