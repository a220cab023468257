"""``task = "train"``: the epoch loop with dev eval, learning-rate control and checkpoints."""
from __future__ import annotations

import os

from engine import log
from engine.config import Config
from engine.distributed.protocol import ParamSyncSchedule, broadcast_initial
from engine.errors import ConfigError, EngineError
from engine.model import build_model
from engine.tasks.prepare import Ranks, data_dims, init_device, init_ranks, load_dataset
from engine.training.checkpoint import checkpoint_path, find_newest_epoch, load_checkpoint, save_checkpoint
from engine.training.loop import BatchOptions, DataParallel, agree_on_failure, evaluate, train_epoch
from engine.training.lr_control import LearningRateControl
from engine.training.report import hms
from engine.training.step import Steps
from engine.training.updater import Updater


def batch_options(config: Config) -> BatchOptions:
    if not config.has("batch_size"):
        raise ConfigError("Config key 'batch_size' is required for training: the maximum number of padded "
                          "frames (max_len * num_seqs) per batch and rank, e.g. batch_size = 5000.")
    max_seq_length = config.typed("max_seq_length", 0)
    return BatchOptions(config.int("batch_size"), config.int("max_seqs", -1), max_seq_length)


def resolve_start_epoch(config: Config, model_prefix: str | None, ranks: Ranks) -> int:
    """``start_epoch = "auto"``: one after rank 0's newest checkpoint; every rank gets rank 0's answer."""
    start = config.value("start_epoch", "auto")
    if start in ("auto", None):
        newest = find_newest_epoch(model_prefix) if (model_prefix and ranks.is_main) else None
        start = (newest or 0) + 1
    else:
        start = config.int("start_epoch")
        if start < 1:
            raise ConfigError(f"Config key 'start_epoch' must be 'auto' or >= 1, got {start}.")
    return ranks.comm.broadcast_object(start, root=0)


class Trainer:
    def __init__(self, config: Config, ranks: Ranks) -> None:
        self.config, self.ranks, comm, ctx = config, ranks, ranks.comm, ranks.ctx
        init_device(config)
        self.train_data = load_dataset(config, "train", ranks, train=True)
        if self.train_data is None:
            raise ConfigError("Config key 'train' is missing: task 'train' needs a train dataset.")
        self.dev_data = load_dataset(config, "dev", ranks)
        self.opts = batch_options(config)
        dims = data_dims(config, self.train_data)
        self.model = build_model(config, input_dim=dims.input_dim, input_sparse=dims.input_sparse,
                                 target_dims=dims.target_dims)
        self.lr_scale = comm.size if (ctx and ctx.scale_lr) else 1
        self.updater = Updater.from_config(config, self.model.named_trainable_variables())
        self.steps = Steps(self.model, self.updater, comm,
                           reduce_gradients=bool(ctx) and ctx.reduce_type == "grad",
                           average_gradients=bool(ctx) and ctx.avg_grad)
        self.dp = DataParallel(comm, ctx.reduce_type if ctx else "grad",
                               ctx.dataset_distribution if ctx else "shard",
                               ParamSyncSchedule(ctx) if ctx else None)
        self.lr_control = LearningRateControl.from_config(config)
        self.model_prefix = config.str("model")
        self.num_epochs = config.int("num_epochs", 5)
        self.save_interval = config.int("save_interval", 1)
        self.lr_file = config.str("learning_rate_file")
        self.start_epoch = resolve_start_epoch(config, self.model_prefix, ranks)
        self.global_step = 0

    def load_on_main(self) -> None:
        """Rank 0 loads the checkpoint to resume from (or ``load``) and the learning-rate history."""
        if self.ranks.is_main and self.start_epoch <= self.num_epochs:
            if self.start_epoch > 1:
                if not self.model_prefix:
                    raise ConfigError(f"start_epoch is {self.start_epoch}, but no 'model' prefix is set to "
                                      "load the previous epoch's checkpoint from.")
                path = checkpoint_path(self.model_prefix, self.start_epoch - 1)
                info = load_checkpoint(path, self.model.named_variables(), self.updater.named_variables())
                self.global_step = info.global_step
                log.info(f"resuming after epoch {info.epoch} from {path}")
            elif self.config.str("load"):
                load_checkpoint(self.config.str("load"), self.model.named_variables())
                log.info(f"initialised the parameters from {self.config.str('load')}")
            if self.lr_file and os.path.exists(self.lr_file):
                self.lr_control.load(self.lr_file)

    def broadcast_state(self) -> None:
        """Rank 0's parameters and optimizer state (initial or loaded) to every rank, before step 1."""
        broadcast_initial(self.ranks.comm, list(self.model.variables) + self.updater.variables)

    def run(self) -> None:
        comm, is_main = self.ranks.comm, self.ranks.is_main
        if self.start_epoch > self.num_epochs:
            log.info(f"model already trained for {self.start_epoch - 1} epochs (num_epochs = "
                     f"{self.num_epochs}); nothing to do")
            return
        for epoch in range(self.start_epoch, self.num_epochs + 1):
            lr = comm.broadcast_object(self.lr_control.learning_rate_for_epoch(epoch) if is_main else None, root=0)
            self.updater.set_learning_rate(lr * self.lr_scale)
            log.debug(f"epoch {epoch}: learning rate {lr * self.lr_scale:g}")
            report = train_epoch(self.steps, self.train_data, epoch, self.opts, self.dp)
            self.global_step += report.steps
            scores = {"train_score": report.scores.score, "train_error": report.scores.error}
            line = f"epoch {epoch} score: {report.scores.score:.6f} error: {report.scores.error:.6f} " \
                   f"elapsed: {hms(report.elapsed)}"
            log.info(line)
            if self.dev_data is not None:
                dev = evaluate(self.steps, self.dev_data, epoch, "dev", self.opts, comm)
                scores.update(dev_score=dev.scores.score, dev_error=dev.scores.error)
                log.info(f"dev: score {dev.scores.score:.6f} error {dev.scores.error:.6f}")
            self.lr_control.set_epoch_scores(epoch, scores)
            if is_main:
                self._save(epoch)
        log.info(f"finished training after epoch {self.num_epochs}")

    def _save(self, epoch: int) -> None:
        if self.lr_file:
            self.lr_control.save(self.lr_file)
        if self.model_prefix and (epoch % self.save_interval == 0 or epoch == self.num_epochs):
            path = checkpoint_path(self.model_prefix, epoch)
            save_checkpoint(path, self.model.named_variables(), self.updater.named_variables(),
                            epoch, self.global_step)
            log.info(f"saved model to {path}")


def run_train(config: Config) -> None:
    ranks = init_ranks(config)
    trainer, error = None, None
    try:
        trainer = Trainer(config, ranks)
        trainer.load_on_main()
    except EngineError as exc:  # e.g. a missing corpus: reported once, not by every rank
        error = exc
    agree_on_failure(ranks.comm, error)
    trainer.broadcast_state()
    trainer.run()
