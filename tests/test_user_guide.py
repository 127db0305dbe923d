"""docs/user-guide.md cannot drift from what slurm-ft writes (issue 25).

The guide is built around what the job's owner sees, one screen per outcome, pasted from the lab
(tests/test_lab_user_view.py prints them with ``-s``). Here every such screen is read back and
checked against the code that writes it:

- each ``slurm-ft: ...`` line of a log in the guide is remade by the function that writes it
  (slurm_ft.failover.marker: the attempt markers, the give-up line, the hang block) from the
  values the line itself shows, and must come out the same, character for character;
- each ``slurm-ft:<state>`` (AdminComment, sacct), ``ft state <state>`` (ft-history) and
  ``slurm-ft wait`` answer names a state the code has, and ``exit N`` after ``slurm-ft wait`` is
  that state's exit code (slurm_ft.job.wait.EXIT_CODES);
- every outcome has its section with the three screens (Slurm's view, the log, ft-history).
"""

from __future__ import annotations

import calendar
import json
import re
import time
from pathlib import Path

import pytest

from slurm_ft.failover import marker, policy
from slurm_ft.job.wait import EXIT_CODES

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "user-guide.md"
#: The outcomes the guide shows, by the heading of their section.
OUTCOMES = ("Failover", "Your program's own error", "Retries used up", "Time-limit continuation", "Hang",
            "Image pull failure", "Cancelled")
#: AdminComment states besides the ft states: the submit hook's and a restarted attempt's.
ADMIN_WORDS = {"submitted", "restarted"}
STATES = {v for k, v in vars(policy).items() if k.isupper() and isinstance(v, str) and re.fullmatch(r"[a-z-]+", v)}


def blocks(text: str) -> list[str]:
    """The fenced code blocks of ``text`` (their bodies)."""
    return re.findall(r"^ *```[a-z]*\n(.*?)^ *```", text, re.S | re.M)


def marker_lines(text: str) -> list[list[str]]:
    """Runs of consecutive ``slurm-ft: `` lines in the guide's code blocks (a hang block is one run)."""
    runs = []
    for body in blocks(text):
        run: list[str] = []
        for line in body.splitlines() + [""]:
            if line.startswith("slurm-ft: "):
                run.append(line)
            elif run:
                runs.append(run)
                run = []
    return runs


def section(text: str, heading: str) -> str:
    m = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.M)
    assert m, f"docs/user-guide.md has no section {heading!r}"
    level = len(m.group(1))
    rest = text[m.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[:end.start()] if end else rest


# ------------------------------------------------------------------------------ remaking each line
def _restart(line: str) -> str:
    """The attempt marker remade by marker.restart_sentence (the SPANK plugin adds ``on NODE``)."""
    m = re.fullmatch(r"slurm-ft: attempt (\d+)(?:/(\d+))? on (\S+) after (.*); budget (\d+) left(; .*)?", line)
    assert m, f"not an attempt marker: {line}"
    n, _m, node, cause, left, tail = int(m[1]), m[2], m[3], m[4], int(m[5]), m[6] or ""
    ended = n - 2
    verdicts = []
    if cause == "a time-limit continuation (checkpoint saved)":
        actions = [{"action": "continue", "attempt": ended, "status": "done", "detail": "time limit"}]
        row = {"retries": left}
    elif cause.startswith("an evacuation ("):
        actions = [{"action": "evacuation", "attempt": ended, "status": "done", "detail": cause[15:-1]}]
        row = {"retries": left}
    else:
        hw = re.fullmatch(r"hardware fault \(Xid ([\d,]+)(?:, GPU (\S+))?\) on (\S+)", cause)
        other = re.fullmatch(r"(hang|infra|unknown)(?: fault)? \((.*)\) on (\S+)", cause)
        assert hw or other, f"unknown cause in {line}"
        if hw:
            xids = [{"xid": int(x), "bus_id": hw[2]} for x in hw[1].split(",")]
            verdicts = [{"verdict": "hardware", "rule": "xid", "xids": xids, "node": hw[3]}]
        else:
            verdicts = [{"verdict": other[1], "rule": other[2], "xids": [], "node": other[3]}]
        blamed = [] if "no node blamed" in tail else [verdicts[0]["node"]]
        actions = [{"action": "failover", "attempt": ended, "status": "done",
                    "detail": json.dumps({"reason": "r", "blamed": blamed})}]
        row = {"retries": left + 1}
    sentence = marker.restart_sentence(row, actions, lambda a: verdicts)
    words = sentence.split(" ", 2)
    return f"slurm-ft: {words[0]} {words[1]} on {node} {words[2]}"


def _give_up(line: str) -> str:
    m = re.fullmatch(r"slurm-ft: gave up after attempt (\d+): ([a-z-]+): (.*)", line)
    assert m, f"not a give-up line: {line}"
    kind = m[2]
    assert kind in marker.FIX, f"{kind!r}: slurm-ft gives up with no such state ({line})"
    fix = f"; {marker.FIX[kind]}"
    assert m[3].endswith(fix), f"the give-up line does not end with what the code says to do: {line}"
    return "slurm-ft: " + marker.give_up_sentence(kind, m[3][:-len(fix)], int(m[1]) - 1)


def _epoch(utc: str) -> float:
    return float(calendar.timegm(time.strptime(utc, "%Y-%m-%dT%H:%M:%SZ")))


def _head(text: str) -> tuple:
    m = re.fullmatch(r"hang on (\S+): no progress for (\d+) s \(window (\d+) s\); "
                     r"(?:last heartbeat (\S+), step (\d+)|no heartbeat); (.*)", text)
    assert m, f"not a hang line: {text}"
    beat = _epoch(m[4]) if m[4] else None
    return m[1], float(m[2]), float(m[3]), beat, int(m[5]) if m[5] else None, m[6]


def _hang(run: list[str]) -> list[str]:
    """A hang block remade by marker.hang_block from what it shows."""
    node, quiet, window, beat, step, action = _head(run[0][len("slurm-ft: "):])
    assert action in marker.HANG_ACTIONS.values(), f"the watcher never says {action!r}"
    dumps = []
    for line in run[1:]:
        body = line[len(marker.HANG_LEADER) + 2:]
        stack = re.fullmatch(r"stack of pid (\d+) \((.*)\), innermost first:", body)
        reason = re.fullmatch(r"pid (\d+) \((.*?)\): (.*)", body)
        if stack:
            dumps.append([int(stack[1]), stack[2], f"Thread {stack[1]} (idle)\n"])
        elif body.startswith("  ") and dumps:
            dumps[-1][2] += f"    {body[2:]}\n"
        else:
            assert reason, f"not a line of a hang block: {line}"
            dumps.append([int(reason[1]), reason[2], reason[3]])
    return marker.hang_block(node, quiet, window, beat, step, [tuple(d) for d in dumps], action).splitlines()


def remade(run: list[str]) -> list[str]:
    if run[0].startswith(marker.HANG_LEADER + " on "):
        return _hang(run)
    out = []
    for line in run:
        if line.startswith("slurm-ft: attempt "):
            out.append(_restart(line))
        elif line.startswith("slurm-ft: gave up "):
            out.append(_give_up(line))
        else:
            pytest.fail(f"docs/user-guide.md shows a line slurm-ft never writes: {line}")
    return out


# ------------------------------------------------------------------------------ the tests
def test_every_marker_line_in_the_guide_is_what_the_code_writes():
    runs = marker_lines(GUIDE.read_text())
    kinds = {r[0].split(" ", 3)[1] for r in runs}
    assert {"attempt", "gave", "hang"} <= kinds, kinds             # the guide shows all three kinds
    for run in runs:
        assert remade(run) == run


def test_every_state_the_guide_names_is_one_the_code_has():
    text = GUIDE.read_text()
    admin = set(re.findall(r"slurm-ft:([a-z][a-z-]*)", text))
    assert admin and admin <= STATES | ADMIN_WORDS, admin - STATES - ADMIN_WORDS
    shown = set(re.findall(r"\): ft state ([a-z][a-z-]*)", text))         # ft-history headings
    assert shown and shown <= STATES, shown - STATES
    for body in blocks(text):
        lines = body.splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"\$ .*slurm-ft wait (\d+)", line)
            if not m:
                continue
            answer = re.match(rf"{m[1]} ([a-z-]+)(?::|$)", lines[i + 1])
            assert answer and answer[1] in EXIT_CODES, lines[i + 1]
            assert lines[i + 2] == f"exit {EXIT_CODES[answer[1]]}", lines[i:i + 3]


def test_the_hang_summary_in_ft_history_is_the_watchers():
    text = section(GUIDE.read_text(), "Hang")
    lines = re.findall(r"^  attempt \d+: (hang on .*)$", text, re.M)
    assert lines, "the Hang section shows ft-history's hang line"
    for line in lines:
        node, quiet, window, beat, step, stack = _head(line)
        m = re.fullmatch(r"stack dump of (\d+) process(?:es)? \((\d+) frames?\) in the job's log|no stack dump", stack)
        assert m, line
        ranks, frames = (int(m[1]), int(m[2])) if m[1] else (0, 0)
        assert marker.hang_summary(node, quiet, window, beat, step, ranks, frames) == line


@pytest.mark.parametrize("heading", OUTCOMES)
def test_each_outcome_has_its_screens(heading):
    text = section(GUIDE.read_text(), heading)
    for what in ("$ scontrol show job", "$ cat ", "$ ft-history -j"):
        assert what in text, f"section {heading!r} lacks its {what!r} screen"
