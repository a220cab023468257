"""The distributed runtime: one collective interface, three backends, the step protocol, failure handling.

    ctx = HorovodContext.from_config(config)                 # None: single process
    comm = create_communicator(ctx.backend_name if ctx else "local", ctx and ctx.stall_timeout)
    install_failure_handler(comm, ctx and ctx.stall_timeout)
    helpers.set_global_communicator(comm)

Importing this package imports neither mpi4py nor TensorFlow; the backends import them when created.
"""
from engine.distributed import helpers
from engine.distributed.backend import OPS, Communicator
from engine.distributed.context import HorovodContext
from engine.distributed.failure import Watchdog, fail, format_error, install_failure_handler
from engine.distributed.protocol import (ParamSyncSchedule, StepSignal, broadcast_initial,
                                         check_config_consistency, reduce_scores, step_signal)
from engine.distributed.select import BACKENDS, create_communicator, horovod_import_error

__all__ = [
    "OPS", "BACKENDS", "Communicator", "HorovodContext", "ParamSyncSchedule", "StepSignal", "Watchdog",
    "broadcast_initial", "check_config_consistency", "create_communicator", "fail", "format_error",
    "helpers", "horovod_import_error", "install_failure_handler", "reduce_scores", "step_signal",
]
