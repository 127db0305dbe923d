"""Hang detection (docs/hang.md): a per-node watcher started by the prolog for jobs submitted
with ``--ft-hang-timeout`` (``watcher``), the heartbeat the checkpoint helper writes each step
(``heartbeat``), the job's processes found through slurmstepd (``procs``), and the evidence of a
hang (``evidence``: stack dumps, last heartbeat, GPU utilisation)."""
