"""A container image that cannot be pulled, through the real epilog and daemon on the lab (issue 22).

pyxis and enroot are not Debian packages, so the lab cannot run them; each job prints, to its
stderr, the lines pyxis prints when enroot's import of ``--container-image`` fails (verbatim from
the public reports the rows' ``ref`` cite, the node and process numbers as reported), then exits
1, as a job whose step pyxis refused does. The real epilog reads that output and journals its
verdict; the real daemon decides:

* ``image-pull-rejected`` (the registry refuses the image: NVIDIA/pyxis#168, 401 on the
  manifest): ``user``, the same on every node: not retried;
* ``image-pull-transient`` (the node's pyxis runtime path is full: NVIDIA/pyxis#53): ``infra``,
  retried elsewhere as an unblamed retry ([failover] unblamed_retries);
* ``image-pull-failed`` (the import failed and the log names no cause: NVIDIA/pyxis#71):
  ``unknown``, not retried by default.

None of them drains a node, excludes one or blames one.
"""

from __future__ import annotations

import os
import time

import pytest

from slurm_ft import config as config_mod
from slurm_ft.failover import policy
from slurm_ft.journal import open_journal
from slurm_ft.lab.users import LAB_USER, ensure_user, run_as

pytestmark = pytest.mark.lab

#: NVIDIA/pyxis#168: the registry answers 401 to the manifest request.
REJECTED = """\
pyxis: importing docker image: evuedsoacr.azurecr.io/dc-ecosys-appl-eng/mlperf-nvidia:stable_diffusion-pyt
slurmstepd: error: pyxis: child 1022281 failed with error code: 1
slurmstepd: error: pyxis: failed to import docker image
slurmstepd: error: pyxis: printing enroot log file:
slurmstepd: error: pyxis:     [INFO] Querying registry for permission grant
slurmstepd: error: pyxis:     [INFO] Authenticating with user: <anonymous>
slurmstepd: error: pyxis:     [INFO] Authentication succeeded
slurmstepd: error: pyxis:     [INFO] Fetching image manifest list
slurmstepd: error: pyxis:     [INFO] Fetching image manifest
slurmstepd: error: pyxis:     [ERROR] URL https://registry-1.docker.io/v2/evuedsoacr.azurecr.io/dc-ecosys-appl-eng/mlperf-nvidia/manifests/stable_diffusion-pyt returned error code: 401 Unauthorized
slurmstepd: error: pyxis: couldn't start container
slurmstepd: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1
slurmstepd: error: Failed to invoke spank plugin stack
"""
#: NVIDIA/pyxis#53: mksquashfs runs out of space in the node's /run/pyxis (a tmpfs).
TRANSIENT = """\
pyxis: importing docker image ...
slurmstepd: error: pyxis: child 52574 failed with error code: 1
slurmstepd: error: pyxis: failed to import docker image
slurmstepd: error: pyxis: printing contents of log file ...
slurmstepd: error: pyxis:     [INFO] Querying registry for permission grant
slurmstepd: error: pyxis:     [INFO] Authentication succeeded
slurmstepd: error: pyxis:     [INFO] Fetching image manifest list
slurmstepd: error: pyxis:     [INFO] Fetching image manifest
slurmstepd: error: pyxis:     [INFO] Found all layers in cache
slurmstepd: error: pyxis:     [INFO] Extracting image layers...
slurmstepd: error: pyxis:     [INFO] Converting whiteouts...
slurmstepd: error: pyxis:     [INFO] Creating squashfs filesystem...
slurmstepd: error: pyxis:     Write failed because No space left on device
slurmstepd: error: pyxis:     FATAL ERROR:Failed to write to output filesystem
slurmstepd: error: pyxis:     Parallel mksquashfs: Using 2 processors
slurmstepd: error: pyxis:     Creating 4.0 filesystem on /run/pyxis/1000/7.0.squashfs, block size 131072.
"""
#: NVIDIA/pyxis#71: the import fails while downloading layers; pyxis's log names no cause.
FAILED = """\
pyxis: importing docker image: nvcr.io#nvidia/pytorch:20.02-py3
slurmstepd: error: pyxis: child 129103 failed with error code: 1
slurmstepd: error: pyxis: failed to import docker image
slurmstepd: error: pyxis: printing enroot log file:
slurmstepd: error: pyxis:     [INFO] Querying registry for permission grant
slurmstepd: error: pyxis:     [INFO] Authenticating with user: <anonymous>
slurmstepd: error: pyxis:     [INFO] Authentication succeeded
slurmstepd: error: pyxis:     [INFO] Fetching image manifest list
slurmstepd: error: pyxis:     [INFO] Fetching image manifest
slurmstepd: error: pyxis:     [INFO] Downloading 59 missing layers...
slurmstepd: error: pyxis: couldn't start container
"""

#: case -> (printed lines, expected verdict, expected rule)
CASES = {
    "rejected": (REJECTED, "user", "image-pull-rejected"),
    "transient": (TRANSIENT, "infra", "image-pull-transient"),
    "failed": (FAILED, "unknown", "image-pull-failed"),
}


@pytest.fixture(scope="module")
def user(lab):
    return ensure_user()


def _journal(lab):
    return open_journal(config_mod.load(lab.lay.ft_conf).journal.path)


def _submit(lab, name: str, text: str) -> int:
    """An ft job of the lab's user that prints ``text`` to its stderr and exits 1."""
    jobs = lab.lay.jobs_dir
    stamp = time.time_ns()
    lines = jobs / f"image-pull-{name}-{stamp}.txt"
    lines.write_text(text)
    os.chmod(lines, 0o644)
    script = jobs / f"image-pull-{name}-{stamp}.sh"
    script.write_text(f"#!/bin/sh\ncat {lines} >&2\nexit 1\n")
    os.chmod(script, 0o755)
    argv = ["/usr/bin/sbatch", "--parsable", f"--output={jobs}/%j.out", "--ft", "--ft-retries=3", str(script)]
    proc = run_as(LAB_USER, argv, lab.env(), cwd=str(jobs))
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def _no_blame(lab, slurm, job_id: int) -> None:
    """No node drained by slurm-ft, no drain action, no node excluded for ``job_id``."""
    for n in slurm.nodes():
        assert not (n.drained and n.reason.startswith("slurm-ft:")), (n.name, n.reason)
    with _journal(lab) as j:
        acts = j.actions(job_id)
        assert not [a for a in acts if a["action"] == "drain"], acts
        assert not (j.job(job_id) or {}).get("excluded_nodes"), j.job(job_id)
    job = slurm.job(job_id)
    if job is not None:
        assert not job.excluded_nodes, job


def test_image_pull_failures_through_the_epilog(lab, slurm, user, ft_history):
    """The three jobs run at once; each attempt 0's epilog verdict is the expected class/rule;
    only the transient one is failed over (unblamed), no node is drained or excluded."""
    jobs = {name: _submit(lab, name, text) for name, (text, _v, _r) in CASES.items()}
    try:
        settled = {}
        for name, job_id in jobs.items():
            want_retry = name == "transient"
            settled[name] = ft_history(
                job_id, lambda h, r=want_retry: h["attempts"] and h["attempts"][0]["verdict"] and (
                    h["failovers"] >= 1 if r else h["ft_state"] in policy.FINAL_STATES), timeout_s=150)
        for name, job_id in jobs.items():
            _text, verdict, rule = CASES[name]
            h = settled[name]
            first = h["attempts"][0]
            assert (first["verdict"], first["rule"]) == (verdict, rule), (name, h)
            assert not first["xids"], (name, h)
            with _journal(lab) as j:
                rows = j.verdicts(job_id, 0)
            assert rows and all((v["verdict"], v["rule"]) == (verdict, rule) for v in rows), (name, rows)
            _no_blame(lab, slurm, job_id)
        # the registry refused the image / the import failed for no known cause: not retried
        for name in ("rejected", "failed"):
            h = settled[name]
            assert h["failovers"] == 0 and len(h["attempts"]) == 1, (name, h)
            # its own visible state (the seed's imagepullbackoff), not user-error/failed
            assert h["ft_state"] == policy.IMAGE_PULL_FAILED, (name, h)
        # the node's cache was full: retried elsewhere once, blaming no node (no exclusion above)
        h = settled["transient"]
        assert h["failovers"] == 1 and h["ft_state"] not in (policy.USER_ERROR, policy.FAILED,
                                                             policy.IMAGE_PULL_FAILED), h
        job = slurm.job(jobs["transient"])
        assert job is not None and (job.restart_count >= 1 or job.state == "PENDING"), job
    finally:
        for job_id in jobs.values():  # the retried one waits out Slurm's requeue delay: not needed
            slurm.run("scancel", str(job_id), check=False)
