"""What the job's owner reads (issue 25), without the lab: the marker sentence (slurm_ft.failover.
marker), its safety for the user's terminal and for the AdminComment record, ``slurm-ft wait``'s
reading of Slurm (slurm_ft.job.wait), the give-up line appended as the user (slurm_ft.node.userfile)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_ft.failover import jobspec, marker, policy
from slurm_ft.failover.options import admin_comment
from slurm_ft.node.userfile import UserFileError, append_line
from slurm_ft.job.wait import EXIT_CODES, ft_word, look

TOKEN = "ft:retries=3,ckpt_signal=USR1,ckpt_wait=600,hang_timeout=0"
XID = {"verdict": "hardware", "rule": "xid-79", "xids": [{"xid": 79, "bus_id": "0000:10:00.0"}], "node": "n1"}


def _failover(attempt: int, blamed, status="done"):
    return {"action": "failover", "attempt": attempt, "status": status,
            "detail": json.dumps({"reason": "hardware fault (xid-79)", "blamed": blamed})}


def test_failover_sentence_counts_attempts_and_budget():
    acts = [_failover(0, ["n1"]), _failover(1, ["n2"], "intent")]
    text = marker.restart_sentence({"retries": 3}, acts, lambda a: [dict(XID, node=f"n{a + 1}")])
    assert text == "attempt 3/4 after hardware fault (Xid 79, GPU 0000:10:00.0) on n2; budget 1 left"


def test_unblamed_retry_says_why_it_waits():
    hang = {"verdict": "hang", "rule": "no-progress", "xids": [], "node": "n2"}
    text = marker.restart_sentence({"retries": 2}, [_failover(0, [])], lambda a: [hang])
    assert text.startswith("attempt 2/3 after hang (no-progress) on n2; budget 1 left; no node blamed")
    assert "requeue delay" in text


def test_continuation_and_evacuation_sentences():
    cont = [{"action": "continue", "attempt": 0, "status": "done", "detail": "time limit"}]
    assert marker.restart_sentence({"retries": 3}, cont, lambda a: []) == \
        "attempt 2 after a time-limit continuation (checkpoint saved); budget 3 left"
    evac = [{"action": "evacuation", "attempt": 1, "status": "done", "detail": "n1 degraded"}]
    assert marker.restart_sentence({"retries": 1}, evac, lambda a: []) == \
        "attempt 3 after an evacuation (n1 degraded); budget 1 left"
    assert marker.restart_sentence({"retries": 1}, [], lambda a: []) is None


def test_give_up_sentence_says_what_to_fix():
    text = marker.give_up_sentence(policy.USER_ERROR, "user fault (cuda-oom)", 0)
    assert text.startswith("gave up after attempt 1: user-error: user fault (cuda-oom); the program failed")


@settings(max_examples=300, deadline=None)
@given(rule=st.text(max_size=80), node=st.text(max_size=30), detail=st.text(max_size=300),
       reason=st.text(max_size=300))
def test_any_verdict_text_gives_one_safe_line_that_keeps_the_options_record(rule, node, detail, reason):
    """Whatever a rule, node name, reason or detail holds: the sentence is one line of printable
    ASCII within the bound, and the AdminComment built from it still yields the job's options
    record (no word of the sentence passes for ``ft:...``)."""
    acts = [{"action": "evacuation", "attempt": 0, "status": "done", "detail": detail},
            {"action": "failover", "attempt": 1, "status": "done",
             "detail": json.dumps({"reason": reason, "blamed": [node]})}]
    texts = [marker.restart_sentence({"retries": 5}, acts,
                                     lambda a: [{"verdict": "infra", "rule": rule, "xids": [], "node": node}]),
             marker.restart_sentence({"retries": 5}, acts[:1], lambda a: []),
             marker.give_up_sentence(policy.MAX_RETRIES, reason, 1)]
    for text in texts:
        assert text and all(0x20 <= ord(c) <= 0x7e for c in text) and len(text) <= 400
        assert not any(w.startswith(("ft:", "slurm-ft:", "slurm-ft-")) for w in text.split())

        class J:
            def job(self, job_id):
                return {"ft_options": TOKEN}

            def actions(self, job_id):
                return []
        comment = admin_comment(J(), 7, policy.FAILOVER, text)
        assert jobspec.from_admin_comment(comment) == jobspec.from_canonical(TOKEN)
        assert ft_word(comment) == (policy.FAILOVER, text)


# ------------------------------------------------------------------------------ slurm-ft wait
class FakeJob:
    def __init__(self, state, admin, completing=False):
        self.state, self.admin_comment, self.completing = state, admin, completing


class FakeSlurm:
    """``job()`` answers from a list of live records; ``run("sacct")`` from ``acct``."""

    def __init__(self, live, acct=None):
        self.live, self.acct = live, acct

    def job(self, job_id):
        return self.live

    def run(self, cmd, *args, check=True):
        assert cmd == "sacct"
        if self.acct is None:
            return subprocess.CompletedProcess([cmd], 1, "", "no slurmdbd")
        return subprocess.CompletedProcess([cmd], 0, self.acct + "\n", "")


def test_wait_does_not_stop_at_a_failovers_failed():
    live = FakeJob("FAILED", f"slurm-ft:restarted attempt 2/4 after x {TOKEN}")
    assert look(FakeSlurm(live, "FAILED|slurm-ft:restarted attempt 2/4"), 1, 5.0, 60) == (None, True)
    assert look(FakeSlurm(FakeJob("PENDING", "slurm-ft:failover-in-progress")), 1, None, 60) == (None, False)


def test_wait_takes_the_final_state_from_accounting_or_a_held_job():
    out, ended = look(FakeSlurm(FakeJob("FAILED", "slurm-ft:submitted " + TOKEN),
                                "FAILED|slurm-ft:user-error gave up after attempt 1: user-error: x " + TOKEN), 1, 0, 60)
    assert ended and out.state == policy.USER_ERROR and out.exit_code == EXIT_CODES[policy.USER_ERROR] == 3
    out, _ = look(FakeSlurm(FakeJob("PENDING", f"slurm-ft: held: pinned {TOKEN}")), 1, None, 60)
    assert out.state == policy.HELD and out.exit_code == 9


def test_wait_without_accounting_settles_then_takes_slurms_word():
    live = FakeJob("COMPLETED", "slurm-ft:submitted " + TOKEN)
    assert look(FakeSlurm(live), 1, 10.0, 60)[0] is None
    out, _ = look(FakeSlurm(live), 1, 61.0, 60)
    assert out.state == policy.COMPLETED and "no ft decision visible" in out.detail


def test_wait_on_a_job_slurm_ft_does_not_look_after():
    out, _ = look(FakeSlurm(FakeJob("TIMEOUT", "")), 1, None, 60)
    assert out.state == policy.TIMEOUT and out.exit_code == 6


# ------------------------------------------------------------------------------ the give-up line
def test_give_up_line_is_appended_to_the_users_own_file_only(tmp_path):
    out = tmp_path / "job.out"
    out.write_text("train: step 1\n")
    append_line(str(out), os.getuid(), os.getgid(), b"slurm-ft: gave up")
    assert out.read_text() == "train: step 1\nslurm-ft: gave up\n"
    link = tmp_path / "link.out"
    link.symlink_to(out)
    with pytest.raises(UserFileError, match="symbolic link"):
        append_line(str(link), os.getuid(), os.getgid(), b"x")
    with pytest.raises(UserFileError):
        append_line(str(tmp_path / "missing.out"), os.getuid(), os.getgid(), b"x")
    assert out.read_text().count("\n") == 2


# ------------------------------------------------------------------------------ [notify]
def test_mail_only_to_jobs_that_asked_and_to_a_plain_address():
    from slurm_ft.failover.notify_owner import mail_target
    kv = {"UserId": "alice(1000)", "MailUser": "alice@example.org MailType=FAIL,REQUEUE"}
    assert mail_target(kv, "failover") == "alice@example.org"
    assert mail_target(kv, "give-up") == "alice@example.org"
    assert mail_target({"UserId": "alice(1000)", "MailUser": "alice MailType=BEGIN"}, "failover") is None
    assert mail_target({"UserId": "alice(1000)"}, "give-up") is None
    assert mail_target({"UserId": "bob(1001)", "MailUser": "-oProgram=x MailType=ALL"}, "give-up") is None


def test_notify_mails_through_mailprog_and_posts_the_webhook(tmp_path):
    import http.server
    import threading

    from slurm_ft.config import NotifyConfig
    from slurm_ft.failover.notify_owner import notify

    got = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.handle_request, daemon=True).start()
    mailprog = tmp_path / "mail"
    sent = tmp_path / "sent"
    mailprog.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {sent}\ncat >> {sent}\n")
    mailprog.chmod(0o755)

    class S:
        observe = False

        def run(self, *argv, check=True):
            text = ("JobId=7 JobName=train\n   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A\n"
                    "   JobState=FAILED Reason=None Dependency=(null)\n"
                    "   MailUser=alice@example.org MailType=FAIL\n")
            return subprocess.CompletedProcess(argv, 0, text, "")

        def show_config(self):
            return {"MailProg": str(mailprog)}

    cfg = NotifyConfig(mail=True, webhook=f"http://127.0.0.1:{server.server_port}/hook", timeout_s=5.0)
    notify(cfg, S(), 7, "give-up", "user-error", "gave up after attempt 1: user-error: x")
    server.server_close()
    lines = sent.read_text().splitlines()
    assert lines[:3] == ["-s", "Slurm Job_id=7 Name=train slurm-ft give-up: user-error", "alice@example.org"]
    assert lines[3] == "slurm-ft: job 7 (train): gave up after attempt 1: user-error: x"
    assert got == [{"job_id": 7, "user": "alice", "event": "give-up", "ft_state": "user-error",
                    "text": "gave up after attempt 1: user-error: x"}]
    sent.unlink()
    notify(NotifyConfig(), S(), 7, "give-up", "user-error", "x")     # off by default
    assert not sent.exists()


# ------------------------------------------------------------------------------ the daemon's side
def test_daemon_writes_the_owners_sentences(tmp_path, monkeypatch):
    """Against the in-memory Slurm: a failover's AdminComment carries the sentence the SPANK
    plugin prints; a give-up goes to the accounting record (sacctmgr) of the finished job."""
    from daemon_world import USER, XID79, World

    w = World(tmp_path, nodes=4, monkeypatch=monkeypatch)
    jid = w.start()
    w.step()
    first = w.job(jid).nodes[0]
    w.slurm.end(jid, verdicts={first: XID79}, epilogs=True)
    w.step(n=6)
    comments = [a for c in w.slurm.calls for a in c.args if a.startswith("AdminComment=")]
    assert any("attempt 2/" in c and "after hardware fault (Xid 79" in c and f"on {first}" in c
               for c in comments), comments
    w.step(n=6)
    w.slurm.end(jid, verdicts={w.job(jid).nodes[0]: USER}, epilogs=True)
    w.step(n=6)
    acct = [c.args for c in w.slurm.calls if c.cmd == "sacctmgr"]
    assert acct and any(a.startswith("AdminComment=slurm-ft:user-error gave up after attempt 2: user-error")
                        for a in acct[-1]), acct


# ------------------------------------------------------------------------------ in-place restarts (item 6)
def test_late_daemon_keeps_every_in_place_restarts_cause(tmp_path):
    """The daemon read the job's record only after the second restart (or the escalation): the
    first restart's cause is still journaled (it used to be 'reported late: cause not kept')."""
    from slurm_ft.job import inplace
    from slurm_ft.job.inplace import Record
    from slurm_ft.journal import open_journal

    class Job:
        job_id, restart_count, nodes = 5, 0, "n1"

        def __init__(self, comment):
            self.comment = comment

    rec = Record(0, 2, 3, "escalated", "hardware", "xid-79", 2.0,
                 ("infra (ib-completion-error)", "hang (no-progress)"))
    with open_journal(str(tmp_path / "j.db")) as j:
        assert inplace.record_restarts(j, Job("my note " + rec.encode())) == 3
        details = [a["detail"] for a in j.actions(5) if a["action"] == "inplace-restart"]
    assert details == ["restart 1/3 in place: infra (ib-completion-error), reported by the job",
                       "restart 2/3 in place: hang (no-progress), reported by the job"]


@settings(max_examples=200, deadline=None)
@given(restarts=st.integers(0, 100), causes=st.lists(st.text(max_size=120), max_size=12),
       rule=st.from_regex(r"[a-z0-9:._-]{0,100}", fullmatch=True))
def test_any_in_place_record_round_trips_within_one_word(restarts, causes, rule):
    from slurm_ft.job.inplace import MAX_WORD, Record
    causes = causes[:restarts]
    word = Record(1, restarts, 100, "restarted", "infra", rule, 1.0, tuple(causes)).encode()
    assert len(word) <= MAX_WORD and len(word.split()) == 1
    back = Record.decode(word)
    assert back is not None and back.restarts == restarts
    assert len(back.causes) <= min(restarts, 8)
    assert [c[:60] for c in causes][len(causes) - len(back.causes):] == list(back.causes)


def test_a_continued_job_seen_mid_requeue_is_the_same_job():
    """Measured on 22.05: a running job slurm-ft requeues (time-limit continuation) shows
    Restarts=1 with its old SubmitTime while it completes, then Restarts=1 with a new one. That
    is the same job (it was retired as 'a new job with a used job id'); a first attempt submitted
    later is a new job."""
    from slurm_ft.journal.identity import same_job
    seen = [(0, 1000.0), (1, 1000.0)]
    assert same_job(seen, 1, 1049.0)
    assert not same_job(seen, 0, 1049.0)


# ------------------------------------------------------------------------------ a hang's evidence
DUMP = """Process 4242: /usr/bin/python3 -I train.py
Python v3.11.2 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    sleep (time.py:0)
    step (train.py:52)
    <module> (train.py:60)
Thread 4250 (idle): "loader"
    wait (threading.py:320)
"""


def test_hang_block_names_the_hang_the_heartbeat_and_the_top_frames():
    block = marker.hang_block("n1", 62.4, 60, 1796192401.0, 2, [(4242, "python3", DUMP)],
                              "ending the job's processes: slurm-ft decides whether it runs again")
    assert block.splitlines() == [
        "slurm-ft: hang on n1: no progress for 62 s (window 60 s); last heartbeat 2026-12-02T06:20:01Z, step 2; "
        "ending the job's processes: slurm-ft decides whether it runs again",
        "slurm-ft: hang: stack of pid 4242 (python3), innermost first:",
        "slurm-ft: hang:   sleep (time.py:0)",
        "slurm-ft: hang:   step (train.py:52)",
        "slurm-ft: hang:   <module> (train.py:60)"]
    none = marker.hang_block("n2", 61, 60, None, None, [(7, "bash", "no stack dump: py-spy is not installed")], "x")
    assert "no heartbeat" in none and "slurm-ft: hang: pid 7 (bash): no stack dump: py-spy is not installed" in none


def test_hang_summary_is_numbers_only_and_travels_in_the_mailbox_record():
    from slurm_ft.failover.mailbox import parse, render
    from slurm_ft.failover.verdict import NodeVerdict
    text = marker.hang_summary("n1", 62, 60, 1796192401.0, 2, 1, 3)
    assert text == ("hang on n1: no progress for 62 s (window 60 s); last heartbeat 2026-12-02T06:20:01Z, step 2; "
                    "stack dump of 1 process (3 frames) in the job's log")
    v = NodeVerdict(9, 0, "hang", "no-progress", (), None, 100.0, "n1", ("full evidence, node journal only",),
                    "retry", "watcher", summary=text)
    (back,) = parse(render([v], 16), "n1")
    assert back == v and back.summary == text and back["evidence"] == [text]
    old = NodeVerdict(9, 0, "hang", "no-progress", (), None, 100.0)   # a record without one: 6 fields, as before
    assert old.encode().count(",") == 5 and parse(render([old], 16))[0]["evidence"] == []


@settings(max_examples=300, deadline=None)
@given(dump=st.text(max_size=3000), comm=st.text(max_size=60), node=st.text(max_size=40),
       frames=st.lists(st.text(max_size=400), max_size=40), step=st.integers(-2**63, 2**63 - 1),
       at=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)))
def test_any_job_text_gives_a_bounded_escaped_hang_block(dump, comm, node, frames, step, at):
    # the job chooses its function and file names, its process name and its output: escape
    # sequences, newlines, bidi overrides, huge frames; the block stays bounded and one line a line
    dump2 = "Thread 1 (idle): \"MainThread\"\n" + "".join(f"    {f}\n" for f in frames)
    block = marker.hang_block(node, 61.0, 60.0, at, step, [(1, comm, dump), (2, comm, dump2), (3, comm, dump)], comm)
    assert block.endswith("\n") and len(block) <= marker.HANG_BLOCK_CHARS
    lines = block.splitlines()
    assert lines and all(line.startswith(marker.HANG_LEADER) for line in lines)
    assert all(" " <= c <= "~" for line in lines for c in line)          # no ESC, no CR, no bidi: printable ASCII
    assert len(block.encode("ascii")) == len(block)
    assert sum(1 for line in lines if line.startswith("slurm-ft: hang:   ")) <= marker.HANG_FRAMES * marker.HANG_RANKS
    assert all(len(line) <= 200 + marker.FRAME_CHARS for line in lines[1:])


@settings(max_examples=200, deadline=None)
@given(summary=st.text(max_size=600), rule=st.text(max_size=40))
def test_any_summary_keeps_the_mailbox_record_whole(summary, rule):
    from slurm_ft.failover.mailbox import parse, render
    from slurm_ft.failover.verdict import SUMMARY_CHARS, NodeVerdict
    v = NodeVerdict(5, 1, "hang", rule, (), None, 1.0, summary=summary)
    other = NodeVerdict(6, 0, "hardware", "xid-79", ((79, "0000:10:00"),), None, 2.0)
    got = parse(render([v, other], 16), "n1")
    assert [r.key for r in got] == ["5.1", "6.0"]                       # never splits or swallows a record
    assert len(got[0].summary) <= SUMMARY_CHARS and all(" " <= c <= "~" for c in got[0].summary)
    assert got[1].summary == "" and got[1].xids == ((79, "0000:10:00"),)


def test_a_hang_reaches_the_owners_log_and_ft_history(tmp_path, monkeypatch):
    """The watcher's hang: the block in the job's output (appended as the job's user), the
    numbers-only summary in the mailbox record, the daemon's journal row, ft-history's views."""
    import calendar
    import time as _time

    from slurm_ft import config
    from slurm_ft.history import format as history_format
    from slurm_ft.failover import mailbox
    from slurm_ft.hang import evidence, procs, watcher as wt
    from slurm_ft.hang.heartbeat import Beat
    from slurm_ft.hang.watcher import Sample
    from slurm_ft.history.query import history
    from slurm_ft.journal import open_journal

    out = tmp_path / "uv-hang-9.out"

    class Slurm:
        extra = ""

        def show_node(self, node):
            return {"Extra": self.extra}

        def update_node(self, node, **f):
            self.extra = f["Extra"]

        def job(self, job_id):
            return None

        def run(self, *argv, check=True, timeout_s=None):     # where the output is: Slurm's expanded StdOut
            assert argv == ("scontrol", "show", "job", "9")
            return subprocess.CompletedProcess(argv, 0, f"JobId=9 JobName=uv-hang\n   UserId=u({os.geteuid()}) "
                                                        f"GroupId=g({os.getegid()})\n   StdOut={out}\n", "")

    cfg = config.from_dict({"journal": {"node_path": str(tmp_path / "node-{node}.db")},
                            "node_state": {"dir": str(tmp_path / "state")},
                            "hang": {"heartbeat_dir": str(tmp_path / "hb" / "{node}"), "kill_wait_s": 0.0,
                                     "grace_s": 0.0, "py_spy": "/nonexistent/py-spy"}})
    out.write_text("train: attempt 0 on n1 from step 0\n")
    rank = procs.Proc(4242, 1, os.geteuid(), "python3", 9, "batch", 0)      # the hung rank (its heartbeat's pid)
    monkeypatch.setattr(procs, "scan", lambda *a, **k: [rank])
    monkeypatch.setattr(procs, "pin", lambda found: [])                      # nothing of this machine is ended
    monkeypatch.setattr(evidence, "kernel_verdict", lambda *a, **k: None)
    monkeypatch.setattr(evidence, "stack_dump", lambda *a, **k: DUMP)
    monkeypatch.setattr(evidence, "find_py_spy", lambda *a: "/usr/bin/py-spy")
    slurm = Slurm()
    w = wt.Watch(9, 0, "n1", os.geteuid(), os.getegid(), (0,), 60.0, 0.0)       # the prolog did not know it
    watcher = wt.Watcher(cfg, w, slurm, lambda m: None, clock=lambda: 100.0, sleep=lambda s: None)
    watcher.progress.observe(30.0, Sample(beats={"4242.hb": Beat(7, 30.0, 0.0, 2, 0, 4242, 0.0)}))
    t0 = _time.time()
    watcher.on_hang(100.0)
    lines = [x for x in out.read_text().splitlines() if x.startswith("slurm-ft: hang")]
    assert lines[0].startswith("slurm-ft: hang on n1: no progress for 70 s (window 60 s); last heartbeat 20")
    assert lines[0].endswith(", step 2; ending the job's processes: slurm-ft decides whether it runs again")
    assert lines[1:] == ["slurm-ft: hang: stack of pid 4242 (python3), innermost first:",
                         "slurm-ft: hang:   sleep (time.py:0)", "slurm-ft: hang:   step (train.py:52)",
                         "slurm-ft: hang:   <module> (train.py:60)"]
    beat_at = calendar.timegm(_time.strptime(lines[0].split("last heartbeat ")[1][:20], "%Y-%m-%dT%H:%M:%SZ"))
    assert t0 - 72 <= beat_at <= t0 - 68                                         # 70 s before the hang, in UTC
    (rec,) = mailbox.parse(slurm.extra, "n1")
    assert "train.py" not in slurm.extra and "4242" not in rec.summary            # numbers only, no job text
    assert rec.summary.endswith("; stack dump of 1 process (3 frames) in the job's log")
    with open_journal(tmp_path / "daemon.db") as j:                              # what the daemon journals
        j.add_node_verdict(rec.on("n1", "mailbox"))
        h = history(j, 9)
    (v,) = h["attempts"][0]["verdicts"]
    assert v["verdict"] == "hang" and "last heartbeat 20" in v["evidence"][0]
    assert json.loads(json.dumps(h))["attempts"][0]["verdicts"][0]["evidence"] == [rec.summary]
    assert f"  attempt 0: {rec.summary}" in history_format.chain(h).splitlines()
