"""The SQLite journal (sqlite-utils, WAL): jobs, attempts, verdicts, actions, health results.

One schema serves both the daemon's journal (controller) and each node's own journal (compute
node, written by prolog/epilog). Times are epoch seconds (float). JSON columns hold lists.
Every value of every row passes the journal boundary first (:mod:`.boundary`: valid UTF-8,
bounded); a spooled write the database refuses is set aside in ``dead_letters``; only
:class:`~slurm_ft.errors.JournalError` leaves the journal.
"""

from slurm_ft.journal.store import Journal, open_daemon_journal, open_journal, open_node_journal

__all__ = ["Journal", "open_daemon_journal", "open_journal", "open_node_journal"]
