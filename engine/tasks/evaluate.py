"""``task = "eval"``: score a saved model on the ``dev`` and ``eval`` datasets, sharded over the ranks."""
from __future__ import annotations

from engine import log
from engine.config import Config
from engine.distributed.protocol import broadcast_initial
from engine.errors import ConfigError, EngineError
from engine.model import build_model
from engine.tasks.prepare import checkpoint_to_load, data_dims, init_device, init_ranks, load_dataset
from engine.training.checkpoint import load_checkpoint
from engine.training.loop import BatchOptions, agree_on_failure, evaluate
from engine.training.step import Steps

DEFAULT_EVAL_BATCH_SIZE = 5000


def eval_batch_options(config: Config) -> BatchOptions:
    return BatchOptions(config.int("batch_size", DEFAULT_EVAL_BATCH_SIZE), config.int("max_seqs", -1))


def load_model_for_inference(config: Config, ranks, dataset):
    """Build the model for ``dataset``'s dims and load the checkpoint on rank 0; returns (model, epoch)."""
    init_device(config)
    dims = data_dims(config, dataset)
    model = build_model(config, input_dim=dims.input_dim, input_sparse=dims.input_sparse,
                        target_dims=dims.target_dims)
    path, epoch = checkpoint_to_load(config, ranks)
    if ranks.is_main:
        load_checkpoint(path, model.named_variables())
        log.info(f"loaded model from {path}")
    return model, epoch


def run_eval(config: Config) -> None:
    ranks = init_ranks(config)
    datasets, model, epoch, error = {}, None, 0, None
    try:
        datasets = {k: ds for k in ("dev", "eval") if (ds := load_dataset(config, k, ranks)) is not None}
        if not datasets:
            raise ConfigError("Task 'eval' needs a 'dev' or 'eval' dataset in the config.")
        model, epoch = load_model_for_inference(config, ranks, next(iter(datasets.values())))
    except EngineError as exc:
        error = exc
    agree_on_failure(ranks.comm, error)
    broadcast_initial(ranks.comm, list(model.variables))
    steps = Steps(model, None, ranks.comm, reduce_gradients=False, average_gradients=False)
    for name, dataset in datasets.items():
        report = evaluate(steps, dataset, max(epoch, 1), name, eval_batch_options(config), ranks.comm)
        log.info(f"{name}: score {report.scores.score:.6f} error {report.scores.error:.6f}")
