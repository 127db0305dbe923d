"""Every CLI command has help text and is documented (README.md or docs/)."""

from pathlib import Path

import click
import pytest

from slurm_ft.cli.main import main
from slurm_ft.cli.history import command as history_command

ROOT = Path(__file__).resolve().parents[1]
DOCS = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def _commands(group: click.Group, prefix: str):
    for name, cmd in group.commands.items():
        yield f"{prefix} {name}", cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{prefix} {name}")


ALL = [*_commands(main, "slurm-ft"), ("ft-history", history_command)]


@pytest.mark.parametrize("name, cmd", ALL, ids=[n for n, _ in ALL])
def test_command_has_help_and_docs(name, cmd):
    assert (cmd.help or "").strip(), f"{name} has no help text"
    for param in cmd.params:
        if isinstance(param, click.Option):
            assert param.help, f"{name} {param.opts[0]} has no help text"
    leaf = name.split(" ", 1)[-1] if name.startswith("slurm-ft") else name
    assert leaf in DOCS, f"{name} is not mentioned in README.md or docs/"


def test_expected_commands_exist():
    names = {n for n, _ in ALL}
    for want in ("slurm-ft daemon", "slurm-ft lab up", "slurm-ft lab down", "slurm-ft lab status",
                 "slurm-ft lab inject-xid", "slurm-ft classify", "slurm-ft health", "ft-history"):
        assert want in names
