"""What slurmd runs as root on a compute node: the prolog, the epilog, and what they share."""
