"""The health-check scope on the real lab (issue 24): the prolog learns each node's GPUs from
Slurm's own record (22.05's ``scontrol show node -o``), caches it, and checks the count Slurm says.

The lab's nodes all have ``gres/gpu`` (other lab tests rely on it), so "a node without gres/gpu
is never drained" is proven at unit level through the real prolog entry with a fake ``scontrol``
and the fake NVML (tests/test_health_scope.py); here the real Slurm shapes and the real path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurm_ft import config as config_mod
from slurm_ft.health.scope import node_facts, read_cache, record_facts, scontrol_lookup
from slurm_ft.lab.layout import GPUS_PER_NODE

pytestmark = pytest.mark.lab


def test_the_lab_node_records_give_each_nodes_gpus(lab, slurm, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(lab.lay.slurm_conf))   # as slurmd gives the prolog
    cfg = config_mod.load(lab.lay.ft_conf)
    for node in ("n1", "n2", "n3"):
        assert record_facts(slurm.show_node(node)) == (GPUS_PER_NODE, ("gpu",))
    lookup = scontrol_lookup(cfg)
    record = lookup("n1")
    assert record["NodeName"] == "n1" and record_facts(record)[0] == GPUS_PER_NODE


def test_a_job_s_prolog_asks_slurm_and_caches_the_record(lab, slurm, workdir):
    cfg = config_mod.load(lab.lay.ft_conf)
    state = cfg.node_state.dir
    Path(state, "slurm-node-n2.json").unlink(missing_ok=True)   # the next prolog on n2 must ask slurmctld
    proc = subprocess.run(["/usr/bin/sbatch", "--parsable", "-w", "n2", f"--output={workdir}/%j.out",
                           "--wrap", "true"], capture_output=True, text=True, timeout=30, env=lab.env())
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip().split(";")[0])
    done = slurm.wait_job(job_id, lambda j: j.ended, 120, 0.2)
    assert done is not None and done.state == "COMPLETED", done
    cached = read_cache(state, "n2")
    assert cached is not None and cached[1:] == (GPUS_PER_NODE, ("gpu",))
    assert slurm.show_node("n2")["State"].split("+")[0] != "DRAIN"
    facts = node_facts(state, "n2", ttl_s=300, lookup=lambda n: pytest.fail("a fresh cache must be used"))
    assert facts.source == "cache" and facts.gpus == GPUS_PER_NODE
