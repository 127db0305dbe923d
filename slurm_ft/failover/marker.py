"""The sentence the job's owner reads about its attempts: in the job's AdminComment (``scontrol
show job``, ``sacct -o AdminComment``) and, through the SPANK plugin, as the first line of each
restarted attempt in the job's own output (``slurm-ft: attempt 2/4 on n2 after hardware fault
(Xid 79, GPU 0000:10:00) on n1; budget 2 left``).

Runs in the daemon (controller, root). Pure functions over journal rows; what they return is
shown on the user's terminal and parsed by the SPANK plugin (``slurm_ft_spank.c``,
``format_marker``), so every sentence passes :func:`clean`: printable ASCII only, one line, at
most :data:`MAX_CHARS` characters, no word that starts like the options record (``ft:``), the
AdminComment leader (``slurm-ft:``) or slurm-ft's own records (``slurm-ft-``). The sentence of
a restarted attempt starts with ``attempt N`` (N counts from 1; ``N/M`` when the retry budget
bounds it: M is the most attempts the job can still have); the plugin inserts ``on <node>`` after that number.

Sources of facts: the journal's ``jobs`` row (``retries``), its ``actions`` (``failover`` with
JSON detail ``{"reason", "blamed"}``, ``evacuation``, ``continue``) and the node verdicts of the
attempt that ended (class, rule, Xid codes and bus ids, node).
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Mapping

from slurm_ft.failover import policy

#: The most characters of a sentence (the SPANK plugin reads at most 511 of the AdminComment).
MAX_CHARS = 240
#: Journal actions that requeue a job (one per ended attempt that was restarted).
REQUEUES = ("failover", "evacuation", "continue")
#: What the owner can do, per final ft state (the give-up line and ``slurm-ft wait``'s message).
FIX = {
    policy.USER_ERROR: "the program failed by itself: fix it and resubmit (not retried)",
    policy.FAILED: "no fault found: see the job's log and ft-history, then resubmit",
    policy.MAX_RETRIES: "retry budget used up: see ft-history for each attempt's fault; resubmit, "
                        "or ask for more with --ft-retries",
    policy.INTERNAL_ERROR: "slurm-ft could not requeue it: tell your admins (ft-history has the step)",
    policy.TIMEOUT: "time limit reached without a saved checkpoint: save on the checkpoint signal "
                    "or ask for a longer --time",
    policy.HELD: "held by slurm-ft: it cannot run with the faulty node excluded; ask your admins",
    policy.IMAGE_PULL_FAILED: "the container image could not be imported: check the image name, the registry's "
                              "credentials and reachability, then resubmit",
}

_UNSAFE = re.compile(r"[^\x20-\x7e]")


def clean(text: str, limit: int = MAX_CHARS) -> str:
    """``text`` as one printable-ASCII line of at most ``limit`` characters (anything else is
    ``?``, runs of spaces are one), with no word starting ``ft:`` or ``slurm-ft:`` (such a word
    would be read as the job's options record: its colon becomes ``;``) or ``slurm-ft-`` (a
    record slurm-ft keeps after the options; becomes ``slurm-ft_``)."""
    words = []
    for w in _UNSAFE.sub("?", str(text)).split():
        if w.startswith(("ft:", "slurm-ft:")):
            w = w.replace(":", ";", 1)
        elif w.startswith("slurm-ft-"):     # slurm-ft's own records after the options (intent)
            w = "slurm-ft_" + w[len("slurm-ft-"):]
        words.append(w)
    out = " ".join(words)
    return out if len(out) <= limit else out[:limit - 3].rstrip() + "..."


def cause(verdicts: Iterable[Mapping], reason: str = "") -> str:
    """What ended an attempt, from its node verdicts (dicts or NodeVerdicts with ``verdict``,
    ``rule``, ``xids``, ``node``): ``hardware fault (Xid 79, GPU 0000:10:00) on n1``, ``hang
    (no-progress) on n1``, ``infra fault (rule) on n2``; ``reason`` (the decision's) when no
    verdict names one."""
    order = {"hardware": 0, "hang": 1, "infra": 2, "unknown": 3}
    faults = sorted((v for v in verdicts if v["verdict"] in order), key=lambda v: order[v["verdict"]])
    if not faults:
        return reason or "an unexplained end"
    v = faults[0]
    nodes = sorted({x["node"] for x in faults if x["verdict"] == v["verdict"] and x["node"]})
    where = f" on {','.join(nodes[:4])}" if nodes else ""
    xids = [x for x in v["xids"] or [] if isinstance(x, Mapping) and "xid" in x]
    if xids:
        codes = ",".join(dict.fromkeys(str(x["xid"]) for x in xids))
        bus = next((x["bus_id"] for x in xids if x.get("bus_id")), None)
        return f"hardware fault (Xid {codes}{', GPU ' + bus if bus else ''}){where}"
    rule = str(v["rule"] or "")
    if v["verdict"] == "hang":
        return f"hang ({rule or 'no progress'}){where}"
    return f"{v['verdict']} fault ({rule}){where}" if rule else f"{v['verdict']} fault{where}"


def failovers_spent(actions: Iterable[Mapping]) -> int:
    """Failovers that count against the budget: attempts with a ``failover`` action not failed."""
    return len({a["attempt"] for a in actions if a["action"] == "failover" and a["status"] != "failed"})


def restart_sentence(row: Mapping | None, actions: list[Mapping], verdicts_of) -> str | None:
    """The sentence of the attempt slurm-ft's last requeue starts, or None when it never requeued
    the job. ``row``: the journal's jobs row; ``actions``: the job's journal actions (oldest
    first); ``verdicts_of(attempt)``: that attempt's node verdicts."""
    last = next((a for a in reversed(actions) if a["action"] in REQUEUES and a["status"] != "failed"), None)
    if last is None:
        return None
    ended = int(last["attempt"])
    number = ended + 2          # attempts count from 1; the requeue starts the next one
    retries = int((row or {}).get("retries") or 0)
    left = max(0, retries - failovers_spent(a for a in actions if a["attempt"] <= ended))
    budget = f"budget {left} left"
    if last["action"] == "failover":
        try:
            detail = json.loads(last["detail"] or "{}")
        except ValueError:      # an evacuation journaled as a failover by an older daemon
            detail = {"reason": last["detail"] or "", "blamed": ["?"]}
        detail = detail if isinstance(detail, dict) else {}
        text = f"attempt {number}/{number + left} after {cause(verdicts_of(ended), str(detail.get('reason') or ''))}"
        text += f"; {budget}"
        if not detail.get("blamed"):
            text += "; no node blamed, so it waits out Slurm's requeue delay (about 2 min) before it starts"
    elif last["action"] == "continue":
        text = f"attempt {number} after a time-limit continuation (checkpoint saved); {budget}"
    else:
        why = str(last["detail"] or "an evacuation")
        text = f"attempt {number} after an evacuation ({why}); {budget}"
    return clean(text)


def give_up_sentence(kind: str, reason: str, attempt: int) -> str:
    """The last word on a job slurm-ft will not start again: ``gave up after attempt 3:
    max-retries-exceeded: <reason>; <what to do>`` (``attempt``: the ended attempt, from 0)."""
    fix = FIX.get(kind)
    return clean(f"gave up after attempt {attempt + 1}: {kind}: {reason}" + (f"; {fix}" if fix else ""), 400)


def journal_sentence(journal, job_id: int) -> str | None:
    """:func:`restart_sentence` for ``job_id`` from the daemon's journal."""
    return restart_sentence(journal.job(job_id), journal.actions(job_id),
                            lambda attempt: journal.node_verdicts(job_id, attempt))


# ------------------------------------------------------------------------------ a hang, in the job's log
#: What the hang watcher writes into the job's own output (as the job's user) when it ends a hung
#: attempt: at most this many characters in all, :data:`HANG_FRAMES` frames of at most
#: :data:`FRAME_CHARS` characters for each of at most :data:`HANG_RANKS` processes.
HANG_BLOCK_CHARS = 2000
HANG_FRAMES, FRAME_CHARS, HANG_RANKS = 5, 160, 2
#: The first words of every line of the hang block (the guide's screens are checked against them).
HANG_LEADER = "slurm-ft: hang"
#: What the watcher does next, as the block's first line ends (by ``[hang] act`` and whether
#: ``slurm-ft run`` marked the job's heartbeat directory).
HANG_ACTIONS = {
    "requeue": "ending the job's processes: slurm-ft decides whether it runs again",
    "inplace": "ending the step's tasks: slurm-ft run restarts the step here",
    "observe": "the job is left running ([hang] act = false)",
}


def utc(epoch: float | None) -> str:
    """``2026-12-02T06:20:01Z`` (UTC), or ``unknown`` for a time that is not one."""
    import math
    import time as _time

    if epoch is None or not isinstance(epoch, (int, float)) or not math.isfinite(epoch) or not 0 <= epoch < 2 ** 33:
        return "unknown"
    return _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime(epoch))


def _safe_line(text: str, limit: int) -> str:
    """One line of printable ASCII: controls and non-ASCII escaped (``\\x1b``, ``\\u202e``),
    never cut inside an escape's meaning beyond ``limit`` characters (ends in ``...``)."""
    from slurm_ft.textsafe import terminal_safe

    out = terminal_safe(" ".join(str(text).split())).encode("ascii", "backslashreplace").decode("ascii")
    return out if len(out) <= limit else out[:limit - 3] + "..."


def top_frames(dump: str, n: int = HANG_FRAMES) -> list[str]:
    """The innermost ``n`` frames of the first thread of a ``py-spy dump`` (``Thread ...`` header,
    then one indented ``function (file:line)`` line per frame, innermost first), each
    :func:`_safe_line` of at most :data:`FRAME_CHARS`; [] when ``dump`` holds none (a reason
    line such as ``no stack dump: py-spy is not installed``). ``dump`` is the job's own text
    (function and file names): never trusted, never more than its first 64 KiB looked at."""
    frames, in_thread = [], False
    for line in str(dump)[:1 << 16].splitlines():
        if line.startswith("Thread "):
            if in_thread and frames:
                break
            in_thread = True
            continue
        if in_thread and line[:1] in (" ", "\t") and line.strip():
            frames.append(_safe_line(line.strip(), FRAME_CHARS))
            if len(frames) >= n:
                break
        elif in_thread and frames:
            break
    return frames


def _hang_head(node: str, quiet_s: float, window_s: float, beat_at: float | None, beat_step: int | None) -> str:
    beat = (f"last heartbeat {utc(beat_at)}, step {int(beat_step)}" if beat_at is not None and beat_step is not None
            else "no heartbeat")
    return f"hang on {node}: no progress for {quiet_s:.0f} s (window {window_s:.0f} s); {beat}"


def hang_summary(node: str, quiet_s: float, window_s: float, beat_at: float | None, beat_step: int | None,
                 ranks: int, frames: int) -> str:
    """One line about a hang that names nothing the job wrote but numbers: the verdict's
    evidence that travels in the node's mailbox record (Slurm's node field, readable by every
    user: no function or file name goes there). ``beat_at``: the last heartbeat (epoch s, None:
    the job beat none); ``ranks``/``frames``: processes dumped, frames found."""
    stack = (f"stack dump of {ranks} process{'es' if ranks != 1 else ''} ({frames} frame{'s' if frames != 1 else ''}) "
             f"in the job's log"
             if frames else "no stack dump")
    return clean(f"{_hang_head(node, quiet_s, window_s, beat_at, beat_step)}; {stack}", 300)


def hang_block(node: str, quiet_s: float, window_s: float, beat_at: float | None, beat_step: int | None,
               dumps, action: str) -> str:
    """The lines the hang watcher appends to the job's own output when it ends a hung attempt
    (each starts ``slurm-ft: hang``; newline-terminated; at most :data:`HANG_BLOCK_CHARS`
    characters, printable ASCII only)::

        slurm-ft: hang on n1: no progress for 62 s (window 60 s); last heartbeat 2026-12-02T06:20:01Z, step 2; ...
        slurm-ft: hang: stack of pid 4242 (python3), innermost first:
        slurm-ft: hang:   sleep (train.py:55)

    ``dumps``: (pid, process name, py-spy dump text or its one-line reason) per process, the
    watcher's order; ``action``: what happens next (``the job's processes are ended: it is
    requeued``)."""
    lines = [f"slurm-ft: {clean(_hang_head(node, quiet_s, window_s, beat_at, beat_step), 300)}; {clean(action, 200)}"]
    for pid, comm, dump in list(dumps)[:HANG_RANKS]:
        frames = top_frames(dump)
        who = f"pid {int(pid)} ({_safe_line(comm, 32)})"
        if frames:
            lines.append(f"{HANG_LEADER}: stack of {who}, innermost first:")
            lines += [f"{HANG_LEADER}:   {f}" for f in frames]
        else:
            lines.append(f"{HANG_LEADER}: {who}: {_safe_line(dump, FRAME_CHARS)}")
    out, used = [], 0
    for line in lines:
        if used + len(line) + 1 > HANG_BLOCK_CHARS:
            break
        out.append(line)
        used += len(line) + 1
    return "".join(f"{line}\n" for line in out)
