"""The files slurm-ft puts beside Slurm, read from the package (``slurm_ft/data/``) and rendered.

One source for both users of them: ``slurm-ft install`` (a real cluster, docs/install.md) and
``slurm-ft lab up`` (slurm_ft/lab/spank.py). Nothing here writes a file.

* ``lua/job_submit.lua.in`` (slurmctld) and ``lua/cli_filter.lua`` (sbatch): docs/spank.md,
  docs/ft-token.md; job_submit.lua carries the site's retry limits (:func:`render_job_submit`);
* ``install/slurm-ft-prolog.in``, ``install/slurm-ft-epilog.in``: the scripts slurmd runs, with
  the absolute path of the Python that has slurm-ft (:func:`render_wrapper`);
* ``install/slurm-ft-daemon.service.in``: the daemon's systemd unit (:func:`render_unit`);
* ``install/slurm-ft-ctld-event``: the PrologSlurmctld/EpilogSlurmctld hook (POSIX sh), with the
  config's events directory (:func:`render_ctld_event`); ``install/slurm-ft.tmpfiles.in``: the
  tmpfiles.d(5) entry that recreates that directory at boot (:func:`render_tmpfiles`);
* ``install/roles.toml``: which components each ``--role`` installs (:func:`roles_table`);
* ``install/slurm-ft.toml``: the commented default config;
* ``spank/slurm_ft_spank.c`` and its ``Makefile``: the SPANK plugin's source (built on the site).
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from pathlib import Path

from slurm_ft.config import FailoverConfig
from slurm_ft.data import data_text

#: Where ``slurm-ft install`` puts each kind of file (below ``--prefix``); docs/install.md.
LIBEXEC_DIR = "/usr/local/libexec/slurm-ft"
SPANK_SRC_DIR = "/usr/local/src/slurm-ft/spank"
SPANK_LIB = "/usr/local/lib/slurm-ft/slurm_ft_spank.so"
UNIT_PATH = "/etc/systemd/system/slurm-ft-daemon.service"
CTLD_EVENT_PATH = f"{LIBEXEC_DIR}/slurm-ft-ctld-event"
TMPFILES_PATH = "/etc/tmpfiles.d/slurm-ft.conf"
CONFIG_PATH = "/etc/slurm-ft/slurm-ft.toml"
#: Where jobs import the stdlib-only job client from (docs/user-guide.md): a fixed path.
JOB_CLIENT_DIR = "/usr/share/slurm-ft/python"
JOB_CLIENT_PATH = f"{JOB_CLIENT_DIR}/slurm_ft_job.py"
SLURM_CONF_DIR = "/etc/slurm"
#: Characters a path rendered into a unit file or a shell script may hold (no quoting games).
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9._+/@:=,-]*$")
#: A user name as useradd(8) accepts it (Debian's NAME_REGEX, without the trailing ``$``).
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
#: The hook's events-directory line, as shipped (:func:`render_ctld_event` replaces its default).
_EVENTS_LINE = "dir=${SLURM_FT_EVENTS_DIR:-/run/slurm-ft/events}\n"


def plain_path(path: str | Path, what: str) -> str:
    """``path`` as text if it is absolute and holds no whitespace, quote, ``$``, ``%`` or ``\\``
    (it goes into shell scripts and systemd units verbatim); else ValueError naming ``what``."""
    text = str(path)
    if not _PLAIN_PATH.match(text):
        raise ValueError(f"{what}: {text!r} must be an absolute path of plain characters "
                         f"(letters, digits, / . _ + @ : = , -)")
    return text


def render_cli_filter() -> str:
    return data_text("lua/cli_filter.lua")


def render_job_submit(max_retries: int = FailoverConfig.max_retries,
                      default_retries: int = FailoverConfig.retries) -> str:
    """job_submit.lua with the site's retry limits: ``max_retries`` (``[failover] max_retries``,
    larger ``--ft-retries``/``ft:retries`` are refused at submit) and ``default_retries``
    (``[failover] retries``, written when the job gives none). Raises ValueError unless
    ``0 <= default_retries <= max_retries <= 100``."""
    for name, v in (("max_retries", max_retries), ("default_retries", default_retries)):
        if type(v) is not int or not 0 <= v <= 100:
            raise ValueError(f"{name}: an integer 0..100, got {v!r}")
    if default_retries > max_retries:
        raise ValueError(f"default_retries {default_retries} exceeds max_retries {max_retries}")
    return (data_text("lua/job_submit.lua.in").replace("@MAX_RETRIES@", str(max_retries))
            .replace("@DEFAULT_RETRIES@", str(default_retries)))


def venv_python() -> str:
    """The Python that runs this slurm-ft, as its virtualenv names it (``<venv>/bin/python``,
    not the interpreter the venv links to): the path the prolog/epilog wrappers exec."""
    candidate = Path(sys.prefix) / "bin" / "python"
    return str(candidate if candidate.exists() else Path(sys.executable))


def slurm_ft_command() -> str:
    """How the daemon is started: ``<venv>/bin/slurm-ft`` when the entry point exists, else this
    Python with ``-m slurm_ft.cli.main``."""
    script = Path(sys.prefix) / "bin" / "slurm-ft"
    return str(script) if script.exists() else f"{venv_python()} -m slurm_ft.cli.main"


def render_wrapper(kind: str, python: str, installed_at: str) -> str:
    """The prolog or epilog wrapper (``kind``: ``prolog``/``epilog``) that runs ``python -I -m
    slurm_ft.<kind>`` and maps its status: 0 -> 0, ``boundary.EXIT_DRAIN`` -> 1 (Slurm drains the
    node), anything else (``python`` missing, an import error, a signal) -> a syslog line and
    ``[node_state] on_internal_error`` (0 for ``pass``, 1 for ``drain``)."""
    if kind not in ("prolog", "epilog"):
        raise ValueError(f"kind: prolog or epilog, got {kind!r}")
    return (data_text(f"install/slurm-ft-{kind}.in")
            .replace("@PYTHON@", shlex.quote(plain_path(python, "python")))
            .replace("@WRAPPER@", plain_path(installed_at, "wrapper path")))


def render_unit(command: str, config: str = CONFIG_PATH) -> str:
    """The daemon's systemd unit; ``command``: the slurm-ft executable (or ``python -m
    slurm_ft.cli.main``), ``config``: the ``SLURM_FT_CONFIG`` it reads."""
    words = command.split(" ")
    for w in words:
        if w.startswith("/"):
            plain_path(w, "slurm-ft command")
        elif w not in ("-m", "slurm_ft.cli.main"):
            raise ValueError(f"slurm-ft command: unexpected word {w!r} in {command!r}")
    return (data_text("install/slurm-ft-daemon.service.in").replace("@SLURM_FT@", command)
            .replace("@CONFIG@", plain_path(config, "config path")))


def default_config() -> str:
    return data_text("install/slurm-ft.toml")


def render_plugstack_line(so: str = SPANK_LIB) -> str:
    """The plugstack.conf line that loads the plugin (``optional``: a host without the .so still
    runs jobs; ``sbatch --ft`` there fails with "unrecognized option")."""
    return f"optional {plain_path(so, 'plugin path')}"


def job_client_source() -> str:
    """The job-side client (``slurm_ft/data/client/slurm_ft_job.py``, stdlib only) as installed."""
    return data_text("client/slurm_ft_job.py")


def spank_sources() -> dict[str, str]:
    """The SPANK plugin's source files: name -> text."""
    return {name: data_text(f"spank/{name}") for name in ("slurm_ft_spank.c", "Makefile")}


def render_ctld_event(events_dir: str = FailoverConfig.events_dir) -> str:
    """The PrologSlurmctld/EpilogSlurmctld hook with ``events_dir`` (``[failover] events_dir``)
    as its default directory. Raises ValueError for a path that is not plain."""
    text = data_text("install/slurm-ft-ctld-event")
    if text.count(_EVENTS_LINE) != 1:
        raise ValueError("slurm-ft-ctld-event: its dir= line is not the one shipped")
    return text.replace(_EVENTS_LINE, f"dir=${{SLURM_FT_EVENTS_DIR:-{plain_path(events_dir, 'events_dir')}}}\n")


def render_tmpfiles(events_dir: str, slurm_user: str) -> str:
    """The tmpfiles.d(5) entry: ``events_dir`` mode 0700, owned by ``slurm_user`` (SlurmUser:
    slurmctld runs the hook as that user). Raises ValueError for a path that is not plain or a
    name useradd(8) would refuse."""
    if not _USER_NAME.match(slurm_user):
        raise ValueError(f"SlurmUser: {slurm_user!r} is not a plain user name")
    return (data_text("install/slurm-ft.tmpfiles.in").replace("@EVENTS_DIR@", plain_path(events_dir, "events_dir"))
            .replace("@SLURM_USER@", slurm_user).replace("@TMPFILES@", TMPFILES_PATH))


def roles_table() -> dict:
    """``install/roles.toml`` parsed: ``{"components": {name: about}, "aliases": {name: [..]},
    "roles": {role: {"about": str, "components": [..]}}}`` (tomllib; a broken file raises
    tomllib.TOMLDecodeError)."""
    return tomllib.loads(data_text("install/roles.toml"))
