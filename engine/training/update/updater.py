"""Parameter updates: the optimizer (``optimizers.py``, chosen by ``optimizer_config.py``), a settable
learning rate, the gradients' post-processing (``gradients.py``) before each update, and the layers'
``L2`` as decoupled weight decay (``decouple_constraints``).

``decouple_constraints`` (RETURNN's TensorFlow updater since 2022-11): a layer's ``L2`` is no loss term;
instead, at every update, after the gradients are computed (at the undecayed parameters) and
post-processed, and before the optimizer's update, each of the layer's parameters that has a gradient
is multiplied by (1 - 2 * L2): w -= 2 * L2 * w, the SGD step of L2 * sum(w^2) at rate 1. The learning
rate does not scale it, and the optimizer never sees it (adam's moments hold the loss gradients only).
With data-parallel training the decay acts on each rank's parameters like the update itself: in grad
mode every rank decays the same parameters, in param mode each its own before the averaging (which
the decay, being linear, commutes with).

Every slot exists at construction (so a checkpoint can be loaded, or rank 0's state broadcast, before
step 1), and the learning rate is a variable (changing it per epoch never retraces a ``tf.function``).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import tensorflow as tf

from engine.model.precision import compute_dtype
from engine.training.update.gradients import GradientOptions, process_gradients
from engine.training.update.loss_scale import LossScale, loss_scale_for
from engine.training.update.optimizer_config import optimizer_for_config
from engine.training.update.optimizers import Optimizer, optimizer_from_config

__all__ = ["Updater", "Optimizer", "optimizer_from_config"]


class Updater:
    """Applies (already reduced) gradients to a fixed list of variables: ``gradients.process_gradients``
    with ``gradient_options``, then the optimizer's update.

    ``variables`` is a sequence, or a dict name -> variable (e.g. ``model.named_variables()``) whose
    names then label the slots in ``named_variables()``. ``random_seed`` keys the gradient noise.
    ``decoupled_l2``: None, the layers' ``L2`` is a loss term (``Steps`` adds it); or a dict variable name
    -> L2 (names as in ``named_variables``, each listed variable decays by 2 * L2 per update, see above).
    ``parts``: variable name -> the row counts of the RETURNN variables it holds (the model's
    ``returnn_parts()``), for ``gradient_clip_norm``. ``loss_scale``: float16's (``loss_scale.py``), whose
    state is part of the optimizer state here.
    """

    def __init__(
        self,
        variables: Sequence[tf.Variable] | dict[str, tf.Variable],
        optimizer: Optimizer,
        *,
        learning_rate: float = 1.0,
        gradient_options: GradientOptions = GradientOptions(),
        random_seed: int = 0,
        decoupled_l2: Mapping[str, float] | None = None,
        parts: Mapping[str, Sequence[int]] | None = None,
        loss_scale: LossScale | None = None,
    ) -> None:
        if isinstance(variables, dict):
            names, self.vars = list(variables), list(variables.values())
        else:
            self.vars = list(variables)
            names = [f"{i:03d}:{v.name.split(':')[0]}" for i, v in enumerate(self.vars)]
        # per variable: the factor of the decoupled decay w -= factor * w (None: L2 is a loss term)
        self.decay: list[float] | None = None
        if decoupled_l2 is not None:
            unknown = sorted(set(decoupled_l2) - set(names))
            if unknown:
                raise ValueError(f"Updater: decoupled_l2 names variables it does not update: {unknown}.")
            self.decay = [2.0 * float(decoupled_l2.get(name, 0.0)) for name in names]
        unknown = sorted(set(parts or {}) - set(names))
        if unknown:
            raise ValueError(f"Updater: parts names variables it does not update: {unknown}.")
        # per variable: None, or the row counts of the RETURNN variables it holds
        self.parts: list[tuple[int, ...] | None] = [
            tuple(parts[name]) if parts and name in parts else None for name in names]
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
        self.loss_scale = loss_scale
        if loss_scale is not None:
            self._named.update(loss_scale.named_variables())

    @classmethod
    def from_config(cls, config, variables: Sequence[tf.Variable] | dict[str, tf.Variable],
                    l2: Mapping[str, float] | None = None,
                    parts: Mapping[str, Sequence[int]] | None = None) -> "Updater":
        """The optimizer (``optimizer_config``), ``learning_rate`` (the loop sets each epoch's rate with
        ``set_learning_rate``), the gradient keys of ``gradients.py``, ``random_seed`` and
        ``decouple_constraints``; ``l2``: the model's ``l2_factors()`` (variable name -> its layer's L2),
        decayed here when ``decouple_constraints`` is set; ``parts``: the model's ``returnn_parts()``."""
        return cls(
            variables,
            optimizer_for_config(config),
            learning_rate=config.float("learning_rate"),
            gradient_options=GradientOptions.from_config(config),
            random_seed=config.int("random_seed"),
            decoupled_l2=dict(l2 or {}) if config.bool("decouple_constraints") else None,
            parts=parts,
            loss_scale=loss_scale_for(compute_dtype(config.value("tf_amp"))),
        )

    @property
    def decouples_l2(self) -> bool:
        """Whether the layers' L2 acts as decoupled weight decay here (not as a loss term)."""
        return self.decay is not None

    @property
    def learning_rate(self) -> float:
        return float(self._lr.numpy())

    def set_learning_rate(self, learning_rate: float) -> None:
        self._lr.assign(float(learning_rate))

    def named_variables(self) -> dict[str, tf.Variable]:
        """Optimizer state for checkpoints: ``iterations``, ``<slot>/<variable name>`` and the loss scale's
        ``loss_scale/...`` (float16 only)."""
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
        self.apply_processed(self.processed_gradients(grads, variables, extra))

    def processed_gradients(
        self, grads: Sequence[tf.Tensor | None], variables: Sequence[tf.Variable] | None = None,
        extra: Sequence[tf.Tensor | None] | None = None,
    ) -> list[tf.Tensor | None]:
        """What the update step applies: the gradients after ``gradients.process_gradients`` (arguments
        as ``apply_gradients``); ``apply_processed`` then updates with them."""
        if variables is not None and [id(v) for v in variables] != [id(v) for v in self.vars]:
            raise ValueError(
                "Updater.apply_gradients: variables differ from those the updater was built for."
            )
        if len(grads) != len(self.vars):
            raise ValueError(
                f"Updater.apply_gradients: {len(grads)} gradients for {len(self.vars)} variables."
            )
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        return process_gradients(grads, self.gradient_options, self.step_seed(), extra, self.parts)

    def apply_processed(self, grads: Sequence[tf.Tensor | None]) -> None:
        """The update step with gradients from ``processed_gradients`` (of this step: the noise is keyed
        by the update count, which this increments)."""
        if self.decay is not None:
            # after the gradients (taken at the undecayed parameters), before the optimizer's update
            for var, grad, factor in zip(self.vars, grads, self.decay):
                if grad is not None and factor:
                    var.assign_sub(var * tf.constant(factor, var.dtype))
        step = tf.cast(self.iterations.assign_add(1), tf.float32)
        lr = tf.convert_to_tensor(self._lr)
        for var, grad, slots in zip(self.vars, grads, self.slots):
            if grad is not None:
                self.optimizer.update(var, tf.cast(grad, var.dtype), slots, lr, step)
