"""``ft-history``'s command line (click only): sacct's options parsed and checked, the
selection handed to :mod:`slurm_ft.history.query` (or, for a user who cannot read the journal, to
the history service through :mod:`slurm_ft.history.client`), the result printed through
:mod:`slurm_ft.history.format`. Library errors become ``Error: ...``; no traceback reaches the user.

Runs anywhere, as any user (``ft-history`` on a login node, root on the controller)."""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import time

import click

from slurm_ft import config as config_mod
from slurm_ft.errors import SlurmFTError
from slurm_ft.failover import daemonlock
from slurm_ft.history import format as fmt
from slurm_ft.history import query
from slurm_ft.history.query import (MAX_NODES, Rendered, Selection, fold_nodes, memo_kind,
                                    node_steps, not_in_journal, parse_job_ids, parse_nodelist, parse_states,
                                    select)
from slurm_ft.journal import open_journal
from slurm_ft.slurm.timespec import parse_time
from slurm_ft.textsafe import terminal_safe

class _Parsed(click.ParamType):
    """An option value parsed by ``parse`` (text -> value; its ValueError becomes click's usage
    error, the message terminal-safe). A value of type ``done`` is already parsed (click converts
    a default or a repeated option's value again) and passes as it is."""

    def __init__(self, name: str, parse, done: type):
        self.name, self._parse, self._done = name, parse, done

    def convert(self, value, param, ctx):
        if isinstance(value, self._done):
            return value
        try:
            return self._parse(str(value))
        except ValueError as exc:
            self.fail(terminal_safe(str(exc)), param, ctx)


_JOB_IDS = _Parsed("JOBID[_TASK][,...]", parse_job_ids, list)
_NODES = _Parsed("NODES", parse_nodelist, frozenset)
_TIME = _Parsed("TIME", parse_time, float)
_STATES = _Parsed("STATE[,STATE...]", parse_states, frozenset)
_FORMAT = _Parsed("FIELD[%WIDTH],...", fmt.parse_format, list)


class _Users(click.ParamType):
    name = "USER[,USER...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        names = []
        for item in str(value).split(","):
            item = item.strip()
            if item.isdigit():
                names.append(fmt.user_name(item))
            elif re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}\$?", item):
                names.append(item)
            else:
                self.fail(terminal_safe(f"{item!r} is not a user name or uid"), param, ctx)
        return names


class _Accounts(click.ParamType):
    name = "ACCOUNT[,ACCOUNT...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        names = [item.strip(" ") for item in str(value).split(",")]
        for item in names:
            # printable ASCII without spaces and commas (Slurm's account names); never a control character
            if not re.fullmatch(r"[!-+\--~]{1,64}", item):
                self.fail(terminal_safe(f"{item!r} is not a Slurm account name"), param, ctx)
        return [n.lower() for n in names]


class _Delimiter(click.ParamType):
    name = "CHARACTERS"

    def convert(self, value, param, ctx):
        try:
            return fmt.check_delimiter(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _helpformat(ctx, param, value):
    if value and not ctx.resilient_parsing:
        click.echo(fmt.helpformat())
        ctx.exit(0)


def _midnight(now: float) -> float:
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


@click.command(name="ft-history")
@click.option("-j", "--jobs", "job_ids", type=_JOB_IDS, multiple=True,
              help="Job ids, comma-separated; repeatable. As sacct: an array's id selects all its tasks, "
                   "ID_TASK one task, ID_[1-3,5] several. Without -j: every ft job in the time window.")
@click.option("-u", "--user", "--uid", "users", type=_Users(), multiple=True,
              help="Only these users' jobs (names or uids, comma-separated; repeatable). Default: your own "
                   "(root and SlurmUser: everyone's). With Slurm PrivateData=jobs you see only your own.")
@click.option("-a", "--allusers", "all_users", is_flag=True,
              help="Every user's jobs (as far as Slurm PrivateData lets you see them).")
@click.option("-A", "--accounts", "--account", "accounts", type=_Accounts(), multiple=True,
              help="Only jobs of these Slurm accounts (comma-separated; repeatable; case-insensitive, as Slurm "
                   "keeps accounts in lower case). Combines with -u/-a: still only jobs you may see.")
@click.option("-N", "--nodelist", "nodelist", type=_NODES, multiple=True,
              help="Only jobs with an attempt, a verdict or an action on these nodes in the time window (a Slurm "
                   "hostlist, g[001-004],n1; repeatable); combines with -u/-a/-A/-s/-j. After the jobs, each "
                   "node's drains and repair steps (in --json: the \"nodes\" key; not with -p/-P).")
@click.option("-S", "--starttime", "start", type=_TIME,
              help="Jobs active at or after this time (Slurm time formats: YYYY-MM-DD[THH:MM[:SS]], "
                   "MMDD[YY], now-2days, ...). Default: 00:00 today; with -j: no limit.")
@click.option("-E", "--endtime", "end", type=_TIME, help="Jobs active at or before this time. Default: now.")
@click.option("-s", "--state", "states", type=_STATES, multiple=True,
              help="Only jobs in these ft states (completed, max-retries-exceeded, ...) or with an attempt in "
                   "these Slurm states (FAILED, NF, RQ, ...); comma-separated.")
@click.option("-o", "--format", "columns", type=_FORMAT,
              help=f"Fields to print, comma-separated, FIELD%N for a width (negative: left-justified), or ALL. "
                   f"Default: {fmt.CHAIN_FORMAT} under each job; with -X: {fmt.JOB_FORMAT}; with -p, -P, "
                   f"-X -D: {fmt.LIST_FORMAT}.")
@click.option("-e", "--helpformat", is_flag=True, expose_value=False, is_eager=True, callback=_helpformat,
              help="List the fields -o accepts and exit.")
@click.option("-p", "--parsable", is_flag=True,
              help="'|'-separated output (see --delimiter), with a '|' at the end of each line.")
@click.option("-P", "--parsable2", is_flag=True, help="'|'-separated output (see --delimiter), no '|' at the end.")
@click.option("--delimiter", type=_Delimiter(),
              help="Field separator of -p/-P output instead of '|' (as sacct: ignored without -p or -P): 1 to 16 "
                   "ASCII punctuation characters, spaces or tabs. Such a character inside a value is written \\xNN.")
@click.option("--detail", is_flag=True,
              help="Each attempt's evidence: under its row, the lines that decided each verdict (NODE VERDICT "
                   "(RULE): LINE); with -p, -P or -X the Evidence field is added instead (lines joined by \\x0a).")
@click.option("-n", "--noheader", is_flag=True, help="No column header.")
@click.option("-X", "--allocations", is_flag=True, help="One row per job: no attempt rows.")
@click.option("-D", "--duplicates", is_flag=True,
              help="Every attempt as a row of its own: with -X one row per attempt; attempts outside the time "
                   "window or (with Slurm states in -s) in another state are left out.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON (every field, every attempt); -o, -p, -P, -n and -X are ignored.")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False),
              help="Journal file (default: [journal] path of the config).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Config file (default: $SLURM_FT_CONFIG, slurm-ft.toml beside $SLURM_CONF, "
                   "/etc/slurm-ft/slurm-ft.toml).")
def command(job_ids, users, all_users: bool, accounts, nodelist, start: float | None, end: float | None, states,
            columns, parsable: bool, parsable2: bool, delimiter: str | None, detail: bool, noheader: bool,
            allocations: bool, duplicates: bool, as_json: bool, journal_path: str | None,
            config_path: str | None) -> None:
    """Show fault-tolerant jobs and their retry chains: under each job one row per attempt (nodes,
    times, Slurm state, verdict, Xids, checkpoint, what slurm-ft did). sacct's options and time
    formats. Reads the journal only."""
    if parsable and parsable2:
        raise click.UsageError("use -p/--parsable or -P/--parsable2, not both")
    now = time.time()
    ids = tuple(i for group in job_ids for i in group)
    if start is None:
        start = 0.0 if ids else _midnight(now)
    if end is not None and start > end:
        raise click.UsageError(f"start time {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(start))} is after "
                               f"end time {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(end))}")
    sel = Selection(job_ids=ids, users=frozenset(u for g in users for u in g) if users else None,
                    all_users=all_users, start=start, end=end,
                    states=frozenset(s for g in states for s in g), duplicates=duplicates,
                    accounts=frozenset(a for g in accounts for a in g) if accounts else None,
                    nodes=frozenset(n for g in nodelist for n in g) if nodelist else None)
    if sel.nodes is not None and len(sel.nodes) > MAX_NODES:
        raise click.UsageError(f"-N: more than {MAX_NODES} nodes")
    steps = None
    try:
        # root with --journal needs no config; anyone else needs [slurm] to ask Slurm's PrivateData
        root_with_path = journal_path and not config_path and os.getuid() == 0
        cfg = None if root_with_path else config_mod.load(config_path)
        path = journal_path or cfg.journal.path
        from slurm_ft.history import client as history_client
        remote = cfg is not None and history_client.wanted(path, bool(journal_path))  # controller answers
        if remote:
            found, error, warnings, steps = history_client.select(cfg, sel)
            waiting = 0
            for w in warnings:
                click.echo(terminal_safe(f"ft-history: warning: {w}"), err=True)
            if sel.nodes is not None and steps is None and not (parsable or parsable2):
                click.echo("ft-history: note: the history service did not send the nodes' drains and repairs "
                           "(ask an admin, or update slurm-ft)", err=True)
        else:
            with open_journal(path, readonly=True) as journal:
                viewer = query.current_viewer(cfg)   # through the module: tests stand in a viewer
                memo = memo_kind(columns=columns, parsable=parsable or parsable2, delimiter=delimiter,
                                 header=not noheader, allocations=allocations, detail=detail, as_json=as_json,
                                 sel=sel)
                found, missing = select(journal, sel, viewer=viewer, now=now, memo=memo)
                error = not_in_journal(journal, missing, viewer) if missing else None
                if sel.nodes is not None:
                    steps = node_steps(journal, sel.nodes, sel.start, now if sel.end is None else sel.end, viewer)
                waiting = journal.waiting_rows
    except SlurmFTError as exc:
        raise click.ClickException(terminal_safe(str(exc))) from None
    poll = cfg.failover.poll_interval_s if cfg is not None else config_mod.FailoverConfig().poll_interval_s
    daemon_state, age = ("fresh", 0.0) if remote else daemonlock.staleness(path, poll, now)
    if daemon_state == "stale":
        click.echo(terminal_safe(f"ft-history: warning: the slurm-ft daemon has not run for {age:.0f} s (heartbeat "
                                 f"{daemonlock.heartbeat_path(path)}): the journal may be behind Slurm"), err=True)
    from slurm_ft.journal import (  # a full disk, a read-only remount: rows may wait unwritten (issue 20)
        trouble)
    if not remote and ((jt := trouble.check_writable(path)) is not None or waiting):
        why = f"its filesystem is {jt}" if jt else f"{waiting} row(s) wait in its spool"
        click.echo(terminal_safe(f"ft-history: warning: journal {path}: {why}: the newest decisions may not be "
                                 f"shown yet (the daemon keeps them and writes them when it can)"), err=True)
    if error is not None and daemon_state != "fresh":
        why = (f"it has not run for {age:.0f} s" if daemon_state == "stale" else "no heartbeat") + \
            f" ({daemonlock.heartbeat_path(path)})"
        error = SlurmFTError(f"{error}; the slurm-ft daemon may be down: {why}, and a job it has not seen yet is not "
                             f"in the journal")
    if as_json:
        # ensure_ascii: control characters (and all non-ASCII) become \uXXXX escapes, valid JSON
        if sel.nodes is not None:    # -N --json: {"jobs": [...], "nodes": {node: [step, ...]}} (null: not sent)
            click.echo(json.dumps({"jobs": found, "nodes": steps}, indent=2, ensure_ascii=True))
        elif len(set(ids)) == 1 and len(found) <= 1:   # ft-history -j ID --json: the job's object, as always
            if found:
                click.echo(json.dumps(found[0], indent=2, ensure_ascii=True))
        else:
            click.echo(json.dumps(found, indent=2, ensure_ascii=True))
    else:
        text = _render(found, columns, parsable=parsable or parsable2, trailing=parsable, header=not noheader,
                       allocations=allocations, duplicates=duplicates, now=now, delimiter=delimiter or "|",
                       detail=detail)
        if text:
            click.echo(text)
        if sel.nodes is not None and steps is not None and not (parsable or parsable2):
            # after the job table: each node's drains and repairs (machine output stays one table)
            if text:
                click.echo("")
            click.echo(fmt.node_sections(steps, fold_nodes(sel.nodes)))
    if error is not None:
        raise click.ClickException(terminal_safe(str(error)))


def _render(found: list[dict], columns, *, parsable: bool, trailing: bool, header: bool, allocations: bool,
            duplicates: bool, now: float, delimiter: str = "|", detail: bool = False) -> str:
    if not parsable and not allocations:
        return "\n\n".join(h if isinstance(h, Rendered) else fmt.chain(h, columns, header=header, now=now,
                                                                       detail=detail) for h in found)
    job_rows, attempt_rows = (False, True) if allocations and duplicates else (True, not allocations)
    cols = columns or fmt.parse_format(fmt.JOB_FORMAT if allocations and not duplicates and not parsable
                                       else fmt.LIST_FORMAT)
    if detail and not any(c.field.name == "Evidence" for c in cols):
        cols = [*cols, fmt.Column(fmt.BY_NAME["evidence"])]
    if parsable and any(isinstance(h, Rendered) for h in found):
        # the memo's -P lines (default columns, "|") between the lines of jobs rendered now, in order
        end = delimiter if trailing else ""
        lines = fmt.parsable(cols, [], header=header, trailing=trailing, delimiter=delimiter)
        for h in found:
            if isinstance(h, Rendered):
                lines.append(h.replace("\n", end + "\n") + end)
            else:
                lines += fmt.parsable(cols, fmt.rows(h, job_row=job_rows, attempts=attempt_rows, now=now),
                                      header=False, trailing=trailing, delimiter=delimiter)
        return "\n".join(lines)
    rows = [r for h in found for r in fmt.rows(h, job_row=job_rows, attempts=attempt_rows, now=now)]
    lines = fmt.parsable(cols, rows, header=header, trailing=trailing, delimiter=delimiter) if parsable else \
        fmt.table(cols, rows, header=header)
    return "\n".join(lines)


def main() -> None:
    # a short-lived reader that builds one large acyclic structure (a 30-day window: ~100,000
    # rows): the cyclic garbage collector's passes over it cost a third of the run
    # (benchmarks/history_scale.py), and it frees nothing here
    gc.disable()
    command(prog_name="ft-history")


if __name__ == "__main__":
    sys.exit(main())
