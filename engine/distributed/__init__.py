"""The distributed runtime: one collective interface, its backends, the strategies, failure handling.

    strategy = start(config)           # communicator, process identity, strategy (startup.py)
    strategy.comm.allreduce([...])     # the collective interface (backend.py)

Importing this package imports neither mpi4py nor TensorFlow; the backends import them when created.

Stage 5 (distributed): may import runtime, config, report, datasets and model; imported by training,
tasks, tools and main.
"""
from engine.distributed import helpers
from engine.distributed.backend import OPS, Communicator
from engine.distributed.consistency import check_config_consistency
from engine.distributed.failure import fail, format_error, install_failure_handler
from engine.distributed.protocol import (StepSignal, agree_on_failure, broadcast_initial, raise_on_failure,
                                         reduce_scores, step_signal)
from engine.distributed.select import BACKENDS, auto_backend, create_communicator, horovod_import_error
from engine.distributed.settings import DataParallelSettings
from engine.distributed.startup import start
from engine.distributed.strategy import (GradAllreduce, ParamAverage, ParamSyncSchedule, StepPlan, Strategy,
                                         build_strategy)
from engine.distributed.watchdog import StallLimits, Watchdog

__all__ = [
    "OPS", "BACKENDS", "Communicator", "DataParallelSettings", "GradAllreduce", "ParamAverage",
    "ParamSyncSchedule", "StallLimits", "StepPlan", "StepSignal", "Strategy", "Watchdog", "agree_on_failure",
    "auto_backend",
    "broadcast_initial", "build_strategy", "check_config_consistency", "create_communicator", "fail",
    "format_error", "helpers", "horovod_import_error", "install_failure_handler", "raise_on_failure",
    "reduce_scores", "start", "step_signal",
]
