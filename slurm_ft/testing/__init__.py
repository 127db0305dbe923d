"""Test support: an in-memory Slurm (fake_slurm) for the daemon's unit and property tests."""
