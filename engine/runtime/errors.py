"""User-facing errors and the exit codes of ``rnn.py`` and the tools.

An ``EngineError`` carries one clear paragraph for the user (what is wrong, which file, key or rank,
what was expected). ``rnn.py`` and the tools print it without a traceback and exit with the error's
``exit_code``; anything else that escapes is a bug in the engine and is shown with its traceback.

Exit codes, a contract for job scripts, supervisors and schedulers (docs/long-jobs.md, "Exit codes"):

    0   finished
    1   failed: a bug, a failed or stalled rank, a lost node (a restart from the newest checkpoint may
        succeed)
    2   ConfigError: the config files or the command line are wrong (a restart cannot fix it)
    3   DataError: a corpus or dataset definition is wrong; NonFiniteTrainScore: training met an Inf or
        NaN (a restart cannot fix either)
    99  stopped on request (preemption signal or time limit) after saving a checkpoint: run the same
        command again to resume; SGE reschedules a job that exits 99
"""
import errno

EXIT_OK = 0
EXIT_FAILURE = 1
CONFIG_ERROR_EXIT_CODE = 2
DATA_ERROR_EXIT_CODE = 3
RESUMABLE_EXIT_CODE = 99

# A restart runs into the same error again: a supervisor gives up at once on these.
NOT_RESTARTABLE_EXIT_CODES = frozenset({CONFIG_ERROR_EXIT_CODE, DATA_ERROR_EXIT_CODE})


# errno values of reads that may succeed when tried again: EIO (a disk or network file system hiccup),
# ESTALE (an NFS handle gone stale, e.g. after a server restart), ETIMEDOUT (a network file system timeout).
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.ESTALE, errno.ETIMEDOUT})

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

    exit_code = EXIT_FAILURE
    agreed = False
    quiet = False


class ConfigError(EngineError):
    """The config files or the ``++key value`` overrides are wrong."""

    exit_code = CONFIG_ERROR_EXIT_CODE


class DataError(EngineError):
    """A corpus file or dataset definition is wrong."""

    exit_code = DATA_ERROR_EXIT_CODE


class TransientIOError(EngineError):
    """Reading a file failed with an I/O error that may pass (``TRANSIENT_ERRNOS``: a flaky disk or network
    file system): not the config's fault, so the exit code is 1, on which ``supervise`` restarts."""

    exit_code = EXIT_FAILURE


class DistributedError(EngineError):
    """The MPI job is misconfigured, or another rank failed."""


class NonFiniteTrainScore(EngineError):
    """Training met an Inf or NaN (``stop_on_nonfinite_train_score``): a step's loss or gradient, or the
    parameters after an update or before a save. Exit code 3, as a data error: a rerun resumes from the
    newest checkpoint and meets the same step again, so the config (learning rate, clipping) or the data
    must change first; ``supervise`` does not restart it."""

    exit_code = DATA_ERROR_EXIT_CODE


class TrainingStopped(EngineError):
    """Training stopped on request (a preemption signal, the time limit) after saving a checkpoint.

    Not an error: the ranks agreed on the stop through the step signal, and rank 0 logged the one line
    saying why, so every rank ends quietly with ``RESUMABLE_EXIT_CODE``."""

    exit_code = RESUMABLE_EXIT_CODE
    agreed = True
    quiet = True
