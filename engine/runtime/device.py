"""Where this rank computes: ``device = "cpu"`` hides the GPUs, and so does RETURNN's way of saying it,
``tf_session_opts = {"device_count": {"GPU": 0}}``; otherwise rank r takes visible GPU ``local_rank`` (the
rule and its errors are ``cluster.gpu_for_rank``'s). The CPU thread pools are set first (``tf_threads``):
TensorFlow fixes them when it starts."""
from __future__ import annotations

import os
import socket

from engine.runtime import log, process
from engine.runtime.cluster import gpu_for_rank
from engine.runtime.config_view import ConfigView
from engine.runtime.errors import ConfigError
from engine.runtime.tf_threads import configure_threads

DEVICE_COUNT = "tf_session_opts['device_count']"


def device_count_hides_gpus(config: ConfigView) -> bool:
    """Whether ``tf_session_opts``'s ``device_count`` says ``{"GPU": 0}`` (RETURNN users force the CPU so).

    A TensorFlow 1 session made that many devices of each kind. Here a rank uses one GPU or the CPU, so
    ``GPU``: 0 means the CPU, a positive number changes nothing (a rank takes one GPU), and ``CPU``: a
    positive number changes nothing (TensorFlow 2 has one CPU device, using the thread pools); anything
    else (no CPU, other device kinds, a value that is not a count) is refused rather than ignored."""
    session = config.dict("tf_session_opts") or {}
    counts = session.get("device_count")
    if counts is None:
        return False
    if not isinstance(counts, dict):
        raise ConfigError(f"Config key {DEVICE_COUNT} is {counts!r}; expected a dict such as {{'GPU': 0}} "
                          "(the number of devices of each kind).")
    for kind, number in counts.items():
        if kind not in ("GPU", "CPU"):
            raise ConfigError(f"Config key {DEVICE_COUNT} has {kind!r}, which this engine does not know; it "
                              "takes 'GPU' (0: train on the CPU) and 'CPU' (at least 1).")
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ConfigError(f"Config key {DEVICE_COUNT} has {kind!r}: {number!r}; expected a number of "
                              "devices, an integer >= 0.")
    if counts.get("CPU") == 0:
        raise ConfigError(f"Config key {DEVICE_COUNT} has 'CPU': 0, but TensorFlow always has its CPU device "
                          "(it runs the input pipeline and the host side of every step). Remove the entry.")
    return counts.get("GPU") == 0


def requested_device(config: ConfigView) -> str:
    """The config's ``device`` ("cpu", "gpu" or "": GPU when present), with ``device_count`` {"GPU": 0}
    as "cpu"; the two contradicting each other is an error."""
    device = config.str("device")
    if not device_count_hides_gpus(config):
        return device
    if device.startswith("gpu"):
        raise ConfigError(f"Config keys 'device' = {device!r} and {DEVICE_COUNT} = {{'GPU': 0}} contradict "
                          "each other; keep one of them.")
    return "cpu"


def select_device(config: ConfigView) -> None:
    """Call once the communicator exists (``engine.runtime.process`` then knows the local rank), before the
    model."""
    import tensorflow as tf

    configure_threads(config)
    device = requested_device(config)
    if device == "cpu" and not config.str("device"):
        # before TensorFlow makes its logical devices: hidden here, a GPU never gets a context or memory
        log.info(f"{DEVICE_COUNT} = {{'GPU': 0}}: the GPUs are hidden, this rank computes on the CPU")
    gpus = tf.config.list_physical_devices("GPU")  # those CUDA_VISIBLE_DEVICES leaves visible
    if device.startswith("cpu") or not gpus:
        if device.startswith("gpu"):
            raise ConfigError("Config key 'device' is 'gpu', but TensorFlow sees no GPU "
                              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}).")
        if not gpus and not device and tf.test.is_built_with_cuda():
            # the GPU install on a machine without one (or with none left visible): it still trains
            log.info("TensorFlow is built with CUDA but sees no GPU (CUDA_VISIBLE_DEVICES="
                     f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}): this rank computes on the CPU")
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
