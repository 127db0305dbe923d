#!/bin/sh
# The node Epilog of benchmarks/vs_slurm.py's experiment "slurm-ft-expedite" (Slurm >= 25.11, jobs
# submitted with --requeue=expedite): slurm-ft's own epilog (@FT_EPILOG@, put in by the benchmark),
# then exit 1 when that epilog drained this node for this job (a trusted hardware verdict: the
# reason "slurm-ft: ... (job N)"), so that slurmctld requeues the expedited job at once. Any other
# verdict exits as slurm-ft's epilog did (0): a user fault is never an epilog failure.
#
# Runs as root from slurmd on every node of the job; reads SLURM_JOB_ID and SLURMD_NODENAME.

PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH

@FT_EPILOG@
rc=$?
case "$SLURM_JOB_ID" in ''|*[!0-9]*) exit $rc ;; esac
node="$SLURMD_NODENAME"
[ -n "$node" ] || exit $rc
if timeout 10 scontrol -o show node "$node" 2>/dev/null | grep -q "Reason=slurm-ft:.*(job $SLURM_JOB_ID)"; then
    exit 1
fi
exit $rc
