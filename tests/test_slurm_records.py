"""One parser of the controllers (slurm_ft.slurm.records.slurmctld_hosts) for the daemon's
leadership, doctor's host roles and the history service's endpoints (issue 21: three copies)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from slurm_ft.admin.doctor import controller_hosts
from slurm_ft.failover.leader import Controllers
from slurm_ft.history.client import controllers
from slurm_ft.slurm import parse_config, parse_slurm_conf, slurmctld_hosts
from slurm_ft.slurm.records import replace_comment_record

SHOW_22 = "SlurmctldHost[0]       = ctl(10.0.0.1)\nSlurmctldHost[1]       = backup.example\nStateSaveLocation = /s\n"


def test_every_shape_gives_the_same_controllers_in_order():
    want = [("ctl", "10.0.0.1"), ("backup.example", "backup.example")]
    assert slurmctld_hosts(parse_config(SHOW_22)) == want
    assert slurmctld_hosts({"SlurmctldHost[1]": "backup.example", "SlurmctldHost[0]": "ctl(10.0.0.1)"}) == want
    assert slurmctld_hosts(parse_slurm_conf("SlurmctldHost=ctl(10.0.0.1),backup.example\n")) == want
    assert slurmctld_hosts({"ControlMachine": "ctl(10.0.0.1)", "BackupController": "backup.example"}) == want
    assert slurmctld_hosts({"SlurmctldHost[0]": "(null)", "SlurmctldHost[1]": "b"}) == [("b", "b")]
    assert slurmctld_hosts({}) == [] and slurmctld_hosts({"SlurmctldHost": ""}) == []


def test_the_three_users_read_it_alike():
    conf = parse_config(SHOW_22)
    assert Controllers.from_config(conf).hosts == ("ctl", "backup.example")
    assert controllers(conf, 6827) == [("10.0.0.1", 6827), ("backup.example", 6827)]
    assert controller_hosts({k.lower(): v for k, v in conf.items()}) == ["ctl", "backup"]


@given(st.dictionaries(st.sampled_from(["SlurmctldHost", "SlurmctldHost[0]", "slurmctldhost[7]", "ControlMachine",
                                        "BackupController", "Other"]) | st.text(max_size=20),
                       st.text(max_size=60), max_size=6))
def test_never_raises_and_names_only_what_the_entries_hold(conf):
    joined = ",".join(str(v) for v in conf.values())
    for name, addr in slurmctld_hosts(conf):
        assert name and addr and name == name.strip() and addr == addr.strip()
        assert name in joined and addr in joined


_WORD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0"),
                min_size=1, max_size=12)


@given(words=st.lists(st.one_of(_WORD, _WORD.map(lambda w: "slurm-ft-ckpt:" + w)), max_size=6),
       record=_WORD.map(lambda w: "slurm-ft-ckpt:" + w))
def test_the_comment_record_rule_is_the_job_clients(words, record):
    """The package's rule for a comment record (slurm.records.replace_comment_record) and the job's
    stand-alone client's copy (slurm_ft_job.merge, which cannot import the package) agree."""
    from slurm_ft.data.client import slurm_ft_job

    class _Ack:
        def encode(self):
            return record

    comment = " ".join(words)
    new = replace_comment_record(comment, slurm_ft_job.PREFIX, record)
    assert new == slurm_ft_job.merge(comment, _Ack())
    assert new.split()[-1] == record and [w for w in new.split() if w.startswith(slurm_ft_job.PREFIX)] == [record]
    assert [w for w in new.split() if not w.startswith(slurm_ft_job.PREFIX)] == \
        [w for w in comment.split() if not w.startswith(slurm_ft_job.PREFIX)]


def test_one_writer_puts_both_records_in_the_comment():
    """The checkpoint ack and the in-place restart record go through put_comment_record: each
    replaces its own record and keeps the other's and the user's words."""
    from slurm_ft.checkpoint.channel import Reporter
    from slurm_ft.job.inplace import PREFIX as INPLACE, CommentReporter, Record

    class _Slurm:
        comment = "ft:retries=2 my-note"

        def job_comment(self, job_id):
            return self.comment

        def update_job(self, job_id, **fields):
            self.comment = fields["Comment"]

    s = _Slurm()
    Reporter(7, 0, slurm=s).report("saved", step=10)
    rec = Record(attempt=0, restarts=1, of=3, state="restarted", verdict="infra", rule="nccl-timeout", time=1.0)
    CommentReporter(7, s).report(rec)
    Reporter(7, 0, slurm=s).report("saving")
    words = s.comment.split()
    assert words[:2] == ["ft:retries=2", "my-note"]
    assert [w for w in words if w.startswith(INPLACE)] == [rec.encode()]
    assert len([w for w in words if w.startswith("slurm-ft-ckpt:")]) == 1 and "state=saving" in words[-1]
