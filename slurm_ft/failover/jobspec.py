"""Which jobs are fault-tolerant, and with what options — the one place that decides it.

First cut (until the SPANK ``--ft`` options land): a job is ft-enabled when its Slurm comment holds
the token ``ft``, optionally with options: ``--comment=ft`` or ``--comment="ft:retries=2"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

_TOKEN = re.compile(r"(?:^|[\s,;])ft(?::(?P<opts>[^\s;]*))?(?=$|[\s,;])")


@dataclass(frozen=True)
class FtOptions:
    enabled: bool
    retries: int


def parse_retries(value: str, where: str = "retries") -> int:
    """An integer retry budget in 0..100 (0 = never requeue). Raises :class:`ConfigError`."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: must be an integer 0..100, got {value!r}") from None
    if not 0 <= n <= 100:
        raise ConfigError(f"{where}: must be 0..100 (0 = never requeue), got {n}")
    return n


def from_comment(comment: str, default_retries: int) -> FtOptions:
    """Options from a job comment. Raises :class:`ConfigError` for a malformed option."""
    m = _TOKEN.search(comment or "")
    if not m:
        return FtOptions(False, default_retries)
    retries = default_retries
    for item in filter(None, (m.group("opts") or "").split(",")):
        key, _, value = item.partition("=")
        if key == "retries":
            retries = parse_retries(value, "ft:retries")
        else:
            raise ConfigError(f"ft option {key!r} unknown (known: retries)")
    return FtOptions(True, retries)
