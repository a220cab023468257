"""User-facing errors.

An ``EngineError`` carries one clear paragraph for the user (what is wrong, which file, key or rank,
what was expected). ``rnn.py`` and the tools print it without a traceback and exit non-zero; anything
else that escapes is a bug in the engine and is shown with its traceback.
"""


# A rank that stays quiet about an error another rank reports waits this long before it exits: mpirun
# ends the whole job at the first non-zero exit, which could otherwise cut the reporting rank off before
# its message is out.
QUIET_RANK_EXIT_DELAY = 3.0


class EngineError(Exception):
    """An error the user can fix: bad config, bad data, bad command line, a failed rank.

    ``agreed``: every rank of the job already knows about this failure (it was exchanged in the step
    signal), so the ranks can exit on their own and nobody needs to abort the MPI job.
    ``quiet``: exit non-zero without a message, because another rank reports the cause.
    """

    exit_code = 1
    agreed = False
    quiet = False


class ConfigError(EngineError):
    """The config files or the ``++key value`` overrides are wrong."""

    exit_code = 2


class DataError(EngineError):
    """A corpus file or dataset definition is wrong."""


class DistributedError(EngineError):
    """The MPI job is misconfigured, or another rank failed."""
