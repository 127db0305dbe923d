"""Wiring of the SPANK plugin into a Slurm config: plugstack.conf, cli_filter.lua, job_submit.lua.

Used by ``slurm-ft lab up`` (the lab's slurm.conf) and documented for real clusters in
docs/spank.md. Why three pieces (facts verified on 22.05, see shared/SLURM_LAB_NOTES.md):

* the plugin (``spank/slurm_ft_spank.c``) registers ``--ft...``, rejects bad values at submit time
  and hands the values to the job (``SPANK_FT_*`` for prolog/epilog, ``SLURM_FT_*`` for tasks);
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

from ..config import FailoverConfig
from .layout import repo_root

PLUGIN = "slurm_ft"

def plugin_path(repo: Path | None = None) -> Path:
    return (repo or repo_root()) / "spank" / "slurm_ft_spank.so"


def render_plugstack(so: Path) -> str:
    return f"# Written by `slurm-ft lab up`.\noptional {so}\n"


CLI_FILTER_LUA = r"""-- slurm-ft cli_filter: runs inside sbatch/salloc/srun on the submit host, as the submitting user.
-- Reads only the SPANK options of the slurm_ft plugin (options.spank.slurm_ft).
-- For sbatch with any --ft option: --open-mode=append (one output file across attempts) and
-- --requeue. The time-limit checkpoint signal is sent by the slurm-ft daemon, only to the job's
-- processes that catch it (Slurm's --signal would kill a batch shell or a program without a
-- handler); a --signal the user gives is theirs.
local PLUGIN = "slurm_ft"

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
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
"""

JOB_SUBMIT_LUA = r"""-- slurm-ft job_submit: runs in slurmctld (as SlurmUser) for every submitted and modified job.
-- Reads job_desc.spank_job_env (FT_* values set by the slurm_ft SPANK plugin at submit time)
-- and the job's comment; never runs a command. Lua 5.1 (what Debian's job_submit_lua.so links)
-- to 5.4.
-- The ft token in a comment follows docs/ft-token.md exactly, as slurm_ft/failover/jobspec.py
-- does; both run tests/fixtures/ft_token_vectors.json.
-- An ft job (--ft... or --comment=ft[:...]): values checked, the site maximum of retries enforced,
-- the site default applied, requeue forced, and the canonical options
--   ft:retries=N,ckpt_signal=SIG,ckpt_wait=S,hang_timeout=S
-- written first into the job's comment and, as "slurm-ft:submitted <token>", into its
-- admin_comment: the record slurm-ft acts on (the job's owner cannot set AdminComment).
-- slurm_job_modify keeps the comment's token when anyone rewrites the comment and drops any other
-- ft word, so an owner can neither change nor add one.
-- slurm.log_user(fmt, ...) runs string.format(fmt, ...): user text goes in as an argument, never
-- in the format.
local MAX_RETRIES = @MAX_RETRIES@        -- [failover] max_retries of slurm-ft.toml
local DEFAULT_RETRIES = @DEFAULT_RETRIES@    -- [failover] retries
local ADMIN_STATE = "slurm-ft:submitted"
local SIGNALS = { USR1 = true, USR2 = true, HUP = true, INT = true, TERM = true, ALRM = true,
                  URG = true, WINCH = true }
local SIGNAL_LIST = "USR1 USR2 HUP INT TERM ALRM URG WINCH"
-- A word: a run of bytes other than ASCII space, TAB, LF, VT, FF, CR (never %s: locale-dependent).
local WORD = "[^ \t\n\v\f\r]+"

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

-- 1 to 9 ASCII digits whose value is in lo..hi, else nil.
local function int_in(v, lo, hi)
  if type(v) ~= "string" or #v > 9 or not string.find(v, "^[0-9]+$") then return nil end
  local n = tonumber(v)
  if n < lo or n > hi then return nil end
  return n
end

-- hang_timeout: 0 (unset) or 60..604800 s.
local function hang_in(v)
  local n = int_in(v, 0, 604800)
  if n == nil or (n ~= 0 and n < 60) then return nil end
  return n
end

-- ASCII upper case, whatever the locale.
local function ascii_upper(s)
  return (string.gsub(s, "[a-z]", function(c) return string.char(string.byte(c) - 32) end))
end

-- USR2, usr2, SIGUSR2, sigUsr2 -> "USR2"; numbers and anything else -> nil.
local function token_signal(v)
  if type(v) ~= "string" or not string.find(v, "^[A-Za-z0-9]+$") then return nil end
  local up = ascii_upper(v)
  if string.sub(up, 1, 3) == "SIG" then up = string.sub(up, 4) end
  if SIGNALS[up] then return up end
  return nil
end

local function is_ft_word(w)
  return w == "ft" or string.sub(w, 1, 3) == "ft:"
end

-- The first ft word of a comment (the token), or nil.
local function ft_token(comment)
  if comment == nil then return nil end
  for w in string.gmatch(comment, WORD) do
    if is_ft_word(w) then return w end
  end
  return nil
end

-- The comment without any ft word, its other words joined by one space.
local function strip_token(comment)
  if comment == nil then return "" end
  local words = {}
  for w in string.gmatch(comment, WORD) do
    if not is_ft_word(w) then table.insert(words, w) end
  end
  return table.concat(words, " ")
end

-- The options a token gives explicitly: {retries=, ckpt_signal=, ckpt_wait=, hang_timeout=}
-- (absent keys nil), or nil and the problem.
local function parse_token(token)
  local opts = {}
  if token == "ft" then return opts, nil end
  if string.sub(token, 1, 3) ~= "ft:" then return nil, "not an ft token" end
  local body = string.sub(token, 4)
  if body == "" then return nil, "no options after 'ft:' (write ft alone, or ft:key=value,...)" end
  local start = 1
  while true do
    local comma = string.find(body, ",", start, true)
    local item
    if comma == nil then item = string.sub(body, start) else item = string.sub(body, start, comma - 1) end
    if item == "" then return nil, "empty option (stray ',')" end
    local eq = string.find(item, "=", 1, true)
    local k, v = item, nil
    if eq ~= nil then k = string.sub(item, 1, eq - 1); v = string.sub(item, eq + 1) end
    if k ~= "retries" and k ~= "ckpt_signal" and k ~= "ckpt_wait" and k ~= "hang_timeout" then
      return nil, "unknown option '" .. string.sub(k, 1, 40) .. "' (known: retries ckpt_signal ckpt_wait hang_timeout)"
    end
    if v == nil then return nil, k .. " needs a value (" .. k .. "=...)" end
    if opts[k] ~= nil then return nil, k .. " given twice" end
    if k == "retries" then
      opts[k] = int_in(v, 0, 100)
      if opts[k] == nil then return nil, "retries must be an integer 0..100 (0 = never requeue)" end
    elseif k == "ckpt_signal" then
      opts[k] = token_signal(v)
      if opts[k] == nil then return nil, "ckpt_signal must be one of " .. SIGNAL_LIST end
    elseif k == "ckpt_wait" then
      opts[k] = int_in(v, 1, 3600)
      if opts[k] == nil then return nil, "ckpt_wait must be whole seconds 1..3600" end
    else
      opts[k] = hang_in(v)
      if opts[k] == nil then return nil, "hang_timeout must be 0 or 60..604800 s" end
    end
    if comma == nil then break end
    start = comma + 1
  end
  return opts, nil
end

-- A token's problem, or nil when it is valid.
local function check_comment_token(token)
  local _, problem = parse_token(token)
  return problem
end

-- The ft options of a comment: nil, nil when it holds no ft word; nil, problem when it holds
-- more than one or a malformed one; else the explicit options.
local function comment_options(comment)
  local token, count = nil, 0
  if comment ~= nil then
    for w in string.gmatch(comment, WORD) do
      if is_ft_word(w) then
        count = count + 1
        if token == nil then token = w end
      end
    end
  end
  if count == 0 then return nil, nil end
  if count > 1 then return nil, "more than one ft token (" .. count .. "); give exactly one" end
  local opts, problem = parse_token(token)
  if problem ~= nil then return nil, "'" .. string.sub(token, 1, 200) .. "': " .. problem end
  return opts, nil
end

-- The canonical token, defaults filled in (retries: the given default).
local function canonical(opts, default_retries)
  local hang = opts.hang_timeout or 0
  return string.format("ft:retries=%d,ckpt_signal=%s,ckpt_wait=%d,hang_timeout=%d",
                       opts.retries or default_retries, opts.ckpt_signal or "USR1",
                       opts.ckpt_wait or 600, hang)
end

-- The SPANK values as options, or nil and the problem. FT_RETRIES_GIVEN=0: the user gave no
-- --ft-retries (FT_RETRIES is then the plugin's placeholder): the site default applies. A plugin
-- without FT_RETRIES_GIVEN always passes its value.
local function spank_options(ft)
  local opts = {}
  if ft["FT_RETRIES_GIVEN"] ~= "0" then
    opts.retries = int_in(ft["FT_RETRIES"], 0, 100)
    if opts.retries == nil then return nil, "--ft-retries must be an integer 0..100" end
  end
  opts.ckpt_wait = int_in(ft["FT_CKPT_WAIT"], 1, 3600)
  if opts.ckpt_wait == nil then return nil, "--ft-ckpt-wait must be whole seconds 1..3600" end
  opts.hang_timeout = hang_in(ft["FT_HANG_TIMEOUT"])
  if opts.hang_timeout == nil then return nil, "--ft-hang-timeout must be 60 s .. 7 days" end
  opts.ckpt_signal = ft["FT_CKPT_SIGNAL"]
  if opts.ckpt_signal == nil or not SIGNALS[opts.ckpt_signal] then
    return nil, "--ft-ckpt-signal must be one of " .. SIGNAL_LIST
  end
  return opts, nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local ft = spank_values(job_desc)
  local opts, problem, what
  if ft["FT"] == "1" then
    what = "--ft-retries"
    opts, problem = spank_options(ft)
    if problem ~= nil then
      slurm.log_user("%s", "slurm_ft: " .. problem)
      return slurm.ERROR
    end
  else
    what = "--comment=ft:retries"
    opts, problem = comment_options(job_desc.comment)
    if problem ~= nil then
      slurm.log_user("%s", "slurm_ft: --comment: " .. problem)
      return slurm.ERROR
    end
    if opts == nil then return slurm.SUCCESS end
  end
  if opts.retries ~= nil and opts.retries > MAX_RETRIES then
    slurm.log_user("slurm_ft: %s=%d exceeds this site's maximum of %d retries ([failover] max_retries)",
                   what, opts.retries, MAX_RETRIES)
    return slurm.ERROR
  end
  local token = canonical(opts, DEFAULT_RETRIES)
  local rest = strip_token(job_desc.comment)
  if rest ~= "" then job_desc.comment = token .. " " .. rest else job_desc.comment = token end
  job_desc.admin_comment = ADMIN_STATE .. " " .. token
  job_desc.requeue = 1
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if job_desc.comment == nil or job_rec == nil then return slurm.SUCCESS end
  local old = ft_token(job_rec.comment)
  local new = strip_token(job_desc.comment)
  if old ~= nil then
    if new ~= "" then new = old .. " " .. new else new = old end
  end
  if new ~= job_desc.comment then job_desc.comment = new end
  return slurm.SUCCESS
end
"""


def render_cli_filter() -> str:
    return CLI_FILTER_LUA


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
    return (JOB_SUBMIT_LUA.replace("@MAX_RETRIES@", str(max_retries))
            .replace("@DEFAULT_RETRIES@", str(default_retries)))


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
