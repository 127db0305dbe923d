"""The ranks of the SPANK / checkpoint-before-exit tests, shared by the native lab
(test_spank_lab.py) and the Docker lab (test_docker_lab.py)."""

from __future__ import annotations

import time
from pathlib import Path

# A rank: counts steps from the saved step; on the checkpoint signal writes its marker; rank 0
# waits for every rank's marker (the job's own barrier), records the step and acks through Slurm.
# After saving it keeps running: slurm-ft ends (requeues) the job.
RANK_SH = r"""#!/bin/bash
dir=$1; py=$2; mode=$3
attempt=${SLURM_RESTART_COUNT:-0}
step=0
if [ -f "$dir/saved-step" ]; then step=$(cat "$dir/saved-step"); echo "rank $SLURM_PROCID resuming from step $step"; fi
saved=0
on_ckpt() {
  echo "$step" > "$dir/rank$SLURM_PROCID.a$attempt.saved"
  if [ "$SLURM_PROCID" = 0 ]; then
    "$py" -m slurm_ft.checkpoint report saving --step "$step"
    for i in $(seq 1 100); do [ $(ls "$dir"/rank*.a$attempt.saved | wc -l) -ge "$SLURM_NTASKS" ] && break; sleep 0.1; done
    echo "$step" > "$dir/saved-step"
    "$py" -m slurm_ft.checkpoint report saved --step "$step" --path "$dir"
  fi
  saved=1
}
case "$mode" in
  ignore) trap '' "$SLURM_FT_CKPT_SIGNAL" ;;
  noack) trap ':' "$SLURM_FT_CKPT_SIGNAL" ;;
  *) trap on_ckpt "$SLURM_FT_CKPT_SIGNAL" ;;
esac
echo "rank $SLURM_PROCID on $SLURMD_NODENAME attempt $attempt signal $SLURM_FT_CKPT_SIGNAL retries $SLURM_FT_RETRIES"
while true; do
  [ $saved = 0 ] && step=$((step+1))
  sleep 0.1
done
"""


def rank_workdir(jobs_dir: Path) -> Path:
    """A fresh world-writable directory under ``jobs_dir`` (the lab's shared job directory)
    holding ``rank.sh``: ``srun rank.sh DIR PYTHON [ignore|noack|trap]``."""
    d = jobs_dir / f"spank-{time.time_ns()}"
    d.mkdir()
    d.chmod(0o777)
    (d / "rank.sh").write_text(RANK_SH)
    (d / "rank.sh").chmod(0o755)
    return d
