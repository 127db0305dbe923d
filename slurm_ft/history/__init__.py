"""``ft-history`` and the history service: the journal read back for users and admins."""
