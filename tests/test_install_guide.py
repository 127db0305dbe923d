"""docs/install.md, followed verbatim on a plain Debian Slurm cluster (marker ``docker``).

The cluster: the Docker lab's debootstrap *base* image of the Slurm version under test
(``$SLURM_FT_LAB_SLURM``: 24.11 on trixie, 22.05 on bookworm), with no slurm-ft in it; a controller
``ctl`` and two compute nodes, ``n1`` with one (fake) GPU in its Slurm record and ``n2`` with none;
Debian's own paths (/etc/slurm, SlurmUser=slurm), each host its own copy of slurm.conf, no shared
file system, no systemd. What a site brings before the guide is set up here: Slurm and munge
working, the built ``.deb`` in ``/srv/slurm-ft/`` (step 1 says to copy it there) and the site's
``/etc/slurm-ft/slurm-ft.toml`` (a fake NVML inventory for n1, which has no driver; config
management distributes it, step 2).

Then every ``sh`` block of docs/install.md whose ``# when:`` lines are ``deb`` / ``no systemd`` runs
as it is, as root, on each host its ``# on:`` line names (extracted from the file: the guide is the
test). Then: ``slurm-ft doctor`` exits 0 on every host; ``srun`` works inside batch jobs (ft and
not) on both nodes; an Xid 79 on n1's GPU drains n1 and requeues the ft job off it; n2 (no GPUs)
is never drained.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "install.md"
#: which ``# when:`` conditions this cluster meets
WHEN = {"deb", "no systemd"}
ROLES = {"ctl": "controller", "n1": "compute", "n2": "compute"}
INVENTORY = "/var/lib/slurm-ft-site/nvml/{node}.json"


def guide_blocks() -> list[tuple[set[str], set[str], str]]:
    """(hosts, when-conditions, body) of each ```sh block of docs/install.md."""
    out = []
    for body in re.findall(r"^```sh\n(.*?)^```", GUIDE.read_text(), re.M | re.S):
        m = re.match(r"# on: ([\w, -]+)\n((?:# when: [\w ]+\n)*)", body)
        assert m, f"an sh block of docs/install.md has no '# on:' line:\n{body}"
        hosts = {h.strip() for h in m.group(1).split(",")}
        when = {w.strip() for w in re.findall(r"# when: ([\w ]+)\n", m.group(2))}
        out.append((hosts, when, body))
    return out


def test_guide_blocks_name_known_hosts_and_conditions():
    """No block is silently skipped by the end-to-end test for a typo in its markers."""
    blocks = guide_blocks()
    assert blocks
    for hosts, when, body in blocks:
        assert hosts <= {"all", "controller", "compute", "login", "build-host"}, body
        assert when <= {"deb", "pip", "systemd", "no systemd"}, body
    ran = [b for h, w, b in blocks if w <= WHEN and h != {"build-host"}]
    assert any("apt-get install" in b for b in ran) and any("slurm-ft install --role compute" in b for b in ran)


# -- the cluster ----------------------------------------------------------------------------------
def _bus_id(number: int) -> str:
    """n1's GPU: PCI domain 0x00E0 + lab number, used by no other lab (docker_engine: D0-D7)."""
    return f"{0xE0 + number:08X}:10:00.0"


def _slurm_conf(version: str, ip: dict[str, str]) -> str:
    return "\n".join([
        f"ClusterName=guide{version.replace('.', '')}", f"SlurmctldHost=ctl({ip['ctl']})",
        "SlurmUser=slurm", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        "StateSaveLocation=/var/lib/slurm/slurmctld", "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurm/slurmctld.pid", "SlurmdPidFile=/run/slurm/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log", "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none", "MailProg=/bin/true", "ReturnToService=2", "SlurmdTimeout=10",
        "SlurmdParameters=config_overrides", "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
        "GresTypes=gpu",
        f"NodeName=n1 NodeAddr={ip['n1']} CPUs=4 RealMemory=4000 Gres=gpu:1 State=UNKNOWN",
        f"NodeName=n2 NodeAddr={ip['n2']} CPUs=4 RealMemory=4000 State=UNKNOWN",
        "PartitionName=main Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n"


SITE_CONFIG = f"""# the site's slurm-ft config (tests/test_install_guide.py): n1 has no NVIDIA driver
[nvml]
backend = "fake"
inventory = "{INVENTORY}"

[failover]
poll_interval_s = 0.5

[breaker]
max_nodes = 2
max_fraction = 1.0
"""

ENTRY = """set -eu
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /run/slurm && chown munge:munge /run/munge && chown slurm:slurm /run/slurm
runuser -u munge -- /usr/sbin/munged --force
if [ "$1" = ctl ]; then exec /usr/sbin/slurmctld -D -i >>/var/log/slurm/slurmctld.stdout 2>&1; fi
if [ "$1" = n1 ]; then mkdir -p /dev/lab-gpu && mknod -m 0666 /dev/lab-gpu/nvidia0 c 1 3; fi
exec /usr/sbin/slurmd -D -N "$1" >>/var/log/slurm/slurmd.stdout 2>&1
"""


def _tar(files: dict[str, tuple[bytes, int]], dirs: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        for path, (data, mode) in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class GuideCluster:
    """Three containers of the plain base image on their own network; ``run`` = a shell block."""

    def __init__(self, version: str):
        from slurm_ft.lab import docker_engine as D
        self.D = D
        self.version = version
        self.number = D.VERSIONS[version][2]
        self.prefix = f"sftguide-{version.replace('.', '')}"
        self.subnet = f"172.31.{248 + self.number}.0"
        self.client = D._client()
        self.ip = {"ctl": self.subnet[:-1] + "10", "n1": self.subnet[:-1] + "11", "n2": self.subnet[:-1] + "12"}

    def down(self) -> None:
        import docker
        for c in self.client.containers.list(all=True, filters={"label": f"slurm-ft-guide={self.prefix}"}):
            c.remove(force=True)
        for net in self.client.networks.list(names=[f"{self.prefix}-net"]):
            if net.attrs.get("Labels", {}).get("slurm-ft-guide") == self.prefix:
                try:
                    net.remove()
                except docker.errors.APIError:
                    pass

    def up(self, deb: Path) -> None:
        import docker
        from slurm_ft.nvml import fake
        D = self.D
        self.down()
        base = D.build_base(self.client, self.version, log=lambda *_: None)
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=self.subnet + "/24")])
        net = self.client.networks.create(f"{self.prefix}-net", driver="bridge", ipam=ipam,
                                          labels={"slurm-ft-guide": self.prefix})
        key = secrets.token_bytes(1024)
        conf = _slurm_conf(self.version, self.ip).encode()
        inv = Path(f"/tmp/{self.prefix}-n1.json")
        gpu = {"index": 0, "pci_bus_id": _bus_id(self.number), "name": "NVIDIA H100 80GB HBM3",
               "uuid": f"GPU-e{self.number:07x}-0001-4000-8000-000000000000"}
        fake.write_inventory(str(inv), "n1", [gpu])
        for name in ROLES:
            files = {"etc/slurm/slurm.conf": (conf, 0o644),
                     "etc/slurm-ft/slurm-ft.toml": (SITE_CONFIG.encode(), 0o644),
                     f"srv/slurm-ft/{deb.name}": (deb.read_bytes(), 0o644)}
            dirs = ["etc/slurm-ft", "srv/slurm-ft"]
            if name == "n1":
                files["etc/slurm/gres.conf"] = (b"NodeName=n1 Name=gpu File=/dev/lab-gpu/nvidia0\n", 0o644)
                files[INVENTORY.format(node="n1").lstrip("/")] = (inv.read_bytes(), 0o644)
                dirs += ["var/lib/slurm-ft-site", "var/lib/slurm-ft-site/nvml"]
            c = self.client.containers.create(
                base, ["/bin/sh", "-c", ENTRY, "entry", name], name=f"{self.prefix}-{name}", hostname=name,
                init=True, cap_add=list(D.CAPS), devices=["/dev/kmsg:/dev/kmsg:rw"],
                security_opt=["seccomp=unconfined", "apparmor=unconfined"], environment={"LC_ALL": "C.UTF-8"},
                labels={"slurm-ft-guide": self.prefix})
            net.connect(c, ipv4_address=self.ip[name], aliases=[name])
            try:
                self.client.networks.get("bridge").disconnect(c)
            except docker.errors.APIError:
                pass
            c.put_archive("/etc/munge", _tar({"munge.key": (key, 0o400)}))
            c.put_archive("/", _tar(files, tuple(dirs)))
            c.start()
        inv.unlink()

    def container(self, name: str):
        return self.client.containers.get(f"{self.prefix}-{name}")

    def sh(self, name: str, script: str, check: bool = True) -> tuple[int, str]:
        rc, out, err = self.D.exec_in(self.container(name), ["/bin/sh", "-ec", script], workdir="/root")
        text = out.decode(errors="replace") + err.decode(errors="replace")
        if check:
            assert rc == 0, f"on {name}, rc {rc}:\n{script}\n--- output:\n{text[-3000:]}"
        return rc, text

    def wait(self, ok, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ok():
                return
            time.sleep(0.5)
        _, log = self.sh("ctl", "tail -n 30 /var/log/slurm/slurmctld.log", check=False)
        pytest.fail(f"{what}: not within {timeout_s:g} s; slurmctld.log:\n{log}")

    def states(self) -> dict[str, str]:
        rc, out = self.sh("ctl", "sinfo -N -h -o '%N %T'", check=False)
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2) if rc == 0 else {}

    def job(self, job_id: str) -> dict[str, str]:
        _, out = self.sh("ctl", f"scontrol show job -o {job_id}", check=False)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def job_processes(self, node: str, job_id: str) -> list[tuple[int, str]]:
        """(host pid, job id) of job ``job_id``'s processes in ``node``'s container."""
        from slurm_ft.lab.inject import job_processes
        c = self.container(node)
        ns = os.readlink(f"/proc/{c.attrs['State']['Pid']}/ns/pid")
        found = []
        for pid, job in job_processes(node, None):
            try:
                if job == job_id and os.readlink(f"/proc/{pid}/ns/pid") == ns:
                    found.append((pid, job))
            except OSError:
                continue
        return found


@pytest.fixture(scope="module")
def guide_cluster():
    if os.geteuid() != 0:
        pytest.skip("the Docker lab needs root")
    from slurm_ft.lab import docker_engine as D
    version = D.version_or_default(None)
    deb_build = D.deb_builder()
    deb = deb_build.cached_deb(deb_build.release_for_slurm(version), log=lambda *_: None)
    cluster = GuideCluster(version)
    try:
        cluster.up(deb)
        cluster.wait(lambda: cluster.states().get("n1", "").startswith("idle")
                     and cluster.states().get("n2", "").startswith("idle"), 90, "a plain Slurm cluster")
        yield cluster
    finally:
        cluster.down()


@pytest.mark.docker
def test_install_guide_verbatim_on_a_mixed_cluster(guide_cluster):
    cl = guide_cluster
    t0 = time.monotonic()
    ran = 0
    for hosts, when, body in guide_blocks():
        if not when <= WHEN:
            continue
        for name, role in ROLES.items():
            if "all" in hosts or role in hosts:
                cl.sh(name, body)
                ran += 1
    assert ran >= 9
    cl.wait(lambda: all(s.startswith("idle") for s in cl.states().values()) and len(cl.states()) == 2, 60,
            "nodes idle after the guide")
    # doctor: a config-management check, so it must pass on every host (the controller's once the
    # daemon started by step 5 has written its first heartbeat)
    for name in ROLES:
        deadline = time.monotonic() + 30
        while True:
            rc, out = cl.sh(name, "slurm-ft doctor", check=False)
            if rc == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        if rc != 0 and name == "ctl":
            out += cl.sh(name, "tail -n 20 /var/log/slurm-ft/daemon.stderr /var/log/slurm-ft/daemon.log; "
                               "ps -ef | grep -v grep | grep 'slurm-ft daemon'", check=False)[1]
        assert rc == 0, f"slurm-ft doctor on {name}:\n{out}"
    _, out = cl.sh("ctl", "sbatch --help")
    assert "--ft" in out, "the SPANK plugin is not loaded after step 4"

    # srun inside batch jobs, ft and not, on both nodes (the GPU-less one passes every prolog)
    ids = {}
    for node, ft in (("n1", ""), ("n2", ""), ("n2", "--ft ")):
        _, out = cl.sh("ctl", f"sbatch --parsable -w {node} {ft}-o /tmp/%j.out --wrap 'srun hostname'")
        ids[out.strip().split(";")[0]] = node
    for job_id, node in ids.items():
        cl.wait(lambda: cl.job(job_id).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"),
                60, f"job {job_id}")
        info = cl.job(job_id)
        _, out = cl.sh(node, f"cat /tmp/{job_id}.out", check=False)
        assert info.get("JobState") == "COMPLETED", f"srun in a batch job on {node}: {info}\n{out}"
        assert out.strip() == node, out
    assert cl.states()["n2"].startswith("idle")

    # an ft job on the GPU node; Xid 79 there: n1 drained, the job requeued off it
    _, out = cl.sh("ctl", "sbatch --parsable --ft --requeue --gres=gpu:1 -o /tmp/%j.out --wrap 'srun sleep 600'")
    job_id = out.strip().split(";")[0]
    cl.wait(lambda: cl.job(job_id).get("JobState") == "RUNNING" and cl.job_processes("n1", job_id), 60,
            f"ft job {job_id} running on n1")
    from slurm_ft.lab.inject import xid_fault
    done = xid_fault(_bus_id(cl.number), 79, cl.job_processes("n1", job_id))
    assert done["killed"]
    cl.wait(lambda: int(cl.job(job_id).get("Restarts", "0")) >= 1, 90, f"ft job {job_id} requeued")
    _, reason = cl.sh("ctl", "scontrol show node n1 | grep -o 'Reason=.*'")
    assert "slurm-ft: Xid 79" in reason, reason
    assert "n1" in cl.job(job_id).get("ExcNodeList", ""), cl.job(job_id)
    assert cl.states()["n1"].startswith("drain") and not cl.states()["n2"].startswith("drain")
    _, hist = cl.sh("ctl", f"ft-history -j {job_id}", check=False)
    assert "xid-79" in hist or "Xid 79" in hist, hist
    # the GPU-less node was never drained, not even for a moment (slurmctld logs each drain)
    _, log = cl.sh("ctl", "grep -i 'drain' /var/log/slurm/slurmctld.log || true")
    assert "n2" not in log, log
    cl.sh("ctl", f"scancel {job_id}", check=False)
    print(f"install guide on Slurm {cl.version}: {time.monotonic() - t0:.1f} s after the cluster was up")
