"""What the launcher (``mpirun``, ``srun``) tells a process through its environment, before MPI starts,
and where the launcher's output goes.

Used where the engine must know its rank before (or without) initialising MPI: per-rank log files and
printing a start-up error once rather than once per rank; and by the progress display, which draws a
bar only where a person watches a terminal.
"""
from __future__ import annotations

import os

# Open MPI, MPICH/Hydra and PMIx launchers, then SLURM's srun. The batch script of an sbatch job (and
# a plain `python` it starts) gets SLURM_NTASKS (the job's task count) and SLURM_PROCID=0 as well, so
# those do not mean "one of N ranks"; only a task that srun started has the step variables
# SLURM_STEP_ID and SLURM_STEP_NUM_TASKS (the tasks of this step), which sbatch does not set.
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")


def _first_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return default


def env_rank() -> int:
    return _first_int(_RANK_VARS, 0)


def env_size() -> int:
    return _first_int(_SIZE_VARS, 1)


def launched_by_mpi() -> bool:
    return any(name in os.environ for name in _RANK_VARS[:3])


def launcher_output_is_terminal(fd: int) -> bool:
    """Whether output to this process's ``fd`` (a terminal itself) ends up on a terminal.

    Open MPI gives every rank a pseudo-terminal as stdout and copies what arrives there to ``mpirun``'s
    own stdout, which may be a file or a pipe (a batch job): then a rank's ``isatty()`` says yes, and a
    progress bar would fill the job's log with redraws. Under an MPI launcher this looks at the same
    descriptor of the parent process (``mpirun`` itself on its node); where that cannot be seen (a rank
    on another node, whose parent is a daemon, or no ``/proc``), the answer is no."""
    if not launched_by_mpi():
        return True
    try:
        target = os.readlink(f"/proc/{os.getppid()}/fd/{fd}")
    except OSError:
        return False
    return target.startswith(("/dev/pts/", "/dev/tty"))
