"""``ft-history``: a job's retry chain, one row per attempt, from the daemon's journal.

Privacy: when Slurm's ``PrivateData`` includes ``jobs``, a user other than root and SlurmUser
sees only their own jobs (the journal's ``jobs.user``), as ``squeue`` would show them. Every
text field printed is passed through :func:`slurm_ft.textsafe.terminal_safe` (``--json`` is
ASCII JSON, which escapes control characters itself).
"""

from __future__ import annotations

import json
import os
import pwd
import sys
import time
from dataclasses import dataclass

import click

from . import config as config_mod
from .errors import SlurmFTError
from .failover import policy
from .journal import open_journal
from .textsafe import terminal_safe


@dataclass(frozen=True)
class Viewer:
    """Who runs ft-history, and whether Slurm hides other users' jobs from them."""

    uid: int
    user: str
    #: Slurm's ``PrivateData`` includes ``jobs`` (or could not be read: fail closed).
    private_jobs: bool
    slurm_user: str = "root"

    @property
    def sees_all(self) -> bool:
        return self.uid == 0 or not self.private_jobs or self.user in ("root", self.slurm_user)

    def may_see(self, job: dict | None) -> bool:
        return self.sees_all or bool(job and job.get("user") and job["user"] == self.user)


def current_viewer(cfg, uid: int | None = None, slurm=None) -> Viewer:
    """The calling user (real uid) and Slurm's ``PrivateData``/``SlurmUser``, read once with
    ``scontrol show config`` (not asked for root). If Slurm cannot be asked, a non-root user is
    treated as under ``PrivateData=jobs``."""
    uid = os.getuid() if uid is None else uid
    if uid == 0:
        return Viewer(0, "root", False)
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    from .slurm import Slurm, private_data
    try:
        timeout_s = cfg.slurm.command_timeout_s if cfg is not None else config_mod.SlurmConfig().command_timeout_s
        conf = (slurm or Slurm(bin_dir=_trusted_bin_dir(cfg), timeout_s=timeout_s)).show_config()
    except SlurmFTError:
        return Viewer(uid, user, True)
    return Viewer(uid, user, "jobs" in private_data(conf), conf.get("SlurmUser", "root").split("(")[0] or "root")


def _trusted_bin_dir(cfg) -> str:
    """``[slurm] bin_dir`` of a config only root can change; else the default. A user's own
    ``--config``/``$SLURM_FT_CONFIG`` must not pick the ``scontrol`` that answers PrivateData."""
    default = config_mod.SlurmConfig().bin_dir
    if cfg is None or cfg.source is None:
        return default if cfg is None else cfg.slurm.bin_dir
    try:
        st = os.stat(cfg.source)
    except OSError:
        return default
    return cfg.slurm.bin_dir if st.st_uid == 0 and not st.st_mode & 0o022 else default


def history(journal, job_id: int, viewer: Viewer | None = None) -> dict:
    """``{"job_id", "name", "ft_state", "retries", "attempts": [...]}``; each attempt has
    ``attempt, nodes, start, end, state, verdict, rule, xids, action`` (times epoch seconds).
    ``viewer``: who asks (None: no restriction); a job ``viewer`` may not see is reported as
    not in the journal, exactly like an unknown one."""
    job = journal.job(job_id)
    if viewer is not None and not viewer.sees_all:
        hidden = ", or not yours (Slurm PrivateData=jobs)"
        if not viewer.may_see(job):
            job = None
    else:
        hidden = ""
        if job is None and journal.verdicts(job_id):
            job = {"name": None, "ft_state": "not-configured", "retries": None, "excluded_nodes": None}
    if job is None:
        raise SlurmFTError(f"job {job_id} is not in the journal {journal.path} (not ft-enabled, or unknown{hidden})")
    rows = []
    recorded = {a["attempt"]: a for a in journal.attempts(job_id)}
    # an attempt that never ran (a prolog health check refused the node) has verdicts/actions only
    numbers = set(recorded) | {v["attempt"] for v in journal.verdicts(job_id)} | \
        {x["attempt"] for x in journal.actions(job_id)}
    for n in sorted(numbers):
        verdicts = journal.verdicts(job_id, n)
        refused = any(v["rule"].startswith(policy.HEALTH_RULE) for v in verdicts)
        a = recorded.get(n) or {"attempt": n, "nodes": None, "start": None, "end": None,
                                "state": "PROLOG_REFUSED" if refused else "NOT_STARTED",
                                "exit_code": None, "signal": None}
        actions = [x for x in journal.actions(job_id, n) if x["status"] != "intent"]
        if a["nodes"] is None and verdicts:
            a["nodes"] = ",".join(sorted({v["node"] for v in verdicts}))
        worst = next((v for c in ("hardware", "hang", "infra", "user", "unknown", "ok")
                      for v in verdicts if v["verdict"] == c), None)
        rows.append({
            "attempt": a["attempt"], "nodes": a["nodes"], "start": a["start"], "end": a["end"],
            "state": a["state"], "exit_code": a["exit_code"], "signal": a["signal"],
            "verdict": worst["verdict"] if worst else None, "rule": worst["rule"] if worst else None,
            "xids": sorted({f"{x['xid']}@{x.get('bus_id') or '?'}" for v in verdicts for x in v["xids"]}),
            "verdicts": [{k: v[k] for k in ("node", "verdict", "rule", "xids", "evidence")} for v in verdicts],
            "checkpoint": _checkpoint(actions),
            "action": _summarise(actions),
            "actions": [{k: x[k] for k in ("action", "target", "detail", "status", "created")} for x in actions],
        })
    return {"job_id": job_id, "name": job["name"], "ft_state": job["ft_state"], "retries": job["retries"],
            "excluded_nodes": job["excluded_nodes"], "attempts": rows}


def _checkpoint(actions: list[dict]) -> dict | None:
    """The attempt's exit checkpoint (slurm_ft/checkpoint/evacuate.py): result, step, path."""
    ckpt = [x for x in actions if x["action"].startswith("ckpt-")]
    if not ckpt:
        return None
    last = ckpt[-1]
    out: dict = {"result": "notified", "step": None, "path": None, "detail": last["detail"]}
    if last["action"] == "ckpt-ack":
        words = last["detail"].split()
        out["result"] = words[0] if words else "?"
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key == "step" and value.isdigit():
                out["step"] = int(value)
            elif key == "path":
                out["path"] = value
    elif last["action"] == "ckpt-timeout":
        out["result"] = "timeout"
    return out


def _ckpt_cell(c: dict | None) -> str:
    if not c:
        return "-"
    text = c["result"]
    if c["step"] is not None:
        text += f" @{c['step']}"
    if c["path"]:
        text += f" {c['path']}"
    return text


def _summarise(actions: list[dict]) -> str:
    parts = []
    for x in actions:
        if x["action"] == "drain" and x["status"] == "done":
            parts.append(f"drain {x['target']}")
        elif x["action"] in ("requeue", "release") and x["status"] == "done":
            parts.append(x["action"])
        elif x["action"] == "decide":
            parts.append(x["detail"])  # e.g. "internal-error: not a hardware fault: xid-13 on n2"
        elif x["action"] == "ckpt-timeout":
            parts.append("checkpoint wait expired")
        elif x["status"] == "failed":
            parts.append(f"{x['action']} failed")
    return ", ".join(parts) or "-"


def _t(ts) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) if ts else "-"


def render_table(h: dict) -> str:
    """The human table; every cell is terminal-safe (journal text is partly user-controlled)."""
    head = ("ATTEMPT", "NODES", "START", "END", "STATE", "VERDICT", "XIDS", "CHECKPOINT", "ACTION")
    rows = [tuple(terminal_safe(c) for c in (
                str(a["attempt"]), a["nodes"] or "-", _t(a["start"]), _t(a["end"]), a["state"] or "-",
                f"{a['verdict']} ({a['rule']})" if a["verdict"] else "-", ",".join(a["xids"]) or "-",
                _ckpt_cell(a.get("checkpoint")), a["action"]))
            for a in h["attempts"]]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    budget = f", retries {h['retries']}" if h["retries"] is not None else ""
    lines = [terminal_safe(f"Job {h['job_id']} ({h['name'] or '-'}): ft state {h['ft_state']}{budget}")]
    for r in [head, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


@click.command(name="ft-history")
@click.option("-j", "--jobs", "job_id", type=click.IntRange(min=1), required=True, help="Job id to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False),
              help="Journal file (default: [journal] path of the config).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Config file (default: $SLURM_FT_CONFIG, slurm-ft.toml beside $SLURM_CONF, "
                   "/etc/slurm-ft/slurm-ft.toml).")
def command(job_id: int, as_json: bool, journal_path: str | None, config_path: str | None) -> None:
    """Show a fault-tolerant job's retry chain: one row per attempt (nodes, times, Slurm state,
    verdict, Xids, what slurm-ft did). Reads the journal only."""
    try:
        # root with --journal needs no config; anyone else needs [slurm] to ask Slurm's PrivateData
        root_with_path = journal_path and not config_path and os.getuid() == 0
        cfg = None if root_with_path else config_mod.load(config_path)
        path = journal_path or cfg.journal.path
        with open_journal(path, readonly=True) as journal:
            h = history(journal, job_id, viewer=current_viewer(cfg))
    except SlurmFTError as exc:
        raise click.ClickException(terminal_safe(str(exc))) from None
    # ensure_ascii: control characters (and all non-ASCII) become \uXXXX escapes, valid JSON
    click.echo(json.dumps(h, indent=2, ensure_ascii=True) if as_json else render_table(h))


def main() -> None:
    command(prog_name="ft-history")


if __name__ == "__main__":
    sys.exit(main())
