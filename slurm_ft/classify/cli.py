"""``slurm-ft classify``: classify a blob of evidence, or measure the policy on labelled cases.

Library errors (ConfigError, EvidenceError) become ``click.ClickException`` here: ``Error: ...`` on
stderr, exit 1; usage errors exit 2.  Nothing else in ``slurm_ft.classify`` imports click.
"""

from __future__ import annotations

import json
import sys

import click

from ..errors import SlurmFTError

#: Most bytes read from FILE/stdin (the newest are kept).
MAX_INPUT_BYTES = 256 << 20


def _policy(config_path: str | None):
    from .. import config as config_mod
    from .policy import default_policy, from_config

    cfg = config_mod.load(config_path)
    return from_config(cfg.classify) if cfg.classify else default_policy()


def _read_input(path: str | None) -> str:
    if path in (None, "-"):
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        where = "stdin"
    else:
        try:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - MAX_INPUT_BYTES))
                data = fh.read(MAX_INPUT_BYTES)
        except OSError as exc:
            raise click.ClickException(f"{path}: {exc.strerror or exc}") from None
        where = path
    if len(data) > MAX_INPUT_BYTES:
        raise click.ClickException(f"{where}: more than {MAX_INPUT_BYTES} bytes")
    return data.decode("utf-8", "replace")


@click.command("classify")
@click.argument("file", required=False, metavar="[FILE|-]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--eval", "eval_path", metavar="LABELLED.jsonl",
              help="Classify labelled cases (JSON Lines with id, text, expected) and report accuracy.")
@click.option("--config", "config_path", metavar="TOML",
              help="slurm-ft.toml whose [classify] policy to use (default: the usual lookup order).")
def classify_command(file: str | None, as_json: bool, eval_path: str | None, config_path: str | None) -> None:
    """Classify failure evidence: kernel log lines, job stderr and Slurm messages, mixed.

    Reads FILE (or stdin when FILE is - or absent) and prints the verdict (hardware, user, infra,
    hang, unknown), the deciding rule, the recommended action, the Xids seen and the evidence
    lines.  With --eval, classifies every labelled case instead and prints a confusion matrix,
    the misses, false_failover (a non-hardware case classified hardware) and missed_hardware.
    Exit status: 0 done, 1 error, 2 usage error.
    """
    from .evaluate import evaluate, evidence_from_text, format_report, read_cases
    from .engine import classify

    if eval_path and file:
        raise click.UsageError("give either FILE or --eval, not both")
    try:
        policy = _policy(config_path)
        if eval_path:
            text = _read_input(eval_path)
            result = evaluate(read_cases(text.splitlines(), eval_path), policy)
            click.echo(json.dumps(result, indent=2) if as_json else format_report(result))
            return
        verdict = classify(evidence_from_text(_read_input(file)), policy)
    except SlurmFTError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(verdict.to_dict(), indent=2))
        return
    click.echo(f"verdict: {verdict.verdict}")
    click.echo(f"rule: {verdict.rule}")
    click.echo(f"action: {verdict.action}")
    for x in verdict.xids:
        where = x.bus_id or "bus id unknown"
        idx = f" (GPU {x.gpu_index})" if x.gpu_index is not None else ""
        click.echo(f"{'SXid' if x.kind == 'sxid' else 'Xid'} {x.xid} on {where}{idx}")
    if verdict.evidence:
        click.echo("evidence:")
        for line in verdict.evidence:
            click.echo(f"  {line}")
