#!/usr/bin/env python3
"""A tiny "training" job for the slurm-ft demo: counts steps, checkpoints every K steps and on
its checkpoint signal (``$SLURM_FT_CKPT_SIGNUM``, default SIGUSR1), resumes from its checkpoint when Slurm runs it again (requeue).

Checkpoints are fenced by attempt (``SLURM_RESTART_COUNT``): a stale copy of an older attempt
(e.g. still running on a node Slurm lost) never overwrites a newer attempt's checkpoint.

On the checkpoint signal it saves, reports ``saved`` to slurm-ft (the ack in the job's comment,
slurm_ft/checkpoint/channel.py; skipped when slurm_ft cannot be imported) and waits: slurm-ft
requeues the job (a drain, or the time limit) and it resumes from that step. With ``srun -n N``
only rank 0 (``SLURM_PROCID``) saves and reports; the other ranks just wait too.

Each step is also a heartbeat for hang detection (``slurm_ft.checkpoint.heartbeat``, docs/hang.md);
``--hang-at-step`` and ``--slow-save-at-step``/``--slow-save-s`` make a hang and a checkpoint longer
than the window for the lab's tests.
"""

import argparse
import json
import os
import signal
import sys
import time

try:  # the ack channel; the repo checkout is on the path when this file runs from examples/
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    from slurm_ft.checkpoint import channel, heartbeat
except ImportError:  # pragma: no cover - slurm_ft not installed where the job runs
    channel = None
    heartbeat = None


def load(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {"step": 0, "attempt": -1}


def save(path, step, attempt):
    current = load(path)
    if current.get("attempt", -1) > attempt:
        print(f"attempt {attempt}: not saving, attempt {current['attempt']} owns the checkpoint", flush=True)
        return False
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"step": step, "attempt": attempt, "time": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-time", type=float, default=0.25, help="seconds per step")
    ap.add_argument("--every", type=int, default=5, help="checkpoint every K steps")
    ap.add_argument("--ckpt", required=True, help="checkpoint file")
    # hang detection (--ft-hang-timeout): a heartbeat every step; faults to show it
    ap.add_argument("--hang-at-step", type=int, default=0, help="stop making progress after this step (a hang)")
    ap.add_argument("--slow-save-at-step", type=int, default=0, help="at this step, a checkpoint that takes "
                    "--slow-save-s seconds (reported as saving)")
    ap.add_argument("--slow-save-s", type=float, default=0.0, help="seconds the slow checkpoint takes")
    args = ap.parse_args()

    attempt = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    rank = int(os.environ.get("SLURM_PROCID") or 0)
    reporter = channel.Reporter.from_env() if channel is not None and rank == 0 else None
    node = os.environ.get("SLURMD_NODENAME", "?")
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    state = load(args.ckpt)
    step = state["step"]
    if step:
        print(f"attempt {attempt} on {node} (GPU {gpus}): resuming from step {step}", flush=True)
    else:
        print(f"attempt {attempt} on {node} (GPU {gpus}): starting from step 0", flush=True)

    want_save = []
    # the checkpoint signal chosen with `sbatch --ft-ckpt-signal` (SPANK), else SIGUSR1
    signum = int(os.environ.get("SLURM_FT_CKPT_SIGNUM") or signal.SIGUSR1)
    signal.signal(signum, lambda *_: want_save.append(True))
    while step < args.steps:
        if args.hang_at_step and step >= args.hang_at_step:
            print(f"attempt {attempt} rank {rank}: hanging at step {step}", flush=True)
            while True:  # as a rank stuck in a collective: alive, no progress, no output
                time.sleep(3600)
        time.sleep(args.step_time)
        step += 1
        if heartbeat is not None:
            heartbeat(step)
        if args.slow_save_at_step and step == args.slow_save_at_step:
            print(f"attempt {attempt} rank {rank}: slow checkpoint at step {step} ({args.slow_save_s:g} s)",
                  flush=True)
            if heartbeat is not None:
                heartbeat(step, saving=True)
            time.sleep(args.slow_save_s)
            print(f"attempt {attempt} rank {rank}: slow checkpoint done", flush=True)
        if want_save:
            if rank == 0 and save(args.ckpt, step, attempt):
                print(f"attempt {attempt}: checkpoint at step {step} on signal", flush=True)
                if reporter is not None:
                    channel.report_quietly(reporter, "saved", step, args.ckpt)
            print(f"attempt {attempt} rank {rank}: saved, waiting for slurm-ft to requeue the job", flush=True)
            while True:
                time.sleep(1)
        if step % args.every == 0 and rank == 0:
            save(args.ckpt, step, attempt)
    if rank == 0:
        save(args.ckpt, step, attempt)
    print(f"attempt {attempt} on {node}: done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
