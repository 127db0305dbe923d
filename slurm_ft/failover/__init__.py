"""Failover: the requeue daemon, its policy, the verdict mailbox and the ft job options."""
