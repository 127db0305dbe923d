"""Shared fixtures. Lab tests (marker ``lab``) run against the real local Slurm lab cluster,
started once per session with ``slurm-ft lab up`` (idempotent) and left running for reuse."""

from __future__ import annotations

import os
import shutil

import pytest

LAB_DIR = os.environ.get("SLURM_FT_LAB_DIR", "/var/tmp/slurm-ft-lab")
#: Nodes of the lab (n1..nN). A private lab beside the main one can use more nodes than the main
#: lab has, so that its faults land on node names (and GPU bus ids, in the one kernel log all labs
#: share) that no other lab has.
LAB_NODES = int(os.environ.get("SLURM_FT_LAB_NODES", "3"))


def _lab_possible() -> str | None:
    if os.geteuid() != 0:
        return "lab tests need root"
    if not shutil.which("slurmctld", path="/usr/sbin"):
        return "Debian slurm packages not installed (run `make setup`)"
    return None


@pytest.fixture(scope="session")
def lab():
    """The lab cluster (a :class:`slurm_ft.lab.cluster.Lab`), a fresh incarnation per test session:
    a lab left running by an earlier session keeps its node journals, whose fault history (the
    epilog's cross-job rules, e.g. an Xid recurring on one GPU within an hour) would change this
    session's verdicts. Its journals, outputs and logs are archived, never deleted."""
    why = _lab_possible()
    if why:
        pytest.skip(why)
    from slurm_ft.lab.cluster import Lab
    lab = Lab(LAB_DIR)
    lab.down(log=lambda *_: None)
    lab.up(nodes=LAB_NODES, daemon=True, log=lambda *_: None)
    lab.daemon_start()  # always the daemon of the code under test
    return lab


@pytest.fixture
def slurm(lab):
    """A Slurm command runner for the lab, with every node resumed and every fake GPU healthy."""
    from slurm_ft.lab.demo import reset_nodes
    from slurm_ft.slurm import Slurm
    s = Slurm(conf=str(lab.lay.slurm_conf))
    reset_nodes(lab, s)
    yield s
    reset_nodes(lab, s)


@pytest.fixture
def ft_history(lab):
    """``ft_history(job_id, pred, timeout_s=30)``: the job's ft-history (daemon journal) once
    ``pred(history)`` holds."""
    from slurm_ft import config as config_mod
    from slurm_ft.errors import SlurmFTError
    from slurm_ft.history.query import history
    from slurm_ft.journal import open_journal
    from slurm_ft.lab.demo import wait_for

    path = config_mod.load(lab.lay.ft_conf).journal.path

    def get(job_id, pred=lambda h: True, timeout_s=30):
        def probe():
            with open_journal(path) as j:
                try:
                    h = history(j, job_id)
                except SlurmFTError:
                    return None
            return h if pred(h) else None
        return wait_for(probe, timeout_s, f"ft-history of job {job_id}")
    return get


# -- Docker lab (marker ``docker``; SLURM_FT_LAB_SLURM=22.05|24.11 picks the image) --------------
@pytest.fixture(scope="session")
def docker_lab():
    """The Docker lab of ``$SLURM_FT_LAB_SLURM`` (default 24.11), started fresh once per session
    (a :class:`slurm_ft.lab.docker_engine.DockerLab`) and left running."""
    if os.geteuid() != 0:
        pytest.skip("the Docker lab needs root")
    from slurm_ft.lab.docker_engine import DockerLab
    lab = DockerLab(os.environ.get("SLURM_FT_LAB_SLURM"))
    lab.up(nodes=int(os.environ.get("SLURM_FT_DOCKER_NODES", "3")), log=lambda *_: None)
    return lab


@pytest.fixture
def dslurm(docker_lab):
    """A Slurm runner for the Docker lab's controller, with every node back, resumed and healthy."""
    s = docker_lab.slurm()
    docker_lab.reset(s)
    yield s
    docker_lab.reset(s)


@pytest.fixture
def workdir(lab, request):
    """A fresh job directory under the lab's jobs dir that every user may write, with the
    repository's ``examples`` linked in (the lab tests' sbatch scripts run from it)."""
    import time
    from slurm_ft.lab.layout import repo_root
    d = lab.lay.jobs_dir / f"{request.module.__name__.rsplit('.', 1)[-1].removeprefix('test_lab_')}-{time.time_ns()}"
    d.mkdir()
    d.chmod(0o777)
    (d / "examples").symlink_to(repo_root() / "examples")
    return d


# Generative tests draw the same examples on every run unless HYPOTHESIS_PROFILE=explore: a
# clean-clone CI run is then repeatable (a failure found while exploring is kept as an explicit
# @example or a unit test, never left to chance).
from hypothesis import settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
_hyp_settings.register_profile("explore", derandomize=False)
_hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))
