"""In-place step restarts on the real lab (issue 13): ``slurm-ft run --restarts 2 -- srun ...``
re-launches a step killed by an injected infra fault twice in the same allocation; the third
failure exceeds the budget and escalates: the job ends and slurm-ft requeues it."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.job import inplace
from slurm_ft.hang.procs import scan, tasks
from slurm_ft.journal import open_journal
from slurm_ft.lab.demo import wait_for
from slurm_ft.lab.inject import inject_infra
from slurm_ft.slurm import split_nodes

pytestmark = pytest.mark.lab


def test_infra_failures_restart_in_place_twice_then_escalate_to_a_requeue(lab, slurm, workdir):
    conf = str(lab.lay.slurm_conf)
    proc = subprocess.run(["/usr/bin/sbatch", "--nodes=2", "--export=ALL,STEP_TIME=0.1",
                           "examples/train-inplace.sbatch"], cwd=workdir, env=lab.env(), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    job_id = int(re.search(r"Submitted batch job (\d+)", proc.stdout).group(1))
    out = workdir / f"ft-train-{job_id}.out"
    text = lambda: out.read_text(errors="replace") if out.exists() else ""  # noqa: E731
    running = slurm.wait_job(job_id, lambda j: j.state == "RUNNING", 60, 0.2)
    node = split_nodes(running.nodes)[-1]           # not the batch node: its rank dies, srun goes on
    for k in (1, 2, 3):
        # the k-th run of the step: both ranks started and the trainer ran a step or two
        wait_for(lambda: text().count("attempt 0 on") >= 2 * k, 60, f"step run {k} to start")
        wait_for(lambda: tasks(scan(job_id, conf=conf, node=node)), 30, f"step run {k}'s tasks on {node}")
        time.sleep(1.0)
        done = inject_infra(node, conf=conf, job_id=job_id)
        assert done["killed"], f"nothing killed on {node}"
        if k < 3:
            wait_for(lambda: f"restart {k}/2 in place" in text(), 60, f"restart {k}")
    # the third failure: budget used up, the wrapper escalates, the job ends and is requeued
    wait_for(lambda: "in-place budget 2 used up: escalating" in text(), 60, "the escalation")
    requeued = slurm.wait_job(job_id, lambda j: j.restart_count >= 1, 60, 0.2)
    assert requeued is not None, slurm.job(job_id)
    t = text()
    assert t.count("infra (ib-completion-error)") == 3, t
    assert "restart 1/2 in place" in t and "restart 2/2 in place" in t and "restart 3/" not in t
    # the restarts resumed from the checkpoint, in the same allocation (same job, attempt 0)
    assert re.search(r"attempt 0 on \S+ \(GPU \S*\): resuming from step [1-9]", t), t
    # the record in the job's own comment
    rec = inplace.find(slurm.job(job_id).comment)
    assert rec is not None and (rec.attempt, rec.restarts, rec.of, rec.state) == (0, 2, 2, "escalated"), rec
    assert (rec.verdict, rec.rule) == ("infra", "ib-completion-error")
    # slurm-ft requeued the job for the infra fault (a retry from the requeue budget, no node blamed)
    cfg = config_mod.load(lab.lay.ft_conf)

    def failover():
        with open_journal(cfg.journal.path) as j:
            acts = j.actions(job_id, 0)
        return acts if any(a["action"] == "failover" and a["status"] == "done" for a in acts) else None
    acts = wait_for(failover, 30, "the daemon's failover")
    assert not any(a["action"] == "drain" for a in acts)
    with open_journal(cfg.journal.path) as j:
        assert {v["verdict"] for v in j.verdicts(job_id, 0)} <= {"infra", "unknown"}
        assert any(v["verdict"] == "infra" for v in j.verdicts(job_id, 0))
    # the daemon journals the wrapper's record (slurm_ft.job.inplace.record_restarts): ft-history

    def restarts():
        with open_journal(cfg.journal.path) as j:
            rows = [a for a in j.actions(job_id, 0) if a["action"] == "inplace-restart"]
        return rows if len(rows) == 2 else None
    rows = wait_for(restarts, 30, "the restarts in ft-history")
    assert [a["detail"].split()[1] for a in rows] == ["1/2", "2/2"], rows
    slurm.run("scancel", str(job_id), check=False)
