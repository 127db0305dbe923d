"""Break-fix remediation (``[remediate]``, off by default): after slurm-ft drains a node for a
hardware fault and no job runs there, the repair the Xid catalog calls for (GPU reset or reboot
through Slurm), the trusted checks, then resume, or an RMA reason after too many repairs.

:mod:`.policy` decides (pure), :mod:`.actions` acts (daemon side and node side)."""
