"""Wiring of the SPANK plugin into a Slurm config: plugstack.conf, cli_filter.lua, job_submit.lua.

Used by ``slurm-ft lab up`` (the lab's slurm.conf); on a real cluster ``slurm-ft install`` writes
the same files (docs/install.md). The Lua scripts are package data (``slurm_ft/data/lua/``, read
and rendered by :mod:`slurm_ft.admin.assets`). Why three pieces (facts verified on 22.05, see
shared/SLURM_LAB_NOTES.md):

* the plugin (``slurm_ft/data/spank/slurm_ft_spank.c``, reached as ``spank/`` in a checkout)
  registers ``--ft...``, rejects bad values at submit time and hands the values to the job
  (``SPANK_FT_*`` for prolog/epilog, ``SLURM_FT_*`` for tasks);
* ``cli_filter.lua`` (sbatch, on the submit host) turns ``--ft`` into ``--open-mode=append`` and
  ``--requeue``; only the client can set open_mode (job_submit.lua cannot on 22.05). It no longer
  sets ``--signal``: Slurm's time-limit signal reaches either the step tasks or the batch shell,
  and kills any of them without a handler; the daemon sends the time-limit checkpoint signal
  itself, only to processes that catch it (slurm_ft/checkpoint/deliver.py). A ``--signal`` the
  user gives is theirs and left alone;
* ``job_submit.lua`` (slurmctld) checks the values again (SPANK options, or the legacy
  ``--comment=ft[:...]`` token, grammar in docs/ft-token.md), refuses a retry budget above the
  site maximum (``[failover] max_retries``, rendered in by :func:`render_job_submit`), applies the
  site default (``[failover] retries``) when the user gave none, forces ``requeue`` and writes
  the canonical token ``ft:retries=N,ckpt_signal=SIG,ckpt_wait=S,hang_timeout=S`` into the job's
  comment and, as ``slurm-ft:submitted <token>``, into its **admin_comment**: the record slurm-ft
  acts on, because the job's owner cannot set AdminComment (refused at submit and by ``scontrol
  update``; verified on 22.05) while the comment is theirs to rewrite. (The SPANK job environment
  is not in ``squeue``/``scontrol show job``; ``system_comment`` cannot be set from
  job_submit.lua.) ``slurm_job_modify`` keeps the comment's token when the comment is rewritten
  (the exit checkpoint ack does, see slurm_ft/checkpoint/channel.py) and drops any other ft word.
"""

from __future__ import annotations

from pathlib import Path

from slurm_ft.admin import assets
from slurm_ft.config import FailoverConfig
from slurm_ft.lab.layout import repo_root

PLUGIN = "slurm_ft"

def plugin_path(repo: Path | None = None) -> Path:
    return (repo or repo_root()) / "spank" / "slurm_ft_spank.so"


def render_plugstack(so: Path) -> str:
    return f"# Written by `slurm-ft lab up`.\noptional {so}\n"


def render_cli_filter() -> str:
    """cli_filter.lua (package data ``slurm_ft/data/lua/cli_filter.lua``)."""
    return assets.render_cli_filter()


def render_job_submit(max_retries: int = FailoverConfig.max_retries,
                      default_retries: int = FailoverConfig.retries) -> str:
    """job_submit.lua (package data ``slurm_ft/data/lua/job_submit.lua.in``) with the site's
    retry limits; see :func:`slurm_ft.admin.assets.render_job_submit`."""
    return assets.render_job_submit(max_retries, default_retries)


def slurm_conf_lines(conf_dir: Path, so: Path | None) -> list[str]:
    """slurm.conf lines enabling the pieces; no PlugStackConfig when the plugin is not built."""
    lines = ["CliFilterPlugins=lua", "JobSubmitPlugins=lua"]
    if so is not None:
        lines.insert(0, f"PlugStackConfig={conf_dir}/plugstack.conf")
    return lines


def write_files(conf_dir: Path, repo: Path | None = None, log=print,
                failover: FailoverConfig | None = None) -> Path | None:
    """Write plugstack.conf (if the plugin is built), cli_filter.lua and job_submit.lua into
    ``conf_dir`` (beside slurm.conf, where Slurm looks for the Lua scripts); job_submit.lua gets
    the retry limits of ``failover`` (the cluster's ``[failover]``; None = built-in defaults).
    Returns the plugin path, or None (logged) when ``spank/slurm_ft_spank.so`` is missing."""
    failover = failover or FailoverConfig()
    so = plugin_path(repo)
    (conf_dir / "cli_filter.lua").write_text(render_cli_filter())
    (conf_dir / "job_submit.lua").write_text(render_job_submit(failover.max_retries, failover.retries))
    plug = conf_dir / "plugstack.conf"
    if so.exists():
        plug.write_text(render_plugstack(so))
        return so
    plug.unlink(missing_ok=True)
    log(f"lab: {so} not built (make -C spank): no --ft options in this lab (plugstack.conf skipped)")
    return None
