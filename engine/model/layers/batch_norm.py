"""RETURNN's ``batch_norm`` layer (``BatchNormLayer``, computed by ``LayerBase.batch_norm``), with the
defaults of a config without ``behavior_version`` (RETURNN's behaviour version 0).

Per feature, the output is (x - mean) / sqrt(variance + ``epsilon``) * gamma + beta. Which mean and
variance: the batch's own (over its valid frames: ``masked_time``), the running ones, or a mix
(``use_sample``), as RETURNN chooses them in training and in eval. The running statistics are two
non-trainable variables (``mean`` starts at 0, ``variance`` at 1) that get no gradient, L2 decay or optimizer
state; after each batch they move towards the batch's statistics: r <- r + (batch - r) * ``momentum``.

What follows the layer's options, in training (the train step's model call) and in eval (dev, forward):

- the batch's statistics are those of all valid frames of the batch, padding excluded;
- training uses mean = (1 - u) * batch + u * running with u = ``use_sample`` (0: the batch's alone); eval
  uses the running statistics (with ``force_sample``, the same mix as in training);
- "running" means the values after this batch's update unless ``delay_sample_update`` (then the values
  before it). Training batches update them; eval batches too unless ``update_sample_only_in_training``, as
  RETURNN runs its update ops with every step, dev and forward included. A model call stores the update
  in training, and in eval when the step asks (``update_running``: the engine's eval and forward steps); a
  dev pass puts the values back at its end (``Steps.kept_running_state``), so that the epoch's checkpoint,
  saved after it here, holds what RETURNN's holds (RETURNN saves before its dev pass).

Parameters under RETURNN's names (``returnn_names``): ``<layer>/batch_norm/<prefix>mean``, ``...variance``,
``...gamma`` (``use_std``), ``...beta`` (``use_shift``), where ``param_version`` 0 (the default) has the
prefix ``<layer>_<layer>_output_`` and shape (1, 1, F), 1 no prefix and (1, 1, F), 2 ``v2_`` and (F,).
Data-parallel ranks update their running statistics from their own batches;
``engine/training/running_state.py`` averages them over the ranks where all ranks must agree (epoch ends,
checkpoints).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from engine.model.initializers import parse_initializer
from engine.model.layers.base import Layer
from engine.runtime.errors import ConfigError

DEFAULTS = {  # RETURNN's LayerBase.batch_norm at behaviour version 0
    "use_shift": True, "use_std": True, "use_sample": 0.0, "force_sample": False, "momentum": 0.99,
    "epsilon": 1e-3, "update_sample_only_in_training": False, "delay_sample_update": False,
    "param_version": 0, "gamma_init": 1.0, "beta_init": 0.0, "masked_time": True,
}


def _flag(layer: str, opts: dict, key: str) -> bool:
    value = opts.get(key, DEFAULTS[key])
    if not isinstance(value, bool):
        raise ConfigError(f"Network layer '{layer}': {key!r} must be True or False, got {value!r}.")
    return value


def _number(layer: str, opts: dict, key: str, low: float, high: float) -> float:
    value = opts.get(key, DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"Network layer '{layer}': {key!r} must be a number in [{low:g}, {high:g}], "
                          f"got {value!r}.")
    return float(value)


class BatchNorm(Layer):
    """``batch_norm`` (see the module's docstring). A frame's output depends on the other frames of its
    batch through the batch's statistics, as in RETURNN; padded frames never count."""

    running_keys = ("mean", "variance")

    def __init__(self, name: str, opts: dict, in_dim: int, *, random_seed: int) -> None:
        super().__init__(in_dim)
        if not _flag(name, opts, "masked_time"):
            raise ConfigError(f"Network layer '{name}': masked_time False is not supported: RETURNN then "
                              "takes the statistics over the padded frames too, whose values this engine "
                              "does not keep equal to RETURNN's (nor independent of how sequences are "
                              "batched).")
        self.use_shift, self.use_std = _flag(name, opts, "use_shift"), _flag(name, opts, "use_std")
        self.force_sample = _flag(name, opts, "force_sample")
        self.only_in_training = _flag(name, opts, "update_sample_only_in_training")
        self.delay_update = _flag(name, opts, "delay_sample_update")
        self.use_sample = _number(name, opts, "use_sample", 0.0, 1.0)
        self.momentum = _number(name, opts, "momentum", 0.0, 1.0)
        self.epsilon = _number(name, opts, "epsilon", 0.0, float("inf"))
        version = opts.get("param_version", DEFAULTS["param_version"])
        if isinstance(version, bool) or version not in (0, 1, 2):
            raise ConfigError(f"Network layer '{name}': 'param_version' must be 0, 1 or 2, got {version!r}.")
        shape = (1, 1, in_dim) if version < 2 else (in_dim,)
        self.params["mean"] = tf.Variable(tf.zeros(shape), trainable=False, name=f"{name}/mean")
        self.params["variance"] = tf.Variable(tf.ones(shape), trainable=False, name=f"{name}/variance")
        for key, used, flag in (("gamma", self.use_std, "use_std"), ("beta", self.use_shift, "use_shift")):
            if used:
                option = f"{key}_init"
                init = parse_initializer(name, option, opts.get(option, DEFAULTS[option]))
                self.params[key] = init.variable(f"{name}/{key}", shape, random_seed)
            elif f"{key}_init" in opts:
                raise ConfigError(f"Network layer '{name}': {key}_init is given, but {flag} is False, so the "
                                  f"layer has no {key}.")
        prefix = {0: f"{name}_{name}_output_", 1: "", 2: "v2_"}[version]
        self.returnn_names = {key: f"{name}/batch_norm/{prefix}{key}" for key in self.params}

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool,
                 update_running: bool = False) -> tf.Tensor:
        """``update_running``: an eval call stores the running statistics it moves (the eval and forward
        steps; a training call always stores them)."""
        dtype, x = x.dtype, tf.cast(x, tf.float32)  # tf_amp: the statistics in float32
        update = training or not self.only_in_training
        mixes_batch = self.use_sample != 1.0 and (self.force_sample or training)
        stored_mean, stored_variance = self.params["mean"], self.params["variance"]
        running = [tf.convert_to_tensor(stored_mean), tf.convert_to_tensor(stored_variance)]
        batch: Any = None
        if update or mixes_batch:
            valid = tf.transpose(tf.sequence_mask(lengths, tf.shape(x)[0]))  # (T, B)
            mean, variance = tf.nn.moments(tf.boolean_mask(x, valid), axes=[0])
            batch = [tf.reshape(mean, stored_mean.shape), tf.reshape(variance, stored_mean.shape)]
        if update:
            # RETURNN adds the step to the variable and reads it back: no gradient reaches the batch through
            # it, and the read passes the gradient to the variable unscaled
            updated = [r + tf.stop_gradient((b - r) * self.momentum) for r, b in zip(running, batch)]
            if training or update_running:
                stored_mean.assign(updated[0])
                stored_variance.assign(updated[1])
            if not self.delay_update:
                running = updated
        mean, variance = running
        if self.force_sample or training:
            u = self.use_sample
            if u == 0.0:
                mean, variance = batch
            elif u != 1.0:
                mean, variance = ((1.0 - u) * b + u * r for b, r in zip(batch, running))
        y = (x - mean) * tf.math.rsqrt(variance + self.epsilon)
        if self.use_std:
            y = y * self.params["gamma"]
        if self.use_shift:
            y = y + self.params["beta"]
        return tf.cast(y, dtype)
