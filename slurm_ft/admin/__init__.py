"""What an admin runs: ``slurm-ft install``, ``doctor``, ``metrics``, and the files slurm-ft puts beside Slurm."""
