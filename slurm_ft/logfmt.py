"""Log output of the long-running commands (``slurm-ft daemon``, ``slurm-ft metrics --port``):
plain text, or one JSON object per line (``--log-format json``) for a log pipeline.

A JSON line: ``{"time": "2026-11-30T12:00:00.123Z", "level": "INFO", "logger": "slurm_ft.daemon",
"message": "...", "pid": 123}``, plus ``"exception"`` (the traceback text) when there is one, and
any ``extra={...}`` fields a caller passes (``job_id``, ``node``, ...). ASCII only
(``ensure_ascii``): a job name with control characters cannot break the line or a terminal.
"""

from __future__ import annotations

import json
import logging
import sys
import time

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"
#: LogRecord attributes that are not ``extra`` fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=True)


def setup(fmt: str = "text", *, verbose: bool = False, stream=None) -> None:
    """Configure the root logger once for a command: level INFO (DEBUG with ``verbose``), to
    ``stream`` (stderr), as ``fmt`` (``text`` or ``json``). Replaces handlers set earlier."""
    if fmt not in FORMATS:
        raise ValueError(f"log format: text or json, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
