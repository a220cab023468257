"""``task = "eval"``: score a saved model on the ``dev`` and ``eval`` datasets, sharded over the ranks."""
from __future__ import annotations

from engine.config.loader import Config
from engine.datasets import BatchOptions, Dataset, data_dims, dataset_from_config
from engine.distributed import Communicator, agree_on_failure, broadcast_initial, start
from engine.model import SeqModel, build_model
from engine.model.pretrain import pretrain_from_config
from engine.runtime import log
from engine.runtime.device import select_device
from engine.runtime.errors import ConfigError, EngineError
from engine.training.checkpoints.file_format import checkpoint_to_load
from engine.training.checkpoints.initial_params import load_for_inference
from engine.training.loop import evaluate
from engine.training.pretrain_switch import PretrainRun
from engine.training.report import layer_lines
from engine.training.step import Steps


def load_model_for_inference(config: Config, comm: Communicator, dataset: Dataset) -> tuple[SeqModel, int]:
    """Build the model for ``dataset``'s dims and load the checkpoint on rank 0; returns (model, epoch)."""
    select_device(config)
    dims = data_dims(config, dataset)
    path, epoch = checkpoint_to_load(config, comm)
    schedule = pretrain_from_config(config)  # pretraining: the network of the checkpoint's epoch
    if schedule is not None:  # ('load', epoch 0: the full network, as RETURNN takes it then)
        config = PretrainRun(config, schedule).epoch_config(epoch or schedule.num_epochs)
    model = build_model(config, input_dim=dims.input_dim, input_sparse=dims.input_sparse,
                        target_dims=dims.target_dims)
    if comm.rank == 0:
        load_for_inference(config, model, path, "load" if config.str("load") else "model")
        log.info(f"loaded model from {path}")
    return model, epoch


def run_eval(config: Config) -> None:
    comm = start(config).comm
    datasets, model, epoch, error = {}, None, 0, None
    try:
        datasets = {k: ds for k in ("dev", "eval") if (ds := dataset_from_config(config, k)) is not None}
        if not datasets:
            raise ConfigError("Task 'eval' needs a 'dev' or 'eval' dataset in the config.")
        model, epoch = load_model_for_inference(config, comm, next(iter(datasets.values())))
        batching = BatchOptions.from_config(config, train=False)
        steps = Steps(model)
        steps.trace("eval")
    except EngineError as exc:
        error = exc
    agree_on_failure(comm, error)
    broadcast_initial(comm, list(model.variables))
    for name, dataset in datasets.items():
        report = evaluate(steps, dataset, max(epoch, 1), name, batching, comm)
        log.info(f"{name}: score {report.scores.score:.6f} error {report.scores.error:.6f}")
        for line in layer_lines(name, report.layer_scores):
            log.info(line)
