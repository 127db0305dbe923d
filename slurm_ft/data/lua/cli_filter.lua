-- slurm-ft cli_filter: runs inside sbatch/salloc/srun on the submit host, as the submitting user.
-- Source: slurm_ft/data/lua/cli_filter.lua (installed by `slurm-ft install`, docs/install.md).
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
  -- "" is --requeue given bare: 22.05 and 24.11 ignore the value, 26.05 reads it
  -- (--requeue[=expedite]) and refuses "1" with "Invalid --requeue specification" (docs/lab.md)
  options["requeue"] = ""
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
