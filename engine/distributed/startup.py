"""Starting a task's distributed side: the communicator, the process identity, the strategy.

    strategy = start(config)   # on every rank, before anything collective

Reads the data-parallel keys once (``settings.py``), refuses a multi-rank launch without
``use_horovod``, creates the communicator (with its stall watchdog), makes it this process's identity
(``engine.process``), routes uncaught errors to ``failure.fail``, checks that all ranks run the same
config and logs where each rank runs.
"""
from __future__ import annotations

import socket

from engine import log, process
from engine.cluster import format_host_map
from engine.config import Config
from engine.device import requested_device
from engine.distributed.consistency import check_config_consistency
from engine.distributed.failure import install_failure_handler
from engine.distributed.select import create_communicator
from engine.distributed.settings import DataParallelSettings
from engine.distributed.strategy import Strategy, build_strategy
from engine.errors import ConfigError
from engine.launch import env_size


def start(config: Config) -> Strategy:
    settings = DataParallelSettings.from_config(config)  # checks every horovod_* key, also when off
    if not settings.enabled and env_size() > 1:
        raise ConfigError(f"This process is one of {env_size()} ranks started by mpirun/srun, but "
                          "'use_horovod' is off, so every rank would train its own model and overwrite the "
                          "others' files. Add '++use_horovod 1' for data-parallel training, or start a "
                          "single process.")
    comm = create_communicator(settings.backend_name if settings.enabled else "local", settings.stall,
                               requested_device(config))  # tf_session_opts' device_count can say "cpu"
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
