"""Starting a task's distributed side: the communicator, the process identity, the strategy.

    strategy = start(config)   # on every rank, before anything collective

Reads the data-parallel keys once (``settings.py``), refuses a multi-rank launch without
``use_horovod``, creates the communicator (with its stall watchdog), makes it this process's identity
(``engine.runtime.process``), routes uncaught errors to ``failure.fail``, checks that all ranks run the same
config and logs where each rank runs.
"""
from __future__ import annotations

import contextlib
import socket
from typing import Iterator

from engine.config.loader import Config
from engine.distributed.buckets import set_horovod_fusion_threshold
from engine.distributed.consistency import check_config_consistency
from engine.distributed.deadline import kill_after
from engine.distributed.failure import install_failure_handler
from engine.distributed.select import create_communicator
from engine.distributed.settings import DataParallelSettings
from engine.distributed.strategy import Strategy, build_strategy
from engine.distributed.watchdog import StallLimits
from engine.runtime import log, process
from engine.runtime.cluster import format_host_map
from engine.runtime.device import requested_device
from engine.runtime.errors import ConfigError
from engine.runtime.launch import env_rank, env_size


def start(config: Config) -> Strategy:
    settings = DataParallelSettings.from_config(config)  # checks every horovod_* key, also when off
    if not settings.enabled and env_size() > 1:
        raise ConfigError(f"This process is one of {env_size()} ranks started by mpirun/srun, but "
                          "'use_horovod' is off, so every rank would train its own model and overwrite the "
                          "others' files. Add '++use_horovod 1' for data-parallel training, or start a "
                          "single process.")
    set_horovod_fusion_threshold(settings.bucket_mb)  # read by hvd.init, if Horovod is the backend
    with joining_deadline(settings.stall if settings.enabled else StallLimits(), env_size()):
        comm = create_communicator(settings.backend_name if settings.enabled else "local", settings.stall,
                                   requested_device(config),  # tf_session_opts' device_count can say "cpu"
                                   tf_gpu_reduction=settings.tf_gpu_reduction)
    process.set_communicator(comm)
    install_failure_handler()
    strategy = build_strategy(settings, comm)
    if comm.size > 1:
        check_config_consistency(comm, {key: config.value(key) for key in config.keys()})
        log.info(f"data-parallel: {comm.size} ranks, backend {comm.name}, {strategy.describe()}, "
                 f"dataset distribution {settings.dataset_distribution}")
        # Which rank runs where: the first thing to check when ranks are slow or unreachable.
        log.info(f"hosts: {format_host_map(comm.allgather_object(socket.gethostname()))}")
    return strategy


@contextlib.contextmanager
def joining_deadline(limits: StallLimits, size: int) -> Iterator[None]:
    """Ends this rank when the communicator is not up after the stall timeout (plus the watchdog's grace).

    MPI's start waits until every rank has joined, and the stall watchdog exists only once it has: a
    rank stopped or stuck before it (a frozen node, an import hanging on a network file system) would
    otherwise leave the others waiting for ever. MPI_Init holds Python's lock while it waits, so no thread
    of this process could act: a small watcher process does, and killing this rank lets the launcher end
    the whole job. The watcher ends when its pipe closes: at the end of this block, or with this rank."""
    if size <= 1 or not limits.timeout:
        yield
        return
    seconds = limits.timeout + limits.grace
    message = (f"[rank {env_rank()}] rnn.py: error: the {size} ranks did not all join the job within "
               f"{seconds:.0f} s (distributed_stall_timeout = {limits.timeout:g} s, plus {limits.grace:g} s "
               "of grace): some rank is stopped, or stuck before it starts MPI (an import hanging on a "
               "network file system, a frozen node). Ending this rank so that the launcher ends the job.\n")
    watcher = kill_after(seconds, message)
    try:
        yield
    finally:
        watcher.stdin.close()
        watcher.wait()
