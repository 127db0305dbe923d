"""The result of one check on one GPU (or on the node): the unit every check returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass

STATUSES = ("pass", "warn", "fail")
#: Checks in run order (``nvml_responsive`` is not listed: it is always reported). Kept here, in a
#: leaf module, as the node record reads them too (slurm_ft.slurm.records; slurm_ft.health.config
#: imports the node record).
CHECK_NAMES: tuple[str, ...] = (
    "gpu_count",
    "persistence",
    "compute_mode",
    "ecc_volatile_uncorrected",
    "retired_pages",
    "row_remap",
    "temperature",
    "throttle",
    "pcie_link",
    "nvlink",
    "xid_events",
)


@dataclass(frozen=True)
class CheckResult:
    """One verdict.

    ``check``: check name (:data:`CHECK_NAMES`, plus ``nvml_responsive``).
    ``status``: ``"pass"`` | ``"warn"`` | ``"fail"``.
    ``gpu``: NVML GPU index, or None for a node-level result.
    ``measurement``: short human text fit for a Slurm drain reason (``"GPU1 row remap pending"``).
    ``value``: the raw measurement (°C, count, bitmask, "gen/width" …) or None.
    ``detail``: traceback text when the check crashed, else extra context or "".
    """

    check: str
    status: str
    gpu: int | None
    measurement: str
    value: float | int | str | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict:
        """JSON-ready dict with the six fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CheckResult":
        """Inverse of :meth:`to_dict` (used across the worker-process pipe)."""
        return cls(**{k: data.get(k) for k in ("check", "status", "gpu", "measurement", "value")},
                   detail=data.get("detail") or "")
