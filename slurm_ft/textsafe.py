"""Make untrusted text safe to print on a terminal.

Job output excerpts, checkpoint paths, node reasons and the like come from users; printed raw
they could carry terminal escape sequences (ESC ``[31m``, OSC 52 clipboard writes, a ``\\r`` that
hides the rest of a line, a BEL, a C1 CSI ``\\x9b``) onto an admin's terminal. Every text field
a command prints goes through :func:`terminal_safe` first.
"""

from __future__ import annotations

import re

# C0 controls (newline and tab included: a field is one cell of one line), DEL, C1 controls.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Characters that reorder or break the displayed line without being controls: bidi embeddings,
# overrides and isolates ("Trojan Source"), line and paragraph separators.
_INVISIBLE = re.compile("[\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Lone surrogates: a non-UTF-8 byte of a file name or environment value (PEP 383 surrogate escape,
# U+DC80-U+DCFF) or a forged "\ud800"; no UTF-8 file or terminal can hold them.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate(m: re.Match) -> str:
    code = ord(m.group())
    return f"\\x{code - 0xdc00:02x}" if 0xdc80 <= code <= 0xdcff else f"\\u{code:04x}"


def terminal_safe(s: object) -> str:
    """``s`` as text with every control character escaped: ESC as ``\\x1b``, other C0/C1 controls
    and DEL as ``\\xNN``, bidi overrides and line separators as ``\\uNNNN``, an undecodable
    byte of a name (surrogate escape U+DCNN) as ``\\xNN``, any other lone surrogate as
    ``\\uNNNN``. Printable text (any script) is kept. Idempotent: the result holds no control
    character, is one line, and always encodes as UTF-8."""
    text = s if isinstance(s, str) else str(s)
    if text.isascii() and text.isprintable():
        return text                      # nothing to escape (the common case: one C-level pass)
    text = _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    text = _SURROGATE.sub(_surrogate, text)
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
