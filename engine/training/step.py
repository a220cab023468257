"""The compiled steps: train (grad or param mode), eval, forward and parameter averaging.

Each is one ``tf.function`` with an input signature of unknown batch and time, so batches of any shape
run the same graph. In grad mode the gradients and the step's score sums travel in one fused
collective inside the step; param mode trains locally and averages the parameters in ``sync_params``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from engine.distributed.backend import Communicator
from engine.model.base import SeqModel
from engine.training.updater import Updater

# A step returns the score vector [loss sum, frame-error sum, non-padded frames]: sums, so ranks add up.


class Steps:
    def __init__(self, model: SeqModel, updater: Updater | None, comm: Communicator, *, reduce_gradients: bool,
                 average_gradients: bool) -> None:
        self.model = model
        self.updater = updater
        self.comm = comm
        self.reduce_gradients = reduce_gradients and comm.size > 1
        self.average_gradients = average_gradients
        self.params = list(model.trainable_variables)
        self.target_keys = sorted(model.target_dims)
        data_spec, lengths_spec = model.input_signature
        targets_spec = {k: tf.TensorSpec([None, None], tf.int32, name=k) for k in self.target_keys}
        target_lengths_spec = {k: tf.TensorSpec([None], tf.int32, name=f"{k}_len") for k in self.target_keys}
        signature = [data_spec, lengths_spec, targets_spec, target_lengths_spec]
        self._train = tf.function(self._train_step, input_signature=signature)
        self._eval = tf.function(self._eval_step, input_signature=signature)
        self._forward = tf.function(self._forward_step, input_signature=[data_spec, lengths_spec])
        self._sync = tf.function(self._sync_params)
        self._input_dtype = data_spec.dtype.as_numpy_dtype

    # ----- graph functions -----
    def _scores(self, losses) -> tf.Tensor:
        return tf.stack([losses.loss, losses.error, losses.num_frames])

    def _train_step(self, data, lengths, targets, target_lengths):
        with tf.GradientTape() as tape:
            outputs = self.model(data, lengths, training=True)
            losses = self.model.compute_losses(outputs, targets, target_lengths)
        grads = tape.gradient(losses.objective, self.params)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, self.params)]
        scores = self._scores(losses)
        if self.reduce_gradients:
            # The score sums ride along in the gradients' fused buffer: one collective per step.
            reduced = self.comm.allreduce_tensors(grads + [scores], "sum")
            grads, scores = reduced[:-1], reduced[-1]
            if self.average_gradients:
                grads = [g / float(self.comm.size) for g in grads]
        self.updater.apply_gradients(grads, self.params)
        return scores

    def _eval_step(self, data, lengths, targets, target_lengths):
        outputs = self.model(data, lengths, training=False)
        return self._scores(self.model.compute_losses(outputs, targets, target_lengths))

    def _forward_step(self, data, lengths):
        return self.model(data, lengths, training=False)["output"]

    def _sync_params(self):
        averaged = self.comm.allreduce_tensors([v.read_value() for v in self.params], "average")
        for var, value in zip(self.params, averaged):
            var.assign(value)

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

    def sync_params(self) -> None:
        if self.comm.size > 1:
            self._sync()
