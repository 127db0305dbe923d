"""slurm-ft: automatic fault tolerance for GPU training jobs on Slurm."""

__version__ = "0.1.0"
