"""slurm-ft's data files (Xid catalog, signature and policy tables, install templates, the SPANK
plugin's source), read as text: one reader for every room. Files sit beside this module in a
checkout and in an installed package alike (the wheel is never zipped)."""

from __future__ import annotations

import os

#: The directory of the data files.
DIR = os.path.dirname(os.path.abspath(__file__))


def data_text(name: str) -> str:
    """The text (UTF-8) of ``slurm_ft/data/<name>`` (``name`` with ``/`` between directories).
    Raises OSError when the file is missing (a packaging bug)."""
    with open(os.path.join(DIR, *name.split("/")), encoding="utf-8") as fh:
        return fh.read()
