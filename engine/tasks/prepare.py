"""What every task builds first: the ranks, the device, the datasets, the data dims and the model."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from engine import log
from engine.cluster import format_host_map, gpu_for_rank
from engine.config import Config
from engine.datasets import create_dataset
from engine.distributed import HorovodContext, create_communicator, install_failure_handler
from engine.distributed.helpers import global_communicator, set_global_communicator
from engine.distributed.protocol import check_config_consistency
from engine.errors import ConfigError
from engine.launch import env_size

@dataclass
class Ranks:
    """The communicator and the data-parallel settings (``ctx`` is None without ``use_horovod``)."""

    comm: object
    ctx: HorovodContext | None

    @property
    def is_main(self) -> bool:
        return self.comm.rank == 0


def init_ranks(config: Config) -> Ranks:
    ctx = HorovodContext.from_config(config)  # validates every horovod_* key, also without use_horovod
    if ctx is None and env_size() > 1:
        raise ConfigError(f"This process is one of {env_size()} ranks started by mpirun/srun, but 'use_horovod' "
                          "is off, so every rank would train its own model and overwrite the others' files. "
                          "Add '++use_horovod 1' for data-parallel training, or start a single process.")
    stall_timeout = ctx.stall_timeout if ctx else None
    comm = create_communicator(ctx.backend_name if ctx else "local", stall_timeout)
    set_global_communicator(comm)
    log.set_rank(comm.rank, comm.size)
    install_failure_handler(comm, stall_timeout)
    if comm.size > 1:
        check_config_consistency(comm, _plain_config_items(config))
        log.info(f"data-parallel: {comm.size} ranks, backend {comm.name}, reduce type {ctx.reduce_type}, "
                 f"dataset distribution {ctx.dataset_distribution}")
        # Which rank runs where: the first thing to check when ranks are slow or unreachable.
        log.info(f"hosts: {format_host_map(comm.allgather_object(socket.gethostname()))}")
    return Ranks(comm, ctx)


def _plain_config_items(config: Config) -> dict:
    """Keys whose values are plain data (functions and modules cannot be compared across processes)."""
    plain = (str, int, float, bool, list, tuple, dict, type(None))
    return {k: repr(v) for k in config.keys() if isinstance(v := config.value(k), plain)}


def init_device(config: Config) -> None:
    """``device = "cpu"`` hides GPUs; otherwise rank r uses visible GPU ``local_rank``, by the rule of
    ``cluster.gpu_for_rank``. Called after ``init_ranks``, whose communicator knows the local rank."""
    import tensorflow as tf

    device = config.str("device", "")
    gpus = tf.config.list_physical_devices("GPU")  # those CUDA_VISIBLE_DEVICES leaves visible
    if device.startswith("cpu") or not gpus:
        if device.startswith("gpu"):
            raise ConfigError("Config key 'device' is 'gpu', but TensorFlow sees no GPU "
                              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}).")
        tf.config.set_visible_devices([], "GPU")
        return
    comm, host = global_communicator(), socket.gethostname()
    choice = gpu_for_rank(comm.local_rank, comm.local_size, len(gpus),
                          os.environ.get("CUDA_VISIBLE_DEVICES"), host=host)
    gpu = gpus[choice.index]
    tf.config.set_visible_devices([gpu], "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)
    log.debug(f"rank {comm.rank} (local rank {comm.local_rank} on {host}) uses GPU "
              f"{choice.index} of {len(gpus)} visible (CUDA device {choice.device_id})")


def load_dataset(config: Config, key: str, ranks: Ranks, *, train: bool = False):
    """The dataset under ``key`` (``train``/``dev``/``eval``), or None when the config has none."""
    spec = config.typed(key)
    if not spec:
        return None
    offset = ranks.ctx.random_seed_offset(ranks.comm.rank) if (train and ranks.ctx) else 0
    return create_dataset(spec, default_seq_ordering=config.str("batching") if train else None,
                          random_seed_offset=offset, cache_size=config.value("cache_size"))


@dataclass
class DataDims:
    input_dim: int
    input_sparse: bool
    target_dims: dict[str, int]


def data_dims(config: Config, dataset) -> DataDims:
    """From ``extern_data``, else ``num_inputs``/``num_outputs``, else the dataset."""
    if config.has("extern_data"):
        streams = {k: _stream(k, v) for k, v in config.dict("extern_data").items()}
    elif config.has("num_inputs") or config.has("num_outputs"):
        outputs = config.typed("num_outputs")
        outputs = outputs if isinstance(outputs, dict) else {"classes": outputs}
        streams = {k: _stream(k, v, default_sparse=True) for k, v in outputs.items()}
        streams["data"] = _stream("data", config.typed("num_inputs"))
    elif dataset is not None:
        streams = {k: (dataset.get_data_dim(k), dataset.is_sparse(k)) for k in dataset.data_keys}
    else:
        raise ConfigError("Cannot tell the input and output dims: set 'extern_data' (or 'num_inputs' and "
                          "'num_outputs'), or give a 'train' dataset.")
    if dataset is not None:
        _check_against_dataset(streams, dataset)
    if "data" not in streams:
        raise ConfigError(f"The input stream 'data' is missing (streams: {', '.join(sorted(streams))}).")
    dim, sparse = streams.pop("data")
    return DataDims(dim, sparse, {k: d for k, (d, s) in streams.items() if s})


def _check_against_dataset(streams: dict[str, tuple[int, bool]], dataset) -> None:
    """The declared dims must be the data's, or the first step fails deep inside TensorFlow."""
    for key, (dim, sparse) in streams.items():
        if key not in dataset.data_keys:
            raise ConfigError(f"'extern_data'/'num_outputs' declares stream '{key}', but dataset {dataset!r} has "
                              f"only {', '.join(dataset.data_keys)}.")
        actual = (dataset.get_data_dim(key), dataset.is_sparse(key))
        if actual != (dim, sparse):
            raise ConfigError(f"'extern_data'/'num_outputs' declares stream '{key}' with dim {dim} "
                              f"({'sparse' if sparse else 'dense'}), but dataset {dataset!r} has dim {actual[0]} "
                              f"({'sparse' if actual[1] else 'dense'}).")


def _stream(key: str, value, default_sparse: bool = False) -> tuple[int, bool]:
    """``{"dim": 50, "sparse": True}``, ``(dim, ndim)`` (ndim 1 = sparse) or a plain dim."""
    if isinstance(value, dict) and "dim" in value:
        return int(value["dim"]), bool(value.get("sparse", False))
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1]) == 1
    if isinstance(value, int) and not isinstance(value, bool):
        return value, default_sparse
    raise ConfigError(f"Config 'extern_data'/'num_outputs' entry '{key}' = {value!r} is not understood; write "
                      "{'dim': D, 'sparse': True/False} or (dim, ndim).")


def checkpoint_to_load(config: Config, ranks: Ranks) -> tuple[str, int]:
    """For eval/forward: ``load`` (a checkpoint file), else ``<model>.<load_epoch>``, else the newest
    ``<model>.<NNN>``. Rank 0 decides; every rank gets (path, epoch)."""
    from engine.training.checkpoint import checkpoint_path, find_newest_epoch

    found: tuple[str, int] | None = None
    if ranks.is_main:
        prefix = config.str("model")
        if config.str("load"):
            found = (config.str("load"), 0)
        elif prefix and config.has("load_epoch"):
            found = (checkpoint_path(prefix, config.int("load_epoch")), config.int("load_epoch"))
        elif prefix and (newest := find_newest_epoch(prefix)) is not None:
            found = (checkpoint_path(prefix, newest), newest)
    found = ranks.comm.broadcast_object(found, root=0)
    if found is None:
        raise ConfigError("No model to load: set 'load' to a checkpoint file, or 'model' to the prefix of "
                          "trained checkpoints (<model>.<NNN>), optionally with 'load_epoch'.")
    return found
