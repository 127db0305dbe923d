"""Which GPUs a job holds (``scontrol show job -d``): read from the anchored record's detail lines
only, so nothing the user sets (job name, command, working directory, comment) can add a GPU to
a job, and with it the blame for another job's GPU fault (issue 27's attribution rule)."""

from hypothesis import given, strategies as st

from slurm_ft.slurm.jobinfo import gres_gpu_detail
from slurm_ft.slurm import Slurm

#: ``scontrol show job -d`` of a 1-GPU job as Slurm 22.05 prints it on the lab (user values: {}).
RECORD = """JobId=41 JobName={name}
   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A
   Priority=1 Nice=0 Account=root QOS=normal
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   NodeList=n1
   TRES=cpu=1,node=1,billing=1
   JOB_GRES=gpu:1
     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
   Command={command}
   WorkDir={workdir}
   Comment={comment} 
   StdOut=/home/alice/slurm-41.out
   Power=
"""
FORGED = "\n     Nodes=n3 CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)\n"


def _gpus(text: str, job_id: int = 41) -> dict:
    slurm = Slurm()
    slurm.run = lambda *a, **k: type("P", (), {"stdout": text})()
    return slurm.job_gpus(job_id)


def test_the_real_detail_line_is_read():
    text = RECORD.format(name="train", command="/bin/true", workdir="/home/alice", comment="ft")
    assert _gpus(text) == {"n1": {0}}


def test_a_forged_detail_line_in_any_user_value_adds_no_gpu():
    for field in ("name", "command", "workdir", "comment"):
        values = dict(name="train", command="/bin/true", workdir="/home/alice", comment="ft")
        values[field] += FORGED
        held = _gpus(RECORD.format(**values))
        assert "n3" not in held, field


def test_gres_with_a_type_and_other_gres():
    text = RECORD.format(name="t", command="c", workdir="/w", comment="").replace(
        "GRES=gpu:1(IDX:0)", "GRES=gpu:a100:2(IDX:0-1),mps:100(0/100,0/100)")
    assert gres_gpu_detail(text, 41) == {"n1": "0-1"}


line_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=120)


@given(name=line_text, command=line_text, workdir=line_text, comment=line_text)
def test_no_user_value_changes_the_gpus_a_job_holds(name, command, workdir, comment):
    """Whatever the four user-set values hold (newlines, forged detail or field lines), the job
    holds GPU 0 on n1 or, when the record is ambiguous, none: never another node's or more."""
    text = RECORD.format(name=name, command=command, workdir=workdir, comment=comment)
    assert _gpus(text) in ({"n1": {0}}, {})


def test_another_jobs_record_is_not_read():
    text = RECORD.format(name="t", command="c", workdir="/w", comment="")
    assert _gpus(text, job_id=42) == {}
