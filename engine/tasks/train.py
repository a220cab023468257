"""``task = "train"``: the epoch loop with dev eval, learning-rate control and checkpoints (mid-epoch ones,
resuming and stopping on request: ``engine/training/checkpoints/policy.py``)."""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from engine.config.loader import Config
from engine.datasets import BatchOptions, data_dims, dataset_from_config
from engine.distributed import Strategy, agree_on_failure, broadcast_initial, start
from engine.model import build_model
from engine.model.pretrain import pretrain_from_config
from engine.report.clock import hms
from engine.runtime import log
from engine.runtime.device import select_device
from engine.runtime.errors import ConfigError, EngineError
from engine.training.checkpoints import stop_requests
from engine.training.checkpoints.cleanup import CleanupPolicy, cleanup_old_models
from engine.training.checkpoints.initial_params import init_for_training
from engine.training.checkpoints.policy import Checkpointer
from engine.training.checkpoints.resume import ResumePoint, choose_resume_point
from engine.training.checkpoints.returnn_format import ReturnnView
from engine.training.epoch_end import check_train_score
from engine.training.loop import evaluate, train_epoch
from engine.training.monitor import RunMonitor
from engine.training.pretrain_switch import PretrainRun, carry_parameters
from engine.training.report import layer_lines
from engine.training.step import Steps
from engine.training.update.lr_control import LearningRateControl
from engine.training.update.lr_history import learning_rate_file
from engine.training.update.updater import Updater


class Trainer:
    def __init__(self, config: Config, strategy: Strategy) -> None:
        self.config, self.strategy = config, strategy
        self.comm = strategy.comm
        select_device(config)
        self.train_data = dataset_from_config(config, "train", random_seed_offset=strategy.random_seed_offset)
        if self.train_data is None:
            raise ConfigError("Config key 'train' is missing: task 'train' needs a train dataset.")
        if (getattr(strategy, "distribution", None) == "random_seed_offset" and self.comm.rank == 0
                and self.train_data.fixed_random_seed is not None):
            log.warning(f"horovod_dataset_distribution = 'random_seed_offset', but the train dataset sets "
                        f"fixed_random_seed = {self.train_data.fixed_random_seed}, which ignores the ranks' "
                        "seed offsets (as in RETURNN): every rank reads the same data in the same order.")
        self.dev_data = dataset_from_config(config, "dev")
        self.train_batching = BatchOptions.from_config(config, train=True)
        eval_batching = BatchOptions.from_config(config, train=False)
        # RETURNN scores `dev` within training with the training's max_seq_length (its sequences that are
        # longer are skipped, as in training); task eval and forward use every sequence.
        self.eval_batching = dataclasses.replace(eval_batching,
                                                 max_seq_length=self.train_batching.max_seq_length)
        self.dims = data_dims(config, self.train_data)
        schedule = pretrain_from_config(config)
        self.pretrain = PretrainRun(config, schedule) if schedule is not None else None
        if schedule is not None:
            log.info(schedule.describe())
        self._build(1)  # resuming, load_on_main and broadcast_state build the checkpoint's network instead
        self.lr_control = LearningRateControl.from_config(config)
        self.lr_control.resolve_layer_keys(self.model.score_layers())
        self.monitor = RunMonitor(config, self.comm, self.lr_control)
        # traced after the monitor exists: its timeline wraps the collectives the graph is built with
        self.steps.trace("train")
        self.checkpoints = Checkpointer(config, strategy, self.model, self.updater, self.lr_control)
        self.num_epochs = config.int("num_epochs")
        self.save_interval = config.int("save_interval")
        if self.save_interval < 1:
            raise ConfigError("Config key 'save_interval' must be >= 1 (save every N epochs), "
                              f"got {self.save_interval}.")
        self.cleanup = CleanupPolicy.from_config(config)
        self.lr_file = learning_rate_file(config)
        self.resume: ResumePoint | None = None  # rank 0 decides in load_on_main, broadcast_state tells all
        self.start_epoch = 0
        self.global_step = 0

    def _build(self, epoch: int) -> None:
        """The model (epoch ``epoch``'s network when pretraining), a fresh updater and the compiled steps."""
        config = self.pretrain.epoch_config(epoch) if self.pretrain is not None else self.config
        dims = self.dims
        self.model = build_model(config, input_dim=dims.input_dim, input_sparse=dims.input_sparse,
                                 target_dims=dims.target_dims)
        self.updater = Updater.from_config(config, self.model.named_trainable_variables(),
                                           l2=self.model.l2_factors(), parts=self.model.returnn_parts())
        self.steps = Steps(self.model, self.updater, self.strategy,
                           check_numerics=config.bool("debug_add_check_numerics_ops"),
                           accum_steps=config.int("accum_grad_multiple_step"),
                           stop_on_nonfinite=config.bool("stop_on_nonfinite_train_score"))
        if hasattr(self, "monitor"):  # a network switch (the first build is traced in __init__)
            self.steps.trace("train")
        if self.pretrain is not None:  # #config may change the batching
            self.pretrain.built = self.pretrain.schedule.net_dict(epoch)
            ReturnnView(self.model)  # the copy rule works on RETURNN's names: refused now if there are none
            self.train_batching = BatchOptions.from_config(config, train=True)
            self.eval_batching = dataclasses.replace(BatchOptions.from_config(config, train=False),
                                                     max_seq_length=self.train_batching.max_seq_length)
        if hasattr(self, "checkpoints"):
            self.checkpoints.model, self.checkpoints.updater = self.model, self.updater

    def _build_for_checkpoint(self) -> None:
        """Pretraining: the network the resume point's checkpoint holds (that of its epoch)."""
        if self.pretrain is None:
            return
        point = self.resume
        epoch = point.start_epoch - 1 if point.path is not None and not point.mid_epoch else point.start_epoch
        epoch = min(max(epoch, 1), self.pretrain.schedule.num_epochs)
        if self.pretrain.needs_build(epoch):
            self._build(epoch)

    def _switch_network(self, epoch: int) -> None:
        """Pretraining: epoch ``epoch`` trains another network; it takes the old one's parameters as RETURNN
        carries them, every rank the same (then rank 0's are broadcast, as RETURNN does after a new init)."""
        schedule, old = self.pretrain.schedule, self.model
        self._build(epoch)
        mode = schedule.copy_mode(epoch)
        carried, notes = carry_parameters(old, self.model, mode, schedule.copy_output_layer)
        added = [name for name in self.model.specs if name not in old.specs]
        resized = sum(note.endswith(")") and ": subset " in note for note in notes)
        log.info(f"pretraining: epoch {epoch} trains a new network ({len(self.model.specs)} layers"
                 + (f"; new: {', '.join(added)}" if added else "") + f"); copy_param_mode {mode!r} carried "
                 f"{len(carried)} parameter(s) over ({resized} into a larger or smaller shape); the "
                 "optimizer starts afresh")
        for note in notes:
            log.debug(f"pretraining: {note}")
        # before rank 0's values are broadcast: every rank computed the same (log_all_ranks shows each)
        total = sum(float(np.sum(v.numpy(), dtype=np.float64)) for v in self.model.variables)
        log.info(f"pretraining: epoch {epoch} starts with parameter sum {total:.12g}")
        broadcast_initial(self.comm, list(self.model.variables) + self.updater.variables)
        self.strategy.parameters_agreed(self.steps.params)

    def load_on_main(self) -> None:
        """Rank 0 decides where training starts (``choose_resume_point``: it may refuse, or fall back past
        a damaged checkpoint) and loads that checkpoint (or ``load``) and the learning-rate history."""
        if self.comm.rank != 0:
            return
        self.resume, stored = choose_resume_point(self.config, self.lr_file)
        self.start_epoch = self.resume.start_epoch
        self._build_for_checkpoint()
        if self.start_epoch <= self.num_epochs:
            if stored is not None:
                self.checkpoints.load(self.resume, stored)
            elif source := init_for_training(self.config, self.model):  # preload_from_files, load, ...
                log.info(f"initialised the parameters from {source}")
            if self.lr_file and os.path.exists(self.lr_file):
                try:
                    self.lr_control.load(self.lr_file)
                except ConfigError as exc:
                    if stored is None:
                        raise
                    # Damaged or mis-edited: either way not overwritten unasked, but the way out is known.
                    hint = (f"If the file was damaged rather than edited, remove it: the resume then takes "
                            f"the history stored in {self.resume.path}.")
                    raise ConfigError(f"{exc} {hint}") from None

    def broadcast_state(self) -> None:
        """Rank 0's decision where to start, and its parameters and optimizer state (initial or loaded), to
        every rank before step 1; then each rank's own part of a checkpoint (param mode, mid-epoch
        position)."""
        self.resume = self.comm.broadcast_object(self.resume, root=0)
        self.start_epoch = self.resume.start_epoch
        if self.comm.rank != 0:
            self._build_for_checkpoint()
        broadcast_initial(self.comm, list(self.model.variables) + self.updater.variables)
        self.strategy.parameters_agreed(self.steps.params)  # before any rank's own state is restored
        self.global_step = self.checkpoints.restore_rank_states(self.resume)

    def run(self) -> None:
        if self.start_epoch > self.num_epochs:
            log.info(f"model already trained for {self.start_epoch - 1} epochs (num_epochs = "
                     f"{self.num_epochs}); nothing to do")
            return
        for epoch in range(self.start_epoch, self.num_epochs + 1):
            if self.pretrain is not None and self.pretrain.needs_build(epoch):
                self._switch_network(epoch)
            lr = self._learning_rate(epoch) if self.comm.rank == 0 else None
            lr = self.comm.broadcast_object(lr, root=0) * self.strategy.lr_scale
            self.updater.set_learning_rate(lr)
            log.debug(f"epoch {epoch}: learning rate {lr:g}")
            self.checkpoints.begin_epoch(epoch, self.global_step)
            report = train_epoch(self.steps, self.train_data, epoch, self.train_batching, self.strategy,
                                 self.monitor, self.checkpoints)
            self.global_step += report.steps
            scores = {"train_score": report.scores.score, "train_error": report.scores.error}
            log.info(f"epoch {epoch} score: {report.scores.score:.6f} error: {report.scores.error:.6f} "
                     f"elapsed: {hms(report.elapsed)}")
            check_train_score(epoch, report.scores.score, report.scores.count, self.steps.stop_on_nonfinite,
                              self.comm.rank)
            if self.dev_data is not None:
                dev = evaluate(self.steps, self.dev_data, epoch, "dev", self.eval_batching, self.comm)
                scores.update(dev_score=dev.scores.score, dev_error=dev.scores.error)
                for layer, layer_scores in dev.layer_scores.items():  # RETURNN's dev_score_<layer>
                    scores.update({f"dev_score_{layer}": layer_scores.score,
                                   f"dev_error_{layer}": layer_scores.error})
                log.info(f"dev: score {dev.scores.score:.6f} error {dev.scores.error:.6f}")
                for line in layer_lines("dev", dev.layer_scores):
                    log.info(line)
            self.lr_control.set_epoch_scores(epoch, scores)
            saved = self._save(epoch)
            self.monitor.epoch_done(epoch, report, scores)
            self.checkpoints.stop_if_requested(epoch, self.global_step, saved)
        log.info(f"finished training after epoch {self.num_epochs}")

    def _learning_rate(self, epoch: int) -> float:
        if self.pretrain is not None:
            return self.pretrain.learning_rate(epoch, self.lr_control)
        return self.lr_control.learning_rate_for_epoch(epoch)

    def _save(self, epoch: int) -> str | None:
        """The learning-rate file (rank 0) and, when due, the epoch's checkpoint (every rank takes part)."""
        if self.lr_file and self.comm.rank == 0:
            self.lr_control.save(self.lr_file)
        saved = None
        if epoch % self.save_interval == 0 or epoch == self.num_epochs:
            saved = self.checkpoints.save_epoch(epoch, self.global_step)
        if self.checkpoints.prefix and self.cleanup is not None and self.comm.rank == 0:
            cleanup_old_models(self.checkpoints.prefix, self.num_epochs, self.lr_control, self.cleanup)
        return saved


def run_train(config: Config) -> None:
    """SIGUSR1, SIGUSR2 and SIGTERM stop the training at the next step boundary, after a checkpoint."""
    with stop_requests.installed():
        _train(config)


def _train(config: Config) -> None:
    strategy = start(config)
    trainer, error = None, None
    try:
        trainer = Trainer(config, strategy)
        trainer.load_on_main()
    except EngineError as exc:  # e.g. a missing corpus: reported once, not by every rank
        error = exc
    agree_on_failure(strategy.comm, error)
    trainer.broadcast_state()
    with trainer.monitor.running(trainer.global_step, range(trainer.start_epoch, trainer.num_epochs + 1)):
        trainer.run()
