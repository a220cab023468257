"""The data-parallel keys of a config (``docs/distributed-protocol.md``), read and checked once.

Every ``horovod_*`` key must be known (a typo must not silently train single-rank semantics), and keys
that only mean something in the other reduce mode are an error rather than ignored. ``strategy.py``
turns the settings into the object the training loop talks to.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from engine.distributed.watchdog import StallLimits
from engine.distributed.wire import WIRE_FORMATS
from engine.runtime import log
from engine.runtime.errors import ConfigError

REDUCE_TYPES = ("grad", "param")
DATASET_DISTRIBUTIONS = ("shard", "random_seed_offset")
# sum: the ranks' gradients of RETURNN's objective (loss sums) are added, as RETURNN with Horovod does:
# the gradient of one process on the union batch; average: and divided by the number of ranks
# (horovod_avg_grad); global_frames: added and divided by all ranks' frames (this engine's option: the
# union batch's frame-averaged gradient, also when the ranks' frame counts differ).
GRAD_NORMALIZATIONS = ("sum", "average", "global_frames")
CONFIG_BACKENDS = ("auto", "horovod", "mpi", "tf")
HOROVOD_KEYS = ("horovod_reduce_type", "horovod_param_sync_step", "horovod_param_sync_time_diff",
                "horovod_dataset_distribution", "horovod_scale_lr", "horovod_avg_grad",
                "horovod_grad_normalization")
BACKEND_KEY = "distributed_backend"
PARAM_OVERLAP_KEY = "distributed_param_sync_overlap"
WIRE_KEY = "distributed_wire_format"
BUCKET_KEY = "distributed_bucket_mb"
TF_GPU_KEY = "distributed_tf_gpu_reduction"
TF_GPU_REDUCTIONS = ("nccl", "ring")  # ring: ranks that share a GPU, which NCCL refuses
STALL_KEYS = ("distributed_stall_warning", "distributed_stall_timeout", "distributed_checkpoint_timeout")
RANDOM_SEED_OFFSET = 16127  # rank r reads the data with seed offset r * 16127 (random_seed_offset)


@dataclass(frozen=True)
class DataParallelSettings:
    enabled: bool = False  # use_horovod
    reduce_type: str = "grad"
    param_sync_step: int = 1
    param_sync_time_diff: float | None = None
    dataset_distribution: str = "shard"
    scale_lr: bool = False
    grad_normalization: str = "sum"
    backend_name: str = "auto"
    param_sync_overlap: bool = False  # param mode: the average runs behind the following steps
    stall: StallLimits = StallLimits()  # when a wait for the other ranks is reported, and ends the job
    wire_format: str | None = None  # distributed_wire_format: None (float32) | "fp16" | "bf16"
    bucket_mb: float = 0.0  # distributed_bucket_mb: gradient buckets reduced during the backward pass
    tf_gpu_reduction: str = "nccl"  # distributed_tf_gpu_reduction: how the tf backend reduces GPU tensors

    @classmethod
    def from_config(cls, config: Any) -> DataParallelSettings:
        """Raises ConfigError for unknown ``horovod_*`` keys (also when ``use_horovod`` is off) and for
        contradictory settings."""
        _check_known_keys(config)
        backend = config.str(BACKEND_KEY, "auto")
        _check_choice(BACKEND_KEY, backend, CONFIG_BACKENDS)
        stall = _stall_limits(config)
        wire_format = _wire_format(config)
        bucket_mb = _bucket_mb(config)
        tf_gpu_reduction = _tf_gpu_reduction(config, backend)
        if not config.bool("use_horovod"):
            return cls(backend_name=backend, stall=stall, wire_format=wire_format, bucket_mb=bucket_mb,
                       tf_gpu_reduction=tf_gpu_reduction)
        settings = cls(
            enabled=True,
            reduce_type=config.str("horovod_reduce_type"),
            param_sync_step=config.int("horovod_param_sync_step"),
            param_sync_time_diff=config.float("horovod_param_sync_time_diff"),
            dataset_distribution=config.str("horovod_dataset_distribution"),
            scale_lr=config.bool("horovod_scale_lr"),
            grad_normalization=_grad_normalization(config),
            backend_name=backend,
            param_sync_overlap=config.bool(PARAM_OVERLAP_KEY),
            stall=stall,
            wire_format=wire_format,
            bucket_mb=bucket_mb,
            tf_gpu_reduction=tf_gpu_reduction,
        )
        settings._validate()
        return settings

    def _validate(self) -> None:
        _check_choice("horovod_reduce_type", self.reduce_type, REDUCE_TYPES)
        _check_choice("horovod_grad_normalization", self.grad_normalization, GRAD_NORMALIZATIONS)
        _check_choice("horovod_dataset_distribution", self.dataset_distribution, DATASET_DISTRIBUTIONS)
        if self.param_sync_step < 1:
            raise ConfigError(f"Config key 'horovod_param_sync_step' is {self.param_sync_step}; expected an "
                              "integer >= 1 (average every N steps).")
        if self.param_sync_time_diff is not None and self.param_sync_time_diff <= 0:
            raise ConfigError(f"Config key 'horovod_param_sync_time_diff' is {self.param_sync_time_diff}; "
                              "expected seconds > 0, or None to average by step count.")
        if self.reduce_type == "grad":
            param_only = {"horovod_param_sync_step": self.param_sync_step != 1,
                          "horovod_param_sync_time_diff": self.param_sync_time_diff is not None,
                          PARAM_OVERLAP_KEY: self.param_sync_overlap}
            for key, is_set in param_only.items():
                if is_set:
                    raise ConfigError(f"Config key '{key}' only applies to horovod_reduce_type = 'param', "
                                      "but horovod_reduce_type is 'grad' (gradients are reduced every "
                                      f"step). Remove '{key}' or set horovod_reduce_type = 'param'.")
        elif self.grad_normalization != "sum":
            raise ConfigError("Config keys 'horovod_avg_grad' and 'horovod_grad_normalization' only apply to "
                              "horovod_reduce_type = 'grad', but horovod_reduce_type is 'param' (parameters "
                              "are always averaged). Remove them or set horovod_reduce_type = 'grad'.")
        if self.param_sync_time_diff is not None and self.param_sync_step != 1:
            log.warning(f"horovod_param_sync_step = {self.param_sync_step} is ignored: "
                        f"horovod_param_sync_time_diff = {self.param_sync_time_diff} takes precedence.")


def _tf_gpu_reduction(config: Any, backend: str) -> str:
    """``distributed_tf_gpu_reduction``: "nccl" (the default) or "ring", which only the tf backend has."""
    value = config.str(TF_GPU_KEY, "nccl")
    _check_choice(TF_GPU_KEY, value, TF_GPU_REDUCTIONS)
    if value != "nccl" and backend != "tf":
        raise ConfigError(f"Config key '{TF_GPU_KEY}' = {value!r} only applies to distributed_backend = "
                          f"'tf', but distributed_backend is {backend!r}. Remove it, or set "
                          "distributed_backend = 'tf'.")
    return value


def _grad_normalization(config: Any) -> str:
    """``horovod_grad_normalization``, with RETURNN's ``horovod_avg_grad = True`` as another spelling of
    'average'; the two must not contradict each other."""
    normalization = config.str("horovod_grad_normalization")
    if config.bool("horovod_avg_grad"):
        if normalization not in (None, "average"):
            raise ConfigError(f"Config keys 'horovod_avg_grad' = True and 'horovod_grad_normalization' = "
                              f"{normalization!r} contradict each other; keep only "
                              "horovod_grad_normalization.")
        return "average"
    return normalization or "sum"


def _wire_format(config: Any) -> str | None:
    """``distributed_wire_format``: checked also when ``use_horovod`` is off, like distributed_backend (a
    config that sets it is meant for multi-rank runs; with one rank it has no effect, which
    ``strategy.build_strategy`` logs)."""
    value = config.typed(WIRE_KEY)
    if value is None:
        return None
    if value not in WIRE_FORMATS:
        raise ConfigError(f"Config key '{WIRE_KEY}' is {value!r}; expected None (float32 on the wire) or "
                          f"one of {', '.join(repr(c) for c in WIRE_FORMATS)}: float32 gradients (grad mode) "
                          "or parameters (param mode) are then cast to that dtype for the reduction, summed "
                          "in it and cast back.")
    return value


def _stall_limits(config: Any) -> StallLimits:
    """``distributed_stall_warning`` [60], ``distributed_stall_timeout`` [300] and, while a checkpoint is
    saved, ``distributed_checkpoint_timeout`` [1800], in seconds; 0 or None: never. With
    ``distributed_stall_timeout`` off no wait ends the job, in checkpoint windows neither: whoever turned
    the stall timeout off would not expect a save to end the job."""
    seconds = []
    for key in STALL_KEYS:
        value = None if config.has(key) and config.typed(key) is None else config.float(key)
        if value is not None and value < 0:
            raise ConfigError(f"Config key '{key}' is {value:g}; expected seconds > 0 (or 0 / None: never).")
        seconds.append(value or None)
    warning, timeout, checkpoint = seconds
    return StallLimits(warning, timeout, checkpoint if timeout else None)


def _bucket_mb(config: Any) -> float:
    """``distributed_bucket_mb``: MB (1e6 bytes) per gradient bucket, >= 0 (0: one reduction at the end)."""
    value = config.float(BUCKET_KEY)  # a ConfigError naming the key for a non-number
    if value is None or not math.isfinite(value) or value < 0:
        raise ConfigError(f"Config key '{BUCKET_KEY}' is {value!r}; expected a size in MB >= 0 (0: reduce "
                          "gradients in one call after the backward pass).")
    return value


def _check_known_keys(config: Any) -> None:
    for key in config.keys():
        if key.startswith("horovod_") and key not in HOROVOD_KEYS:
            close = difflib.get_close_matches(key, HOROVOD_KEYS, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"Config key '{key}' is not a known Horovod setting.{hint} "
                              f"Known keys: use_horovod, {', '.join(HOROVOD_KEYS)}.")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"Config key '{key}' is {value!r}; expected one of "
                          f"{', '.join(repr(c) for c in choices)}.")
