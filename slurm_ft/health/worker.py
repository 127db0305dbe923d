"""The health worker process (``runner.run_in_subprocess`` starts it; nobody else should).

stdin: one JSON request ``{"backend", "inventory", "node", "names", "expected_gpus", "health"}``.
stdout: JSON lines, ``{"progress": [check, gpu]}`` before each NVML step and
``{"result": CheckResult.to_dict()}`` per verdict, flushed as they happen so the parent keeps
whatever finished before a hang. Exit 0 once every result is written.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from slurm_ft.health.config import from_config
    from slurm_ft.health.runner import collect

    request = json.loads(sys.stdin.read())
    cfg = from_config(request["health"])
    out = sys.stdout

    def emit(result) -> None:
        out.write(json.dumps({"result": result.to_dict()}) + "\n")
        out.flush()

    def progress(check: str, gpu: int | None) -> None:
        out.write(json.dumps({"progress": [check, gpu]}) + "\n")
        out.flush()

    collect(request["backend"], request["inventory"], cfg, request["node"], request["names"],
            request["expected_gpus"], emit, progress)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
