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
    "key_check",
    ("ignore_keys", "list", [], "RETURNN names to run without: 'key', 'layer:option', 'dataset:option'", ""),
)
_section(
    "tasks",
    ("task", "str", "train", "train | eval | forward | search"),
    ("train", "any", None, 'train dataset: dict, "file1.hdf,file2.hdf", or "Class:kw=v,..."'),
    ("dev", "any", None, "dev dataset, scored after every epoch (same forms as train)"),
    ("eval", "any", None, "eval dataset (task eval and forward)"),
    ("output_file", "str", None, "forward task: HDF file to write"),
    ("forward_greedy_labels", "bool", False,
     "forward task, ctc output: also write the best-path labels (target key 'greedy')"),
    ("search_data", "any", "eval",
     "search task: 'train' | 'dev' | 'eval' (that dataset) or a dataset of its own"),
    ("search_output_layer", "any", "output",
     "search task: the decide layer (best hypotheses) or searched rec layer (whole beams) written, or a list "
     "of them (py format: a dict per sequence)"),
    ("search_output_file", "str", "",
     "search task: text file of the hypotheses, corpus order (.gz: gzipped)", "none"),
    ("search_output_file_format", "str", "txt",
     "search task: txt (an entry a line) | py (dict seq tag -> entry)"),
    ("search_do_eval", "bool", True,
     "search task: score the hypotheses against the target (WER, label error rate)"),
)
_section(
    "datasets",
    ("extern_data", "dict", None, "stream dims and sparsity, {key: {'dim': D, 'sparse': bool}}",
     "from train data"),
    ("num_inputs", "any", None, "legacy: input dim (with num_outputs)"),
    ("num_outputs", "any", None, "legacy: target dims, an int or {key: dim or (dim, ndim)}"),
    ("target", "str", "classes", "the target of loss layers that name none (RETURNN's default target)"),
    ("batch_size", "int", None, "max padded frames per batch (max_len * num_seqs), per rank",
     "required for train; 5000 for eval/forward"),
    ("max_seqs", "int", -1, "max sequences per batch (-1: no limit)"),
    ("max_seq_length", "any", 0, "skip longer train and dev sequences (0: none; int, per-key dict, -n)"),
    ("batching", "str", None, "default seq_ordering of the train dataset"),
    ("cache_size", "any", None, 'HDF cache bytes ("0": read from file; suffixes K/M/G)'),
    ("chunking", "any", None,
     'cut train sequences into chunks: "size:step", "size", or per key (sizes, steps)'),
    ("min_chunk_size", "any", 0, "chunking: stop cutting once no more than this many frames are left"),
    ("chunk_eval", "bool", False, "chunk dev/eval data too (with the 'chunking' of train)"),
)
_section(
    "model",
    ("network", "any", None, "layer dict (linear, rec, softmax, dropout, copy)"),
    ("optimize_move_layers_out", "bool", True,
     "rec layers with a subnetwork unit: move the layers that allow it out of the decoder loop"),
    ("get_model", "any", None, "config function returning a Keras model or tf.Module"),
    ("get_network", "any", None, "config function get_network(epoch=...) returning a layer dict"),
    ("model_loss", "str", "ce", "get_model's loss against 'classes': ce | ctc"),
    ("model_loss_opts", "any", None, "get_model's ctc loss: the loss_opts of a softmax layer's ctc loss"),
    ("random_seed", "int", 42,
     "seeds the initial parameters, dropout and gradient noise; not the data's order, as in RETURNN"),
    ("device", "str", "", "cpu | gpu", "GPU when present"),
    ("lstm_implementation", "str", "auto", "rec layers' LSTM: auto (cuDNN on a GPU, the engine's own kernel "
     "on a CPU) | cudnn (on a CPU: its twin in plain ops) | native (the engine's own); same parameters"),
    ("tf_amp", "any", None, "mixed precision, RETURNN's name: 'bfloat16' | 'float16' (or {'dtype': ...}): "
     "layers compute in it, parameters, LSTM and loss stay float32; float16 with dynamic loss scaling",
     "off (float32)"),
    ("debug_add_check_numerics_on_output", "bool", False,
     "a 'network' dict's layers: stop the step with the layer's name where its output has a NaN or Inf"),
)
_section(
    "pretrain",
    ("pretrain", "any", None, "RETURNN's pretraining: True, 'default' or a dict {construction_algo, "
     "repetitions, copy_param_mode, copy_output_layer, output_layers, input_layers}; epochs 1..N train "
     "growing networks", "off"),
    ("pretrain_construction_algo", "any", None, "pretrain's construction_algo unless its dict sets one: "
     "'from_output' | 'from_input' | 'no_network_modifications' | a function (idx, net_dict)", "from_output"),
    ("pretrain_repetitions", "any", None, "pretrain's repetitions unless its dict sets them: epochs per "
     "network (int, list or dict)", "1"),
    ("pretrain_copy_output_layer", "any", None, "pretrain's copy_output_layer unless its dict sets it",
     "copy_param_mode, else 'ifpossible'"),
    ("pretrain_greedy", "bool", None, "pretrain's greedy; only False (RETURNN's TF engine has no greedy "
     "pretraining)", "False"),
    ("pretrain_learning_rate", "float", None, "the learning rate of the pretraining epochs (without "
     "use_learning_rate_control_always)", "learning_rate"),
    ("use_learning_rate_control_always", "bool", False, "pretraining epochs take their learning rate from "
     "learning_rate_control (and '#config' may set it), not pretrain_learning_rate"),
)
_section(
    "tf_threads",
    ("intra_op_threads", "int", None, "TensorFlow threads one op may use, per rank (0: TensorFlow's default; "
     "TF_NUM_INTRAOP_THREADS wins)", "from the rank's cores"),
    ("inter_op_threads", "int", None, "TensorFlow ops run at once, per rank (0: TensorFlow's default; "
     "TF_NUM_INTEROP_THREADS wins)", "from the rank's cores"),
    ("tf_session_opts", "dict", None, "RETURNN's session options: intra_op_parallelism_threads and "
     "inter_op_parallelism_threads as the two keys above, device_count {'GPU': 0} as device = 'cpu'; "
     "other entries have no effect"),
)
_section(
    "training",
    ("num_epochs", "int", 5, "epochs to train"),
    ("optimizer", "any", None, "adam | sgd | momentum | rmsprop | nadam, or a dict with 'class'",
     "plain gradient descent (sgd), RETURNN's default"),
    ("adam", "bool", False, "legacy flag: the adam optimizer (instead of 'optimizer')"),
    ("nadam", "bool", False, "legacy flag: the nadam optimizer (instead of 'optimizer')"),
    ("rmsprop", "any", False, "legacy flag: rmsprop (True, or its decay as a float; instead of 'optimizer')"),
    ("momentum", "float", 0.0, "legacy flag: momentum SGD with this momentum; rmsprop's momentum"),
    ("optimizer_epsilon", "float", 1e-16, "epsilon of adam, nadam and rmsprop unless their dict gives one"),
    ("learning_rate", "float", 1.0, "initial learning rate"),
    ("learning_rates", "any", None, "per-epoch learning rates (list, or dict epoch -> rate)"),
    ("gradient_clip_global_norm", "float", 0.0, "scale gradients to at most this global norm (0: off)"),
    ("gradient_clip", "float", 0.0, "clip every gradient value to [-c, c] (0: off)"),
    ("gradient_clip_norm", "float", 0.0, "scale each gradient tensor to at most this norm (0: off)"),
    ("gradient_noise", "float", 0.0,
     "add Gaussian noise with this stddev (truncated at 2x) to gradients (0: off)"),
    ("maximize_grad_norm", "float", 0.0, "add the gradient of -f * ||gradients|| (0: off)"),
    ("accum_grad_multiple_step", "int", 1,
     "sum the gradients of N batches, reduce and update once (normalised like their union batch)"),
    ("decouple_constraints", "bool", False,
     "layers' L2 as weight decay w -= 2 * L2 * w before each update, not as a loss term"),
    ("learning_rate_control", "str", "constant",
     "constant | newbob | newbob_rel | newbob_abs | newbob_multi_epoch"),
    ("debug_add_check_numerics_ops", "bool", False, "stop training at the first Inf or NaN of an op (slow)"),
    ("stop_on_nonfinite_train_score", "bool", True,
     "stop training (exit 3, nothing saved) at the first update whose loss, gradient or resulting parameters "
     "are Inf/NaN; False: apply every update and train on, as RETURNN"),
    ("newbob_learning_rate_decay", "float", 0.5, "newbob: multiply the rate by this"),
    ("newbob_learning_rate_growth", "float", 1.0, "newbob: multiply the rate by this when it is not decayed"),
    ("newbob_relative_error_threshold", "float", -0.01,
     "newbob_rel: decay when the relative change is above"),
    ("newbob_relative_error_grow_threshold", "float", None, "newbob_multi_epoch: grow when the mean relative "
     "change is below", "newbob_relative_error_threshold"),
    ("newbob_relative_error_div_by_old", "bool", False,
     "relative change (new - old) / |old| instead of / |new|"),
    ("newbob_error_threshold", "float", -0.01, "newbob_abs: decay when the absolute change is above"),
    ("newbob_multi_num_epochs", "int", 5,
     "newbob_multi_epoch: average the relative change over this many epochs"),
    ("newbob_multi_update_interval", "int", None, "newbob_multi_epoch: decide every N epochs",
     "newbob_multi_num_epochs"),
    ("learning_rate_control_relative_error_relative_lr", "bool", False,
     "divide the relative change by (rate / initial rate)"),
    ("learning_rate_control_min_num_epochs_per_new_lr", "int", 0,
     "keep a new rate at least this many epochs"),
    ("min_learning_rate", "float", 0.0, "newbob never goes below this"),
    ("learning_rate_control_error_measure", "any", None, "the score newbob compares (a key or list of keys)",
     "dev_score"),
    ("learning_rate_file", "str", None, "per-epoch history of learning rates and scores",
     "<model>.learning_rates"),
)
_section(
    "checkpoints",
    ("model", "str", None, "checkpoint prefix; epoch N is saved as <model>.<NNN>"),
    ("save_interval", "int", 1, "save every N epochs (and at the end)"),
    ("checkpoint_interval", "any", "30 min",
     "checkpoints within an epoch: N or 'N steps', 'M min', 'H h'; 0: none (resume: next batch)"),
    ("cleanup_old_models", "any", False, "delete old checkpoints: True, or {keep_last_n, keep_best_n, keep}"),
    ("start_epoch", "any", "auto", "auto: resume after the newest checkpoint; or an epoch >= 1"),
    ("move_old_checkpoints", "bool", False,
     "a start that does not continue the newest files moves an earlier run's later ones aside, not refuses"),
    ("load", "str", None, "checkpoint to load, this engine's or RETURNN's TensorFlow one (initialisation for "
     "train; the model for eval/forward)"),
    ("import_model_train_epoch1", "str", None,
     "train: initial parameters when starting at epoch 1 (wins over load); this engine's or RETURNN's "
     "checkpoint"),
    ("preload_from_files", "dict", None, "{name: {filename, prefix, init_for_train, ignore_missing, "
     "ignore_params, ignore_params_prefixes, var_name_mapping}}: parameters from other checkpoints"),
    ("load_epoch", "int", None, "eval/forward: load <model>.<load_epoch>", "the newest"),
)
_section(
    "log",
    ("log", "list", [], "log file(s); per rank <name>.horovod-<rank>-<size><ext> under MPI", ""),
    ("log_verbosity", "int", 3, "0..5; 5 prints every step"),
    ("log_all_ranks", "bool", False, "print progress of every rank on stdout, prefixed with the rank"),
    ("debug", "bool", False, "show tracebacks for errors (also for config errors)"),
)
_section(
    "monitoring",
    ("tensorboard", "bool", True, "TensorBoard curves, written by rank 0 (docs/monitoring.md)"),
    ("tensorboard_dir", "str", None, "where the TensorBoard curves go", "<model dir>/tensorboard"),
    ("tensorboard_step_interval", "int", 100, "write the per-step curves (train/*) every N steps"),
    ("progress_interval", "float", 60.0, "seconds between progress lines when stdout is not a terminal"),
    ("timeline_file", "str", None, "Chrome-trace step timeline of every rank (a .json file)",
     "$ENGINE_TIMELINE, else off"),
    ("store_tf_profile", "bool", False,
     "TensorFlow's profile of every train epoch's steps, per rank, under tf_log_dir (tools/profile_ops.py)"),
    ("tf_log_dir", "str", None, "where store_tf_profile writes", "the model's directory"),
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
    ("distributed_backend", "str", "auto", "auto | horovod | mpi | tf"),
    ("distributed_tf_gpu_reduction", "str", "nccl",
     "the tf backend on GPUs: nccl | ring (ranks that share a GPU, which NCCL refuses)"),
    ("distributed_param_sync_overlap", "bool", False,
     "param mode: each average runs in the background while training goes on, and is applied as "
     "params += average(snapshot) - snapshot where the next one starts (docs/multi-node.md)"),
    ("distributed_wire_format", "str", None,
     "fp16 | bf16: float32 gradients (grad mode) or the parameters' change since the last average (param "
     "mode) are cast to this dtype, summed in it over the ranks and cast back: half the bytes on the wire, "
     "rounded sums", "float32"),
    ("distributed_bucket_mb", "float", 25.0,
     "grad mode: MB per gradient bucket, reduced while the backward pass still runs (0: one reduction "
     "after it)"),
    ("distributed_stall_warning", "float", 60.0,
     "seconds a rank may wait in a collective before a warning names the ranks it waits for (0: none)"),
    ("distributed_stall_timeout", "float", 300.0,
     "seconds a rank may wait in a collective before the job ends, naming those ranks (0: wait forever)"),
    ("distributed_checkpoint_timeout", "float", 1800.0,
     "distributed_stall_timeout while a checkpoint is saved (the ranks wait for rank 0 to write it; "
     "0: wait forever)"),
)

KEYS: dict[str, Key] = {key.name: key for key in _KEYS}
if len(KEYS) != len(_KEYS):
    raise AssertionError("engine/config/keys.py: a key is listed twice")


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
