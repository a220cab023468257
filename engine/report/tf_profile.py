"""RETURNN's ``store_tf_profile``: TensorFlow's profiler records every train epoch's steps.

Each epoch of each rank gets its own directory, ``<tf_log_dir>/train-ep<NNN>-<UTC start>`` (with
``-rank<R>`` on several ranks: the profiler names its file after the host, so ranks of one host would
overwrite each other's), holding TensorFlow's ``plugins/profile/<run>/<host>.xplane.pb``. ``tf_log_dir``
defaults to the ``model`` prefix's directory, as in RETURNN (where it also holds RETURNN's TensorBoard
summaries; here those go to ``tensorboard_dir``). ``tools/profile_ops.py`` sums such a profile by op
type, and compares two, e.g. RETURNN's and this engine's of the same network.
"""
from __future__ import annotations

import os
import time

import tensorflow as tf

from engine.config.loader import Config
from engine.runtime import log
from engine.runtime.errors import ConfigError


class EpochProfiler:
    def __init__(self, log_dir: str, rank: int, size: int) -> None:
        self.log_dir, self.rank, self.size = log_dir, rank, size
        self.current: str | None = None

    @classmethod
    def from_config(cls, config: Config, rank: int, size: int) -> "EpochProfiler | None":
        """None unless ``store_tf_profile``; a ``tf_log_dir`` nothing is written to is refused."""
        log_dir = config.str("tf_log_dir")
        if not config.bool("store_tf_profile"):
            if log_dir:
                raise ConfigError(f"Config key 'tf_log_dir' = {log_dir!r} holds only store_tf_profile's "
                                  "profiles here, and store_tf_profile is off (TensorBoard curves go to "
                                  "'tensorboard_dir'); set store_tf_profile = True or remove tf_log_dir.")
            return None
        if not log_dir:
            model = config.str("model")
            if not model:
                raise ConfigError("store_tf_profile = True needs 'tf_log_dir' or 'model' (the profiles go "
                                  "to tf_log_dir, by default the model's directory).")
            log_dir = os.path.dirname(os.path.abspath(model))
        return cls(log_dir, rank, size)

    def start(self, epoch: int) -> None:
        name = f"train-ep{epoch:03d}-{time.strftime('%Y-%m-%d-%H-%M-%S', time.gmtime())}"
        self.current = os.path.join(self.log_dir, name + (f"-rank{self.rank}" if self.size > 1 else ""))
        tf.profiler.experimental.start(self.current)

    def stop(self) -> None:
        if self.current is None:
            return
        tf.profiler.experimental.stop()
        if self.rank == 0:
            log.info(f"store_tf_profile: TensorFlow's profile of the epoch's steps in {self.current} "
                     "(tools/profile_ops.py sums it by op type)")
        self.current = None
