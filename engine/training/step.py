"""The compiled steps: train, eval and forward.

Each is one ``tf.function`` with an input signature of unknown batch and time, so batches of any shape
run the same graph. Between the gradients and the update, the train step hands the gradients and the
step's score sums to the strategy (``engine.distributed.strategy``), which reduces them over the ranks
or not: the step itself never knows the data-parallel mode. Dropout is stateless, keyed by
(``random_seed``, the global step) and the rank, so a resumed run draws the same masks.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from engine.distributed.strategy import Strategy
from engine.errors import ConfigError
from engine.model.base import SeqModel
from engine.training.updater import Updater

# A step returns the score vector [loss sum, frame-error sum, non-padded frames]: sums, so ranks add up.
DROPOUT_STREAM = 0x64726F70  # keeps dropout's random numbers apart from other users of the step's seed


def fold_in(seed: tf.Tensor, data: int) -> tf.Tensor:
    return tf.random.experimental.stateless_fold_in(seed, data)


class Steps:
    def __init__(self, model: SeqModel, updater: Updater | None = None,
                 strategy: Strategy | None = None) -> None:
        """``updater`` and ``strategy`` are needed for training only."""
        self.model = model
        self.updater = updater
        self.strategy = strategy
        if strategy is not None and strategy.differentiates_loss_sum and len(model.loss_targets) > 1:
            raise ConfigError("horovod_grad_normalization = 'global_frames' divides the summed gradient by "
                              "the frames of one target, but the network's losses use several targets "
                              f"({', '.join(sorted(model.loss_targets))}). Use 'sum' or 'average'.")
        self.rank = strategy.comm.rank if strategy is not None else 0
        self.params = list(model.trainable_variables)
        self.target_keys = sorted(model.target_dims)
        data_spec, lengths_spec = model.input_signature
        targets_spec = {k: tf.TensorSpec([None, None], tf.int32, name=k) for k in self.target_keys}
        target_lengths_spec = {k: tf.TensorSpec([None], tf.int32, name=f"{k}_len") for k in self.target_keys}
        signature = [data_spec, lengths_spec, targets_spec, target_lengths_spec]
        self._train = tf.function(self._train_step, input_signature=signature)
        self._eval = tf.function(self._eval_step, input_signature=signature)
        self._forward = tf.function(self._forward_step, input_signature=[data_spec, lengths_spec])
        self._input_dtype = data_spec.dtype.as_numpy_dtype

    # ----- graph functions -----
    def _scores(self, losses) -> tf.Tensor:
        return tf.stack([losses.loss, losses.error, losses.num_frames])

    def _train_step(self, data, lengths, targets, target_lengths):
        # dropout: other masks on every rank and at every step, the same again in a resumed run
        model_seed = fold_in(fold_in(self.updater.step_seed(), DROPOUT_STREAM), self.rank)
        with tf.GradientTape() as tape:
            outputs = self.model(data, lengths, training=True, seed=model_seed)
            losses = self.model.compute_losses(outputs, targets, target_lengths)
        differentiated = losses.loss if self.strategy.differentiates_loss_sum else losses.objective
        grads = tape.gradient(differentiated, self.params)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, self.params)]
        grads, scores = self.strategy.reduce_gradients(grads, self._scores(losses))
        self.updater.apply_gradients(grads, self.params)
        return scores

    def _eval_step(self, data, lengths, targets, target_lengths):
        outputs = self.model(data, lengths, training=False)
        return self._scores(self.model.compute_losses(outputs, targets, target_lengths))

    def _forward_step(self, data, lengths):
        return self.model(data, lengths, training=False)["output"]

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
        return self._train(*self._inputs(batch)).numpy()

    def eval(self, batch) -> np.ndarray:
        return self._eval(*self._inputs(batch)).numpy()

    def forward(self, batch) -> np.ndarray:
        return self._forward(*self._data(batch)).numpy()

    def output_dim(self) -> int:
        """The feature dim of the model's ``output`` layer (from a one-frame forward pass)."""
        data_spec, _ = self.model.input_signature
        data = np.zeros([1, 1] + [d for d in data_spec.shape[2:]], dtype=self._input_dtype)
        return int(self._forward(data, np.ones([1], np.int32)).shape[-1])
