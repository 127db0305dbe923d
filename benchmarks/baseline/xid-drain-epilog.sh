#!/bin/sh
# Slurm alone, as a careful site configures it (the baseline of benchmarks/vs_slurm.py): a node
# Epilog that drains the node and fails when the kernel log holds any NVIDIA Xid written since the
# job started. The pattern of the public Slurm GPU health-check epilogs: read the kernel log since
# the job's StartTime (journalctl -k, else dmesg), grep "NVRM: Xid", `scontrol update state=drain`,
# exit 1 (slurmd then drains the node with "Epilog error" too, and the job is not requeued on 22.05).
#
# Lab only: every lab node shares the host's one kernel log. When XID_PCI_FILTER is set (an
# extended regular expression of this node's GPU PCI bus ids, written by benchmarks/vs_slurm.py's
# per-node wrapper), only Xid lines naming one of them count, as a real node only sees its own.
# Runs as root from slurmd; uses only SLURM_JOB_ID and SLURMD_NODENAME from its environment.

PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH

case "$SLURM_JOB_ID" in ''|*[!0-9]*) exit 0 ;; esac
node="$SLURMD_NODENAME"
[ -n "$node" ] || node=$(hostname -s)

# the job's start, seconds since the epoch (StartTime of `scontrol show job`, local time)
start=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n 's/^StartTime=//p' | head -n 1)
start_s=$(date -d "$start" +%s 2>/dev/null) || start_s=0

xids() {
    if journalctl -k -q --no-pager -n 1 >/dev/null 2>&1 && [ -n "$(journalctl -k -q --no-pager -n 1 2>/dev/null)" ]; then
        journalctl -k -q --no-pager -o short-unix --since "@$start_s" 2>/dev/null | grep 'NVRM: Xid'
    else
        # dmesg's raw stamps are seconds since boot: the job started at start_s - btime (1 s slack)
        btime=$(awk '/^btime/ {print $2}' /proc/stat)
        since=$((start_s - btime - 1))
        dmesg 2>/dev/null | awk -v since="$since" '
            /NVRM: Xid/ { t = $0; sub(/^\[ */, "", t); sub(/\].*/, "", t); if (t + 0 >= since) print }'
    fi
}

found=$(xids)
if [ -n "$XID_PCI_FILTER" ]; then
    found=$(printf '%s\n' "$found" | grep -E "PCI:($XID_PCI_FILTER)\)")
fi
[ -n "$found" ] || exit 0

xid=$(printf '%s\n' "$found" | sed -n 's/.*NVRM: Xid ([^)]*): \([0-9]*\),.*/\1/p' | head -n 1)
scontrol update NodeName="$node" State=DRAIN Reason="epilog: NVRM Xid ${xid:-?} during job $SLURM_JOB_ID" \
    >/dev/null 2>&1
logger -t xid-epilog "drained $node: Xid ${xid:-?} during job $SLURM_JOB_ID" 2>/dev/null
exit 1
