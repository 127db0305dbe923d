"""submitit (from PyPI) jobs under slurm-ft on the real lab (issue 15).

A ``submitit.helpers.Checkpointable`` trainer, submitted with submitit's own ``AutoExecutor`` and
the SPANK options as extra sbatch lines (``--ft --ft-ckpt-signal=USR2``, docs/user-guide.md
"submitit"), through:

* a hardware failover (a real Xid 79 on the job's GPU): requeued elsewhere once, node blamed,
  the trainer resumes from its own periodic checkpoint;
* ``slurm-ft drain NODE --checkpoint``: submitit checkpoints and requeues itself on USR2; slurm-ft
  books one evacuation, blames nothing, the trainer resumes from submitit's checkpoint;
* the time limit with both submitit's ``--signal=USR2@15`` and slurm-ft's time-limit signal:
  submitit requeues itself at each limit, slurm-ft never requeues a second time nor books a fault.

Each one ends with submitit's own ``job.result()`` (through the guide's ``ft_result``, which
waits through the few seconds a failed-over attempt shows ``FAILED`` in ``sacct``) and checks
that every requeue is one event: ``SLURM_RESTART_COUNT`` 0, 1, 2... each seen once by the trainer,
and one ``sacct -D`` record per attempt. submitit polls ``sacct``: the lab runs slurmdbd.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import job_gpu_index, wait_for
from slurm_ft.lab.inject import inject_xid
from slurm_ft.lab.layout import repo_root

submitit = pytest.importorskip("submitit")
cloudpickle = pytest.importorskip("cloudpickle")

pytestmark = pytest.mark.lab


#: as docs/user-guide.md "submitit" submits (the default --ft-ckpt-wait: the drain's wait ends when
#: submitit requeues itself; at a 1-minute limit slurm-ft signals 30 s in, half the limit)
FT_PARAMS = {"slurm_gres": "gpu:1", "slurm_additional_parameters": {"ft": True, "ft-ckpt-signal": "USR2"}}
#: Nodes the jobs must not use (e.g. ``n[1-5]``): every lab on one host shares the kernel log, and
#: node nK has the same GPU bus ids in each, so an Xid another lab injects on its nK hits a job on
#: ours. On a shared host, run a private lab with more nodes than the others (tests/conftest.py)
#: and set this to the node names they use.
AVOID_NODES = os.environ.get("SLURM_FT_TEST_AVOID_NODES", "")


class Trainer(submitit.helpers.Checkpointable):
    """Counts ``steps`` steps of ``step_time`` s. Its progress lives in ``self`` (what submitit's
    checkpoint pickles) and in a progress file written every step (what survives a lost node).
    Returns the steps done and, per start, ``(SLURM_RESTART_COUNT, node, step from submitit's
    pickle, step from the file)``."""

    def __init__(self, steps: int, step_time: float, ckpt: str):
        self.steps, self.step_time, self.ckpt = steps, step_time, ckpt
        self.step = 0
        self.starts: list = []

    def _save(self, attempt: int) -> None:
        tmp = f"{self.ckpt}.{attempt}.tmp"          # fenced by attempt: a stale copy never clobbers it
        with open(tmp, "w") as fh:
            json.dump({"step": self.step, "starts": self.starts}, fh)
        os.replace(tmp, self.ckpt)

    def __call__(self):
        attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        node = os.environ.get("SLURMD_NODENAME", "")
        try:
            with open(self.ckpt) as fh:
                saved = json.load(fh)
        except (OSError, ValueError):
            saved = {"step": 0, "starts": []}
        pickled = self.step
        self.step = max(pickled, saved["step"])
        self.starts = max(self.starts, [list(s) for s in saved["starts"]], key=len) + [[attempt, node, pickled,
                                                                                      saved["step"]]]
        self._save(attempt)
        print(f"attempt {attempt} on {node} from step {self.step}", flush=True)
        while self.step < self.steps:
            time.sleep(self.step_time)
            self.step += 1
            self._save(attempt)
        return {"step": self.step, "starts": self.starts}


# the trainer travels by value: the job's Python cannot import this test module
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def guide_ft_result():
    """``ft_result`` exactly as docs/user-guide.md ("submitit") gives it to users."""
    text = (repo_root() / "docs" / "user-guide.md").read_text()
    section = text.split("\n## submitit\n", 1)[1].split("\n## ", 1)[0]
    block = next(b.split("```", 1)[0] for b in section.split("```python\n")[1:] if "def ft_result(" in b)
    namespace: dict = {}
    exec(compile(block, "docs/user-guide.md (submitit)", "exec"), namespace)
    return namespace["ft_result"]


@pytest.fixture
def run(lab, monkeypatch):
    """``run(steps, step_time, max_num_timeout=3, **params)``: submit a Trainer with submitit's
    AutoExecutor and ``params`` (its ``update_parameters``) plus the slurm-ft options to the lab;
    returns (job, progress file). submitit runs sbatch, sacct and scontrol as found on PATH, and
    they read $SLURM_CONF: the lab's."""
    monkeypatch.setenv("SLURM_CONF", str(lab.lay.slurm_conf))
    folder = lab.lay.jobs_dir / f"submitit-{time.time_ns()}"

    def submit(steps: int, step_time: float, max_num_timeout: int = 3, **params):
        executor = submitit.AutoExecutor(folder=folder, slurm_max_num_timeout=max_num_timeout)
        executor.update_parameters(**FT_PARAMS, **({"slurm_exclude": AVOID_NODES} if AVOID_NODES else {}),
                                   **params)
        ckpt = folder / "progress.json"
        return executor.submit(Trainer(steps, step_time, str(ckpt))), ckpt
    return submit


def result_within(job, timeout_s: float):
    """The guide's ft_result(job), or a failure after timeout_s (never a hung test)."""
    ft_result = guide_ft_result()
    box: dict = {}

    def target():
        try:
            box["result"] = ft_result(job)
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        pytest.fail(f"submitit job {job.job_id}: no result within {timeout_s:g} s (state {job.state})")
    if "error" in box:
        raise box["error"]
    return box["result"]


def journal(lab):
    return open_journal(config_mod.load(lab.lay.ft_conf).journal.path)


def sacct_records(lab, job_id: str) -> list[str]:
    """One ``State`` per attempt of the job, oldest first (``sacct -D``: requeued runs too)."""
    out = subprocess.run(["/usr/bin/sacct", "-D", "-X", "-n", "-P", "-j", str(job_id), "-o", "State"],
                         capture_output=True, text=True, timeout=30, env=lab.env(), check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def running_with_progress(slurm, job, ckpt, step: int = 3):
    def progress():
        try:
            return json.loads(ckpt.read_text())["step"] >= step
        except (OSError, ValueError):
            return False
    wait_for(progress, 60, "trainer progress", interval_s=0.2)
    j = slurm.job(int(job.job_id))
    assert j.state == "RUNNING" and j.restart_count == 0
    return j


def ended(slurm, job_id: int):
    """The job's Slurm record once it has ended (the result file comes before COMPLETING ends)."""
    job = slurm.wait_job(int(job_id), lambda j: j.ended, 30, 0.2)
    assert job is not None, f"job {job_id} did not end: {slurm.job(int(job_id))}"
    return job


def one_start_per_attempt(result: dict, attempts: int) -> None:
    """Every requeue is one event: the trainer ran once per attempt, 0..attempts-1, in order."""
    assert [s[0] for s in result["starts"]] == list(range(attempts)), result["starts"]


def nothing_blamed(lab, job_id: int) -> None:
    with journal(lab) as j:
        assert j.failovers_done(job_id) == 0
        assert not [a for a in j.actions(job_id) if a["action"] in ("drain", "failover", "continue")]
        assert not [v for v in j.verdicts(job_id) if v["verdict"] == "hardware"]


def test_submitit_hardware_failover(lab, slurm, run, ft_history):
    job, ckpt = run(steps=50, step_time=0.5, timeout_min=60)
    first = running_with_progress(slurm, job, ckpt, step=5)
    inject_xid(first.nodes, 79, job_gpu_index(slurm, first.job_id))
    result = result_within(job, 150)
    assert result["step"] == 50
    one_start_per_attempt(result, 2)
    (_, node0, _, _), (_, node1, pickled, from_file) = result["starts"]
    assert node0 == first.nodes and node1 != node0
    assert pickled == 0 and from_file >= 5          # no warning, no submitit checkpoint: its own file
    final = ended(slurm, first.job_id)
    assert final.state == "COMPLETED" and final.restart_count == 1
    h = ft_history(first.job_id, lambda h: h["ft_state"] == "completed")
    assert h["attempts"][0]["verdict"] == "hardware" and h["attempts"][0]["rule"] == "xid-79"
    assert h["failovers"] == 1
    assert slurm.show_node(node0)["Reason"].startswith("slurm-ft: Xid 79")
    assert sacct_records(lab, job.job_id) == ["REQUEUED", "COMPLETED"]


def test_submitit_drain_checkpoint(lab, slurm, run, ft_history):
    job, ckpt = run(steps=40, step_time=0.5, timeout_min=60)   # 60: a drain is a "preemption" for submitit
    first = running_with_progress(slurm, job, ckpt)
    r = subprocess.run([sys.executable, "-m", "slurm_ft.cli.main", "drain", first.nodes, "--checkpoint",
                        "--job", str(first.job_id), "--reason", "maintenance: submitit"],
                       env=lab.env(), capture_output=True, text=True, timeout=120)
    print(r.stdout + r.stderr)
    # USR2 to submitit's python only; submitit saves and requeues itself without reporting to
    # slurm-ft, so the drain says the job "ended instead of saving" (exit 3, docs/user-guide.md)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "SIGUSR2 to 1 process(es)" in r.stdout and "python[" in r.stdout and "srun[" in r.stdout
    result = result_within(job, 120)
    assert result["step"] == 40
    one_start_per_attempt(result, 2)
    (_, node0, _, _), (_, node1, pickled, _) = result["starts"]
    assert node0 == first.nodes and node1 != node0
    assert pickled > 0                               # resumed from submitit's own checkpoint
    final = ended(slurm, first.job_id)
    assert final.state == "COMPLETED" and final.restart_count == 1
    h = ft_history(first.job_id, lambda h: h["ft_state"] == "completed")
    assert h["failovers"] == 0
    nothing_blamed(lab, first.job_id)
    with journal(lab) as j:
        assert [a["status"] for a in j.actions(first.job_id) if a["action"] == "evacuation"] == ["done"]
    assert "maintenance: submitit" in slurm.show_node(node0)["Reason"]      # the admin's reason, no fault's
    assert sacct_records(lab, job.job_id) == ["REQUEUED", "COMPLETED"]
    assert job.paths.stdout.read_text().count("Requeued job") == 1           # submitit's own log
    assert "this job is preempted" in job.paths.stderr.read_text()


def test_submitit_time_limit_self_requeue(lab, slurm, run, ft_history):
    # --time=1 with submitit's own --signal=USR2@15 (Slurm sends it at its first periodic check
    # with less than 15 + 30 s left: 15-45 s into the attempt) and slurm-ft's time-limit USR2 (30 s
    # in: half the limit). Whichever comes first, submitit checkpoints and requeues itself; the
    # 60 s of work need at least one requeue
    job, ckpt = run(steps=60, step_time=1.0, max_num_timeout=10, timeout_min=1, slurm_signal_delay_s=15)
    result = result_within(job, 420)
    assert result["step"] == 60
    requeues = len(result["starts"]) - 1
    assert requeues >= 1
    one_start_per_attempt(result, requeues + 1)
    pickled = [s[2] for s in result["starts"][1:]]
    assert all(p > 0 for p in pickled) and pickled == sorted(pickled)   # each from submitit's checkpoint
    job_id = int(job.job_id)
    final = ended(slurm, job_id)
    assert final.state == "COMPLETED" and final.restart_count == requeues
    h = ft_history(job_id, lambda h: h["ft_state"] == "completed")
    assert h["failovers"] == 0
    nothing_blamed(lab, job_id)         # no "continue": slurm-ft requeues only on a saved report
    with journal(lab) as j:
        evacuations = [a for a in j.actions(job_id) if a["action"] == "evacuation"]
        assert [a["attempt"] for a in evacuations] == list(range(requeues))    # one per self-requeue
        daemon_signalled = [any(a["action"] == "ckpt-notify" and a["status"] == "done"
                                for a in j.actions(job_id, n)) for n in range(requeues)]
    assert sacct_records(lab, job.job_id) == ["REQUEUED"] * requeues + ["COMPLETED"]
    assert job.paths.stdout.read_text().count("Requeued job") == requeues        # submitit's own log
    print(f"time limit: {requeues} self-requeue(s); slurm-ft's daemon signalled attempt(s) "
          f"{[n for n, sent in enumerate(daemon_signalled) if sent]} too")
