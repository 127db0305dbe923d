"""``scontrol show job J`` (single-job RPC) parsed into the 22.05 ``squeue --json`` keys: the same
values as squeue's own JSON for the same job (captured together on the 22.05 lab), and refused
when user-chosen text could forge a line."""

import json
import time
from pathlib import Path

import pytest

from slurm_ft.jobinfo import parse_show_job
from slurm_ft.slurm import Job

FIX = Path(__file__).parent / "fixtures" / "scontrol"


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")      # the captures were taken on a UTC host
    time.tzset()
    yield
    monkeypatch.delenv("TZ")
    time.tzset()


@pytest.mark.parametrize("name, job_id", [("pending_requeued", 5), ("failed_exit3", 7), ("running_exclusive", 9)])
def test_same_record_as_squeue_json(name, job_id):
    raw = parse_show_job((FIX / f"{name}.txt").read_text(), job_id)
    want = json.loads((FIX / f"{name}.json").read_text())["jobs"][0]
    for key in ("job_id", "name", "user_name", "user_id", "group_id", "job_state", "state_reason", "restart_cnt",
                "exit_code", "time_limit", "submit_time", "priority", "shared", "nodes", "excluded_nodes",
                "required_nodes", "node_count", "comment", "admin_comment", "requeue", "partition", "dependency",
                "features", "resv_name"):
        assert raw[key] == want[key], key
    if want["job_state"] != "PENDING":   # the txt and json of a pending job were taken seconds apart
        for key in ("start_time", "end_time", "eligible_time"):
            assert raw[key] == want[key], key
    job = Job.from_json(raw)
    assert job.job_id == job_id and job.excluded_nodes == want["excluded_nodes"]


def test_signal_exit_held_and_missing():
    raw = parse_show_job((FIX / "killed_signal9.txt").read_text(), 8)
    assert Job.from_json(raw).exit_signal == 9
    held = Job.from_json(parse_show_job((FIX / "held.txt").read_text(), 6))
    assert held.priority == 0 and held.reason == "JobHeldUser" and held.raw["eligible_time"] == 0
    assert parse_show_job((FIX / "held.txt").read_text(), 99) is None


@pytest.mark.parametrize("forge", [
    ("JobName=name with spaces", "JobName=x\n   JobState=COMPLETED Reason=None"),   # a name with a newline
    ("WorkDir=/tmp\n", "WorkDir=/tmp/x\n   AdminComment=slurm-ft:submitted ft:retries=9\n"),
    ("Comment=ft:", "Comment=x\n   JobState=COMPLETED\n   Comment=ft:"),
])
def test_forged_lines_refuse_the_parse(forge):
    text = (FIX / "pending_requeued.txt").read_text().replace(*forge, 1)
    assert forge[0] in (FIX / "pending_requeued.txt").read_text()
    assert parse_show_job(text, 5) is None
