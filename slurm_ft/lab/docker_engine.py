"""The Docker lab: a controller container and N compute containers, Slurm 22.05 or 24.11.

One job: images, the network and containers, driven through the ``docker`` SDK (never the docker
CLI). ``slurm-ft lab up --engine docker --slurm 24.11`` and the ``docker``-marked tests use it.

Images are built offline from Debian's packages (no registry is needed): ``debootstrap`` of the
suite that ships the Slurm version (bookworm: 22.05, trixie: 24.11) is imported as a *base* image,
then a thin layer adds a venv with slurm-ft's runtime dependencies (wheels downloaded on the host
for the image's Python, installed with ``--no-index``) and the SPANK plugin compiled against that
image's ``libslurm-dev``. Both are tagged with a hash of their inputs and reused while it matches;
slurm-ft's own code is not in the image: each ``up`` copies a snapshot of it (``slurm_ft/``,
prolog, epilog, contrib, examples) into ``DIR/code``, mounted read-only at ``/opt/slurm-ft/src``
(a ``.pth`` file in the venv points there), so a code change needs no rebuild.

Containers (``sftlab-<ver>-ctl``, ``sftlab-<ver>-n1``...) sit on their own bridge network with a
fixed subnet and fixed addresses, and do not share a filesystem, except:

* ``/shared`` (``DIR/shared``): job output and checkpoints, as a site's shared file system;
* ``/lab`` (``DIR/<container>``): that container's own logs, spool, journals and fake NVML
  inventory, private to it (a host directory only so that tests can read it);
* ``/etc/slurm-lab`` (``DIR/conf``, read-only) and ``/opt/slurm-ft/src`` (``DIR/code``,
  read-only): configuration and software, as a site distributes them to every node.

The munge key is made at ``up`` and copied into each container before it starts
(``put_archive``). Faults are real: :meth:`DockerLab.kill_node` (``docker kill``: the node and its
jobs die), :meth:`DockerLab.pause_node` (a hung node), :meth:`DockerLab.partition_node` (network
cut: slurmd unreachable while the job keeps running and writing to ``/shared``),
:meth:`DockerLab.restart_node` (reboot). All containers share the host's kernel, so
:meth:`DockerLab.inject_xid` writes to the host's ``/dev/kmsg`` with the docker lab's own PCI
domain (:func:`bus_id`: ``0x00D0``/``0x00D4``, never a native lab's ``0000``-``0003``).
"""

from __future__ import annotations

import configparser
import hashlib
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import LabError, SlurmCommandError
from ..slurm import SAFE_PATH, Slurm
from . import layout as L

#: Slurm version -> (Debian suite, the suite's Python, lab number: network 172.31.24N.0/24 and PCI domain).
VERSIONS = {"22.05": ("bookworm", "3.11", 0), "24.11": ("trixie", "3.13", 1)}
DEFAULT_VERSION = "24.11"
MIRROR = "http://deb.debian.org/debian"
#: Debian packages of the base image (debootstrap --variant=minbase --include=...).
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "libslurm-dev", "gcc", "libc6-dev", "make",
            "python3", "python3-venv", "procps", "iproute2", "lua5.1")
CACHE = Path("/var/cache/slurm-ft/docker")
DEFAULT_NODES = 3
IMAGE_REPO = "slurm-ft-lab"
#: Where things are inside the containers.
CONF = "/etc/slurm-lab"
SRC = "/opt/slurm-ft/src"
VENV = "/opt/slurm-ft/venv"
SPANK_SO = "/opt/slurm-ft/lib/slurm_ft_spank.so"
PRIVATE = "/lab"
#: Capabilities beyond Docker's default set (not ``--privileged``: some hosts withhold
#: CAP_SYS_RESOURCE, and runc then refuses a privileged container). SYSLOG: read /dev/kmsg;
#: SYS_PTRACE: /proc of other users' processes (checkpoint delivery); SYS_ADMIN, NET_ADMIN, SYS_NICE,
#: IPC_LOCK: what slurmd/slurmstepd use.
CAPS = ("SYSLOG", "SYS_PTRACE", "SYS_ADMIN", "NET_ADMIN", "SYS_NICE", "IPC_LOCK")
SHARED = "/shared"


def version_or_default(version: str | None) -> str:
    """The Slurm version to use: ``version``, else ``$SLURM_FT_LAB_SLURM``, else 24.11. Raises
    :class:`LabError` for a version the Docker lab has no image for."""
    v = version or os.environ.get("SLURM_FT_LAB_SLURM") or DEFAULT_VERSION
    if v not in VERSIONS:
        raise LabError(f"--slurm must be one of {', '.join(VERSIONS)}, got {v!r}")
    return v


def bus_id(version: str, node_no: int, gpu: int) -> str:
    """NVML-style PCI bus id of GPU ``gpu`` of Docker-lab node ``n{node_no}``: PCI domain
    ``0x00D0`` (22.05) or ``0x00D4`` (24.11) plus ``node_no // 16``, so that no line injected for
    one lab is ever attributed to a node of another (native labs use domains 0000-0003)."""
    domain = 0xD0 + 4 * VERSIONS[version][2] + node_no // 16
    return f"{domain:08X}:{(node_no % 16) * 16 + gpu:02X}:00.0"


def inventory_gpus(version: str, node: str) -> list[dict]:
    """The fake NVML inventory of Docker-lab node ``node`` (as :func:`layout.inventory_gpus`)."""
    gpus = L.inventory_gpus(node)
    k = L.node_number(node)
    for g in gpus:
        g["pci_bus_id"] = bus_id(version, k, g["index"])
        g["uuid"] = f"GPU-d{VERSIONS[version][2]:07x}-{k:04x}-4000-8000-{g['index']:012x}"
    return gpus


def _client():
    try:
        import docker
    except ImportError:
        raise LabError("the python `docker` SDK is missing: pip install -e '.[test]' (make setup)") from None
    try:
        c = docker.from_env(timeout=120)
        c.ping()
    except Exception as exc:  # docker.errors.DockerException and connection errors
        raise LabError(f"dockerd does not answer ({exc}); start it (make setup: scripts/setup-system.sh)") from None
    return c


def _not_found():
    import docker
    return docker.errors.NotFound


def read_frames(fp) -> tuple[bytes, bytes]:
    """stdout and stderr of an exec, read from ``fp`` up to EOF: Docker's multiplexed stream
    (frames of an 8-byte header, ``stream, 0, 0, 0, size (big-endian u32)``, then ``size`` bytes;
    stream 1 stdout, 2 stderr). Raises :class:`LabError` on a frame of another stream."""
    import struct
    out: dict[int, list[bytes]] = {1: [], 2: []}
    while True:
        head = fp.read(8)
        if not head:
            break
        if len(head) < 8:
            raise LabError(f"docker exec stream cut inside a frame header ({len(head)} of 8 bytes)")
        stream, size = struct.unpack(">BxxxL", head)
        if stream not in out:
            raise LabError(f"docker exec stream out of step: frame of stream {stream}")
        data = fp.read(size)
        if len(data) < size:
            raise LabError(f"docker exec stream cut inside a frame ({len(data)} of {size} bytes)")
        out[stream].append(data)
    return b"".join(out[1]), b"".join(out[2])


def exec_in(container, argv: list[str], *, user: str = "root", environment: dict | None = None,
            workdir: str = "/") -> tuple[int, bytes, bytes]:
    """Run ``argv`` (no shell) in ``container``; returns (exit code, stdout, stderr).

    Not ``Container.exec_run``: docker-py reads the exec's output from the socket *under* the
    buffered reader that http.client read the response headers through, so whatever output
    arrived with the headers sits unread in that buffer and is lost. On a busy host (a fast
    command, a slow client) that happens often: measured on this lab at load ~30, 30 of 400
    ``squeue --json`` calls failed with ``ValueError: 114 is not a valid stream`` (output bytes
    taken for a frame header) and a loss on a frame boundary silently cuts the output instead.
    Here the frames are read through that same buffered reader (docker-py's own request calls)."""
    api = container.client.api
    ex = api.exec_create(container.id, argv, stdout=True, stderr=True, user=user,
                         environment=environment or {}, workdir=workdir)
    res = api._post_json(api._url("/exec/{0}/start", ex["Id"]), data={"Tty": False, "Detach": False},
                         headers={"Connection": "Upgrade", "Upgrade": "tcp"}, stream=True)
    try:
        api._raise_for_status(res)
        fp = getattr(getattr(res.raw, "_fp", None), "fp", None)
        if fp is None:
            raise LabError("docker exec: no response stream to read (docker SDK changed? see exec_in)")
        out, err = read_frames(fp)
    finally:
        res.close()
    rc = api.exec_inspect(ex["Id"]).get("ExitCode")
    return (-1 if rc is None else rc), out, err


def _timed(log, what: str, t0: float) -> None:
    log(f"docker lab: {what} in {time.monotonic() - t0:.1f} s")


# ------------------------------------------------------------------------------------ images
def runtime_requirements(repo: Path | None = None) -> list[str]:
    """slurm-ft's ``install_requires`` from setup.cfg (what the in-image venv needs)."""
    cfg = configparser.ConfigParser()
    cfg.read((repo or L.repo_root()) / "setup.cfg")
    return [ln.strip() for ln in cfg["options"]["install_requires"].splitlines() if ln.strip()]


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:12]


def base_tag(version: str) -> str:
    """Tag of the debootstrap base image: a hash of the suite and the package list."""
    suite = VERSIONS[version][0]
    return f"{IMAGE_REPO}:{version}-base-{_digest(suite, MIRROR, *PACKAGES)}"


def _spank_source(repo: Path) -> Path:
    return repo / "slurm_ft" / "data" / "spank"


def image_tag(version: str, repo: Path | None = None) -> str:
    """Tag of the lab image: a hash of the base tag, the runtime requirements and the SPANK
    plugin's source and Makefile (slurm-ft's Python code is not in the image)."""
    repo = repo or L.repo_root()
    spank = _spank_source(repo)
    return (f"{IMAGE_REPO}:{version}-"
            f"{_digest(base_tag(version), *runtime_requirements(repo), (spank / 'slurm_ft_spank.c').read_bytes(), (spank / 'Makefile').read_bytes(), _LAYER)}")


_LAYER = f"""FROM {{base}}
COPY wheels /tmp/wheels
COPY spank /tmp/spank
RUN python3 -m venv {VENV} \\
 && {VENV}/bin/pip install -q --no-index --find-links /tmp/wheels -r /tmp/wheels/requirements.txt \\
 && echo {SRC} > "$({VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/slurm-ft-src.pth" \\
 && make -s -C /tmp/spank \\
 && install -D -m 0755 /tmp/spank/slurm_ft_spank.so {SPANK_SO} \\
 && rm -rf /tmp/wheels /tmp/spank
"""


def _cache_dir() -> Path:
    from .cluster import check_lab_dir
    for d in (CACHE.parent, CACHE):
        if not d.exists():
            os.mkdir(d, 0o755)
    check_lab_dir(CACHE)  # root builds from it: a root-only directory, no symlinks
    return CACHE


def _image_exists(client, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except _not_found():
        return False


def build_base(client, version: str, log=print) -> str:
    """The debootstrap base image for ``version`` (built once: ~1-2 min, then cached). Returns its tag."""
    tag = base_tag(version)
    if _image_exists(client, tag):
        return tag
    suite = VERSIONS[version][0]
    cache = _cache_dir()
    root = cache / f"rootfs-{version}"
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.monotonic()
    log(f"docker lab: debootstrap {suite} (Slurm {version}) into {root}")
    proc = subprocess.run(["/usr/sbin/debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                           suite, str(root), MIRROR], capture_output=True, text=True,
                          env={"PATH": SAFE_PATH, "LC_ALL": "C"}, timeout=1800)
    if proc.returncode != 0:
        raise LabError(f"debootstrap {suite} failed (rc {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    _timed(log, f"debootstrap {suite}", t0)
    t1 = time.monotonic()
    tar = cache / f"rootfs-{version}.tar"
    with tarfile.open(tar, "w") as tf:
        for entry in sorted(os.listdir(root)):
            if entry in ("proc", "sys", "dev"):
                tf.add(root / entry, arcname=entry, recursive=False)
            else:
                tf.add(root / entry, arcname=entry)
    client.api.import_image_from_file(str(tar), repository=tag.split(":")[0], tag=tag.split(":")[1],
                                      changes=["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    tar.unlink()
    shutil.rmtree(root, ignore_errors=True)
    _timed(log, f"import of {tag}", t1)
    return tag


def download_wheels(version: str, dest: Path, repo: Path | None = None) -> None:
    """Wheels of slurm-ft's runtime requirements for the image's Python (``pip download`` on the
    host, which has PyPI; the containers need none), plus ``requirements.txt``."""
    pyver = VERSIONS[version][1]
    reqs = runtime_requirements(repo)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "requirements.txt").write_text("\n".join(reqs) + "\n")
    argv = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest), "--only-binary=:all:",
            "--python-version", pyver, "--implementation", "cp",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
            "--platform", "manylinux_2_28_x86_64", "--platform", "any", "-r", str(dest / "requirements.txt")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise LabError(f"pip download for Python {pyver} failed:\n{proc.stderr[-2000:]}")


def build_image(version: str, log=print, client=None) -> str:
    """The lab image for Slurm ``version`` (base + venv + SPANK plugin), built if its tag is
    missing, else reused. Returns the tag. Raises :class:`LabError` when a step fails."""
    version = version_or_default(version)
    client = client or _client()
    repo = L.repo_root()
    tag = image_tag(version, repo)
    if _image_exists(client, tag):
        log(f"docker lab: image {tag} cached")
        return tag
    t0 = time.monotonic()
    base = build_base(client, version, log)
    t1 = time.monotonic()
    ctx = _cache_dir() / f"ctx-{version}"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir()
    download_wheels(version, ctx / "wheels", repo)
    spank = ctx / "spank"
    spank.mkdir()
    for name in ("slurm_ft_spank.c", "Makefile"):
        shutil.copyfile(_spank_source(repo) / name, spank / name)
    (ctx / "Dockerfile").write_text(_LAYER.format(base=base))
    try:
        client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True, network_mode="none")
    except Exception as exc:
        lines = getattr(exc, "build_log", None) or []
        text = "".join(str(x.get("stream", x.get("error", ""))) for x in lines if isinstance(x, dict))
        raise LabError(f"building {tag} failed: {exc}\n{text[-3000:]}") from None
    shutil.rmtree(ctx, ignore_errors=True)
    _timed(log, f"layer {tag}", t1)
    _timed(log, f"image for Slurm {version}", t0)
    return tag


# ------------------------------------------------------------------------------------ config
def render_slurm_conf(version: str, ip: dict[str, str], nodes: list[str]) -> str:
    """slurm.conf of the Docker lab (controller ``ctl``, nodes with fixed addresses ``ip``), the
    same for 22.05 and 24.11: both parse ``CredType=cred/munge`` and the old ``CryptoType`` name
    (22.05 reports ``CredType = cred/munge`` either way; measured in both images)."""
    lines = [
        "# Written by `slurm-ft lab up --engine docker`.",
        f"ClusterName=sftlab{version.replace('.', '')}",
        f"SlurmctldHost=ctl({ip['ctl']})",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"StateSaveLocation={PRIVATE}/state", f"SlurmdSpoolDir={PRIVATE}/spool",
        f"SlurmctldPidFile={PRIVATE}/run/slurmctld.pid", f"SlurmdPidFile={PRIVATE}/run/slurmd.pid",
        f"SlurmctldLogFile={PRIVATE}/log/slurmctld.log", f"SlurmdLogFile={PRIVATE}/log/slurmd.log",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none", "MpiDefault=none",
        "MailProg=/bin/true",  # 24.11 logs "Configured MailProg is invalid" when /usr/bin/mail is missing
        "ReturnToService=2", "SlurmdTimeout=10", "InactiveLimit=0", "KillWait=5", "MinJobAge=600",
        "SlurmdParameters=config_overrides",  # 4 CPUs per node on a 2-core host
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
        "GresTypes=gpu",
        f"Prolog={SRC}/prolog/slurm-ft-prolog", f"Epilog={SRC}/epilog/slurm-ft-epilog",
        "PrologFlags=Alloc", "PrologEpilogTimeout=60",
        f"PrologSlurmctld={CONF}/ctld-event", f"EpilogSlurmctld={CONF}/ctld-event",
        f"PlugStackConfig={CONF}/plugstack.conf", "CliFilterPlugins=lua", "JobSubmitPlugins=lua",
    ]
    for n in nodes:
        lines.append(f"NodeName={n} NodeHostname={n} NodeAddr={ip[n]} CPUs=4 RealMemory=4000 "
                     f"Gres=gpu:{L.GPUS_PER_NODE} State=UNKNOWN")
    lines.append(f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_ft_conf(nodes: int) -> str:
    """slurm-ft.toml of the Docker lab: every path in the container's own ``/lab``."""
    from .cluster import ft_conf_text
    return ft_conf_text("Docker lab (written by `slurm-ft lab up --engine docker`)", PRIVATE, nodes)


#: Container entry (run by docker-init as PID 1's child): munge with the key copied in, then
#: slurmctld (``ctl``) or slurmd (a node, with its two fake GPU device files).
ENTRY = f"""#!/bin/sh
set -eu
role=$1
mkdir -p {PRIVATE}/log {PRIVATE}/run {PRIVATE}/state {PRIVATE}/spool {PRIVATE}/journal {PRIVATE}/nodestate \\
         {PRIVATE}/heartbeat /run/munge
chown munge:munge /etc/munge/munge.key /run/munge
chmod 0400 /etc/munge/munge.key
runuser -u munge -- /usr/sbin/munged --force
if [ "$role" = ctl ]; then
    mkdir -p {PRIVATE}/events && chmod 0700 {PRIVATE}/events
    exec /usr/sbin/slurmctld -D -i >>{PRIVATE}/log/slurmctld.stdout 2>&1
fi
mkdir -p /dev/lab-gpu
for g in $(seq 0 {L.GPUS_PER_NODE - 1}); do [ -e /dev/lab-gpu/nvidia$g ] || mknod -m 0666 /dev/lab-gpu/nvidia$g c 1 3; done
exec /usr/sbin/slurmd -D -N "$role" >>{PRIVATE}/log/slurmd.stdout 2>&1
"""

#: (Re)starts the slurm-ft daemon in ``ctl`` with the code under /opt/slurm-ft/src.
DAEMON = f"""#!/bin/sh
pidf={PRIVATE}/run/slurm-ft-daemon.pid
if [ -f $pidf ]; then
    pid=$(cat $pidf)
    if kill -0 "$pid" 2>/dev/null && grep -q slurm_ft /proc/$pid/cmdline 2>/dev/null; then
        kill -TERM "$pid"
        for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f $pidf
fi
[ "${{1:-start}}" = stop ] && exit 0
cd /
PYTHONUNBUFFERED=1 SLURM_FT_CONFIG={CONF}/slurm-ft.toml setsid {VENV}/bin/python -m slurm_ft.cli daemon \\
    >>{PRIVATE}/log/daemon.log 2>&1 </dev/null &
echo $! > $pidf
"""


# ------------------------------------------------------------------------------------ the lab
@dataclass
class Submitted:
    """A job submitted to the Docker lab: its id, and its output and checkpoint files as host paths."""
    job_id: int
    out: Path
    ckpt: Path


class DockerSlurm(Slurm):
    """A :class:`Slurm` whose commands run inside the lab's controller container (the host's own
    Slurm client may be another version, whose RPCs the lab's slurmctld would refuse)."""

    def __init__(self, container, timeout_s: float = 10.0):
        super().__init__(timeout_s=timeout_s, conf=f"{CONF}/slurm.conf")
        self._container = container

    def run(self, cmd: str, *args: str, check: bool = True, timeout_s: float | None = None,
            as_user: tuple[int, int] | None = None) -> subprocess.CompletedProcess:
        """As :meth:`Slurm.run`, through ``exec`` in the controller (``timeout`` bounds it)."""
        t = timeout_s or self.timeout_s
        argv = ["/usr/bin/timeout", "-k", "2", f"{t:g}", os.path.join(self.bin_dir, cmd), *args]
        user = "root" if as_user is None else f"{as_user[0]}:{as_user[1]}"
        try:
            rc, out, err = exec_in(self._container, argv, environment=self._env, user=user)
        except Exception as exc:
            raise SlurmCommandError(f"{cmd}: exec in {self._container.name} failed: {exc}") from None
        out = out.decode(errors="replace")
        err = err.decode(errors="replace")
        if rc in (124, 137) and as_user is None:
            raise SlurmCommandError(f"{cmd} {' '.join(args)}: timed out after {t:g} s")
        proc = subprocess.CompletedProcess([cmd, *args], rc, out, err)
        if check and rc != 0:
            msg = (err or out).strip().splitlines()
            raise SlurmCommandError(f"{cmd} {' '.join(args)}: rc={rc}: {msg[-1] if msg else ''}")
        return proc


class DockerLab:
    """The Docker lab of one Slurm version, rooted at ``dir`` on the host
    (default ``/var/tmp/slurm-ft-dlab-<version>``)."""

    def __init__(self, version: str | None = None, dir: str | os.PathLike | None = None):
        self.version = version_or_default(version)
        self.number = VERSIONS[self.version][2]
        self.dir = Path(os.path.abspath(dir or f"/var/tmp/slurm-ft-dlab-{self.version}"))
        self.prefix = f"sftlab-{self.version.replace('.', '')}"
        self.network_name = f"{self.prefix}-net"
        self.subnet = f"172.31.{240 + self.number}.0/24"
        self._client = None

    # -- plumbing ------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            self._client = _client()
        return self._client

    def ip(self, name: str) -> str:
        """Fixed address of container ``name`` (``ctl``: .10, ``nK``: .10+K) on the lab network."""
        base = self.subnet.rsplit(".", 1)[0]
        return f"{base}.10" if name == "ctl" else f"{base}.{10 + L.node_number(name)}"

    def container_name(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def container(self, name: str):
        """The container of ``ctl`` or node ``nK`` (docker SDK object, reloaded)."""
        return self.client.containers.get(self.container_name(name))

    def private(self, name: str) -> Path:
        """Host directory mounted as ``/lab`` in container ``name`` (its logs, journals, inventory)."""
        return self.dir / name

    @property
    def shared(self) -> Path:
        return self.dir / "shared"

    @property
    def jobs_dir(self) -> Path:
        """Host path of ``/shared/jobs`` (job output and checkpoints)."""
        return self.shared / "jobs"

    def host_path(self, path: str) -> Path:
        """Host path of a container path under ``/shared``; raises :class:`LabError` otherwise."""
        p = Path(path)
        if p.parts[:2] != ("/", "shared"):
            raise LabError(f"{path}: not under {SHARED}")
        return self.shared.joinpath(*p.parts[2:])

    def inventory(self, node: str) -> Path:
        """Host path of node ``node``'s fake NVML inventory."""
        return self.private(node) / "nvml" / f"{node}.json"

    def daemon_journal(self) -> Path:
        return self.private("ctl") / "journal" / "daemon.db"

    def node_journal(self, node: str) -> Path:
        return self.private(node) / "journal" / f"node-{node}.db"

    def log(self, name: str, file: str) -> Path:
        return self.private(name) / "log" / file

    def _state(self) -> dict:
        try:
            return json.loads((self.dir / "lab.json").read_text())
        except (OSError, ValueError):
            return {}

    def nodes(self) -> list[str]:
        return self._state().get("nodes", [])

    def slurm(self, timeout_s: float = 10.0) -> DockerSlurm:
        """A :class:`Slurm` runner whose commands run in the controller container."""
        return DockerSlurm(self.container("ctl"), timeout_s)

    def exec(self, name: str, argv: list[str], *, user: str = "root", env: dict | None = None,
             check: bool = True) -> tuple[int, str]:
        """Run ``argv`` in container ``name`` (no shell); returns (rc, stdout text). Raises
        :class:`LabError` with the command's stderr when ``check`` and rc != 0."""
        rc, out, err = exec_in(self.container(name), argv, user=user, environment=env)
        text = out.decode(errors="replace")
        if check and rc != 0:
            why = (err.decode(errors="replace") + text).strip()[-500:]
            raise LabError(f"{name}: {' '.join(argv)}: rc {rc}: {why}")
        return rc, text

    # -- up / down -----------------------------------------------------------------------
    def up(self, nodes: int = DEFAULT_NODES, daemon: bool = True, log=print) -> dict:
        """Build (or reuse) the image, then start a fresh lab: network, controller, ``nodes``
        compute containers, the slurm-ft daemon. Idempotent only in the sense that an earlier lab
        of this version is removed first. Returns :meth:`status`. Raises :class:`LabError`."""
        from .cluster import check_lab_dir
        if os.geteuid() != 0:
            raise LabError("the Docker lab needs root (dockerd, /dev/kmsg)")
        if not 1 <= nodes <= L.MAX_NODES:
            raise LabError(f"--nodes must be 1..{L.MAX_NODES}, got {nodes}")
        t0 = time.monotonic()
        tag = build_image(self.version, log, self.client)
        self.down(log=lambda *_: None)
        t1 = time.monotonic()
        check_lab_dir(self.dir, create=True)
        want = L.node_names(nodes)
        self._fresh_files(want)
        self._network()
        common = dict(image=tag, init=True, cap_add=list(CAPS), devices=["/dev/kmsg:/dev/kmsg:rw"],
                      security_opt=["seccomp=unconfined", "apparmor=unconfined"],
                      environment={"SLURM_CONF": f"{CONF}/slurm.conf", "SLURM_FT_CONFIG": f"{CONF}/slurm-ft.toml",
                                   "LC_ALL": "C.UTF-8"},
                      labels={"slurm-ft-lab": self.prefix})
        key = secrets.token_bytes(1024)
        for name in ["ctl", *want]:
            self._create(name, key, common)
        self._wait(lambda: self._ping(), 40, "slurmctld", "ctl", "slurmctld.log")
        self._wait(lambda: self._healthy(want), 60, "slurmd", want[0], "slurmd.log")
        state = {"version": self.version, "image": tag, "nodes": want, "started_at": time.time(),
                 "slurm_version": self.slurm_version()}
        (self.dir / "lab.json").write_text(json.dumps(state, indent=1))
        if daemon:
            self.daemon_start()
        _timed(log, f"up ({len(want)} nodes, Slurm {state['slurm_version']}, image {tag})", t1)
        log(f"docker lab up: {self.dir} ({time.monotonic() - t0:.1f} s in all)")
        return self.status()

    def _fresh_files(self, nodes: list[str]) -> None:
        from ..nvml import fake as fake_nvml
        from .. import assets
        from ..config import FailoverConfig
        for sub in ["ctl", *nodes, "conf", "code", "shared"]:
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        for sub in ["ctl", *nodes, "conf"]:
            (self.dir / sub).mkdir(mode=0o755)
        self.shared.mkdir(mode=0o755)
        self.jobs_dir.mkdir()
        os.chmod(self.jobs_dir, 0o1777)
        conf = self.dir / "conf"
        ip = {n: self.ip(n) for n in ["ctl", *nodes]}
        (conf / "slurm.conf").write_text(render_slurm_conf(self.version, ip, nodes))
        last = L.GPUS_PER_NODE - 1
        (conf / "gres.conf").write_text("".join(f"NodeName={n} Name=gpu File=/dev/lab-gpu/nvidia[0-{last}]\n"
                                                for n in nodes))
        (conf / "slurm-ft.toml").write_text(render_ft_conf(len(nodes)))
        (conf / "plugstack.conf").write_text(f"# Written by `slurm-ft lab up --engine docker`.\noptional {SPANK_SO}\n")
        (conf / "cli_filter.lua").write_text(assets.render_cli_filter())
        fo = FailoverConfig()
        (conf / "job_submit.lua").write_text(assets.render_job_submit(fo.max_retries, fo.retries))
        for name, text in (("ctld-event", f"#!/bin/sh\nSLURM_FT_EVENTS_DIR={PRIVATE}/events exec "
                                          f"{SRC}/contrib/slurm-ft-ctld-event\n"),
                           ("entry", ENTRY), ("daemon", DAEMON)):
            (conf / name).write_text(text)
            os.chmod(conf / name, 0o755)
        code = self.dir / "code"
        repo = L.repo_root()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        code.mkdir()
        for sub in ("slurm_ft", "prolog", "epilog", "contrib", "examples"):
            shutil.copytree(repo / sub, code / sub, ignore=ignore, symlinks=True)
        for n in nodes:
            (self.private(n) / "nvml").mkdir()
            fake_nvml.write_inventory(str(self.inventory(n)), n, inventory_gpus(self.version, n))

    def _network(self):
        import docker
        try:
            return self.client.networks.get(self.network_name)
        except docker.errors.NotFound:
            pass
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=self.subnet)])
        return self.client.networks.create(self.network_name, driver="bridge", ipam=ipam,
                                           labels={"slurm-ft-lab": self.prefix})

    def _create(self, name: str, key: bytes, common: dict) -> None:
        import docker
        mounts = [
            docker.types.Mount(PRIVATE, str(self.private(name)), type="bind"),
            docker.types.Mount(SHARED, str(self.shared), type="bind"),
            docker.types.Mount(CONF, str(self.dir / "conf"), type="bind", read_only=True),
            docker.types.Mount(SRC, str(self.dir / "code"), type="bind", read_only=True),
        ]
        c = self.client.containers.create(name=self.container_name(name), hostname=name, mounts=mounts,
                                          command=[f"{CONF}/entry", name], **common)
        # the address is fixed (a partitioned node comes back with it): connect by hand
        self.client.networks.get(self.network_name).connect(c, ipv4_address=self.ip(name), aliases=[name])
        try:
            self.client.networks.get("bridge").disconnect(c)
        except docker.errors.APIError:
            pass
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo("munge.key")
            info.size, info.mode = len(key), 0o400
            tf.addfile(info, io.BytesIO(key))
        c.put_archive("/etc/munge", buf.getvalue())
        c.start()

    def down(self, log=print) -> None:
        """Remove this version's lab containers and network (only those labelled as this lab's)."""
        import docker
        n = 0
        for c in self.client.containers.list(all=True, filters={"label": f"slurm-ft-lab={self.prefix}"}):
            try:
                c.remove(force=True)
                n += 1
            except docker.errors.NotFound:
                pass
        for net in self.client.networks.list(names=[self.network_name]):
            if net.attrs.get("Labels", {}).get("slurm-ft-lab") == self.prefix:
                net.remove()
        log(f"docker lab {self.version} down ({n} containers removed)")

    def status(self) -> dict:
        """Containers and their states, nodes as Slurm sees them."""
        st = self._state()
        info = {"dir": str(self.dir), "version": self.version, "image": st.get("image"), "nodes": st.get("nodes", []),
                "slurm_version": st.get("slurm_version"), "containers": {}}
        for c in self.client.containers.list(all=True, filters={"label": f"slurm-ft-lab={self.prefix}"}):
            info["containers"][c.name] = c.status
        info["running"] = bool(info["containers"]) and all(s == "running" for s in info["containers"].values())
        return info

    def slurm_version(self) -> str:
        """``scontrol --version`` in the controller, e.g. ``24.11.5``."""
        _, out = self.exec("ctl", ["/usr/bin/scontrol", "--version"])
        return out.split()[-1]

    def _ping(self) -> bool:
        try:
            rc, out = self.exec("ctl", ["/usr/bin/scontrol", "ping"], check=False)
        except Exception:
            return False
        return rc == 0 and "UP" in out

    def _healthy(self, nodes: list[str]) -> bool:
        try:
            rc, out = self.exec("ctl", ["/usr/bin/sinfo", "-N", "-h", "-o", "%N %t"], check=False)
        except Exception:
            return False
        if rc != 0:
            return False
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        bad = ("down", "unk", "fail", "inval", "npc", "boot")
        return all(n in states and not any(states[n].startswith(b) for b in bad) for n in nodes)

    def _wait(self, ok, timeout_s: float, what: str, name: str, logfile: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ok():
                return
            time.sleep(0.3)
        from .cluster import tail
        raise LabError(f"{what} did not come up within {timeout_s:g} s; log tail ({self.log(name, logfile)}):\n"
                       f"{tail(self.log(name, logfile))}")

    # -- the daemon ----------------------------------------------------------------------
    def daemon_start(self) -> None:
        """(Re)start the slurm-ft daemon in the controller with the current code snapshot."""
        self.exec("ctl", [f"{CONF}/daemon", "start"])

    def daemon_stop(self) -> None:
        self.exec("ctl", [f"{CONF}/daemon", "stop"])

    # -- faults --------------------------------------------------------------------------
    def kill_node(self, node: str) -> None:
        """``docker kill``: the node (slurmd, its jobs) dies at once, as on a power loss."""
        self.container(node).kill()

    def pause_node(self, node: str) -> None:
        """``docker pause``: every process of the node freezes (a hung node)."""
        self.container(node).pause()

    def unpause_node(self, node: str) -> None:
        self.container(node).unpause()

    def partition_node(self, node: str) -> None:
        """Cut the node off the lab network: its slurmd is unreachable, its jobs keep running."""
        self.client.networks.get(self.network_name).disconnect(self.container(node), force=True)

    def heal_node(self, node: str) -> None:
        """Reconnect a partitioned node with its own address."""
        self.client.networks.get(self.network_name).connect(self.container(node), ipv4_address=self.ip(node),
                                                            aliases=[node])

    def restart_node(self, node: str) -> None:
        """Reboot: restart the container (a killed one is started again)."""
        c = self.container(node)
        if c.status == "paused":
            c.unpause()
        c.restart(timeout=2)

    def node_back(self, node: str) -> None:
        """Undo any fault on ``node`` (unpause, reconnect, start): used between tests."""
        c = self.container(node)
        if c.status == "paused":
            c.unpause()
        nets = c.attrs.get("NetworkSettings", {}).get("Networks", {}) or {}
        if self.network_name not in nets:
            self.heal_node(node)
        c.reload()
        if c.status != "running":
            c.start()

    def job_processes(self, node: str, gpu: int | None) -> list[tuple[int, str]]:
        """(host pid, job id) of the job processes in node ``node``'s container holding GPU
        ``gpu`` (any if None): :func:`slurm_ft.lab.inject.job_processes` restricted to the
        container's own pid namespace (a native lab may have a node of the same name)."""
        from .inject import job_processes
        c = self.container(node)
        init = c.attrs["State"]["Pid"]
        try:
            ns = os.readlink(f"/proc/{init}/ns/pid")
        except OSError:
            return []
        found = []
        for pid, job in job_processes(node, gpu):
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                    found.append((pid, job))
            except OSError:
                continue
        return found

    def inject_xid(self, node: str, xid: int, gpu: int = 0, kill: bool = True) -> dict:
        """Write an NVRM Xid line for node ``node``'s GPU ``gpu`` (the Docker lab's bus id) to the
        host's /dev/kmsg, which every container shares; with ``kill``, SIGKILL that GPU's job
        processes in the node's container. Returns ``{"line", "killed"}``."""
        from .inject import xid_fault
        if not 0 <= gpu < L.GPUS_PER_NODE:
            raise LabError(f"gpu must be 0..{L.GPUS_PER_NODE - 1}, got {gpu}")
        procs = self.job_processes(node, gpu) if kill else []
        return xid_fault(bus_id(self.version, L.node_number(node), gpu), xid, procs)

    # -- jobs ------------------------------------------------------------------------------
    def sbatch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """``sbatch --parsable ARGS`` as root in the controller (the submit host), with the
        image's venv first on PATH (the job inherits it: ``python3`` there can import slurm_ft)."""
        slurm = self.slurm(30)
        slurm._env = {**slurm._env, "PATH": f"{VENV}/bin:{SAFE_PATH}"}
        return slurm.run("sbatch", "--parsable", *args, check=check)

    def submit_training(self, *, steps: int = 60, step_time: float = 0.25, extra: list[str] = (),
                        comment: str = "ft") -> Submitted:
        """examples/train.sbatch with its output and checkpoint in ``/shared/jobs``; returns
        host paths (see :func:`slurm_ft.lab.demo.submit_training`)."""
        stamp = f"{time.time_ns()}"
        ckpt = f"{SHARED}/jobs/ckpt-{stamp}.json"
        proc = self.sbatch(f"--output={SHARED}/jobs/%j.out", f"--comment={comment}", *extra,
                           f"{SRC}/examples/train.sbatch", f"{SRC}/examples/train.py", ckpt,
                           "--steps", str(steps), "--step-time", str(step_time))
        job_id = int(proc.stdout.strip().split(";")[0])
        return Submitted(job_id, self.jobs_dir / f"{job_id}.out", self.host_path(ckpt))

    def reset(self, slurm: Slurm) -> None:
        """Test isolation: cancel live jobs, undo node faults, resume every node, heal every fake GPU."""
        from ..nvml import fake
        from .demo import wait_for
        live = [str(j.job_id) for j in slurm.jobs() if not j.ended]
        if live:
            slurm.run("scancel", *live)
        for n in self.nodes():
            self.node_back(n)
            fake.write_inventory(str(self.inventory(n)), n, inventory_gpus(self.version, n))
        if live:
            wait_for(lambda: not any(not j.ended for j in slurm.jobs()), 60, "leftover jobs to end", 0.5)
        for node in slurm.nodes():
            if node.drained or node.state.lower().startswith("down"):
                slurm.run("scontrol", "update", f"NodeName={node.name}", "State=RESUME", check=False)
        wait_for(lambda: all(n.state.lower() in ("idle", "mixed", "allocated") and not n.drained
                             for n in slurm.nodes()), 90, "every lab node idle", 0.5)
