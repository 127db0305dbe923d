"""The Docker lab: a controller container and N compute containers, Slurm 22.05, 24.11 or 26.05.

One job: images, the network and containers, driven through the ``docker`` SDK (never the docker
CLI). ``slurm-ft lab up --engine docker --slurm 24.11`` and the ``docker``-marked tests use it.

Images are built offline from Debian's packages (no registry is needed): ``debootstrap`` of the
suite that ships the Slurm version (bookworm: 22.05, trixie: 24.11, forky: 26.05) is imported as a
*base* image (plain Debian Slurm, no slurm-ft), then a thin layer installs slurm-ft as an admin does: the
release's ``.deb`` (``packaging/deb/build.py``, ``cached_deb``: built from the checkout, offline,
in that same base image) with ``apt-get install``, then ``slurm-ft install --only wrappers --only
ctld_event``, and compiles the SPANK plugin against the image's ``libslurm-dev``. Both are
tagged with a hash of their inputs (the layer's: the package's source digest) and reused while
it matches, so a change to slurm-ft's code builds a new package and layer (measured in
docs/lab.md).

Containers (``sftlab-<ver>-ctl``, ``sftlab-<ver>-n1``...) sit on their own bridge network with a
fixed subnet and fixed addresses, and do not share a filesystem, except:

* ``/shared`` (``DIR/shared``): job output and checkpoints, as a site's shared file system;
* ``/lab`` (``DIR/<container>``): that container's own logs, spool, journals and fake NVML
  inventory, private to it (a host directory only so that tests can read it);
* ``/etc/slurm-lab`` (``DIR/conf``, read-only): configuration, as a site distributes it to every
  node (the software is in the image, from the package).

The munge key is made at ``up`` and copied into each container before it starts
(``put_archive``). Faults are real: :meth:`DockerLab.kill_node` (``docker kill``: the node and its
jobs die), :meth:`DockerLab.pause_node` (a hung node), :meth:`DockerLab.partition_node` (network
cut: slurmd unreachable while the job keeps running and writing to ``/shared``),
:meth:`DockerLab.restart_node` (reboot). ``scontrol reboot NODE`` really restarts the node's
container (slurm.conf's ``RebootProgram``, :data:`REBOOT_NODE`; the container's restart policy
and entry, :func:`rebooted_sh`), and ``slurm-ft health --act`` is the ``HealthCheckProgram``
(issue 26's break-fix remediation). All containers share the host's kernel, so
:meth:`DockerLab.inject_xid` writes to the host's ``/dev/kmsg`` with the docker lab's own PCI
domain (:func:`bus_id`: ``0x00D0``/``0x00D4``/``0x00D8``, never a native lab's ``0000``-``0003``).
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
from pathlib import Path

from slurm_ft.errors import LabError, SlurmCommandError
from slurm_ft.slurm import SAFE_PATH, Slurm
from slurm_ft.lab import layout as L
from slurm_ft.lab.demo import Submitted

#: Slurm version -> (Debian suite, the suite's Python, lab number: network 172.31.24N.0/24 and PCI domain).
#: forky is Debian testing (Slurm 26.05.5 and Python 3.14 when added; docs/lab.md).
VERSIONS = {"22.05": ("bookworm", "3.11", 0), "24.11": ("trixie", "3.13", 1), "26.05": ("forky", "3.14", 2)}
DEFAULT_VERSION = "24.11"
MIRROR = "http://deb.debian.org/debian"
#: debootstrap's suite scripts; a Debian suite newer than the host's debootstrap (bookworm's has no
#: ``forky``) uses ``sid``'s, as debootstrap's own scripts for every suite since bullseye are links to it.
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")
#: Debian packages of the base image (debootstrap --variant=minbase --include=...).
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "libslurm-dev", "gcc", "libc6-dev", "make",
            "python3", "python3-venv", "procps", "iproute2", "lua5.1")
CACHE = Path("/var/cache/slurm-ft/docker")
DEFAULT_NODES = 3
IMAGE_REPO = "slurm-ft-lab"
#: Where things are inside the containers.
CONF = "/etc/slurm-lab"
VENV = "/opt/slurm-ft/venv"
#: What the package and ``slurm-ft install`` put in the image.
LIBEXEC = "/usr/local/libexec/slurm-ft"
EXAMPLES = f"{VENV}/share/slurm-ft/examples"
SPANK_SO = "/usr/local/lib/slurm-ft/slurm_ft_spank.so"
PRIVATE = "/lab"
#: The controller containers of ``up(controllers=N)`` (``SlurmctldHost`` order: primary, backup).
CONTROLLERS = ("ctl", "ctl2")
#: StateSaveLocation of a lab with a backup controller: ``DIR/ctld-state``, mounted in both
#: controller containers (Slurm requires it shared; a site uses shared storage).
CTLD_STATE = "/ctld-state"
#: SlurmctldTimeout (s) of a lab with a backup controller: the backup takes over ~this long after
#: the primary stops (Slurm's default is 120 s; its heartbeat then beats every 6 // 4 = 1 s).
CTLD_TIMEOUT_S = 6
#: Capabilities beyond Docker's default set (not ``--privileged``: some hosts withhold
#: CAP_SYS_RESOURCE, and runc then refuses a privileged container). SYSLOG: read /dev/kmsg;
#: SYS_PTRACE: /proc of other users' processes (checkpoint delivery); SYS_ADMIN, NET_ADMIN, SYS_NICE,
#: IPC_LOCK: what slurmd/slurmstepd use.
CAPS = ("SYSLOG", "SYS_PTRACE", "SYS_ADMIN", "NET_ADMIN", "SYS_NICE", "IPC_LOCK")
SHARED = "/shared"
#: Restart policy of the node containers: ended by a signal (the power switch's cut after a RebootProgram, exit
#: 137) Docker starts them again; ``docker kill`` (:meth:`DockerLab.kill_node`) and ``docker stop``
#: mark a container stopped by hand, which Docker never restarts (moby's ``killWithSignal`` cancels
#: the restart manager; tests/test_docker_lab.py ``test_lost_node_fails_over[kill]`` asserts it).
NODE_RESTART_POLICY = {"Name": "on-failure", "MaximumRetryCount": 0}
#: Marker the RebootProgram leaves in a node's own ``/lab``: the container's next start is a reboot.
REBOOT_MARKER = f"{PRIVATE}/reboot-requested"
#: What the Docker lab adds to slurm.conf for issue 26 (as the native lab's ``Lab.health_check``,
#: but always on: a site that remediates runs it at every slurmd start): slurmd runs the program
#: when it starts (after a reboot, before it registers) only with an interval > 0; 65535 s (the
#: most 22.05 accepts) keeps it to that start.
HEALTH_CHECK_LINES = (f"HealthCheckProgram={CONF}/health-check", "HealthCheckInterval=65535")


def version_or_default(version: str | None) -> str:
    """The Slurm version to use: ``version``, else ``$SLURM_FT_LAB_SLURM``, else 24.11. Raises
    :class:`LabError` for a version the Docker lab has no image for."""
    v = version or os.environ.get("SLURM_FT_LAB_SLURM") or DEFAULT_VERSION
    if v not in VERSIONS:
        raise LabError(f"--slurm must be one of {', '.join(VERSIONS)}, got {v!r}")
    return v


def bus_id(version: str, node_no: int, gpu: int) -> str:
    """NVML-style PCI bus id of GPU ``gpu`` of Docker-lab node ``n{node_no}``: PCI domain
    ``0x00D0`` (22.05), ``0x00D4`` (24.11) or ``0x00D8`` (26.05) plus ``node_no // 16``, so that no
    line injected for one lab is ever attributed to a node of another (native labs use domains 0000-0003)."""
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


def deb_builder(repo: Path | None = None):
    """``packaging/deb/build.py`` of the checkout, as a module (the package build; not part of
    the installed ``slurm_ft``: the lab runs from a checkout)."""
    import importlib.util
    path = (repo or L.repo_root()) / "packaging" / "deb" / "build.py"
    name = "slurm_ft_deb_build"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not path.is_file():
        raise LabError(f"{path} is missing: the Docker lab installs slurm-ft from the package it builds")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def image_tag(version: str, repo: Path | None = None) -> str:
    """Tag of the lab image: a hash of the base tag, the package's source digest (slurm-ft's
    code, setup.cfg, the packaging: ``build.py`` ``source_digest``) and the layer."""
    repo = repo or L.repo_root()
    return f"{IMAGE_REPO}:{version}-{_digest(base_tag(version), deb_builder(repo).source_digest(repo), _LAYER)}"


#: The lab layer: the package as an admin installs it (apt-get, offline: its dependencies are in
#: the base image), then what ``slurm-ft install`` writes from it (wrappers, ctld hook, the SPANK
#: plugin's source: built and installed as docs/install.md step 4 does, at :data:`SPANK_SO`).
_LAYER = """FROM {base}
COPY slurm-ft.deb /tmp/slurm-ft.deb
RUN apt-get install -y -q --no-install-recommends /tmp/slurm-ft.deb >/dev/null \\
 && slurm-ft install --only wrappers --only ctld_event --only spank --slurm-user root >/dev/null \\
 && make -s -C /usr/local/src/slurm-ft/spank install \\
 && rm -f /tmp/slurm-ft.deb
"""


def _cache_dir() -> Path:
    from slurm_ft.lab.cluster import check_lab_dir
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


def debootstrap_script(suite: str, scripts: Path = DEBOOTSTRAP_SCRIPTS) -> list[str]:
    """debootstrap's SCRIPT argument for ``suite``: none when the host's debootstrap knows the
    suite, else its ``sid`` script (Debian testing and unstable share it). Raises
    :class:`LabError` when neither exists (debootstrap missing: ``make setup``)."""
    if (scripts / suite).exists():
        return []
    if (scripts / "sid").exists():
        return [str(scripts / "sid")]
    raise LabError(f"debootstrap has no script for {suite} nor sid in {scripts}: install debootstrap (make setup)")


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
                           suite, str(root), MIRROR, *debootstrap_script(suite)], capture_output=True, text=True,
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
    """The lab image for Slurm ``version`` (base + slurm-ft's .deb + SPANK plugin), built if its
    tag is missing, else reused. Returns the tag. Raises :class:`LabError` when a step fails."""
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
    deb = deb_builder(repo)
    try:
        pkg = deb.cached_deb(deb.release_for_slurm(version), client=client, log=log, repo=repo)
    except deb.PackagingError as exc:
        raise LabError(str(exc)) from None
    shutil.copyfile(pkg, ctx / "slurm-ft.deb")
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
    _prune_layers(client, version, tag)
    return tag


def _prune_layers(client, version: str, keep: str) -> None:
    """Remove this version's older lab layers (each code change makes one; the base stays). A
    layer a container still uses is refused by dockerd and left."""
    import docker
    for image in client.images.list(name=IMAGE_REPO):
        for t in image.tags:
            if t.startswith(f"{IMAGE_REPO}:{version}-") and not t.startswith(f"{IMAGE_REPO}:{version}-base-") \
                    and t != keep:
                try:
                    client.images.remove(t)
                except docker.errors.APIError:
                    pass


# ------------------------------------------------------------------------------------ config
def render_slurm_conf(version: str, ip: dict[str, str], nodes: list[str], controllers=("ctl",)) -> str:
    """slurm.conf of the Docker lab (controller ``ctl``, nodes with fixed addresses ``ip``), the
    same for 22.05, 24.11 and 26.05: all parse ``CredType=cred/munge`` and the old ``CryptoType``
    name (22.05 reports ``CredType = cred/munge`` either way; measured in the images)."""
    lines = [
        "# Written by `slurm-ft lab up --engine docker`.",
        f"ClusterName=sftlab{version.replace('.', '')}",
        *(f"SlurmctldHost={c}({ip[c]})" for c in controllers),   # primary first, then backups
        *((f"SlurmctldTimeout={CTLD_TIMEOUT_S}",) if len(controllers) > 1 else ()),
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"StateSaveLocation={PRIVATE}/state" if len(controllers) == 1 else f"StateSaveLocation={CTLD_STATE}",
        f"SlurmdSpoolDir={PRIVATE}/spool",
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
        f"Prolog={LIBEXEC}/slurm-ft-prolog", f"Epilog={LIBEXEC}/slurm-ft-epilog",
        "PrologFlags=Alloc,NoHold", "PrologEpilogTimeout=60",   # as docs/install.md (issue 24: per-job cost)
        f"PrologSlurmctld={CONF}/ctld-event", f"EpilogSlurmctld={CONF}/ctld-event",
        f"PlugStackConfig={CONF}/plugstack.conf", "CliFilterPlugins=lua", "JobSubmitPlugins=lua",
        # `scontrol reboot` restarts the node's container (REBOOT_NODE); `slurm-ft health --act` at
        # each slurmd start resumes a repaired node (issue 26, slurm_ft/remediate)
        f"RebootProgram={CONF}/reboot-node", *HEALTH_CHECK_LINES,
    ]
    for n in nodes:
        lines.append(f"NodeName={n} NodeHostname={n} NodeAddr={ip[n]} CPUs=4 RealMemory=4000 "
                     f"Gres=gpu:{L.GPUS_PER_NODE} State=UNKNOWN")
    lines.append(f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_ft_conf(nodes: int) -> str:
    """slurm-ft.toml of the Docker lab: every path in the container's own ``/lab``."""
    from slurm_ft.lab.cluster import ft_conf_text
    return ft_conf_text("Docker lab (written by `slurm-ft lab up --engine docker`)", PRIVATE, nodes)


def rebooted_sh(root: str = PRIVATE) -> str:
    """The entry's boot step of a node (``$role``): if the RebootProgram left its marker
    (``ROOT/reboot-requested``), this start is a reboot: the marker goes, the fake GPU inventory
    comes back as at power-on (``ROOT/nvml/$role.at-boot.json``, written by ``up``) unless the
    fault survives reboots (``ROOT/nvml/$role.survives-reboot``: :meth:`DockerLab.sticky_fault`),
    a line goes to ``ROOT/log/reboot.log``, and ``$boot`` is ``-b`` (slurmd reports the node
    rebooted, which completes Slurm's ``scontrol reboot``: the host's kernel, whose uptime slurmd
    reads, did not reboot); else ``$boot`` is empty. Never fails (under ``set -e``, a failed
    start would make Docker restart the container again and again)."""
    return f"""boot=
if [ -e {root}/reboot-requested ]; then
    rm -f {root}/reboot-requested
    if [ -e {root}/nvml/$role.survives-reboot ]; then
        gpus="left faulty (fault survives reboot)"
    elif cp {root}/nvml/$role.at-boot.json {root}/nvml/.inventory-boot.tmp \\
            && mv -f {root}/nvml/.inventory-boot.tmp {root}/nvml/$role.json; then
        gpus=healed
    else
        gpus="left as they were (no $role.at-boot.json)"
    fi
    echo "$(date -u +%FT%T) lab reboot of $role: container restarted, GPUs $gpus" >>{root}/log/reboot.log
    boot=-b
fi
"""


#: The Docker lab's ``RebootProgram`` (slurmd runs it as root, in the node's container; Slurm 22.05
#: gives it no argument): it only leaves :data:`REBOOT_MARKER`; the node's power switch
#: (:data:`POWER_SWITCH`, started by the entry) cuts the power. The program cannot cut it itself:
#: Slurm 26.05's slurmd runs it in a PID namespace of its own (``run_command``'s clone), where no
#: process of the container can be signalled and every process it leaves behind is killed when
#: it exits (a detached ``pkill`` of the container's processes worked on 22.05 and 24.11 and never
#: ran on 26.05: issue 26's RMA case). Refuses to run anywhere PID 1 is not docker-init (the host,
#: a native lab).
REBOOT_NODE = f"""#!/bin/sh
# The Docker lab's RebootProgram (written by `slurm-ft lab up --engine docker`).
set -u
case "$(tr '\\0' ' ' </proc/1/cmdline)" in
    */docker-init\\ *) ;;
    *) echo "reboot-node: PID 1 is not docker-init: not in a lab node container" >&2; exit 1 ;;
esac
date -u +%FT%T >{REBOOT_MARKER}
echo "$(date -u +%FT%T) lab reboot of $(hostname): requested, the power switch cuts it within 1 s" >>{PRIVATE}/log/reboot.log
exit 0
"""

#: A node's power switch: a child of the entry (outside any namespace slurmd makes) that waits for
#: :data:`REBOOT_MARKER`, gives slurmd half a second to finish the reboot RPC, then cuts the power:
#: SIGKILL to docker-init's children (slurmd, munged). docker-init then exits 137 (128 + SIGKILL),
#: the container stops, and Docker starts it again by :data:`NODE_RESTART_POLICY`; the entry sees
#: the marker (:func:`rebooted_sh`). Polls twice a second (one ``test`` builtin and a ``sleep``).
POWER_SWITCH = (f"( while [ ! -e {REBOOT_MARKER} ]; do sleep 0.5; done; sleep 0.5; exec pkill -KILL -P 1 ) "
                "</dev/null >/dev/null 2>&1 &\n")

#: The Docker lab's ``HealthCheckProgram`` (slurmd, root; ``SLURMD_NODENAME`` set by slurmd).
HEALTH_CHECK = f"""#!/bin/sh
# The Docker lab's HealthCheckProgram (written by `slurm-ft lab up --engine docker`).
SLURM_CONF={CONF}/slurm.conf SLURM_FT_CONFIG={CONF}/slurm-ft.toml PATH={SAFE_PATH} \\
    exec {VENV}/bin/python -m slurm_ft.cli.main health --act
"""

#: Container entry (run by docker-init as PID 1's child): munge with the key copied in, then
#: slurmctld (``ctl``) or slurmd (a node, with its two fake GPU device files; ``-b`` after a
#: reboot asked by the RebootProgram: :func:`rebooted_sh`).
ENTRY = f"""#!/bin/sh
set -eu
role=$1
mkdir -p {PRIVATE}/log {PRIVATE}/run {PRIVATE}/state {PRIVATE}/spool {PRIVATE}/journal {PRIVATE}/nodestate \\
         {PRIVATE}/heartbeat /run/munge
chown munge:munge /etc/munge/munge.key /run/munge
chmod 0400 /etc/munge/munge.key
runuser -u munge -- /usr/sbin/munged --force
if [ "$role" = ctl ] || [ "$role" = ctl2 ]; then
    mkdir -p {PRIVATE}/events && chmod 0700 {PRIVATE}/events
    exec /usr/sbin/slurmctld -D -i >>{PRIVATE}/log/slurmctld.stdout 2>&1
fi
mkdir -p /dev/lab-gpu
for g in $(seq 0 {L.GPUS_PER_NODE - 1}); do [ -e /dev/lab-gpu/nvidia$g ] || mknod -m 0666 /dev/lab-gpu/nvidia$g c 1 3; done
{rebooted_sh()}{POWER_SWITCH}exec /usr/sbin/slurmd $boot -D -N "$role" >>{PRIVATE}/log/slurmd.stdout 2>&1
"""

#: (Re)starts the slurm-ft daemon in ``ctl`` (the package's venv).
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
PYTHONUNBUFFERED=1 SLURM_FT_CONFIG={CONF}/slurm-ft.toml setsid {VENV}/bin/python -m slurm_ft.cli.main daemon \\
    >>{PRIVATE}/log/daemon.log 2>&1 </dev/null &
echo $! > $pidf
"""


# ------------------------------------------------------------------------------------ the lab
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
        if name in CONTROLLERS:   # ctl .10, ctl2 .9
            return f"{base}.{10 - CONTROLLERS.index(name)}"
        return f"{base}.{10 + L.node_number(name)}"

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

    def at_boot_inventory(self, node: str) -> Path:
        """Host path of the inventory a reboot of ``node`` puts back (all GPUs healthy)."""
        return self.private(node) / "nvml" / f"{node}.at-boot.json"

    def daemon_journal(self, controller: str = "ctl") -> Path:
        """Host path of the daemon journal of ``controller`` (each controller has its own)."""
        return self.private(controller) / "journal" / "daemon.db"

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

    def controllers(self) -> list[str]:
        """The controller containers, primary first (``["ctl"]``, or ``["ctl", "ctl2"]``)."""
        return self._state().get("controllers", ["ctl"])

    def slurm(self, timeout_s: float = 10.0, on: str = "ctl") -> DockerSlurm:
        """A :class:`Slurm` runner whose commands run in controller container ``on`` (its Slurm
        client finds the controller in charge, as on any host)."""
        return DockerSlurm(self.container(on), timeout_s)

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
    def up(self, nodes: int = DEFAULT_NODES, daemon: bool = True, log=print, controllers: int = 1) -> dict:
        """Build (or reuse) the image, then start a fresh lab: network, controller, ``nodes``
        compute containers, the slurm-ft daemon. Idempotent only in the sense that an earlier lab
        of this version is removed first. Returns :meth:`status`. Raises :class:`LabError`."""
        from slurm_ft.lab.cluster import check_lab_dir
        if os.geteuid() != 0:
            raise LabError("the Docker lab needs root (dockerd, /dev/kmsg)")
        if not 1 <= nodes <= L.MAX_NODES:
            raise LabError(f"--nodes must be 1..{L.MAX_NODES}, got {nodes}")
        if not 1 <= controllers <= len(CONTROLLERS):
            raise LabError(f"--controllers must be 1..{len(CONTROLLERS)}, got {controllers}")
        ctls = list(CONTROLLERS[:controllers])
        t0 = time.monotonic()
        tag = build_image(self.version, log, self.client)
        self.down(log=lambda *_: None)
        t1 = time.monotonic()
        check_lab_dir(self.dir, create=True)
        want = L.node_names(nodes)
        self._fresh_files(want, ctls)
        self._network()
        common = dict(image=tag, init=True, cap_add=list(CAPS), devices=["/dev/kmsg:/dev/kmsg:rw"],
                      security_opt=["seccomp=unconfined", "apparmor=unconfined"],
                      environment={"SLURM_CONF": f"{CONF}/slurm.conf", "SLURM_FT_CONFIG": f"{CONF}/slurm-ft.toml",
                                   "LC_ALL": "C.UTF-8"},
                      labels={"slurm-ft-lab": self.prefix})
        key = secrets.token_bytes(1024)
        for name in [*ctls, *want]:
            self._create(name, key, common)
        self._wait(lambda: self._ping(), 40, "slurmctld", ctls[-1], "slurmctld.log")
        self._wait(lambda: self._healthy(want), 60, "slurmd", want[0], "slurmd.log")
        state = {"version": self.version, "image": tag, "nodes": want, "started_at": time.time(),
                 "slurm_version": self.slurm_version(), "controllers": ctls}
        (self.dir / "lab.json").write_text(json.dumps(state, indent=1))
        if daemon:
            self.daemon_start()
        _timed(log, f"up ({len(want)} nodes, Slurm {state['slurm_version']}, image {tag})", t1)
        log(f"docker lab up: {self.dir} ({time.monotonic() - t0:.1f} s in all)")
        return self.status()

    def _fresh_files(self, nodes: list[str], ctls=("ctl",)) -> None:
        from slurm_ft.nvml import fake as fake_nvml
        from slurm_ft.admin import assets
        from slurm_ft.config import FailoverConfig
        for sub in [*CONTROLLERS, "ctld-state", *nodes, "conf", "code", "shared"]:
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        for sub in [*ctls, *(["ctld-state"] if len(ctls) > 1 else []), *nodes, "conf"]:
            (self.dir / sub).mkdir(mode=0o755)
        self.shared.mkdir(mode=0o755)
        self.jobs_dir.mkdir()
        os.chmod(self.jobs_dir, 0o1777)
        conf = self.dir / "conf"
        ip = {n: self.ip(n) for n in [*ctls, *nodes]}
        (conf / "slurm.conf").write_text(render_slurm_conf(self.version, ip, nodes, ctls))
        last = L.GPUS_PER_NODE - 1
        (conf / "gres.conf").write_text("".join(f"NodeName={n} Name=gpu File=/dev/lab-gpu/nvidia[0-{last}]\n"
                                                for n in nodes))
        (conf / "slurm-ft.toml").write_text(render_ft_conf(len(nodes)))
        (conf / "plugstack.conf").write_text(f"# Written by `slurm-ft lab up --engine docker`.\noptional {SPANK_SO}\n")
        (conf / "cli_filter.lua").write_text(assets.render_cli_filter())
        fo = FailoverConfig()
        (conf / "job_submit.lua").write_text(assets.render_job_submit(fo.max_retries, fo.retries))
        for name, text in (("ctld-event", f"#!/bin/sh\nSLURM_FT_EVENTS_DIR={PRIVATE}/events exec "
                                          f"{LIBEXEC}/slurm-ft-ctld-event\n"),
                           ("entry", ENTRY), ("daemon", DAEMON), ("reboot-node", REBOOT_NODE),
                           ("health-check", HEALTH_CHECK)):
            (conf / name).write_text(text)
            os.chmod(conf / name, 0o755)
        for n in nodes:
            (self.private(n) / "nvml").mkdir()
            fake_nvml.write_inventory(str(self.inventory(n)), n, inventory_gpus(self.version, n))
            # what a reboot puts back (the entry's rebooted_sh)
            fake_nvml.write_inventory(str(self.at_boot_inventory(n)), n, inventory_gpus(self.version, n))

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
        ]
        if name in CONTROLLERS and (self.dir / "ctld-state").is_dir():   # a backup controller: shared state
            mounts.append(docker.types.Mount(CTLD_STATE, str(self.dir / "ctld-state"), type="bind"))
        extra = {} if name in CONTROLLERS else {"restart_policy": dict(NODE_RESTART_POLICY)}  # a reboot
        c = self.client.containers.create(name=self.container_name(name), hostname=name, mounts=mounts,
                                          command=[f"{CONF}/entry", name], **common, **extra)
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

    def _ping(self, on: str = "ctl") -> bool:
        """Every controller answers ``scontrol ping`` (asked from controller container ``on``)."""
        try:
            rc, out = self.exec(on, ["/usr/bin/scontrol", "ping"], check=False)
        except Exception:
            return False
        return rc == 0 and "UP" in out and "DOWN" not in out

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
        from slurm_ft.lab.cluster import tail
        raise LabError(f"{what} did not come up within {timeout_s:g} s; log tail ({self.log(name, logfile)}):\n"
                       f"{tail(self.log(name, logfile))}")

    # -- the daemon ----------------------------------------------------------------------
    def daemon_start(self, on: str | None = None) -> None:
        """(Re)start the slurm-ft daemon in controller ``on`` (default: every controller; the
        image's package). With a backup controller, the daemon whose slurmctld is not in control
        stands by (slurm_ft.failover.leader)."""
        for name in [on] if on else self.controllers():
            self.exec(name, [f"{CONF}/daemon", "start"])

    def daemon_stop(self, on: str | None = None) -> None:
        for name in [on] if on else self.controllers():
            self.exec(name, [f"{CONF}/daemon", "stop"])

    # -- controller faults (a lab with a backup controller) ---------------------------------
    def kill_controller(self, name: str = "ctl") -> None:
        """``docker kill`` controller ``name``: its slurmctld and slurm-ft daemon die at once, as
        on a power loss (the other controller takes over after SlurmctldTimeout)."""
        self.container(name).kill()

    def start_controller(self, name: str = "ctl", timeout_s: float = 60.0) -> None:
        """Start controller ``name`` again (after :meth:`kill_controller`): its slurmctld (a
        primary takes control back from the backup), then its slurm-ft daemon once every
        controller answers ``scontrol ping``. Raises :class:`LabError` if it does not come up."""
        c = self.container(name)
        if c.status != "running":
            c.start()
        self._wait(lambda: self._ping(name), timeout_s, "slurmctld", name, "slurmctld.log")
        self.daemon_start(name)

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

    # reboots (issue 26): the RebootProgram restarts the container (REBOOT_NODE, rebooted_sh) ----
    def sticky_path(self, node: str) -> Path:
        """Host path of the marker: ``node``'s fake GPU fault survives a reboot (the RMA path)."""
        return self.private(node) / "nvml" / f"{node}.survives-reboot"

    def sticky_fault(self, node: str, on: bool) -> None:
        """Make ``node``'s fake GPU faults survive (``on``) or not survive a reboot (as the native
        ``Lab.sticky_fault``)."""
        if on:
            self.sticky_path(node).write_text("the fake GPU fault survives a reboot\n")
        else:
            try:
                self.sticky_path(node).unlink()
            except FileNotFoundError:
                pass

    def boots(self, node: str) -> tuple[str, int]:
        """``(StartedAt, RestartCount)`` of ``node``'s container: a reboot by the RebootProgram
        changes the first and grows the second (Docker restarted it by its policy)."""
        st = self.container(node).attrs
        return st["State"]["StartedAt"], int(st.get("RestartCount", 0))

    def node_back(self, node: str) -> None:
        """Undo any fault on ``node`` (unpause, reconnect, start): used between tests."""
        c = self.container(node)
        deadline = time.monotonic() + 30
        while c.status == "restarting" and time.monotonic() < deadline:   # a reboot under way
            time.sleep(0.3)
            c.reload()
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
        from slurm_ft.lab.inject import job_processes
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
        from slurm_ft.lab.inject import xid_fault
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
                           f"{EXAMPLES}/train.sbatch", f"{EXAMPLES}/train.py", ckpt,
                           "--steps", str(steps), "--step-time", str(step_time))
        job_id = int(proc.stdout.strip().split(";")[0])
        out = self.jobs_dir / f"{job_id}.out"
        try:  # what an earlier job of this id left there is not this job's (Submitted.out_from)
            out_from = out.stat().st_size
        except OSError:
            out_from = 0
        return Submitted(job_id, out, self.host_path(ckpt), out_from)

    def reset(self, slurm: Slurm) -> None:
        """Test isolation: cancel live jobs, undo node faults, resume every node, heal every fake GPU."""
        from slurm_ft.nvml import fake
        from slurm_ft.lab.demo import wait_for
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
