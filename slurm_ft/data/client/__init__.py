"""The job-side client (slurm_ft_job.py): a stdlib-only file that ``slurm-ft install`` copies to
``/usr/share/slurm-ft/python/`` for training jobs to import by path; slurm_ft.checkpoint and
slurm_ft.hang.heartbeat re-export it."""
