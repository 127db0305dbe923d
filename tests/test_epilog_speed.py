"""The epilog's own cost (issue 22: <= 0.15 s median as slurmd runs it, benchmarks/epilog_overhead.py):
the shapes that keep it short, checked structurally so a later change cannot quietly undo them.

* A clean job's epilog never imports sqlite_utils (the journal writes through plain sqlite3;
  ``Journal.db`` makes a ``sqlite_utils.Database`` only on first use) nor click.
* A large kernel-log window is classified on grep's candidate lines (slurm_ft.node.epilog.classify_window)
  and gives exactly the verdict of the pure-Python scan."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st

from slurm_ft.node import epilog
from slurm_ft.classify import Evidence, classify, default_policy
from slurm_ft.classify import prefilter

ROOT = Path(__file__).resolve().parents[1]

NOISE = ("IPv6: ADDRCONF(NETDEV_CHANGE): veth{n:x}: link becomes ready",
         "br-{n:x}: port 3(veth{n:x}) entered forwarding state",
         "EXT4-fs (nvme0n1p{b}): mounted filesystem with ordered data mode. Quota mode: none.",
         "usb 1-{b}: new high-speed USB device number {n} using xhci_hcd")
#: Kernel records and job output lines that decide verdicts (real wordings from the corpus).
SIGNALS = ("NVRM: Xid (PCI:0000:10:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
           "NVRM: Xid (PCI:0000:11:00): 31, pid=99, name=python, Ch 00000008, intr 00000000. MMU Fault",
           "mlx5_core 0000:1a:00.0 ibp26s0: Link down",
           "Out of memory: Killed process 4242 (python) total-vm:1000kB",
           "NVRM: GPU 0000:10:00.0: RmInitAdapter failed! (0x22:0x56:742)")
OUTPUT = ("", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
          "srun: error: n1: task 0: Segmentation fault (core dumped)\n",
          "RuntimeError: CUDA error: uncorrectable ECC error encountered\n")


def test_a_clean_epilog_imports_neither_sqlite_utils_nor_click(tmp_path):
    conf = tmp_path / "slurm-ft.toml"
    conf.write_text(f'[journal]\npath = "{tmp_path}/d.db"\nnode_path = "{tmp_path}/node-{{node}}.db"\n'
                    f'[node_state]\ndir = "{tmp_path}/state"\nlog = "{tmp_path}/node.log"\n'
                    f'[nvml]\nbackend = "fake"\ninventory = "{tmp_path}/{{node}}.json"\n'
                    f'[slurm]\nbin_dir = "{tmp_path}/bin"\n')
    from slurm_ft.nvml import fake
    fake.write_inventory(str(tmp_path / "n1.json"), "n1", [{"index": 0}, {"index": 1}])
    env = {"SLURM_FT_CONFIG": str(conf), "SLURMD_NODENAME": "n1", "SLURM_JOB_RESTART_COUNT": "0",
           "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_GPUS": "0", "SLURM_JOB_UID": str(os.getuid()),
           "PATH": "/usr/bin:/bin"}
    code = ("import json, sys\n"
            "import slurm_ft.classify.sources as s\n"
            "s.read_kmsg = lambda since, **kw: []\n"          # no kernel record: the common path
            "from slurm_ft.node import epilog\n"
            "from slurm_ft.node.job import NodeJob, write_start_marker\n"
            "for job in ('1', '2'):\n"                        # the first run creates the journal
            "    env = {**%r, 'SLURM_JOB_ID': job}\n"
            "    write_start_marker(%r, NodeJob.from_env(env))\n"   # the prolog's marker: the usual path
            "    assert epilog.run(env) == 0\n"
            "    if job == '1':\n"
            "        [sys.modules.pop(m) for m in list(sys.modules) if m.split('.')[0] in ('sqlite_utils', 'click')]\n"
            "print(json.dumps(sorted(m for m in ('sqlite_utils', 'click') if m in sys.modules)))\n") % (
                env, str(tmp_path / "state"))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []
    from slurm_ft.journal import open_journal
    with open_journal(tmp_path / "node-n1.db") as j:
        assert [v["rule"] for v in j.verdicts(2)] == ["clean-exit"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lines=st.integers(500, 3000),
       signals=st.lists(st.sampled_from(SIGNALS), max_size=3), output=st.sampled_from(OUTPUT),
       exit_code=st.sampled_from([0, 1, 139]))
def test_a_large_window_gives_the_verdict_of_the_python_scan(seed, lines, signals, output, exit_code):
    rnd = random.Random(seed)
    kernel = [rnd.choice(NOISE).format(n=rnd.randrange(1, 1 << 20), b=rnd.randrange(1, 9)) for _ in range(lines)]
    for s in signals:
        kernel.insert(rnd.randrange(len(kernel) + 1), s)
    while sum(map(len, kernel)) < prefilter.GREP_MIN_BYTES:     # a window the epilog greps
        kernel += kernel
    ev = Evidence(kernel_lines=kernel, stderr_tail=output, exit_code=exit_code, kernel_records=True,
                  job_bus_ids=frozenset({"0000:10:00"}), node_bus_ids={"0000:10:00": 0, "0000:11:00": 1})
    policy = default_policy()
    assert epilog.classify_window(ev, policy) == classify(ev, policy, prefilter="python")
