"""Named exceptions raised by the library; only the CLI layer turns them into messages."""


class SlurmFTError(Exception):
    """Base class of every error slurm-ft raises on purpose."""


class ConfigError(SlurmFTError):
    """The TOML config (or a value given on the command line) is invalid; the message names the key."""


class JournalError(SlurmFTError):
    """The SQLite journal cannot be opened, is corrupted, or has a newer schema than this code."""


class SlurmCommandError(SlurmFTError):
    """A Slurm command failed, timed out, or printed output we cannot parse."""


class HostlistError(SlurmCommandError):
    """A Slurm hostlist (``n[1-3],gpu[07-08]``) or index list (``0-1,3``) is malformed; the message
    quotes it. A :class:`SlurmCommandError` because such lists come from Slurm's output."""


class EvidenceError(SlurmFTError):
    """An evidence source (kernel log, job output) cannot be read safely."""


class LabError(SlurmFTError):
    """The local lab cluster cannot be started, stopped or driven."""
