"""In-place step restarts (issue 13) without Slurm: ``slurm-ft run``'s decisions on real
classifier verdicts, its budget, the record in the job's comment (and a hostile one), the
daemon-side journaling of that record, the output tee, and the lab's infra injection."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from slurm_ft import config
from slurm_ft.job import inplace
from slurm_ft.job.inplace import Record, StepEnd

IB = ("n2:1:1 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<49189> with error 12, "
      "opcode 0, len 0, vendor err 129 (Recv)\nsrun: error: n2: task 1: Killed\n")
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"


def ends(*tails, code=1):
    it = iter(tails)

    def launcher(argv):
        t = next(it)
        return StepEnd(0 if t is None else code, None, t or "", 0.0, 0.0)
    return launcher


class Rep:
    def __init__(self):
        self.records = []

    def report(self, rec):
        self.records.append(rec)


def run(tails, restarts=2, env=None, slurm=None, **kw):
    rep, logs = Rep(), []
    rc = inplace.run(["srun", "x"], restarts, cfg=config.Config(), env=env or {}, reporter=rep, slurm=slurm,
                     log=logs.append, launcher=ends(*tails, **kw), sleep=lambda s: None)
    return rc, rep.records, logs


def no_kernel(monkeypatch):
    monkeypatch.setattr(inplace, "kernel_since", lambda *a: ([], None, None, ""))


def test_infra_restarts_in_place_up_to_the_budget_then_escalates(monkeypatch):
    no_kernel(monkeypatch)
    rc, recs, logs = run([IB, IB, IB])
    assert rc == 1
    assert [(r.restarts, r.state, r.verdict, r.rule) for r in recs] == [
        (1, "restarted", "infra", "ib-completion-error"), (2, "restarted", "infra", "ib-completion-error"),
        (2, "escalated", "infra", "ib-completion-error")]
    assert "restart 1/2 in place" in logs[0] and "in-place budget 2 used up: escalating" in logs[-1]


def test_success_after_a_restart_exits_0(monkeypatch):
    no_kernel(monkeypatch)
    rc, recs, logs = run([IB, None])
    assert rc == 0 and len(recs) == 1 and "succeeded after 1 in-place restart" in logs[-1]


def test_user_errors_are_never_retried_and_not_escalated(monkeypatch):
    no_kernel(monkeypatch)
    rc, recs, logs = run([OOM], code=3)
    assert rc == 3 and recs == [] and "the job's own error (cuda-oom): not retried" in logs[0]


def test_hardware_looking_output_escalates_at_once(monkeypatch):
    no_kernel(monkeypatch)
    rc, recs, logs = run([ECC])
    assert rc == 1 and [r.state for r in recs] == ["escalated"] and "looks like hardware" in logs[0]


def test_a_bare_kill_is_left_to_slurm_ft(monkeypatch):
    no_kernel(monkeypatch)
    rc, recs, logs = run(["srun: error: n1: task 0: Killed\n"], code=137)
    assert rc == 137 and recs[0].state == "escalated" and recs[0].verdict == "unknown"


def test_preemption_is_not_restarted(monkeypatch):
    no_kernel(monkeypatch)
    rc, recs, _ = run(["slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO PREEMPTION ***\n"])
    assert recs[0].state == "escalated"


def test_zero_restarts_escalates_the_first_infra_failure(monkeypatch):
    no_kernel(monkeypatch)
    rc, recs, _ = run([IB], restarts=0)
    assert rc == 1 and [(r.restarts, r.of, r.state) for r in recs] == [(0, 0, "escalated")]


def test_a_hang_posted_by_the_watcher_restarts_in_place(monkeypatch):
    from slurm_ft.failover.verdict import NodeVerdict
    from slurm_ft.slurm import Node
    no_kernel(monkeypatch)
    hang = NodeVerdict(7, 1, "hang", "no-progress", (), None, 1000.0)
    old = NodeVerdict(7, 0, "hang", "no-progress", (), None, 1000.0)      # another attempt's

    class S:
        def nodes(self):
            return [Node("n2", "ALLOCATED", [], "", "", "", "slurm-ft/1;" + old.encode() + ";" + hang.encode(), {}),
                    Node("n9", "IDLE", [], "", "", "", "slurm-ft/1;" + hang.encode(), {})]
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "n[1-2]"}
    launcher = lambda argv: StepEnd(137, None, "srun: error: n2: task 1: Killed\n", 0.0, 999.0)  # noqa: E731
    rep, logs = Rep(), []
    it = iter([launcher, lambda argv: StepEnd(0, None, "", 0.0, 0.0)])
    rc = inplace.run(["srun"], 2, cfg=config.Config(), env=env, reporter=rep, slurm=S(), log=logs.append,
                     launcher=lambda argv: next(it)(argv), sleep=lambda s: None)
    assert rc == 0 and (rep.records[0].verdict, rep.records[0].rule) == ("hang", "no-progress")
    assert "hang watcher on n2" in logs[0]
    # a hang verdict older than the step, or of another attempt, is not this step's
    assert inplace.hang_posted(config.Config(), S(), {**env, "SLURM_RESTART_COUNT": "0"}, 5000.0) is None


# ------------------------------------------------------------------------------ the record
def test_record_round_trip_and_merge_keeps_other_words():
    r = Record(1, 2, 3, "restarted", "infra", "ib-completion-error", 1700000000.0)
    assert Record.decode(r.encode()) == r
    c = inplace.merge("ft:retries=2 slurm-ft-ckpt:state=saved,attempt=0,t=1.0 my note " + r.encode(),
                      Record(1, 3, 3, "escalated", "infra", "x", 1.0))
    assert c.split()[:4] == ["ft:retries=2", "slurm-ft-ckpt:state=saved,attempt=0,t=1.0", "my", "note"]
    assert inplace.find(c).restarts == 3


@pytest.mark.parametrize("word", [
    "slurm-ft-run:attempt=0,restarts=99999999,of=3,state=restarted,verdict=infra,rule=x,t=1",
    "slurm-ft-run:attempt=0,restarts=1,of=3,state=bogus,verdict=infra,rule=x,t=1",
    "slurm-ft-run:attempt=-1,restarts=1,of=3,state=restarted,verdict=infra,rule=x,t=1",
    "slurm-ft-run:attempt=0,restarts=1",
    "slurm-ft-run:" + "a" * 1000,
    "slurm-ft-run:attempt=0,restarts=1,of=3,state=restarted,verdict=infra,rule=x,t=nan1",
])
def test_hostile_records_are_ignored(word):
    assert Record.decode(word) is None


def _job(comment, restart_count=0):
    from slurm_ft.slurm import Job
    return Job.from_json({"job_id": 12, "job_state": "RUNNING", "comment": comment, "restart_cnt": restart_count,
                          "nodes": "n[1-2]"})


def test_daemon_side_journals_each_restart_once(tmp_path):
    from slurm_ft.journal import open_journal
    with open_journal(tmp_path / "d.db") as j:
        r1 = Record(0, 1, 2, "restarted", "infra", "ib-completion-error", 1.0)
        assert inplace.record_restarts(j, _job(r1.encode())) == 1
        assert inplace.record_restarts(j, _job(r1.encode())) == 0           # seen again: nothing new
        r3 = Record(0, 2, 2, "escalated", "hang", "no-progress", 2.0)       # the daemon missed nothing here
        assert inplace.record_restarts(j, _job(r3.encode())) == 2           # restart 2/2 + the escalation
        acts = [(a["action"], a["detail"]) for a in j.actions(12, 0)]
    assert acts[0] == ("inplace-restart", "restart 1/2 in place: infra (ib-completion-error), reported by the job")
    assert acts[1] == ("inplace-restart", "restart 2/2 in place: hang (no-progress), reported by the job")
    assert acts[2][0] == "inplace-escalate"


def test_daemon_side_ignores_a_record_of_a_future_attempt_and_caps_the_count(tmp_path):
    from slurm_ft.journal import open_journal
    with open_journal(tmp_path / "d.db") as j:
        assert inplace.record_restarts(j, _job(Record(5, 1, 2, "restarted", "infra", "x", 1).encode(), 0)) == 0
        word = "slurm-ft-run:attempt=0,restarts=100000,of=100000,state=restarted,verdict=infra,rule=x,t=1"
        assert inplace.record_restarts(j, _job(word)) == 0


def test_history_shows_restarts_in_the_action_column():
    from slurm_ft.history.query import _summarise
    text = _summarise([{"action": "inplace-restart", "status": "done", "target": "n1",
                        "detail": "restart 1/2 in place: infra (ib-completion-error), reported by the job"},
                       {"action": "inplace-escalate", "status": "done", "target": "n1", "detail": "x"},
                       {"action": "bisect", "status": "done", "target": "n5",
                        "detail": '{"summary": "culprit: n5 (3 rounds)"}'}])
    assert "restart 1/2 in place (infra" in text and "in-place budget used up" in text and "bisect: culprit: n5" in text


# ------------------------------------------------------------------------------ the step's output
def test_launch_passes_output_through_and_keeps_the_tail():
    out, err = io.BytesIO(), io.BytesIO()
    end = inplace.launch([sys.executable, "-c", "import sys; print('a'*10); print('boom', file=sys.stderr); "
                          "sys.exit(3)"], out, err)
    assert end.code == 3 and out.getvalue() == b"a" * 10 + b"\n" and err.getvalue() == b"boom\n"
    assert "boom" in end.tail
    big = inplace.launch([sys.executable, "-c", "import sys; sys.stdout.write('x' * 300000 + 'END')"], io.BytesIO(),
                         io.BytesIO())
    assert big.code == 0 and len(big.tail) <= inplace.TAIL_BYTES and big.tail.endswith("END")
    missing = inplace.launch(["/nonexistent/srun"], io.BytesIO(), io.BytesIO())
    assert missing.code == 127


def test_launch_sets_kill_on_bad_exit_unless_the_job_chose():
    end = inplace.launch([sys.executable, "-c", "import os; print(os.environ['SLURM_KILL_BAD_EXIT'])"],
                         io.BytesIO(), io.BytesIO())
    assert end.tail.strip() == "1"


def test_cli_runs_the_command_and_keeps_its_status():
    p = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "run", "--restarts", "1", "--delay", "0", "--",
                        sys.executable, "-c", "import sys; print('OSError: [Errno 5] Input/output error'); sys.exit(4)"],
                       capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                            if not k.startswith("SLURM")})
    assert p.returncode == 4
    assert p.stdout.count("Input/output error") == 2
    assert "restart 1/1 in place" in p.stderr and "escalating" in p.stderr
    p = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "run"], capture_output=True, text=True)
    assert p.returncode == 2


# ------------------------------------------------------------------------------ lab injection
@pytest.mark.skipif(os.geteuid() != 0, reason="root writes into another process's stderr")
def test_infra_injection_writes_only_into_a_pipe_never_into_a_file(tmp_path):
    from slurm_ft.lab.inject import say_on_stderr
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0\n")
    with open(victim, "a") as fh:
        p = subprocess.Popen(["sleep", "30"], stderr=fh)
    try:
        assert not say_on_stderr(p.pid, "forged line")
    finally:
        p.kill()
        p.wait()
    assert victim.read_text() == "root:x:0:0\n"
    q = subprocess.Popen(["sleep", "30"], stderr=subprocess.PIPE)
    try:
        assert say_on_stderr(q.pid, "NCCL WARN NET/IB : Got completion with error")
    finally:
        q.kill()
        _, err = q.communicate()
    assert b"Got completion with error" in err


def test_unreadable_kernel_log_is_said_once_not_on_every_restart_line(monkeypatch):
    """As an ordinary user ``/dev/kmsg`` is root's (issue 25 item 6): the kernel log is tried once,
    said once, then not read again; the restart decisions stay those of the job's own output."""
    from slurm_ft.classify import sources
    calls = []

    def refused(since, **kw):
        from slurm_ft.errors import EvidenceError
        calls.append(since)
        raise EvidenceError("/dev/kmsg: Operation not permitted; dmesg: read kernel buffer failed: "
                            "Operation not permitted")
    monkeypatch.setattr(sources, "read_kmsg", refused)
    rc, recs, logs = run([IB, IB, IB])
    assert rc == 1 and len(calls) == 1
    assert [(r.state, r.verdict) for r in recs] == [("restarted", "infra"), ("restarted", "infra"),
                                                   ("escalated", "infra")]
    said = [line for line in logs if "kernel evidence is not available to the job" in line]
    assert len(said) == 1 and "Operation not permitted" in said[0]
    steps = [line for line in logs if line.startswith("step failed")]
    assert len(steps) == 3 and not any("kmsg" in line or "not permitted" in line for line in steps)
    # a user error and a hardware-looking output still decide the same without the kernel log
    rc, recs, logs = run([OOM])
    assert rc == 1 and recs == [] and "not retried" in logs[-1]
    rc, recs, logs = run([ECC])
    assert rc == 1 and recs[-1].state == "escalated" and logs[-1].endswith("escalating")


def test_readable_kernel_log_is_read_for_every_step(monkeypatch):
    from slurm_ft.classify import sources
    calls = []
    monkeypatch.setattr(sources, "read_kmsg", lambda since, **kw: calls.append(since) or [])
    monkeypatch.setattr(inplace, "kernel_since",
                        lambda cfg, env, since: (sources.read_kmsg(since), {}, frozenset(), ""))
    rc, recs, logs = run([IB, IB, None])
    assert rc == 0 and len(calls) == 2
    assert not any("kernel evidence" in line for line in logs)
