"""The shipped bisect test: every node's GPU health checks, then an all-reduce across the nodes.

Run by ``slurm-ft bisect`` under ``srun`` (one task per node): ``python -I -m slurm_ft.bisect.collective``.
Each rank checks its node (``slurm_ft.health.run_checks``), computes a known vector on each of
its GPUs and sends it to rank 0 over TCP; rank 0 sums them and compares the sum with the exact
expected value, then tells every rank. Like a real all-reduce, the result says *that* the
collective is wrong, not *which* GPU made it wrong: that is what bisect is for. A failing health
check, on the other hand, is attributable and is printed with its node.

The computation per GPU: CUDA through torch when both are present; on the lab's fake GPUs (``[nvml]
backend = "fake"``) the vector is computed on the CPU and a GPU whose inventory says
``collective_corrupt`` returns it with one value off (silent data corruption that no health check
sees); elsewhere (no torch/CUDA) the CPU computes it and the test checks the network path only,
and says so.

Rendezvous (no shared filesystem; slurm_ft/bisect/meeting.py): rank 0 listens on the first free
port of ``PORT_BASE + (job * 31 + step) % PORT_SPAN`` and the next :data:`PORT_TRIES`; the others
probe them all at once and join the listener that proves, with the bisect's secret (a ticket the
runner hands every rank on stdin), to be this test's rank 0. Every message is MAC'd and bound to
the bisect, round, test, step and connection; rank 0 counts only the test's ranks, once each.

Exit status: 0 pass, 1 the test failed (health or collective), 2 it could not run (no ticket, no
meeting: a line starting with :data:`NOT_RUN`; bisect then blames nobody).
"""

from __future__ import annotations

import os
import socket
import sys

from slurm_ft.bisect.meeting import Meeting, MeetingError, Ticket

PORT_BASE, PORT_SPAN, PORT_TRIES = 40000, 20000, 16
#: Values per GPU vector, and seconds to wait for every rank to join.
LENGTH, JOIN_TIMEOUT_S = 256, 90.0
#: The value a corrupting fake GPU gets wrong, and by how much.
CORRUPT_INDEX, CORRUPT_DELTA = 17, 1.0
#: How a rank's output line starts when the test could not run (the runner reads it: no verdict).
NOT_RUN = "collective: NOT RUN"


def value(rank: int, gpu: int, i: int) -> float:
    """Element ``i`` of the vector rank ``rank`` contributes for its GPU ``gpu`` (exact in float64)."""
    return float((rank * 1000 + gpu * 10 + i) % 8191) * 0.5


def expected_sum(gpus_by_rank: dict[int, list[int]]) -> list[float]:
    return [sum(value(r, g, i) for r, gs in gpus_by_rank.items() for g in gs) for i in range(LENGTH)]


# ------------------------------------------------------------------------------ one rank's work
def local_gpus(env) -> list[int]:
    """Node-local GPU indices of this task (``SLURM_STEP_GPUS``, else ``CUDA_VISIBLE_DEVICES``); []
    when the step holds none."""
    for key in ("SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        text = env.get(key, "")
        if text and all(p.strip().isdigit() for p in text.split(",")):
            return [int(p) for p in text.split(",")]
    return []


def compute(cfg, node: str, rank: int, gpus: list[int]) -> tuple[dict[int, list[float]], str]:
    """Each GPU's vector, and how it was computed (``fake``, ``cuda``, ``cpu``)."""
    if cfg.nvml.backend == "fake":
        from slurm_ft.nvml.inventory import read
        inv = {g["index"]: g for g in read(cfg.nvml_inventory_path(node))["gpus"]}
        out = {}
        for g in gpus:
            vec = [value(rank, g, i) for i in range(LENGTH)]
            if inv.get(g, {}).get("collective_corrupt"):
                vec[CORRUPT_INDEX] += CORRUPT_DELTA
            out[g] = vec
        return out, "fake"
    try:
        import torch  # optional: a site's training image has it
        if gpus and torch.cuda.is_available():
            out = {}
            for pos, g in enumerate(gpus):   # CUDA numbers the visible GPUs 0..n-1
                idx = torch.arange(LENGTH, dtype=torch.float64, device=f"cuda:{pos}")
                out[g] = (((idx + rank * 1000 + g * 10) % 8191) * 0.5).cpu().tolist()
            return out, "cuda"
    except ImportError:
        pass
    return {g: [value(rank, g, i) for i in range(LENGTH)] for g in gpus}, "cpu"


def health(cfg, node: str) -> str:
    """'' when every check passes, else ``check: measurement`` of the first failing one."""
    from slurm_ft.health import run_checks, unhealthy
    bad = unhealthy(run_checks(cfg, node))
    return "" if not bad else f"{bad[0].check}: {bad[0].measurement}"


# ------------------------------------------------------------------------------ rendezvous
def ports(job: int, step: int) -> list[int]:
    first = PORT_BASE + (job * 31 + step) % PORT_SPAN
    return [first + k for k in range(PORT_TRIES)]


def node_address(node: str) -> str:
    try:
        return socket.getaddrinfo(node, None, socket.AF_INET)[0][4][0]
    except OSError:
        from slurm_ft.slurm import Slurm
        addr = Slurm().show_node(node).get("NodeAddr", "")
        if not addr:
            raise OSError(f"no address for node {node}") from None
        return addr


def reduce_and_check(every: dict[int, dict]) -> dict:
    """Sum every rank's GPU vectors and compare with the exact expected sum."""
    sick = [f"{m.get('node')}: {m['health']}" for m in every.values() if m.get("health")]
    gpus = {r: [int(g) for g in m.get("vectors", {})] for r, m in every.items()}
    total = [0.0] * LENGTH
    for m in every.values():
        for vec in m.get("vectors", {}).values():
            if not isinstance(vec, list) or len(vec) != LENGTH:
                return {"ok": False, "why": f"rank on {m.get('node')} sent a malformed vector"}
            total = [a + float(b) for a, b in zip(total, vec)]
    want = expected_sum(gpus)
    err = max((abs(a - b) for a, b in zip(total, want)), default=0.0)
    n_gpus = sum(len(g) for g in gpus.values())
    how = sorted({m.get("how", "?") for m in every.values()})
    if sick:
        return {"ok": False, "why": f"health check failed on {'; '.join(sick)}"}
    if err > 0:
        return {"ok": False, "why": f"all-reduce over {len(every)} ranks, {n_gpus} GPUs ({'/'.join(how)}): "
                                    f"result wrong (max error {err:g})"}
    return {"ok": True, "why": f"all-reduce over {len(every)} ranks, {n_gpus} GPUs ({'/'.join(how)}): exact"}


def main(env=None, stdin=None) -> int:
    """The test on one rank (``env``: the task's environment; ``stdin``: the binary stream the
    runner's ticket arrives on). Exit 0 pass, 1 fail, 2 not run (a line starting with
    :data:`NOT_RUN` says why: no ticket, no meeting)."""
    from slurm_ft import config as config_mod
    env = os.environ if env is None else env
    try:
        job, step = int(env["SLURM_JOB_ID"]), int(env.get("SLURM_STEP_ID") or 0)
        rank, size = int(env.get("SLURM_PROCID", "0")), int(env.get("SLURM_NTASKS", "1"))
        node = env["SLURMD_NODENAME"]
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or node
    except (KeyError, ValueError) as exc:
        print(f"collective: not run under srun ({exc})", file=sys.stderr)
        return 2
    from slurm_ft.slurm import split_nodes
    try:
        meeting = Meeting(Ticket.read(stdin if stdin is not None else sys.stdin.buffer), f"{job}.{step}", size)
        meeting.check(node)
    except MeetingError as exc:
        print(f"{NOT_RUN}: rank {rank} on {node}: {exc}", flush=True)
        return 2
    cfg = config_mod.load(env=dict(env))
    sick = health(cfg, node)
    vectors, how = compute(cfg, node, rank, local_gpus(env))
    mine = {"node": node, "health": sick, "how": how, "vectors": {str(g): v for g, v in vectors.items()}}
    try:
        if size == 1:
            answer = reduce_and_check({0: mine})
        elif rank == 0:
            answer = meeting.serve(mine, ports(job, step), JOIN_TIMEOUT_S, reduce_and_check)
        else:
            answer = meeting.join(rank, node, mine, node_address(split_nodes(nodes)[0]), ports(job, step),
                                  JOIN_TIMEOUT_S)
    except OSError as exc:
        print(f"{NOT_RUN}: rank {rank} on {node}: {exc}", flush=True)
        return 2
    if rank == 0:
        print(f"collective: {'PASS' if answer.get('ok') else 'FAIL'}: {answer.get('why')}", flush=True)
    return 0 if answer.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
