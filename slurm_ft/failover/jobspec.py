"""Which jobs are fault-tolerant, and with what options — the one place that decides it.

The grammar of the ``ft`` token is docs/ft-token.md; job_submit.lua (slurm_ft/lab/spank.py)
implements the same grammar and both run tests/fixtures/ft_token_vectors.json.

Two records carry a job's options:

* the job's **comment** holds the token ``ft`` or ``ft:key=value,...``, put there by the user
  (legacy ``--comment=ft:retries=2``) or by ``job_submit.lua`` from the SPANK options
  (``sbatch --ft --ft-retries=2 ...``). The job's owner can rewrite the comment at any time
  (``scontrol update JobId=J Comment=...``): it is user input, read with :func:`from_comment`;
* the job's **admin_comment** gets, at submit time, ``slurm-ft:submitted
  ft:retries=N,ckpt_signal=SIG,ckpt_wait=S,hang_timeout=S`` from ``job_submit.lua``: the
  validated, canonical options with the site default and maximum applied. Slurm refuses
  AdminComment from the job's owner (at submit and by ``scontrol update``, verified on 22.05), so
  this is the record to act on: :func:`from_admin_comment`. The daemon replaces the state word
  (``slurm-ft:<state>``) and keeps the ``ft:...`` word.

The site maximum (``[failover] max_retries``) is applied at submit by job_submit.lua and again
by whoever acts on the options (:func:`clamp`).
"""

from __future__ import annotations

import dataclasses
import re
import signal as _signal
from dataclasses import dataclass

from slurm_ft.errors import ConfigError

#: Signals the plugin accepts for ``--ft-ckpt-signal`` (catchable, not used by Slurm's own job control).
CKPT_SIGNALS = ("USR1", "USR2", "HUP", "INT", "TERM", "ALRM", "URG", "WINCH")
DEFAULT_CKPT_SIGNAL = "USR1"
DEFAULT_CKPT_WAIT_S = 600
MAX_CKPT_WAIT_S = 3600
MAX_RETRIES = 100
HANG_RANGE_S = (60, 7 * 24 * 3600)
#: Leading word of slurm-ft's record in a job's admin_comment (``slurm-ft:<state>``).
ADMIN_LEADER = "slurm-ft:"
#: State word job_submit.lua writes at submit.
SUBMITTED = "submitted"

#: The only word separators of a comment: ASCII space, TAB, LF, VT, FF, CR (docs/ft-token.md).
#: Not ``str.split()``: it also splits on U+00A0, U+2003, U+001C... which job_submit.lua does not.
_WS = re.compile("[ \t\n\x0b\x0c\r]+")
#: A number in the token: 1 to 9 ASCII digits (``int()`` would also take "+5", "1_0", "٣").
_DIGITS = re.compile("[0-9]{1,9}")
_ALNUM = re.compile("[A-Za-z0-9]+")


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


def _number(value: str, where: str, what: str) -> int:
    if not isinstance(value, str) or not _DIGITS.fullmatch(value):
        raise ConfigError(f"{where}: must be {what}, got {value!r}")
    return int(value)


def parse_retries(value: str, where: str = "retries") -> int:
    """An integer retry budget in 0..100 (0 = never requeue), ASCII digits only.
    Raises :class:`ConfigError`. The site maximum is :func:`clamp`'s business."""
    n = _number(value, where, f"an integer 0..{MAX_RETRIES} (0 = never requeue)")
    if not 0 <= n <= MAX_RETRIES:
        raise ConfigError(f"{where}: must be 0..{MAX_RETRIES} (0 = never requeue), got {n}")
    return n


def parse_signal(value: str, where: str = "ckpt_signal") -> str:
    """``USR2``, ``SIGUSR2``, ``usr2`` or ``12`` -> ``"USR2"``. Raises :class:`ConfigError`.

    Lenient (numbers, surrounding blanks): for environment values such as
    ``SLURM_FT_CKPT_SIGNAL``. The comment token uses :func:`parse_token_signal`."""
    text = str(value).strip().upper()
    if text.isdigit():
        names = {int(getattr(_signal, "SIG" + n)): n for n in CKPT_SIGNALS}
        if int(text) in names:
            return names[int(text)]
    text = text.removeprefix("SIG")
    if text in CKPT_SIGNALS:
        return text
    raise ConfigError(f"{where}: {value!r} is not one of {' '.join(CKPT_SIGNALS)}")


def parse_token_signal(value: str, where: str = "ckpt_signal") -> str:
    """The token's signal value: ASCII letters/digits, case-insensitive, one optional ``SIG``
    prefix, a name of :data:`CKPT_SIGNALS` (no numbers). Raises :class:`ConfigError`."""
    if isinstance(value, str) and _ALNUM.fullmatch(value):
        text = value.upper()
        text = text[3:] if text.startswith("SIG") else text
        if text in CKPT_SIGNALS:
            return text
    raise ConfigError(f"{where}: {value!r} is not one of {' '.join(CKPT_SIGNALS)}")


def parse_wait(value: str, where: str = "ckpt_wait") -> int:
    """Whole seconds 1..3600, ASCII digits only. Raises :class:`ConfigError`."""
    n = _number(value, where, f"whole seconds 1..{MAX_CKPT_WAIT_S}")
    if not 1 <= n <= MAX_CKPT_WAIT_S:
        raise ConfigError(f"{where}: must be whole seconds 1..{MAX_CKPT_WAIT_S}, got {value!r}")
    return n


def parse_hang(value: str, where: str = "hang_timeout") -> int | None:
    """Seconds (the plugin normalises durations), ASCII digits only; 0 = unset (None)."""
    lo, hi = HANG_RANGE_S
    n = _number(value, where, f"whole seconds, 0 or {lo}..{hi}")
    if n == 0:
        return None
    if not lo <= n <= hi:
        raise ConfigError(f"{where}: must be 0 or {lo}..{hi} s, got {n}")
    return n


_KEYS = {"retries": ("retries", parse_retries), "ckpt_signal": ("ckpt_signal", parse_token_signal),
         "ckpt_wait": ("ckpt_wait_s", parse_wait), "hang_timeout": ("hang_timeout_s", parse_hang)}


def words(text: str | None) -> list[str]:
    """``text`` split on ASCII whitespace only (docs/ft-token.md), empty words dropped."""
    return [w for w in _WS.split(text or "") if w]


def is_ft_word(word: str) -> bool:
    """A word that is the ft token: exactly ``ft`` or starting with ``ft:`` (case-sensitive)."""
    return word == "ft" or word.startswith("ft:")


def parse_token(token: str) -> dict:
    """The options a token gives explicitly, as FtOptions field names (absent keys absent).

    ``token`` is one ft word (``ft`` or ``ft:key=value,...``). Raises :class:`ConfigError` for
    an empty option list (``ft:``), an empty item, an item without ``=``, an unknown or repeated
    key, or a value outside its grammar/range."""
    if token == "ft":
        return {}
    if not token.startswith("ft:"):
        raise ConfigError(f"{token[:40]!r} is not an ft token")
    body = token[3:]
    if body == "":
        raise ConfigError("no options after 'ft:' (write ft alone, or ft:key=value,...)")
    values: dict = {}
    seen: set[str] = set()
    for item in body.split(","):
        if item == "":
            raise ConfigError("ft: empty option (stray ',')")
        key, eq, value = item.partition("=")
        if key not in _KEYS:
            raise ConfigError(f"ft option {key[:40]!r} unknown (known: {', '.join(_KEYS)})")
        if not eq:
            raise ConfigError(f"ft:{key}: needs a value ({key}=...)")
        if key in seen:
            raise ConfigError(f"ft:{key}: given twice")
        seen.add(key)
        field, parse = _KEYS[key]
        values[field] = parse(value, f"ft:{key}")
    return values


def from_comment(comment: str, default_retries: int) -> FtOptions:
    """Options from a job comment (user input: see :func:`from_admin_comment`).

    Not ft-enabled when no word is an ft word. Raises :class:`ConfigError` when more than one
    word is, or the token is malformed (docs/ft-token.md)."""
    found = [w for w in words(comment) if is_ft_word(w)]
    if not found:
        return FtOptions(False, default_retries)
    if len(found) > 1:
        raise ConfigError(f"comment holds {len(found)} ft tokens; exactly one is allowed")
    values: dict = {"retries": default_retries, **parse_token(found[0])}
    return FtOptions(True, **values)


def admin_token(opts: FtOptions) -> str:
    """The canonical token of ``opts``: ``ft:retries=N,ckpt_signal=SIG,ckpt_wait=S,hang_timeout=S``
    (all four keys in this order, decimal without leading zeros, signal name upper case without
    ``SIG``, ``hang_timeout=0`` when unset). What job_submit.lua writes into the comment and, after
    ``slurm-ft:<state>``, into the admin_comment."""
    return (f"ft:retries={int(opts.retries)},ckpt_signal={opts.ckpt_signal},"
            f"ckpt_wait={int(opts.ckpt_wait_s)},hang_timeout={int(opts.hang_timeout_s or 0)}")


def from_admin_comment(text: str | None) -> FtOptions | None:
    """The options fixed at submit, from a job's admin_comment; the record to act on.

    The record is the first word starting ``slurm-ft:`` (the state word, e.g.
    ``slurm-ft:submitted``) followed, anywhere later, by a word starting ``ft:``; the first such
    word counts and must be exactly canonical (:func:`admin_token`). Returns None when there is
    no state word or no ``ft:`` word after it (the job was not ft-enabled at submit, or was
    submitted before job_submit.lua wrote the record). Raises :class:`ConfigError` when the
    ``ft:`` word is malformed or not canonical: only job_submit.lua, slurm-ft and admins write
    this field, so anything else is a bug or tampering and must not be guessed at."""
    ws = words(text)
    start = next((i for i, w in enumerate(ws) if w.startswith(ADMIN_LEADER)), None)
    if start is None:
        return None
    token = next((w for w in ws[start + 1:] if w.startswith("ft:")), None)
    return None if token is None else from_canonical(token, "admin_comment")


def from_canonical(token: str, where: str = "recorded") -> FtOptions:
    """Options from a canonical token (:func:`admin_token`), strictly: all four keys, in canonical
    form. ``where`` names the record in errors. Raises :class:`ConfigError` otherwise."""
    values = parse_token(token)
    missing = [k for k, (field, _) in _KEYS.items() if field not in values]
    if missing:
        raise ConfigError(f"{where} ft token lacks {', '.join(missing)}: {token[:120]!r}")
    opts = FtOptions(True, **values)
    if admin_token(opts) != token:
        raise ConfigError(f"{where} ft token is not canonical: {token[:120]!r}")
    return opts


def admin_record(state: str, opts: FtOptions) -> str:
    """``slurm-ft:<state> <canonical token>``: the admin_comment for ``opts`` in ``state``."""
    return f"{ADMIN_LEADER}{state} {admin_token(opts)}"


def clamp(opts: FtOptions, max_retries: int) -> FtOptions:
    """``opts`` with ``retries`` at most the site maximum ``max_retries``
    (``[failover] max_retries``); unchanged when already within it."""
    if opts.retries <= max_retries:
        return opts
    return dataclasses.replace(opts, retries=max(0, int(max_retries)))


def from_job(job, default_retries: int) -> FtOptions:
    """Options of a :class:`slurm_ft.slurm.Job` from its comment (SPANK ``--ft`` or legacy
    ``--comment=ft``). The comment is owner-writable: prefer :func:`from_admin_comment`
    (``job.admin_comment``) and :func:`clamp` wherever the options decide an action."""
    return from_comment(job.comment, default_retries)
