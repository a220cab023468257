"""Every config key the engine reads: its type, default, one-line help and the module that reads it.

This table is the single source of ``--help`` and of every default: ``Config``'s getters fall back to
the default here when the caller gives none (``config.int("num_epochs")`` is 5 unless the config says
otherwise). A module that starts reading a new key adds one line here, and no default of its own.

Types: ``int``, ``float``, ``bool``, ``str``, ``list``, ``dict``, or ``any`` (the value as given:
numbers, dicts or functions, checked by the owner).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Key:
    name: str
    type: str  # int | float | bool | str | list | dict | any
    default: Any
    help: str
    owner: str  # the module that reads it, relative to engine/
    shown_default: str | None = None  # for --help when the default is computed (e.g. "GPU when present")


_KEYS: list[Key] = []


def _section(owner: str, *rows: tuple) -> None:
    for name, type_, default, help_text, *shown in rows:
        _KEYS.append(Key(name, type_, default, help_text, owner, shown[0] if shown else None))


_section(
    "tasks",
    ("task", "str", "train", "train | eval | forward"),
    ("train", "any", None, 'train dataset: dict, "file1.hdf,file2.hdf", or "Class:kw=v,..."'),
    ("dev", "any", None, "dev dataset, scored after every epoch (same forms as train)"),
    ("eval", "any", None, "eval dataset (task eval and forward)"),
    ("output_file", "str", None, "forward task: HDF file to write"),
)
_section(
    "datasets",
    ("extern_data", "dict", None, "stream dims and sparsity, {key: {'dim': D, 'sparse': bool}}",
     "from train data"),
    ("num_inputs", "any", None, "legacy: input dim (with num_outputs)"),
    ("num_outputs", "any", None, "legacy: target dims, an int or {key: dim or (dim, ndim)}"),
    ("batch_size", "int", None, "max padded frames per batch (max_len * num_seqs), per rank",
     "required for train; 5000 for eval/forward"),
    ("max_seqs", "int", -1, "max sequences per batch (-1: no limit)"),
    ("max_seq_length", "any", 0, "skip longer training sequences (0: no limit; int or per-key dict)"),
    ("batching", "str", None, "default seq_ordering of the train dataset"),
    ("cache_size", "any", None, 'HDF cache bytes ("0": read from file; suffixes K/M/G)'),
)
_section(
    "model",
    ("network", "any", None, "layer dict (linear, rec, softmax, dropout, copy)"),
    ("get_model", "any", None, "config function returning a Keras model or tf.Module"),
    ("get_network", "any", None, "config function get_network(epoch=...) returning a layer dict"),
    ("random_seed", "int", 42, "seed for parameters and data order"),
    ("device", "str", "", "cpu | gpu", "GPU when present"),
)
_section(
    "training",
    ("num_epochs", "int", 5, "epochs to train"),
    ("optimizer", "any", None, "adam | sgd | momentum | rmsprop | nadam, or a dict with 'class'",
     '{"class": "adam"}'),
    ("learning_rate", "float", 1.0, "initial learning rate"),
    ("learning_rates", "any", None, "per-epoch learning rates (list, or dict epoch -> rate)"),
    ("gradient_clip_global_norm", "float", None, "clip gradients to this global norm (0: off)"),
    ("learning_rate_control", "str", "constant", "constant | newbob | newbob_rel | newbob_abs"),
    ("newbob_learning_rate_decay", "float", 0.5, "newbob: multiply the rate by this"),
    ("newbob_relative_error_threshold", "float", -0.01, "newbob_rel: decay above this relative change"),
    ("newbob_error_threshold", "float", -0.01, "newbob_abs: decay when the absolute change is above"),
    ("min_learning_rate", "float", 0.0, "newbob never goes below this"),
    ("learning_rate_control_error_measure", "str", None, "the score newbob compares", "dev_score"),
    ("learning_rate_file", "str", None, "per-epoch history of learning rates and scores"),
)
_section(
    "checkpoints",
    ("model", "str", None, "checkpoint prefix; epoch N is saved as <model>.<NNN>"),
    ("save_interval", "int", 1, "save every N epochs (and at the end)"),
    ("start_epoch", "any", "auto", "auto: resume after the newest checkpoint; or an epoch >= 1"),
    ("load", "str", None, "checkpoint to load (initialisation for train; the model for eval/forward)"),
    ("load_epoch", "int", None, "eval/forward: load <model>.<load_epoch>", "the newest"),
)
_section(
    "log",
    ("log", "list", [], "log file(s); per rank <name>.horovod-<rank>-<size><ext> under MPI", ""),
    ("log_verbosity", "int", 3, "0..5; 5 prints every step and tracebacks"),
    ("log_all_ranks", "bool", False, "print progress of every rank on stdout, prefixed with the rank"),
    ("debug", "bool", False, "show tracebacks for errors"),
)
_section(
    "monitoring",
    ("tensorboard", "bool", True, "TensorBoard curves, written by rank 0 (docs/monitoring.md)"),
    ("tensorboard_dir", "str", None, "where the TensorBoard curves go", "<model dir>/tensorboard"),
    ("tensorboard_step_interval", "int", 100, "write the per-step curves (train/*) every N steps"),
    ("progress_interval", "float", 60.0, "seconds between progress lines when stdout is not a terminal"),
    ("timeline_file", "str", None, "Chrome-trace step timeline of every rank (a .json file)",
     "$ENGINE_TIMELINE, else off"),
)
_section(
    "distributed",
    ("use_horovod", "bool", False, "data-parallel training over the ranks of the MPI job"),
    ("horovod_reduce_type", "str", "grad", "grad: allreduce gradients each step; param: average parameters"),
    ("horovod_param_sync_step", "int", 1, "param mode: average every N steps"),
    ("horovod_param_sync_time_diff", "float", None, "param mode: average every T seconds instead"),
    ("horovod_dataset_distribution", "str", "shard", "shard | random_seed_offset"),
    ("horovod_scale_lr", "bool", False, "multiply the learning rate by the number of ranks"),
    ("horovod_avg_grad", "bool", False, "grad mode: average instead of sum (horovod_grad_normalization)"),
    ("horovod_grad_normalization", "str", None, "grad mode: sum | average | global_frames", "sum"),
    ("distributed_backend", "str", "auto", "auto | horovod | mpi"),
    ("distributed_stall_timeout", "float", None, "abort the job when a collective waits longer (seconds)"),
)

KEYS: dict[str, Key] = {key.name: key for key in _KEYS}
if len(KEYS) != len(_KEYS):
    raise AssertionError("engine/keys.py: a key is listed twice")


def default(name: str, fallback: Any = None) -> Any:
    """The listed default of ``name``; ``fallback`` for keys the table does not list (config code's own)."""
    key = KEYS.get(name)
    return fallback if key is None else copy.copy(key.default)  # a caller may change a list it gets


def help_rows() -> list[tuple[str, str, str, str]]:
    """(owner, key, help, shown default) for --help, in the table's order."""
    rows = []
    for key in KEYS.values():
        shown = key.shown_default
        if shown is None:
            shown = "" if key.default is None else f'"{key.default}"' if isinstance(key.default, str) \
                else str(key.default)
        rows.append((key.owner, key.name, key.help, shown))
    return rows
