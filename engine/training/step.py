"""The compiled steps: train, eval and forward.

Each is one ``tf.function`` with an input signature of unknown batch and time, so batches of any shape
run the same graph. Between the gradients and the update, the train step hands the gradients and the
step's score sums to the strategy (``engine.distributed.strategy``), which reduces them over the ranks
or not: the step itself never knows the data-parallel mode. The updater then post-processes the reduced
gradients (``gradients.py``) and updates. Random numbers (dropout, gradient noise) are stateless, keyed by
(``random_seed``, the global step) and for dropout the rank, so a resumed run draws the same ones.

With ``accum_grad_multiple_step`` k > 1 a batch only adds its gradient of the objective (and its score
sums) to per-variable accumulators; after k batches one reduction and one update use the accumulated
sum, as RETURNN's ``accum_grad_multiple_step`` does (in ``global_frames`` mode the strategy divides it by
all ranks' frames of the group). Each batch's gradient holds the constraints (L2), as in RETURNN. An
incomplete group at the epoch's end makes no update, as in RETURNN's PyTorch engine.
"""
from __future__ import annotations

import contextlib
import re
from typing import Iterator

import numpy as np
import tensorflow as tf

from engine.distributed.protocol import SCORE_NAMES
from engine.distributed.strategy import Strategy
from engine.model.base import SeqModel
from engine.runtime import log
from engine.runtime.errors import ConfigError
from engine.training.compiled_step import CompiledStep
from engine.training.nonfinite import FINITE, NONFINITE_GRADIENT, NONFINITE_LOSS, NONFINITE_PARAMS
from engine.training.update.loss_scale import OVERFLOW, check_mode
from engine.training.update.updater import Updater

DROPOUT_STREAM = 0x64726F70  # keeps dropout's random numbers apart from other users of the step's seed


def fold_in(seed: tf.Tensor, data: int) -> tf.Tensor:
    return tf.random.experimental.stateless_fold_in(seed, data)


def _all_finite(tensors) -> tf.Tensor:
    return tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in tensors]))


def _dense(grads, params) -> list:
    """None (no gradient) as zeros: the fused collective needs a tensor for every variable."""
    return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, params)]


# the two ways TensorFlow says that an op (here: one inside a gradient) has no gradient of its own
_NO_SECOND_GRADIENT = re.compile(r"gradient registry has no entry for: (\w+)|No gradient defined for "
                                 r"operation\s*'[^']*' \(op type: (\w+)\)")


class Steps:
    def __init__(self, model: SeqModel, updater: Updater | None = None,
                 strategy: Strategy | None = None, check_numerics: bool = False,
                 accum_steps: int = 1, stop_on_nonfinite: bool = True) -> None:
        """``updater`` and ``strategy`` are needed for training only. ``check_numerics``: every op of the
        steps checks its output, and the first Inf or NaN stops training (RETURNN's
        ``debug_add_check_numerics_ops``). ``accum_steps``: ``accum_grad_multiple_step``.
        ``stop_on_nonfinite`` (``stop_on_nonfinite_train_score``): an update whose scores or processed
        gradients hold an Inf or NaN is not applied, and after each update the parameters are checked;
        ``nonfinite`` says what the last update found (the loop stops training on it). False: every
        update is applied as it comes, as in RETURNN."""
        self.model = model
        self.stop_on_nonfinite = stop_on_nonfinite
        self.nonfinite = FINITE  # what the last update found (FINITE ... NONFINITE_PARAMS)
        self.loss_scale = updater.loss_scale if updater is not None else None  # tf_amp = "float16"
        self.overflows = 0  # steps the loss scale skipped (float16's range overflowed)
        check_mode(self.loss_scale, strategy is not None and strategy.keeps_rank_state)
        self.updater = updater
        self.strategy = strategy
        self.rank = strategy.comm.rank if strategy is not None else 0
        if strategy is not None and strategy.differentiates_loss_sum and len(model.loss_targets) > 1:
            raise ConfigError("horovod_grad_normalization = 'global_frames' divides the summed gradient by "
                              "the frames of one target, but the network's losses use several targets "
                              f"({', '.join(sorted(model.loss_targets))}). Use 'sum' or 'average'.")
        normalized = getattr(model, "normalized_loss_layers", [])
        if strategy is not None and strategy.differentiates_loss_sum and normalized:
            raise ConfigError("horovod_grad_normalization = 'global_frames' divides the summed loss by all "
                              f"ranks' frames, but the loss of {normalized} sets use_normalized_loss, which "
                              "divides it by this rank's frames already. Use one of them.")
        if check_numerics:
            tf.debugging.enable_check_numerics()  # instruments what is traced from now on
        self.params = list(model.trainable_variables)
        # decouple_constraints: the updater decays the L2 parameters, so L2 leaves the differentiated loss
        self.decoupled_l2 = updater is not None and updater.decouples_l2
        if self.decoupled_l2:
            l2 = model.l2_factors()
            wanted = [2.0 * l2.get(name, 0.0) for name in model.named_trainable_variables()]
            if updater.decay != wanted:
                raise ValueError("Steps: the updater's decoupled L2 differs from the model's layer L2 (build "
                                 "it with Updater.from_config(config, variables, l2=model.l2_factors())).")
        if updater is not None and updater.gradient_options.clip_norm:
            parts = model.returnn_parts()
            if updater.parts != [parts.get(name) for name in model.named_trainable_variables()]:
                raise ValueError("Steps: gradient_clip_norm clips each of RETURNN's variables on its own, "
                                 "but the updater does not know how the model's variables split into them "
                                 "(build it with Updater.from_config(config, variables, "
                                 "parts=model.returnn_parts())).")
        # the streams read as the targets (not those the network computes: register_as_extern_data)
        computed = getattr(model, "computed_targets", set())
        self.target_keys = sorted((model.loss_targets - computed) | model.input_streams)
        # the loss layers besides the main one: an eval step gives their sums too (RETURNN's score_<layer>)
        self.other_score_layers = list(model.score_layers()[1:])
        # what the steps read; other streams of the dataset are not loaded
        self.batch_keys = ["data"] + [k for k in self.target_keys if k != "data"]
        data_spec, lengths_spec = model.input_signature
        targets_spec = {k: tf.TensorSpec([None, None], tf.int32, name=k) for k in self.target_keys}
        target_lengths_spec = {k: tf.TensorSpec([None], tf.int32, name=f"{k}_len") for k in self.target_keys}
        signature = [data_spec, lengths_spec, targets_spec, target_lengths_spec]
        self._train = CompiledStep(self._train_step, signature)
        self._eval = CompiledStep(self._eval_step, signature)
        self._forward = CompiledStep(self._forward_step, [data_spec, lengths_spec])
        # batch_norm: eval and forward steps store the running statistics they move, as RETURNN's steps do
        self._eval_options = {"update_running": True} if model.running_state() else {}
        # a decoder loop over the targets, or layers reading other streams ("data:delayed")
        self._reads_streams = getattr(model, "reads_streams", False)
        self._input_dtype = data_spec.dtype.as_numpy_dtype
        self.accum_steps = self._checked_accum_steps(accum_steps)
        self._pending = 0  # batches in the accumulators
        if self.accum_steps > 1:
            self._acc = [tf.Variable(tf.zeros_like(v), trainable=False, name="accumulated_grad")
                         for v in self.params]
            self._acc_scores = tf.Variable(tf.zeros([len(SCORE_NAMES)]), trainable=False,
                                           name="accumulated_scores")
            self._present: list[bool] | None = None  # which variables get a gradient; set when traced
            self._accumulate = CompiledStep(self._accumulate_step,
                                            signature + [tf.TensorSpec([], tf.int32, name="index")])
            self._apply = CompiledStep(self._apply_step, [])
            self._drop = CompiledStep(self._drop_step, [])

    def _checked_accum_steps(self, accum_steps) -> int:
        if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1:
            raise ConfigError(f"Config key 'accum_grad_multiple_step' must be an integer >= 1 (the batches "
                              f"whose gradients are summed into one update), got {accum_steps!r}.")
        if accum_steps == 1:
            return 1
        if self.updater is not None and self.updater.gradient_options.maximize_norm:
            raise ConfigError("accum_grad_multiple_step > 1 cannot be combined with maximize_grad_norm: the "
                              "norm term needs the second derivative of the whole group's loss, which "
                              "accumulation does not keep. Set one of them off.")
        if len(self.model.loss_targets) > 1:
            raise ConfigError("accum_grad_multiple_step > 1 divides the summed gradient by the frames of "
                              "one target, but the network's losses use several targets "
                              f"({', '.join(sorted(self.model.loss_targets))}).")
        if self.strategy is not None and self.strategy.keeps_rank_state:
            raise ConfigError("accum_grad_multiple_step > 1 is not supported with horovod_reduce_type = "
                              "'param' (each rank updates alone there, so accumulating would only make its "
                              "batches larger); use a larger batch_size, or reduce type 'grad'.")
        return accum_steps

    def trace(self, *steps: str) -> None:
        """Build the graphs of ``steps`` ("train", "eval", "forward") now: the errors found while building
        them then come with the model's (before any step, where all ranks agree on failure)."""
        for name in steps:
            if name == "train" and self.accum_steps > 1:
                self._accumulate.trace()
                self._apply.trace()
                self._drop.trace()
            else:
                getattr(self, f"_{name}").trace()

    # ----- graph functions -----
    def _scores(self, losses, lengths) -> tf.Tensor:
        """A step returns [loss sum, error sum, count, input frames] (``SCORE_NAMES``): sums, so ranks add
        up. The count divides the scores (ctc: target labels); the input frames are the rate's."""
        input_frames = tf.reduce_sum(tf.cast(lengths, tf.float32))
        return tf.stack([losses.loss, losses.error, losses.num_frames, input_frames])

    def _train_step(self, data, lengths, targets, target_lengths):
        seed = self.updater.step_seed()
        model_seed = fold_in(fold_in(seed, DROPOUT_STREAM), self.rank)  # each rank its own dropout masks
        maximize = self.updater.gradient_options.maximize_norm
        with tf.GradientTape() if maximize else contextlib.nullcontext() as outer:
            with tf.GradientTape() as tape:
                outputs = self.model(data, lengths, training=True, seed=model_seed,
                                     train_step=self._train_step_count(), stream_lengths=target_lengths,
                                     **self._streams(targets))
                losses = self.model.compute_losses(outputs, targets, target_lengths, training=True)
                differentiated = self._scaled(self._differentiated(losses))
            local = self._unscaled(tape.gradient(differentiated, self.params))
        present = [g is not None for g in local]  # a variable without a gradient is not updated
        scores = self._scores(losses, lengths)
        grads, scores = self.strategy.reduce_gradients(_dense(local, self.params), scores)
        extra = None
        if maximize:
            extra = [-maximize * g for g in self._grad_norm_gradient(outer, local, grads, scores)]
        grads = [g if p else None for g, p in zip(grads, present)]
        return scores, self._update(grads, scores, extra)

    def _scaled(self, differentiated: tf.Tensor) -> tf.Tensor:
        """With a loss scale (``tf_amp = "float16"``) the loss times the scale, inside the tape, so that small
        gradients survive float16's backward pass; ``_unscaled`` divides the gradients again (float32)."""
        return differentiated if self.loss_scale is None else self.loss_scale.scaled(differentiated)

    def _unscaled(self, grads: list) -> list:
        """The gradients of the loss itself (what is reduced and applied)."""
        return grads if self.loss_scale is None else self.loss_scale.unscaled(grads)

    def _update(self, grads, scores, extra=None) -> tf.Tensor:
        """With a loss scale (``tf_amp = "float16"``): finite scores with a non-finite reduced gradient are
        float16's overflow, expected under loss scaling: the update is skipped (``OVERFLOW``) and the scale
        halves; else the scale counts a good step and ``_checked_update`` goes on. The reduced gradients
        are the same on every rank, so every rank decides alike (``loss_scale.py``)."""
        if self.loss_scale is None:
            return self._checked_update(grads, scores, extra)
        present = [g for g in grads if g is not None]
        overflow = tf.logical_and(_all_finite([scores]), tf.logical_not(_all_finite(present or [scores])))
        self.loss_scale.update(tf.logical_not(overflow))
        return tf.cond(overflow, lambda: tf.constant(OVERFLOW),
                       lambda: self._checked_update(grads, scores, extra))

    def _checked_update(self, grads, scores, extra=None) -> tf.Tensor:
        """Apply the (reduced) gradients; returns what was found (``FINITE`` ... ``NONFINITE_PARAMS``). With
        ``stop_on_nonfinite``, an Inf or NaN in the scores or in the gradients as processed for the update
        (clipping, noise, maximize_grad_norm's term) leaves parameters and optimizer state as they were.
        In grad mode scores and gradients are the reduced ones, so every rank finds the same."""
        if not self.stop_on_nonfinite:
            self.updater.apply_gradients(grads, self.params, extra)
            return tf.constant(FINITE)
        processed = self.updater.processed_gradients(grads, self.params, extra)
        loss_finite = _all_finite([scores])
        grads_finite = _all_finite([g for g in processed if g is not None] or [scores])

        def apply() -> tf.Tensor:
            self.updater.apply_processed(processed)
            # read after the update: a tf.function orders the operations on one variable as written
            return tf.where(_all_finite([v.read_value() for v in self.params]), FINITE, NONFINITE_PARAMS)

        def skip() -> tf.Tensor:
            return tf.where(loss_finite, NONFINITE_GRADIENT, NONFINITE_LOSS)

        return tf.cond(tf.logical_and(loss_finite, grads_finite), apply, skip)

    def _accumulate_step(self, data, lengths, targets, target_lengths, index):
        seed = fold_in(fold_in(fold_in(self.updater.step_seed(), DROPOUT_STREAM), self.rank), index)
        with tf.GradientTape() as tape:
            outputs = self.model(data, lengths, training=True, seed=seed,
                                 train_step=self._train_step_count(index), stream_lengths=target_lengths,
                                 **self._streams(targets))
            losses = self.model.compute_losses(outputs, targets, target_lengths, training=True)
            differentiated = self._scaled(self._differentiated(losses))
        local = self._unscaled(tape.gradient(differentiated, self.params))
        self._present = [g is not None for g in local]
        for acc, grad in zip(self._acc, local):
            if grad is not None:
                acc.assign_add(tf.convert_to_tensor(grad))
        scores = self._scores(losses, lengths)
        self._acc_scores.assign_add(scores)
        return scores

    def _apply_step(self):
        grads = [acc.read_value() for acc in self._acc]
        scores = self._acc_scores.read_value()
        grads, reduced = self.strategy.reduce_gradients(grads, scores)
        grads = [g if p else None for g, p in zip(grads, self._present)]
        found = self._update(grads, reduced)
        # after the reads above: a tf.function orders the operations on one variable as written
        for acc in self._acc:
            acc.assign(tf.zeros_like(acc))
        self._acc_scores.assign(tf.zeros([len(SCORE_NAMES)]))
        return reduced, found

    def _drop_step(self):
        _, reduced = self.strategy.reduce_gradients([], self._acc_scores.read_value())
        for acc in self._acc:
            acc.assign(tf.zeros_like(acc))
        self._acc_scores.assign(tf.zeros([len(SCORE_NAMES)]))
        return reduced

    def _streams(self, targets) -> dict:
        """The target streams themselves, for a model whose decoder loop runs over them."""
        return {"streams": targets} if self._reads_streams else {}

    def _differentiated(self, losses):
        """RETURNN's objective (the loss sums: ``LossResult.objective``) plus the layers' constraints as
        RETURNN adds them: L2 and darc1 on every rank, so summing the ranks' gradients counts them once
        per rank, as RETURNN with Horovod does. In global_frames mode, where the strategy divides by all
        ranks' frames, the L2 terms enter on one rank only, so the result is one process's gradient on the
        union batch. With decouple_constraints the L2 terms are left out: the updater applies them as
        weight decay. The darc1 terms depend on each rank's batch: every rank adds its own."""
        regularizer = 0.0 if self.decoupled_l2 else losses.regularizer
        return losses.objective + regularizer * self.strategy.regularizer_share + losses.data_regularizer

    def _grad_norm_gradient(self, outer, local, grads, scores):
        """d||G||/dw for the reduced gradient G: each rank's Hessian-vector product with G/||G||, reduced
        like the gradients (so all ranks add the same term)."""
        norm = tf.linalg.global_norm(grads)
        unit = [tf.math.divide_no_nan(g, norm) for g in grads]
        connected = [i for i, g in enumerate(local) if g is not None]
        products = outer.gradient([local[i] for i in connected], self.params,
                                  output_gradients=[unit[i] for i in connected])
        return self.strategy.reduce_extra_gradients(_dense(products, self.params), scores)

    def _train_step_count(self, index=None) -> tf.Tensor | None:
        """RETURNN's ``global_train_step`` for this batch: the batches trained before it. RETURNN counts
        every batch, the updater its updates: with accumulation, updates * accum_steps + the batch's
        ``index`` in its group. None without an updater (forward, eval tasks)."""
        if self.updater is None:
            return None
        done = tf.convert_to_tensor(self.updater.iterations) * self.accum_steps
        return done if index is None else done + tf.cast(index, tf.int64)

    def _eval_step(self, data, lengths, targets, target_lengths):
        """``SCORE_NAMES``, then [loss sum, error sum, count] of each of ``other_score_layers``."""
        outputs = self.model(data, lengths, training=False, train_step=self._train_step_count(),
                             stream_lengths=target_lengths, **self._streams(targets), **self._eval_options)
        scores = self._scores(self.model.compute_losses(outputs, targets, target_lengths), lengths)
        if not self.other_score_layers:
            return scores
        sums = self.model.layer_loss_sums(outputs, targets, target_lengths)
        return tf.concat([scores] + [tf.stack([tf.cast(v, tf.float32) for v in sums[name]])
                                     for name in self.other_score_layers], axis=0)

    def _forward_step(self, data, lengths):
        outputs = self.model(data, lengths, training=False, train_step=self._train_step_count(),
                             **self._eval_options)
        if "output" not in outputs:  # a network trained on its loss layers alone: its refusal names it
            self.model.output_lengths(lengths)
        return outputs["output"], outputs.get("output:lengths", lengths)

    # ----- calls from the loop, with numpy batches -----
    def _data(self, batch):
        return (np.asarray(batch.data["data"], dtype=self._input_dtype),
                np.asarray(batch.lengths["data"], dtype=np.int32))

    def _inputs(self, batch):
        data, lengths = self._data(batch)
        targets = {k: np.asarray(batch.data[k], dtype=np.int32) for k in self.target_keys}
        target_lengths = {k: np.asarray(batch.lengths[k], dtype=np.int32) for k in self.target_keys}
        return data, lengths, targets, target_lengths

    def train(self, batch) -> np.ndarray:
        """One step: its score sums (reduced in grad mode); ``nonfinite`` says what its update found."""
        try:
            scores, found = self._train(*self._inputs(batch))
            self.nonfinite = self._found(int(found))
            return scores.numpy()
        except Exception as exc:  # tracing fails when an op's gradient has no gradient of its own
            missing = _NO_SECOND_GRADIENT.search(str(exc))
            if not (missing and self.updater.gradient_options.maximize_norm):
                raise
            op = missing.group(1) or missing.group(2)
            raise ConfigError("maximize_grad_norm differentiates the gradient, but the model has an op "
                              f"whose gradient ({op}) cannot be differentiated; set maximize_grad_norm = 0."
                              ) from None

    def train_accumulating(self, batch) -> tuple[np.ndarray, np.ndarray | None]:
        """With ``accum_steps`` > 1: add ``batch`` to the accumulators, and update when the group is full.
        Returns this batch's own score sums, and the group's reduced score sums when it updated."""
        self.nonfinite = FINITE  # a batch that only accumulates makes no update
        scores = self._accumulate(*self._inputs(batch), np.int32(self._pending)).numpy()
        self._pending += 1
        if self._pending < self.accum_steps:
            return scores, None
        return scores, self.flush()

    def flush(self) -> np.ndarray:
        """Update with the full group in the accumulators; the group's reduced score sums (``nonfinite``
        says what the update found)."""
        self._pending = 0
        reduced, found = self._apply()
        self.nonfinite = self._found(int(found))
        return reduced.numpy()

    def _found(self, found: int) -> int:
        """What the update found, for the loop: a loss-scale overflow is counted and logged, not a stop."""
        if found != OVERFLOW:
            return found
        self.overflows += 1
        log.debug(f"tf_amp = 'float16': the gradients overflowed float16's range; update skipped, loss scale "
                  f"now {float(self.loss_scale.scale.numpy()):g} ({self.overflows} skipped so far)")
        return FINITE

    def drop_partial_group(self) -> tuple[int, np.ndarray | None]:
        """At the epoch's end: forget the batches of an incomplete last group without an update, as
        RETURNN's PyTorch engine does (it zeroes them at the next epoch's first step). Returns their
        number and their reduced score sums (the epoch's scores count them, as RETURNN's do), or None
        when there were none. Every rank calls it at the same point, as the reduction needs."""
        dropped, self._pending = self._pending, 0
        return dropped, (self._drop().numpy() if dropped else None)

    def eval(self, batch) -> np.ndarray:
        """A batch's score sums (``SCORE_NAMES``)."""
        return self.eval_layers(batch)[0]

    def eval_layers(self, batch) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """A batch's score sums, and per other loss layer (``other_score_layers``) its [loss sum, error sum,
        count]."""
        values = self._eval(*self._inputs(batch)).numpy()
        size = len(SCORE_NAMES)
        return values[:size], {name: values[size + 3 * i:size + 3 * i + 3]
                               for i, name in enumerate(self.other_score_layers)}

    def forward(self, batch) -> tuple[np.ndarray, np.ndarray]:
        """The ``output`` layer's values (B, T', dim) and lengths (B,) for a batch."""
        outputs, lengths = self._forward(*self._data(batch))
        return outputs.numpy(), lengths.numpy()

    def output_dim(self) -> int:
        """The feature dim of the model's ``output`` layer (from a one-frame forward pass)."""
        data_spec, _ = self.model.input_signature
        data = np.zeros([1, 1] + [d for d in data_spec.shape[2:]], dtype=self._input_dtype)
        with self.kept_running_state():  # a probe, not a batch of the data
            return int(self._forward(data, np.ones([1], np.int32))[0].shape[-1])

    @contextlib.contextmanager
    def kept_running_state(self) -> Iterator[None]:
        """The model's running state (batch_norm's statistics, ``SeqModel.running_state``) back as it was
        before the block: a dev pass moves it as RETURNN's does, but RETURNN saves the epoch's checkpoint
        before its dev pass (this engine after it) and does not probe the model as ``output_dim`` does."""
        saved = [(var, var.numpy()) for var in self.model.running_state().values()]
        try:
            yield
        finally:
            for var, value in saved:
                var.assign(value)
