"""Where this rank computes: ``device = "cpu"`` hides the GPUs; otherwise rank r takes visible GPU
``local_rank`` (the rule and its errors are ``cluster.gpu_for_rank``'s). The CPU thread pools are set
first (``tf_threads``): TensorFlow fixes them when it starts."""
from __future__ import annotations

import os
import socket

from engine import log, process
from engine.cluster import gpu_for_rank
from engine.config import Config
from engine.errors import ConfigError
from engine.tf_threads import configure_threads


def select_device(config: Config) -> None:
    """Call once the communicator exists (``engine.process`` then knows the local rank), before the model."""
    import tensorflow as tf

    configure_threads(config)
    device = config.str("device")
    gpus = tf.config.list_physical_devices("GPU")  # those CUDA_VISIBLE_DEVICES leaves visible
    if device.startswith("cpu") or not gpus:
        if device.startswith("gpu"):
            raise ConfigError("Config key 'device' is 'gpu', but TensorFlow sees no GPU "
                              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}).")
        tf.config.set_visible_devices([], "GPU")
        return
    comm, host = process.communicator(), socket.gethostname()
    local_rank, local_size = (comm.local_rank, comm.local_size) if comm is not None else (0, 1)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    choice = gpu_for_rank(local_rank, local_size, len(gpus), visible, host=host)
    gpu = gpus[choice.index]
    tf.config.set_visible_devices([gpu], "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)
    log.debug(f"rank {process.rank()} (local rank {local_rank} on {host}) uses GPU "
              f"{choice.index} of {len(gpus)} visible (CUDA device {choice.device_id})")
