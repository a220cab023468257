"""The compiled steps: train, eval and forward.

Each is one ``tf.function`` with an input signature of unknown batch and time, so batches of any shape
run the same graph. Between the gradients and the update, the train step hands the gradients and the
step's score sums to the strategy (``engine.distributed.strategy``), which reduces them over the ranks
or not: the step itself never knows the data-parallel mode.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf

from engine.distributed.strategy import Strategy
from engine.errors import ConfigError, DataError, EngineError
from engine.model.base import SeqModel
from engine.training.updater import Updater

_NUMERICS_FOUND = re.compile(r"!!! (Detected Infinity or NaN in output \d+ of graph op \"[^\"]*\")")


class _CompiledStep:
    """``tf.function(step)`` whose errors reach the user as one paragraph.

    While tracing, autograph replaces an exception from the traced code by a copy whose message is the
    trace's stack ("in user code: File ..."), so a config error found while the graph is built would
    reach the user as a traceback in the message at any log_verbosity; the error as raised is the
    copy's ``__context__``. An Inf or NaN found by ``check_numerics`` comes as TensorFlow's error with
    the op's creation stack; its first line names the op."""

    def __init__(self, step: Callable, signature: list) -> None:
        self._function = tf.function(step, input_signature=signature)
        self.name = step.__name__.strip("_")

    def __call__(self, *args):
        with self._user_errors():
            return self._function(*args)

    def trace(self) -> None:
        """Build the graph now, without data (later calls reuse it)."""
        with self._user_errors():
            self._function.get_concrete_function()

    @contextmanager
    def _user_errors(self) -> Iterator[None]:
        try:
            yield
        except EngineError as exc:
            raised = exc.__context__
            if type(raised) is type(exc) and hasattr(exc, "ag_error_metadata"):
                raise raised from None
            raise
        except tf.errors.InvalidArgumentError as exc:
            found = _NUMERICS_FOUND.search(exc.message)
            if found is None:
                raise
            raise DataError(f"debug_add_check_numerics_ops: {found.group(1)} (in the {self.name}). Check the "
                            "data for Inf/NaN, or lower the learning rate.") from None


# A step returns the score vector [loss sum, frame-error sum, non-padded frames]: sums, so ranks add up.


class Steps:
    def __init__(self, model: SeqModel, updater: Updater | None = None,
                 strategy: Strategy | None = None, check_numerics: bool = False) -> None:
        """``updater`` and ``strategy`` are needed for training only. ``check_numerics``: every op of the
        steps checks its output, and the first Inf or NaN stops training (RETURNN's
        ``debug_add_check_numerics_ops``)."""
        self.model = model
        self.updater = updater
        self.strategy = strategy
        if strategy is not None and strategy.differentiates_loss_sum and len(model.loss_targets) > 1:
            raise ConfigError("horovod_grad_normalization = 'global_frames' divides the summed gradient by "
                              "the frames of one target, but the network's losses use several targets "
                              f"({', '.join(sorted(model.loss_targets))}). Use 'sum' or 'average'.")
        if check_numerics:
            tf.debugging.enable_check_numerics()  # instruments what is traced from now on
        self.params = list(model.trainable_variables)
        self.target_keys = sorted(model.target_dims)
        data_spec, lengths_spec = model.input_signature
        targets_spec = {k: tf.TensorSpec([None, None], tf.int32, name=k) for k in self.target_keys}
        target_lengths_spec = {k: tf.TensorSpec([None], tf.int32, name=f"{k}_len") for k in self.target_keys}
        signature = [data_spec, lengths_spec, targets_spec, target_lengths_spec]
        self._train = _CompiledStep(self._train_step, signature)
        self._eval = _CompiledStep(self._eval_step, signature)
        self._forward = _CompiledStep(self._forward_step, [data_spec, lengths_spec])
        self._input_dtype = data_spec.dtype.as_numpy_dtype

    def trace(self, *steps: str) -> None:
        """Build the graphs of ``steps`` ("train", "eval", "forward") now: the errors found while building
        them then come with the model's (before any step, where all ranks agree on failure)."""
        for name in steps:
            getattr(self, f"_{name}").trace()

    # ----- graph functions -----
    def _scores(self, losses) -> tf.Tensor:
        return tf.stack([losses.loss, losses.error, losses.num_frames])

    def _train_step(self, data, lengths, targets, target_lengths):
        with tf.GradientTape() as tape:
            outputs = self.model(data, lengths, training=True)
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
