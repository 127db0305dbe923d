"""The shipped bisect test: every node's GPU health checks, then an all-reduce across the nodes.

Run by ``slurm-ft bisect`` under ``srun`` (one task per node): ``python -m slurm_ft.bisect.collective``.
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

Rendezvous (no shared filesystem): rank 0 listens on the first free port of
``PORT_BASE + (job * 31 + step) % PORT_SPAN`` and the next :data:`PORT_TRIES`; the others connect
to rank 0's node (its address from DNS, else ``scontrol show node``'s ``NodeAddr``) and introduce
themselves with ``job.step``, so a listener of another job on a candidate port is skipped.

Exit status: 0 pass, 1 the test failed (health or collective), 2 it could not run (rendezvous).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

PORT_BASE, PORT_SPAN, PORT_TRIES = 40000, 20000, 16
#: Values per GPU vector, and seconds to wait for every rank to join.
LENGTH, JOIN_TIMEOUT_S = 256, 90.0
#: The value a corrupting fake GPU gets wrong, and by how much.
CORRUPT_INDEX, CORRUPT_DELTA = 17, 1.0


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
        from ..nvml.inventory import read
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
    from ..health import run_checks, unhealthy
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
        from ..slurm import Slurm
        addr = Slurm().show_node(node).get("NodeAddr", "")
        if not addr:
            raise OSError(f"no address for node {node}") from None
        return addr


def _send(sock: socket.socket, obj: dict) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _recv(sock: socket.socket, limit: int = 1 << 22) -> dict | None:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > limit:
            return None
    try:
        obj = json.loads(buf)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def serve(tag: str, size: int, mine: dict, candidates: list[int], timeout_s: float) -> dict:
    """Rank 0: gather every rank's message (``mine`` is rank 0's), reduce, answer each rank."""
    srv = None
    for port in candidates:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen(size + 8)
            srv = s
            break
        except OSError:
            s.close()
    if srv is None:
        raise OSError(f"no free port in {candidates[0]}..{candidates[-1]}")
    deadline = time.monotonic() + timeout_s
    peers: dict[int, tuple[socket.socket, dict]] = {}
    try:
        while len(peers) < size - 1:
            srv.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                raise OSError(f"{len(peers) + 1} of {size} ranks joined within {timeout_s:g} s") from None
            conn.settimeout(10.0)
            msg = _recv(conn)
            if not msg or msg.get("tag") != tag or not isinstance(msg.get("rank"), int):
                conn.close()
                continue
            peers[msg["rank"]] = (conn, msg)
        every = {0: mine, **{r: m for r, (_, m) in peers.items()}}
        answer = reduce_and_check(every)
        for conn, _ in peers.values():
            _send(conn, answer)
            conn.close()
        return answer
    finally:
        srv.close()


def join(tag: str, rank: int, mine: dict, addr: str, candidates: list[int], timeout_s: float) -> dict:
    """Ranks 1..n-1: find rank 0 among the candidate ports, send, wait for the answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for port in candidates:
            try:
                s = socket.create_connection((addr, port), timeout=2.0)
            except OSError:
                continue
            try:
                s.settimeout(max(1.0, deadline - time.monotonic()))
                _send(s, {**mine, "tag": tag, "rank": rank})
                answer = _recv(s)
            except OSError:
                answer = None
            finally:
                s.close()
            if answer is not None:
                return answer
        time.sleep(0.3)
    raise OSError(f"rank 0 at {addr} not found on ports {candidates[0]}..{candidates[-1]} within {timeout_s:g} s")


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


def main(env=None) -> int:
    from .. import config as config_mod
    env = os.environ if env is None else env
    try:
        job, step = int(env["SLURM_JOB_ID"]), int(env.get("SLURM_STEP_ID") or 0)
        rank, size = int(env.get("SLURM_PROCID", "0")), int(env.get("SLURM_NTASKS", "1"))
        node = env["SLURMD_NODENAME"]
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or node
    except (KeyError, ValueError) as exc:
        print(f"collective: not run under srun ({exc})", file=sys.stderr)
        return 2
    from ..slurm import split_nodes
    cfg = config_mod.load(env=dict(env))
    sick = health(cfg, node)
    vectors, how = compute(cfg, node, rank, local_gpus(env))
    mine = {"node": node, "health": sick, "how": how, "vectors": {str(g): v for g, v in vectors.items()}}
    tag = f"{job}.{step}"
    try:
        if size == 1:
            answer = reduce_and_check({0: mine})
        elif rank == 0:
            answer = serve(tag, size, mine, ports(job, step), JOIN_TIMEOUT_S)
        else:
            answer = join(tag, rank, mine, node_address(split_nodes(nodes)[0]), ports(job, step), JOIN_TIMEOUT_S)
    except OSError as exc:
        print(f"collective: FAIL rank {rank} on {node}: could not run: {exc}", flush=True)
        return 2
    if rank == 0:
        print(f"collective: {'PASS' if answer.get('ok') else 'FAIL'}: {answer.get('why')}", flush=True)
    return 0 if answer.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
