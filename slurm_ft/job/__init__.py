"""What runs as the job's user: inside the job (``slurm-ft run``) or beside it (``slurm-ft wait``)."""
