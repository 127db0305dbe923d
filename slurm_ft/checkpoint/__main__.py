"""``python -m slurm_ft.checkpoint ...``: the job's checkpoint commands (:mod:`slurm_ft.cli.checkpoint`).
Runs inside the job, as the job's user."""

from slurm_ft.cli.checkpoint import main

main(prog_name="python -m slurm_ft.checkpoint")
