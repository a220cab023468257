"""Parameter updates: the optimizer (``optimizers.py``, chosen by ``optimizer_config.py``), a settable
learning rate, and the gradients' post-processing (``gradients.py``) before each update.

Every slot exists at construction (so a checkpoint can be loaded, or rank 0's state broadcast, before
step 1), and the learning rate is a variable (changing it per epoch never retraces a ``tf.function``).
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from engine.training.gradients import GradientOptions, process_gradients
from engine.training.optimizer_config import optimizer_for_config
from engine.training.optimizers import Optimizer, optimizer_from_config

__all__ = ["Updater", "Optimizer", "optimizer_from_config"]


class Updater:
    """Applies (already reduced) gradients to a fixed list of variables: ``gradients.process_gradients``
    with ``gradient_options``, then the optimizer's update.

    ``variables`` is a sequence, or a dict name -> variable (e.g. ``model.named_variables()``) whose
    names then label the slots in ``named_variables()``. ``random_seed`` keys the gradient noise.
    """

    def __init__(
        self,
        variables: Sequence[tf.Variable] | dict[str, tf.Variable],
        optimizer: Optimizer,
        *,
        learning_rate: float = 1.0,
        gradient_options: GradientOptions = GradientOptions(),
        random_seed: int = 0,
    ) -> None:
        if isinstance(variables, dict):
            names, self.vars = list(variables), list(variables.values())
        else:
            self.vars = list(variables)
            names = [f"{i:03d}:{v.name.split(':')[0]}" for i, v in enumerate(self.vars)]
        self.optimizer = optimizer
        self.gradient_options = gradient_options
        self.random_seed = int(random_seed)
        self._lr = tf.Variable(float(learning_rate), trainable=False, dtype=tf.float32, name="learning_rate")
        self.iterations = tf.Variable(0, trainable=False, dtype=tf.int64, name="iterations")
        self.slots: list[dict[str, tf.Variable]] = []
        self._named: dict[str, tf.Variable] = {"iterations": self.iterations}
        for name, var in zip(names, self.vars):
            per_var = {}
            for slot in optimizer.slots:
                start = tf.fill(var.shape, tf.constant(optimizer.slot_start.get(slot, 0.0), var.dtype))
                per_var[slot] = tf.Variable(start, trainable=False, name=f"{slot}/{name}".replace(":", "_"))
                self._named[f"{slot}/{name}"] = per_var[slot]
            self.slots.append(per_var)

    @classmethod
    def from_config(cls, config, variables: Sequence[tf.Variable] | dict[str, tf.Variable]) -> "Updater":
        """The optimizer (``optimizer_config``), ``learning_rate`` (the loop sets each epoch's rate with
        ``set_learning_rate``), the gradient keys of ``gradients.py`` and ``random_seed``."""
        return cls(
            variables,
            optimizer_for_config(config),
            learning_rate=config.float("learning_rate"),
            gradient_options=GradientOptions.from_config(config),
            random_seed=config.int("random_seed"),
        )

    @property
    def learning_rate(self) -> float:
        return float(self._lr.numpy())

    def set_learning_rate(self, learning_rate: float) -> None:
        self._lr.assign(float(learning_rate))

    def named_variables(self) -> dict[str, tf.Variable]:
        """Optimizer state for checkpoints: ``iterations`` and ``<slot>/<variable name>``."""
        return self._named

    @property
    def variables(self) -> list[tf.Variable]:
        return list(self._named.values())

    def step_seed(self) -> tf.Tensor:
        """int64 (2,): (random_seed, updates done so far), the key of this step's random numbers."""
        return tf.stack([tf.constant(self.random_seed, tf.int64), tf.convert_to_tensor(self.iterations)])

    def apply_gradients(
        self, grads: Sequence[tf.Tensor | None], variables: Sequence[tf.Variable] | None = None,
        extra: Sequence[tf.Tensor | None] | None = None,
    ) -> None:
        """One update step; usable inside a ``tf.function``. A ``None`` gradient leaves its variable
        (and slots) unchanged. ``variables``, if given, must be the updater's variables in order;
        ``extra``: the ``maximize_grad_norm`` term per gradient."""
        if variables is not None and [id(v) for v in variables] != [id(v) for v in self.vars]:
            raise ValueError(
                "Updater.apply_gradients: variables differ from those the updater was built for."
            )
        if len(grads) != len(self.vars):
            raise ValueError(
                f"Updater.apply_gradients: {len(grads)} gradients for {len(self.vars)} variables."
            )
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        grads = process_gradients(grads, self.gradient_options, self.step_seed(), extra)
        step = tf.cast(self.iterations.assign_add(1), tf.float32)
        lr = tf.convert_to_tensor(self._lr)
        for var, grad, slots in zip(self.vars, grads, self.slots):
            if grad is not None:
                self.optimizer.update(var, tf.cast(grad, var.dtype), slots, lr, step)
