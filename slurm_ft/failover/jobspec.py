"""Which jobs are fault-tolerant, and with what options — the one place that decides it.

A job is ft-enabled when its Slurm comment holds the token ``ft`` (optionally ``ft:key=value,...``).
Two ways put it there:

* the SPANK plugin (``sbatch --ft --ft-retries=2 --ft-ckpt-signal=USR2 ...``, spank/): its values
  are checked again by ``job_submit.lua`` in slurmctld and written into the comment as
  ``ft:retries=2,ckpt_signal=USR2,ckpt_wait=600,hang_timeout=0`` (see slurm_ft/lab/spank.py for
  why the comment: it is the job field ``squeue --json`` shows that job_submit.lua can set and
  slurm-ft does not otherwise write; ``slurm_job_modify`` keeps the token when the owner rewrites
  the comment);
* the legacy first cut: ``--comment=ft`` or ``--comment="ft:retries=2"``.

Values are validated here again (a comment is user input) with the same limits as the plugin.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass

from ..errors import ConfigError

_TOKEN = re.compile(r"(?:^|[\s,;])ft(?::(?P<opts>[^\s;]*))?(?=$|[\s,;])")

#: Signals the plugin accepts for ``--ft-ckpt-signal`` (catchable, not used by Slurm's own job control).
CKPT_SIGNALS = ("USR1", "USR2", "HUP", "INT", "TERM", "ALRM", "URG", "WINCH")
DEFAULT_CKPT_SIGNAL = "USR1"
DEFAULT_CKPT_WAIT_S = 600
MAX_CKPT_WAIT_S = 3600
HANG_RANGE_S = (60, 7 * 24 * 3600)


@dataclass(frozen=True)
class FtOptions:
    enabled: bool
    retries: int
    ckpt_signal: str = DEFAULT_CKPT_SIGNAL      # name without SIG, e.g. "USR2"
    ckpt_wait_s: int = DEFAULT_CKPT_WAIT_S
    hang_timeout_s: int | None = None           # None = not set

    @property
    def ckpt_signum(self) -> int:
        return int(getattr(_signal, "SIG" + self.ckpt_signal))


def parse_retries(value: str, where: str = "retries") -> int:
    """An integer retry budget in 0..100 (0 = never requeue). Raises :class:`ConfigError`."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: must be an integer 0..100, got {value!r}") from None
    if not 0 <= n <= 100:
        raise ConfigError(f"{where}: must be 0..100 (0 = never requeue), got {n}")
    return n


def parse_signal(value: str, where: str = "ckpt_signal") -> str:
    """``USR2``, ``SIGUSR2``, ``usr2`` or ``12`` -> ``"USR2"``. Raises :class:`ConfigError`."""
    text = str(value).strip().upper()
    if text.isdigit():
        names = {int(getattr(_signal, "SIG" + n)): n for n in CKPT_SIGNALS}
        if int(text) in names:
            return names[int(text)]
    text = text.removeprefix("SIG")
    if text in CKPT_SIGNALS:
        return text
    raise ConfigError(f"{where}: {value!r} is not one of {' '.join(CKPT_SIGNALS)}")


def parse_wait(value: str, where: str = "ckpt_wait") -> int:
    if not str(value).isdigit() or not 1 <= int(value) <= MAX_CKPT_WAIT_S:
        raise ConfigError(f"{where}: must be whole seconds 1..{MAX_CKPT_WAIT_S}, got {value!r}")
    return int(value)


def parse_hang(value: str, where: str = "hang_timeout") -> int | None:
    """Seconds (the plugin normalises durations); 0 = unset."""
    if not str(value).isdigit():
        raise ConfigError(f"{where}: must be whole seconds, got {value!r}")
    n = int(value)
    if n == 0:
        return None
    lo, hi = HANG_RANGE_S
    if not lo <= n <= hi:
        raise ConfigError(f"{where}: must be {lo}..{hi} s, got {n}")
    return n


_KEYS = {"retries": ("retries", parse_retries), "ckpt_signal": ("ckpt_signal", parse_signal),
         "ckpt_wait": ("ckpt_wait_s", parse_wait), "hang_timeout": ("hang_timeout_s", parse_hang)}


def from_comment(comment: str, default_retries: int) -> FtOptions:
    """Options from a job comment. Raises :class:`ConfigError` for a malformed option."""
    m = _TOKEN.search(comment or "")
    if not m:
        return FtOptions(False, default_retries)
    values: dict = {"retries": default_retries}
    for item in filter(None, (m.group("opts") or "").split(",")):
        key, _, value = item.partition("=")
        if key not in _KEYS:
            raise ConfigError(f"ft option {key!r} unknown (known: {', '.join(_KEYS)})")
        field, parse = _KEYS[key]
        values[field] = parse(value, f"ft:{key}")
    return FtOptions(True, **values)


def from_job(job, default_retries: int) -> FtOptions:
    """Options of a :class:`slurm_ft.slurm.Job` (SPANK ``--ft`` or legacy ``--comment=ft``)."""
    return from_comment(job.comment, default_retries)
