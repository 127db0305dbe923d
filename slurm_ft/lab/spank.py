"""Wiring of the SPANK plugin into a Slurm config: plugstack.conf, cli_filter.lua, job_submit.lua.

Used by ``slurm-ft lab up`` (the lab's slurm.conf) and documented for real clusters in
docs/spank.md. Why three pieces (facts verified on 22.05, see shared/SLURM_LAB_NOTES.md):

* the plugin (``spank/slurm_ft_spank.c``) registers ``--ft...``, rejects bad values at submit time
  and hands the values to the job (``SPANK_FT_*`` for prolog/epilog, ``SLURM_FT_*`` for tasks);
* ``cli_filter.lua`` (sbatch, on the submit host) turns ``--ft`` into ``--open-mode=append``,
  ``--requeue`` and ``--signal=SIG@LEAD`` (the time-limit checkpoint signal to every step task);
  only the client can set those (job_submit.lua cannot set open_mode or warn_signal on 22.05);
* ``job_submit.lua`` (slurmctld) checks the values again, forces ``requeue`` and writes them into
  the job's comment as the token ``ft:retries=N,ckpt_signal=SIG,ckpt_wait=S,hang_timeout=S`` -
  the one place a daemon reading ``squeue --json`` can see them (the SPANK job environment is not
  in ``squeue``/``scontrol show job``, and ``system_comment`` cannot be set from job_submit.lua).
  ``slurm_job_modify`` keeps that token when the job's owner rewrites its comment (the exit
  checkpoint ack does, see slurm_ft/checkpoint/channel.py).
"""

from __future__ import annotations

from pathlib import Path

from .layout import repo_root

PLUGIN = "slurm_ft"
#: Seconds added to ``--ft-ckpt-wait`` for the time-limit signal (slurmctld checks limits every ~30 s).
SIGNAL_MARGIN_S = 30


def plugin_path(repo: Path | None = None) -> Path:
    return (repo or repo_root()) / "spank" / "slurm_ft_spank.so"


def render_plugstack(so: Path) -> str:
    return f"# Written by `slurm-ft lab up`.\noptional {so}\n"


CLI_FILTER_LUA = r"""-- slurm-ft cli_filter: runs inside sbatch/salloc/srun on the submit host, as the submitting user.
-- Reads only the SPANK options of the slurm_ft plugin (options.spank.slurm_ft).
-- For sbatch with any --ft option: --open-mode=append, --requeue, and --signal=SIG@(wait+MARGIN)
-- unless the user gave --signal, so every step task gets the checkpoint signal before the time limit.
local PLUGIN = "slurm_ft"
local MARGIN = @MARGIN@

local function opt(spank, name)
  local v = spank[name]
  if v == nil or v == "unset" then return nil end
  return v
end

function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, offset)
  if options.type ~= "sbatch" or options.spank == nil or options.spank[PLUGIN] == nil then
    return slurm.SUCCESS
  end
  local spank = options.spank[PLUGIN]
  local used = false
  for _, name in ipairs({"ft", "ft-retries", "ft-ckpt-signal", "ft-ckpt-wait", "ft-hang-timeout"}) do
    if opt(spank, name) ~= nil then used = true end
  end
  if not used then return slurm.SUCCESS end
  options["open-mode"] = "append"
  options["requeue"] = "1"
  local sig = opt(spank, "ft-ckpt-signal") or "USR1"
  sig = string.upper(sig):gsub("^SIG", "")
  local wait = tonumber(opt(spank, "ft-ckpt-wait") or "600") or 600
  if options["signal"] == nil or options["signal"] == "unset" or options["signal"] == "0@0" then
    options["signal"] = sig .. "@" .. tostring(math.min(65535, wait + MARGIN))
  else
    slurm.log_info("slurm_ft: keeping your --signal=%s (the time-limit checkpoint signal is yours)",
                   options["signal"])
  end
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
"""

JOB_SUBMIT_LUA = r"""-- slurm-ft job_submit: runs in slurmctld (as SlurmUser) for every submitted and modified job.
-- Reads job_desc.spank_job_env (FT_* values set by the slurm_ft SPANK plugin at submit time)
-- and the job's comment; never runs a command.
-- A job with FT=1: values checked again, requeue forced, and the values written into the job's
-- comment as one token "ft:retries=N,ckpt_signal=SIG,ckpt_wait=S,hang_timeout=S" (what the
-- slurm-ft daemon reads with squeue --json). An owner's comment update keeps that token.
local SIGNALS = { USR1 = true, USR2 = true, HUP = true, INT = true, TERM = true, ALRM = true,
                  URG = true, WINCH = true }

local function spank_values(job_desc)
  local out = {}
  local env = job_desc.spank_job_env
  local n = job_desc.spank_job_env_size or 0
  if env == nil then return out end
  for i = 0, n - 1 do
    local item = env[i]
    if item ~= nil then
      local k, v = string.match(item, "^(FT[%w_]*)=(.*)$")
      if k ~= nil then out[k] = v end
    end
  end
  return out
end

local function int_in(v, lo, hi)
  if v == nil or not string.match(v, "^%d+$") then return nil end
  local n = tonumber(v)
  if n < lo or n > hi then return nil end
  return n
end

-- Remove a legacy/previous "ft" or "ft:..." token from a comment.
local function strip_token(comment)
  if comment == nil then return "" end
  local words = {}
  for w in string.gmatch(comment, "%S+") do
    if w ~= "ft" and string.sub(w, 1, 3) ~= "ft:" then table.insert(words, w) end
  end
  return table.concat(words, " ")
end

local function ft_token(comment)
  if comment == nil then return nil end
  for w in string.gmatch(comment, "%S+") do
    if w == "ft" or string.sub(w, 1, 3) == "ft:" then return w end
  end
  return nil
end

-- A legacy "--comment=ft:key=value,..." token: the same limits as the plugin's options, so a
-- typo is an error at submit time instead of a job silently running without fault tolerance.
local function check_comment_token(token)
  if token == "ft" then return nil end
  for item in string.gmatch(string.sub(token, 4), "[^,]+") do
    local k, v = string.match(item, "^([%w_]+)=(.*)$")
    if k == "retries" then
      if int_in(v, 0, 100) == nil then return "retries must be an integer 0..100 (0 = never requeue)" end
    elseif k == "ckpt_signal" then
      if v == nil or not SIGNALS[string.upper(string.gsub(v, "^[Ss][Ii][Gg]", ""))] then
        return "ckpt_signal must be one of USR1 USR2 HUP INT TERM ALRM URG WINCH"
      end
    elseif k == "ckpt_wait" then
      if int_in(v, 1, 3600) == nil then return "ckpt_wait must be whole seconds 1..3600" end
    elseif k == "hang_timeout" then
      local n = int_in(v, 0, 604800)
      if n == nil or (n ~= 0 and n < 60) then return "hang_timeout must be 0 or 60..604800 s" end
    else
      return "unknown option '" .. tostring(k or item) .. "' (known: retries ckpt_signal ckpt_wait hang_timeout)"
    end
  end
  return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local ft = spank_values(job_desc)
  if ft["FT"] ~= "1" then
    local token = ft_token(job_desc.comment)
    if token == nil then return slurm.SUCCESS end
    local problem = check_comment_token(token)
    if problem ~= nil then
      slurm.log_user("slurm_ft: --comment=" .. token .. ": " .. problem)
      return slurm.ERROR
    end
    job_desc.requeue = 1
    return slurm.SUCCESS
  end
  local retries = int_in(ft["FT_RETRIES"], 0, 100)
  local wait = int_in(ft["FT_CKPT_WAIT"], 1, 3600)
  local hang = int_in(ft["FT_HANG_TIMEOUT"], 0, 604800)
  local sig = ft["FT_CKPT_SIGNAL"]
  if retries == nil then
    slurm.log_user("slurm_ft: --ft-retries must be an integer 0..100")
    return slurm.ERROR
  end
  if wait == nil then
    slurm.log_user("slurm_ft: --ft-ckpt-wait must be whole seconds 1..3600")
    return slurm.ERROR
  end
  if hang == nil then
    slurm.log_user("slurm_ft: --ft-hang-timeout must be 60 s .. 7 days")
    return slurm.ERROR
  end
  if sig == nil or not SIGNALS[sig] then
    slurm.log_user("slurm_ft: --ft-ckpt-signal must be one of USR1 USR2 HUP INT TERM ALRM URG WINCH")
    return slurm.ERROR
  end
  local token = string.format("ft:retries=%d,ckpt_signal=%s,ckpt_wait=%d,hang_timeout=%d",
                              retries, sig, wait, hang)
  local rest = strip_token(job_desc.comment)
  if rest ~= "" then token = token .. " " .. rest end
  job_desc.comment = token
  job_desc.requeue = 1
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if job_desc.comment == nil or job_rec == nil then return slurm.SUCCESS end
  local old = ft_token(job_rec.comment)
  if old ~= nil and string.sub(old, 1, 3) == "ft:" and ft_token(job_desc.comment) ~= old then
    local rest = strip_token(job_desc.comment)
    if rest ~= "" then job_desc.comment = old .. " " .. rest else job_desc.comment = old end
  end
  return slurm.SUCCESS
end
"""


def render_cli_filter() -> str:
    return CLI_FILTER_LUA.replace("@MARGIN@", str(SIGNAL_MARGIN_S))


def render_job_submit() -> str:
    return JOB_SUBMIT_LUA


def slurm_conf_lines(conf_dir: Path, so: Path | None) -> list[str]:
    """slurm.conf lines enabling the pieces; no PlugStackConfig when the plugin is not built."""
    lines = ["CliFilterPlugins=lua", "JobSubmitPlugins=lua"]
    if so is not None:
        lines.insert(0, f"PlugStackConfig={conf_dir}/plugstack.conf")
    return lines


def write_files(conf_dir: Path, repo: Path | None = None, log=print) -> Path | None:
    """Write plugstack.conf (if the plugin is built), cli_filter.lua and job_submit.lua into
    ``conf_dir`` (beside slurm.conf, where Slurm looks for the Lua scripts). Returns the plugin
    path, or None (logged) when ``spank/slurm_ft_spank.so`` is missing."""
    so = plugin_path(repo)
    (conf_dir / "cli_filter.lua").write_text(render_cli_filter())
    (conf_dir / "job_submit.lua").write_text(render_job_submit())
    plug = conf_dir / "plugstack.conf"
    if so.exists():
        plug.write_text(render_plugstack(so))
        return so
    plug.unlink(missing_ok=True)
    log(f"lab: {so} not built (make -C spank): no --ft options in this lab (plugstack.conf skipped)")
    return None
