"""``slurm-ft classify``: classify a blob of evidence, or measure the policy on labelled cases.

Library errors (ConfigError, EvidenceError) become ``click.ClickException`` here: ``Error: ...`` on
stderr, exit 1; usage errors exit 2.  Nothing else in ``slurm_ft.classify`` imports click.
"""

from __future__ import annotations

import json
import sys

import click

from slurm_ft.errors import SlurmFTError

#: Most bytes read from FILE/stdin (the newest are kept).
MAX_INPUT_BYTES = 256 << 20


def _policy(config_path: str | None):
    from slurm_ft import config as config_mod
    from slurm_ft.classify.policy import default_policy, from_config

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


def _slurm_state(value: str | None) -> str | None:
    if value is None:
        return None
    text = value.strip().upper()
    if not text.replace("_", "").isalpha() or len(text) > 32:
        raise click.BadParameter(f"not a Slurm job state: {value!r}", param_hint="--slurm-state")
    return text


def _gpus(value: str | None):
    from slurm_ft.classify.parse import normalise_bus_id

    if value is None:
        return None
    try:
        return frozenset(normalise_bus_id(b) for b in value.split(",") if b.strip())
    except SlurmFTError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpus") from None


@click.command("classify")
@click.argument("file", required=False, metavar="[FILE|-]")
@click.option("--kernel-log", "kernel_path", metavar="FILE",
              help="Kernel log (dmesg, syslog or /dev/kmsg text): trusted, parsed as the epilog does: "
                   "a record counts for hardware only when it begins with a kernel-owned header.")
@click.option("--output", "output_path", metavar="FILE",
              help="The job's stdout/stderr: untrusted; alone it never drains or resets (action 'verify').")
@click.option("--exit-code", type=click.IntRange(-255, 255), help="The job's exit code (0-255; -N = killed by signal N).")
@click.option("--signal", "signum", type=click.IntRange(1, 64), help="Signal that ended the job.")
@click.option("--slurm-state", help="Slurm's job state, e.g. NODE_FAIL, OUT_OF_MEMORY, TIMEOUT.")
@click.option("--gpus", metavar="BUSIDS", help="The job's GPUs as comma-separated PCI bus ids; Xids on other GPUs are ignored.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--eval", "eval_path", metavar="LABELLED.jsonl",
              help="Classify labelled cases (JSON Lines with id, text, expected) and report accuracy.")
@click.option("--config", "config_path", metavar="TOML",
              help="slurm-ft.toml whose [classify] policy to use (default: the usual lookup order).")
def classify_command(file: str | None, kernel_path: str | None, output_path: str | None, exit_code: int | None,
                     signum: int | None, slurm_state: str | None, gpus: str | None, as_json: bool,
                     eval_path: str | None, config_path: str | None) -> None:
    """Classify failure evidence: kernel log lines, job stderr and Slurm messages.

    Either FILE (or stdin when FILE is - or absent: one blob read as mixed evidence, for a quick
    look at a pasted log), or each evidence kind given as what it is: --kernel-log, --output,
    --exit-code, --signal, --slurm-state, --gpus. The second form applies the epilog's trust
    model exactly: job output alone never yields drain_node/reset_gpu (it says 'verify': the
    epilog would run the trusted GPU checks), and a kernel record counts for hardware only when it
    begins with the kernel's or driver's own header (after the log tool's timestamps): text a
    process or file name put into a record never does. Prints the verdict (hardware, user, infra, hang, unknown, ok), the
    deciding rule, the action, the Xids seen and the evidence lines. With --eval, classifies
    labelled cases instead and prints a confusion matrix, the misses, false_failover and
    missed_hardware. Exit status: 0 done, 1 error, 2 usage error.
    """
    from slurm_ft.classify.evaluate import evaluate, evidence_from_text, format_report, read_cases
    from slurm_ft.classify.engine import classify
    from slurm_ft.classify.model import Evidence

    kinds = any(v is not None for v in (kernel_path, output_path, exit_code, signum, slurm_state, gpus))
    if eval_path and (file or kinds):
        raise click.UsageError("give either --eval or evidence, not both")
    if file and kinds:
        raise click.UsageError("give either FILE (mixed evidence) or the evidence kinds (--kernel-log, --output, ...)")
    state = _slurm_state(slurm_state)
    bus_ids = _gpus(gpus)
    try:
        policy = _policy(config_path)
        if eval_path:
            text = _read_input(eval_path)
            result = evaluate(read_cases(text.splitlines(), eval_path), policy)
            click.echo(json.dumps(result, indent=2) if as_json else format_report(result))
            return
        if kinds:
            evidence = Evidence(kernel_lines=_read_input(kernel_path).splitlines() if kernel_path else (),
                                stderr_tail=_read_input(output_path) if output_path else "",
                                exit_code=exit_code, signal=signum, slurm_state=state, job_bus_ids=bus_ids,
                                kernel_records=False)  # a saved log: its log tool's wrappers are stripped
        else:
            evidence = evidence_from_text(_read_input(file))
        verdict = classify(evidence, policy)
    except SlurmFTError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(verdict.to_dict(), indent=2))
        return
    from slurm_ft.textsafe import terminal_safe

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
            click.echo(f"  {terminal_safe(line)}")
    if verdict.unplaced:
        click.echo("unplaced (name no GPU: the epilog would run the trusted node checks):")
        for line in verdict.unplaced:
            click.echo(f"  {terminal_safe(line)}")
