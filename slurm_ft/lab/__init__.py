"""The local Slurm lab cluster used by the demo and the tests: munge + slurmctld + N slurmd on
this host, fake GPUs (gres device files + fake NVML inventories), fault injection."""
