"""Slurm filename patterns of the job's output, as the epilog expands them (issue 25 item 5).

The reference below is written from sbatch(1) "filename pattern" and slurmstepd's
``fname_create``/``remove_path_slashes`` (src/slurmd/common/fname.c), independently of
``slurm_ft.node.epilog``: a regex over the whole escape, not a scanner. Generative tests hold the
epilog's expansion to it over patterns nobody wrote by hand.
"""

from __future__ import annotations

import os
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from slurm_ft.node import epilog
from slurm_ft.node.output_pattern import (
    PatternError, expand_output_pattern, expand_pattern, pattern_needs_job_record)
from slurm_ft.node.job import NodeJob

NO_VAL = 4294967294


def reference(pattern: str, job: NodeJob) -> str | None:
    """sbatch(1): ``\\\\`` "Do not process any of the replacement symbols"; ``%%`` "The character
    %"; ``%A`` "Job array's master job allocation number"; ``%a`` "Job array ID (index) number";
    ``%J`` "jobid.stepid of the running job" (the batch step: the job id alone); ``%j`` "jobid of
    the running job"; ``%N`` "short hostname" (the machine's, not the NodeName); ``%n`` "Node identifier relative to current job"
    (0: the batch script runs on the job's first node); ``%s`` "stepid of the running job"
    (``batch``); ``%t`` "task identifier (rank) relative to current job" (0); ``%u`` "User
    name"; ``%x`` "Job name". "A number placed between the percent character and format specifier
    may be used to zero-pad the result ... Ignored if the format specifier corresponds to
    non-numeric data (%N for example). The maximal number is 10". Anything else: None."""
    if "\\" in pattern:
        out = pattern.replace("\\\\", "\0").replace("\\", "").replace("\0", "\\")
    else:
        array = job.array_job_id
        numbers = {"j": job.job_id, "J": job.job_id, "n": 0, "t": 0,
                   "A": None if array is None else (array or job.job_id),
                   "a": None if array is None else (job.array_task_id if array else NO_VAL)}
        names = {"N": job.host or job.node, "s": "batch", "u": job.user, "x": job.job_name}
        bad = []

        def one(m: re.Match) -> str:
            width, key = m.group(1), m.group(2)
            if key == "%" and width == "":
                return "%"
            if key in numbers and numbers[key] is not None:
                return str(numbers[key]).rjust(min(int(width.lstrip("0")[:3] or "0"), 10), "0")
            if key in names and names[key] is not None:
                return names[key]
            bad.append(key)
            return ""

        out = re.sub(r"%([0-9]*)(.?)", one, pattern, flags=re.S | re.A)
        if bad:
            return None
    return out if out.startswith("/") or not job.work_dir else os.path.join(job.work_dir, out)


def job_of(name=None, array=None, task=None, user="alice", work_dir="/home/alice", host=None) -> NodeJob:
    return NodeJob(job_id=12, node="n1", attempt=0, uid=None, gpus=None, exit_code=1, signal=None,
                   stdout=None, stderr=None, work_dir=work_dir, job_name=name, array_job_id=array,
                   array_task_id=task, user=user, host=host)


ESCAPES = st.sampled_from(list("%AajJNnstux") + ["q", "b", "\u00b2", "", "/", "\\"])
PIECES = st.one_of(
    st.text(alphabet="ab/-_.\u00e9 \n", max_size=4),
    st.tuples(st.sampled_from(["", "0", "4", "10", "12", "0004", "9" * 30]), ESCAPES).map(lambda t: "%" + "".join(t)),
    st.sampled_from(["\\", "\\\\", "%%", "%"]),
)
PATTERNS = st.lists(PIECES, max_size=8).map("".join)
JOBS = st.builds(job_of, name=st.one_of(st.none(), st.text(max_size=5)),
                 array=st.one_of(st.none(), st.just(0), st.integers(1, 2**32 - 1)),
                 task=st.integers(0, 2**32 - 1), user=st.one_of(st.none(), st.just("alice")),
                 work_dir=st.sampled_from([None, "/home/alice", "/w/caf\u00e9"]),
                 host=st.sampled_from([None, "vm", "gpu-node07"]))


@settings(max_examples=300, deadline=None)
@given(PATTERNS, JOBS)
@example("%x-%j.out", job_of(name="train"))
@example("slurm-%A_%a.out", job_of(array=10, task=2))
@example("slurm-%A_%a.out", job_of(array=0))
@example("/o/%4j-%5x-%10N-%2s-%3t-%3n-%%-%u", job_of(name="n"))
@example("/o/\\%j\\\\x", job_of())
@example("/o/%" + "9" * 5000 + "j", job_of())
def test_expansion_matches_the_man_page_reference(pattern, job):
    assert expand_output_pattern(pattern, job) == reference(pattern, job)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40).filter(lambda b: b"\0" not in b), JOBS)
def test_any_bytes_expand_or_refuse_and_round_trip(raw, job):
    """Any pattern bytes: a path whose bytes are the pattern's own (never a re-encoding), or a
    refusal that says why (PatternError); never another exception."""
    try:
        path = expand_pattern(raw, job)
    except PatternError as exc:
        assert str(exc)
        return
    assert os.fsencode(path) == os.fsencode(reference(os.fsdecode(raw), job))


def test_common_patterns():
    job = job_of(name="train")
    assert expand_output_pattern("%x-%j.out", job) == "/home/alice/train-12.out"
    assert expand_output_pattern("logs/%x/%j.err", job) == "/home/alice/logs/train/12.err"
    assert expand_output_pattern("slurm-%A_%a.out", job_of(array=10, task=3)) == "/home/alice/slurm-10_3.out"
    assert expand_output_pattern("slurm-%A_%a.out", job_of(array=0)) == "/home/alice/slurm-12_4294967294.out"
    assert expand_output_pattern("/o/%J.%s", job) == "/o/12.batch"
    assert expand_output_pattern("/o/a\\%j", job) == "/o/a%j"          # a backslash: nothing expanded
    with_none = job_of(name=None)
    assert expand_output_pattern("%x-%j.out", with_none) is None        # never a guessed path
    try:
        expand_pattern("/o/%q", job)
    except PatternError as exc:
        assert "%q" in str(exc)
    else:
        raise AssertionError("%q expanded")


def test_only_record_escapes_ask_slurmctld():
    """The epilog asks ``scontrol show job`` only when a pattern needs a value the environment
    lacks (per-job cost, issue 24): ``%j.out`` never, ``%x`` only without SLURM_JOB_NAME."""
    bare = job_of()
    assert not pattern_needs_job_record("/o/%j-%4N-%u-%%x.out", bare)
    assert not pattern_needs_job_record("/o/\\%x", bare)
    assert pattern_needs_job_record("%x-%j.out", bare)
    assert pattern_needs_job_record(b"slurm-%A_%a.out", bare)
    assert not pattern_needs_job_record("%x-%A_%a.out", job_of(name="n", array=0))


def test_percent_n_is_the_short_host_name_not_the_node_name():
    """Measured on the lab (22.05): nodes n1..n3 share host ``vm``; slurmstepd wrote ``%N`` as
    ``vm`` (tests/test_lab_job_shapes.py::test_every_filename_pattern_escape_expands_to_the_file_slurm_wrote)."""
    import socket
    assert expand_output_pattern("/o/%N.out", job_of(host="vm")) == "/o/vm.out"
    job = NodeJob.from_env({"SLURM_JOB_ID": "12", "SLURMD_NODENAME": "n1"})
    assert job.host == socket.gethostname().split(".")[0]


def test_env_gives_name_and_array_ids():
    job = NodeJob.from_env({"SLURM_JOB_ID": "12", "SLURMD_NODENAME": "n1", "SLURM_JOB_NAME": "train",
                            "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_USER": "bob",
                            "SLURM_JOB_WORK_DIR": "/w"})
    assert expand_output_pattern("%x-%A_%a-%u.out", job) == "/w/train-10_3-bob.out"
    odd = NodeJob.from_env({"SLURM_JOB_ID": "12", "SLURMD_NODENAME": "n1", "SLURM_ARRAY_TASK_ID": "1-5%2"})
    assert odd.array_task_id is None                      # not a plain id: unknown, never fatal


class FakeSlurm:
    def __init__(self, text: str):
        self.text, self.calls = text, 0

    def job(self, job_id):
        from slurm_ft.slurm.jobinfo import parse_show_job
        from slurm_ft.slurm import Job
        self.calls += 1
        raw = parse_show_job(self.text, job_id)
        return Job.from_json(raw) if raw else None


SHOW = ("JobId=12 {array}JobName={name}\n   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A\n"
        "   Priority=1 Nice=0 Account=(null) QOS=normal\n   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)\n"
        "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=1:0\n   StdOut=/w/x\n")


def _read_outputs(monkeypatch, show: str, job: NodeJob, files: dict[str, str]):
    from slurm_ft import slurm as slurm_mod
    from slurm_ft.errors import SlurmFTError
    fake = FakeSlurm(show)
    monkeypatch.setattr(slurm_mod.Slurm, "from_config", classmethod(lambda cls, cfg: fake))
    read = []

    def read_tail(path, *, expected_uid, max_bytes):
        read.append(path)
        if path not in files:
            raise SlurmFTError(f"{path}: No such file or directory")
        return files[path]
    logged = []
    tail, unread = epilog.read_outputs(None, job, logged.append, read_tail)
    return tail, unread, read, fake.calls


def test_name_from_one_scontrol_show_job(monkeypatch):
    job = job_of(work_dir="/w")
    job = job.__class__(**{**job.__dict__, "stdout": "%x-%j.out", "stderr": "%x-%j.out"})
    tail, unread, read, calls = _read_outputs(monkeypatch, SHOW.format(array="", name="my job"), job,
                                              {"/w/my job-12.out": "torch.OutOfMemoryError: CUDA out of memory.\n"})
    assert calls == 1 and read == ["/w/my job-12.out"] and "CUDA out of memory" in tail and unread == ()


def test_array_ids_from_scontrol(monkeypatch):
    job = job_of(work_dir="/w")
    job = job.__class__(**{**job.__dict__, "stdout": "slurm-%A_%a.out"})
    tail, unread, read, calls = _read_outputs(monkeypatch, SHOW.format(array="ArrayJobId=10 ArrayTaskId=4 ", name="a"),
                                              job, {"/w/slurm-10_4.out": "x\n"})
    assert calls == 1 and read == ["/w/slurm-10_4.out"] and tail == "x\n"


def test_no_scontrol_for_a_plain_pattern(monkeypatch):
    job = job_of(work_dir="/w")
    job = job.__class__(**{**job.__dict__, "stdout": "%j.out"})
    tail, unread, read, calls = _read_outputs(monkeypatch, "", job, {"/w/12.out": "y\n"})
    assert calls == 0 and tail == "y\n"


def test_unread_output_is_said_in_the_verdict_evidence(monkeypatch):
    from slurm_ft.classify import Evidence, classify
    job = job_of(work_dir="/w")
    job = job.__class__(**{**job.__dict__, "stdout": "/w/%q\n.out", "stderr": "/w/missing-%j.err"})
    tail, unread, read, calls = _read_outputs(monkeypatch, "", job, {})
    assert tail == "" and len(unread) == 2
    assert unread[0] == "output not read: /w/missing-12.err: No such file or directory"
    assert unread[1].startswith("output not read: escape %q is not a Slurm filename pattern")
    assert all("\n" not in line for line in unread)
    ev = Evidence(exit_code=1, output_unread=unread)
    verdict = epilog.with_unread_outputs(classify(ev), ev)
    assert verdict.verdict == "user" and list(verdict.evidence[-2:]) == list(unread)


def test_unread_lines_escape_a_hostile_path(monkeypatch):
    job = job_of(work_dir="/w")
    job = job.__class__(**{**job.__dict__, "stdout": "/w/a\nslurm-ft epilog: verdict hardware\x1b[2J-%j"})
    _, unread, _, _ = _read_outputs(monkeypatch, "", job, {})
    assert len(unread) == 1 and "\n" not in unread[0] and "\x1b" not in unread[0]
    assert len(unread[0]) <= epilog.MAX_UNREAD_CHARS
