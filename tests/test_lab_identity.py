"""Job arrays on the real lab (issue 20, item 4): an array task's fault requeues only that task,
shown and selected in array notation (``ARRAY_TASK``) as sacct does."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurm_ft import config as config_mod
from slurm_ft.cli.history import command as ft_history_cmd
from slurm_ft.lab.demo import job_gpu_index, submit_training, wait_for
from slurm_ft.lab.inject import inject_xid

pytestmark = pytest.mark.lab


def _journal_path(lab) -> str:
    return config_mod.load(lab.lay.ft_conf).journal.path


def _ft_history(lab, *args) -> str:
    r = CliRunner().invoke(ft_history_cmd, ["--journal", _journal_path(lab), *args])
    assert "Traceback" not in r.output, r.output
    return r.output


def test_an_array_task_fault_requeues_only_that_task_shown_as_array_task(lab, slurm):
    sub = submit_training(lab, steps=400, extra=["--array=1-3"])
    array = sub.job_id
    jobs_dir = lab.lay.jobs_dir

    def running_tasks():
        out = slurm.run("squeue", "-h", "-r", "-j", str(array), "-o", "%A %K %T").stdout
        rows = [line.split() for line in out.splitlines() if line.strip()]
        if len(rows) != 3 or any(r[2] != "RUNNING" for r in rows):
            return None
        tasks = {int(k): int(raw) for raw, k, _ in rows}
        started = all("attempt 0 on" in (jobs_dir / f"{raw}.out").read_text(errors="replace")
                      for raw in tasks.values() if (jobs_dir / f"{raw}.out").exists())
        return tasks if started and all((jobs_dir / f"{raw}.out").exists() for raw in tasks.values()) else None
    try:
        raw = wait_for(running_tasks, 90, f"the 3 tasks of array {array} to run", interval_s=0.5)
        victim = slurm.job(raw[2])
        inject_xid(victim.nodes, 79, job_gpu_index(slurm, raw[2]))
        again = slurm.wait_job(raw[2], lambda j: j.state == "RUNNING" and j.restart_count == 1, 90)
        assert again is not None and again.nodes != victim.nodes
        for task in (1, 3):
            other = slurm.job(raw[task])
            assert other.state == "RUNNING" and other.restart_count == 0, other
        expected = [f"{array}_{t}|{raw[t]}|{1 if t == 2 else 0}" for t in (1, 2, 3)]
        wait_for(lambda: _ft_history(lab, "-j", str(array), "-X", "-P", "-n", "-o", "JobID,JobIDRaw,Failovers")
                 .splitlines() == expected, 60, "ft-history to show the array's tasks", interval_s=0.5)
        one = json.loads(_ft_history(lab, "-j", f"{array}_2", "--json"))
        assert (one["job_id"], one["array_job_id"], one["array_task_id"]) == (raw[2], array, 2)
        assert one["attempts"][0]["verdict"] == "hardware" and one["failovers"] == 1
        assert f"Job {array}_2 (" in _ft_history(lab, "-j", f"{array}_2")
        two = _ft_history(lab, "-j", f"{array}_[1,3]", "-X", "-P", "-n", "-o", "JobID")
        assert two.splitlines() == [f"{array}_1", f"{array}_3"]
    finally:
        slurm.run("scancel", str(array), check=False)
