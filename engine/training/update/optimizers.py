"""The optimizers' update rules.

The five optimizers are written here in a few tf ops each rather than taken from Keras: Keras 2 and
Keras 3 optimizers differ in API, slot naming and defaults, and create their slots lazily inside the
first step. Here every slot exists at construction (so a checkpoint can be loaded, or rank 0's state
broadcast, before step 1), the math is element-wise (deterministic, so ranks applying the same reduced
gradients stay bitwise identical: plain ops, and for adam and nadam TensorFlow's fused ``ApplyAdam``
kernel, one op per variable), and the learning rate is a variable (changing it per epoch never retraces
a ``tf.function``).

Formulas (g = gradient, t = step starting at 1, lr = learning rate; as in TensorFlow 1's optimizers,
which RETURNN uses):
- ``sgd``:      w -= lr g
- ``momentum``: a = mu a + g;  w -= lr a  (``nesterov``: w -= lr (g + mu a))
- ``adam``:     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  w -= lr_t m / (sqrt(v) + eps),
                lr_t = lr sqrt(1-b2^t) / (1-b1^t)
- ``nadam``:    as adam, but w -= lr_t (b1 m + (1-b1) g) / (sqrt(v) + eps)  (RETURNN's NadamOptimizer:
                TensorFlow's ApplyAdam with use_nesterov)
- ``rmsprop``:  s = rho s + (1-rho) g^2;  a = mu a + lr g / sqrt(s + eps);  w -= a  (s starts at 1,
                as in TensorFlow 1, which damps the first steps; every other slot starts at 0)
eps is ``optimizer_epsilon`` (1e-16) unless the optimizer's dict gives its own, as in RETURNN.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from engine.config import keys
from engine.runtime.errors import ConfigError


class Optimizer:
    """One update rule: its options (with defaults and accepted aliases) and its slots per variable."""

    slots: tuple[str, ...] = ()
    slot_start: dict[str, float] = {}  # initial slot values other than 0
    defaults: dict[str, Any] = {}
    aliases: dict[str, str] = {}

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        self.opts = dict(self.defaults)
        for key, value in options.items():
            key = self.aliases.get(key, key)
            if key not in self.defaults:
                known = sorted(set(self.defaults) | set(self.aliases))
                raise ConfigError(
                    f"Config key 'optimizer': {name} has no option {key!r}; its options are "
                    f"{known or 'none'} (the learning rate is the key 'learning_rate')."
                )
            flag = isinstance(self.defaults[key], bool)
            if isinstance(value, bool) != flag or not isinstance(value, (int, float)):
                raise ConfigError(
                    f"Config key 'optimizer': {name} option {key!r} must be "
                    f"{'True or False' if flag else 'a number'}, got {value!r}."
                )
            self.opts[key] = value

    def update(
        self, var: tf.Variable, grad: tf.Tensor, slots: dict[str, tf.Variable], lr: tf.Tensor, step: tf.Tensor
    ) -> None:
        raise NotImplementedError


class Sgd(Optimizer):
    def update(self, var, grad, slots, lr, step):
        var.assign_sub(lr * grad)


class Momentum(Optimizer):
    slots = ("momentum",)
    defaults = {"momentum": 0.9, "nesterov": False}
    aliases = {"use_nesterov": "nesterov"}

    def update(self, var, grad, slots, lr, step):
        mu = self.opts["momentum"]
        accum = slots["momentum"].assign(mu * slots["momentum"] + grad)
        var.assign_sub(lr * (grad + mu * accum if self.opts["nesterov"] else accum))


class Adam(Optimizer):
    slots = ("m", "v")
    defaults = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-16}
    aliases = {"beta_1": "beta1", "beta_2": "beta2"}

    nesterov = False

    def update(self, var, grad, slots, lr, step):
        # TensorFlow's fused kernel of this rule (the one TensorFlow 1's AdamOptimizer, so RETURNN, runs):
        # one op per variable instead of a dozen, which for small models was a third of a step's ops
        dtype = var.dtype
        b1, b2 = (tf.constant(self.opts[key], dtype) for key in ("beta1", "beta2"))
        step = tf.cast(step, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=var.handle, m=slots["m"].handle, v=slots["v"].handle, beta1_power=tf.pow(b1, step),
            beta2_power=tf.pow(b2, step), lr=tf.cast(lr, dtype), beta1=b1, beta2=b2,
            epsilon=tf.constant(self.opts["epsilon"], dtype), grad=grad, use_nesterov=self.nesterov)


class Nadam(Adam):
    nesterov = True  # ApplyAdam's use_nesterov: w -= lr_t (b1 m + (1-b1) g) / (sqrt(v) + eps)


class RmsProp(Optimizer):
    slots = ("rms", "momentum")
    slot_start = {"rms": 1.0}
    defaults = {"decay": 0.9, "momentum": 0.0, "epsilon": 1e-16}
    aliases = {"rho": "decay"}

    def update(self, var, grad, slots, lr, step):
        rho = self.opts["decay"]
        ms = slots["rms"].assign(rho * slots["rms"] + (1.0 - rho) * tf.square(grad))
        accum = slots["momentum"].assign(
            self.opts["momentum"] * slots["momentum"] + lr * grad / tf.sqrt(ms + self.opts["epsilon"])
        )
        var.assign_sub(accum)


OPTIMIZERS: dict[str, type[Optimizer]] = {
    "sgd": Sgd,
    "momentum": Momentum,
    "adam": Adam,
    "nadam": Nadam,
    "rmsprop": RmsProp,
}
# RETURNN's class names of the same rules: TensorFlow 1's optimizers, which it registers with and without
# the "Optimizer" suffix. On TensorFlow 2 its "sgd" is Keras' SGD, which its Keras wrapper cannot take on
# TF 2.15 ("'SGD' object has no attribute '_name'"), so RETURNN configs say "gradientdescent" there.
RETURNN_CLASS_NAMES = {
    "gradientdescent": "sgd", "gradientdescentoptimizer": "sgd", "momentumoptimizer": "momentum",
    "adamoptimizer": "adam", "nadamoptimizer": "nadam", "rmspropoptimizer": "rmsprop",
}


def optimizer_from_config(value: Any, *, epsilon: float | None = None) -> Optimizer:
    """``"adam"`` or ``{"class": "adam", "beta1": ...}`` (class names in any case, also RETURNN's
    ``RETURNN_CLASS_NAMES``) -> an ``Optimizer``.

    ``epsilon`` (default: the key ``optimizer_epsilon``'s, 1e-16) is the epsilon of optimizers that have
    one, unless the dict gives its own (RETURNN's rule)."""
    if value is None:  # RETURNN's default: plain gradient descent
        value = {"class": "sgd"}
    if isinstance(value, str):
        value = {"class": value}
    if not isinstance(value, dict) or not isinstance(value.get("class"), str):
        raise ConfigError(
            f"Config key 'optimizer' must be a class name or a dict with 'class', got {value!r}."
        )
    name = value["class"].lower()
    name = RETURNN_CLASS_NAMES.get(name, name)
    if name not in OPTIMIZERS:
        raise ConfigError(
            f"Config key 'optimizer': unknown class {value['class']!r}; known: {', '.join(OPTIMIZERS)} (and "
            f"RETURNN's names of them: {', '.join(RETURNN_CLASS_NAMES)})."
        )
    options = {k: v for k, v in value.items() if k != "class"}
    if "epsilon" in OPTIMIZERS[name].defaults and "epsilon" not in options:
        options["epsilon"] = keys.default("optimizer_epsilon") if epsilon is None else epsilon
    return OPTIMIZERS[name](name, options)
