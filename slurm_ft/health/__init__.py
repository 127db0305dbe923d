"""GPU health checks for the Prolog and Slurm's ``HealthCheckProgram``.

Cheap to import (the prolog imports it): only the result type is loaded here; ``run_checks``
imports the checks, NVML and the runner when called. No click outside ``cli/health.py``.

Layout: ``config`` ([health] table), ``result`` (CheckResult), ``context`` (per-GPU loop and
error verdicts), one module per check family (``device``, ``memory``, ``thermal``, ``links``,
``xid``), ``registry`` (name -> check), ``runner`` (deadline, isolation), ``worker``
(subprocess entry), ``cli`` (``slurm-ft health``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from slurm_ft.health.result import CheckResult

if TYPE_CHECKING:  # pragma: no cover
    from slurm_ft.config import Config

__all__ = ["CheckResult", "run_checks", "unhealthy"]


def run_checks(config: "Config", node: str, *, only: list[str] | None = None,
               expected_gpus: int | None = None) -> list[CheckResult]:
    """Run the enabled checks on ``node``'s GPUs; ``nvml_responsive`` first, then check order.

    NVML comes from ``slurm_ft.nvml.load(config.nvml.backend, config.nvml_inventory_path(node))``;
    thresholds and the check list from ``config.health`` (the raw ``[health]`` table).
    ``only``: run just these checks (names from ``slurm_ft.health.config.CHECK_NAMES``).
    ``expected_gpus``: GPU count the node must have (e.g. from its gres), overriding the config.

    Never hangs: all NVML work shares one ``[health] nvml_timeout_s`` deadline, past which the
    result list ends with an ``nvml_responsive`` fail. Raises :class:`ConfigError` only for a
    bad ``[health]`` table or an unknown name in ``only``.
    """
    from slurm_ft.errors import ConfigError
    from slurm_ft.health import runner
    from slurm_ft.health.config import CHECK_NAMES, from_config

    cfg = from_config(config.health)
    if only:
        unknown = [n for n in only if n not in CHECK_NAMES]
        if unknown:
            raise ConfigError(f"unknown check {unknown[0]!r} (known: {', '.join(CHECK_NAMES)})")
        names = [n for n in CHECK_NAMES if n in only]
    else:
        names = list(cfg.enabled)
    expected = cfg.expected_for(node) if expected_gpus is None else expected_gpus
    inventory = config.nvml_inventory_path(node) if config.nvml.backend == "fake" else None
    return runner.run(config.nvml.backend, inventory, cfg, node, names, expected)


def unhealthy(results: Iterable[CheckResult]) -> list[CheckResult]:
    """The results whose status is ``fail`` (warnings do not make a node unhealthy)."""
    return [r for r in results if r.status == "fail"]
