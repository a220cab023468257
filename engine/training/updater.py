"""Parameter updates: the ``optimizer`` from the config, a settable learning rate, gradient clipping.

The five optimizers are written here in a few tf ops each rather than taken from Keras: Keras 2 and
Keras 3 optimizers differ in API, slot naming and defaults, and create their slots lazily inside the
first step. Here every slot exists at construction (so a checkpoint can be loaded, or rank 0's state
broadcast, before step 1), the math is plain element-wise ops (deterministic, so ranks applying the same
reduced gradients stay bitwise identical), and the learning rate is a variable (changing it per epoch
never retraces a ``tf.function``).

Formulas (g = gradient, t = step starting at 1, lr = learning rate; as in TensorFlow 1's optimizers,
which RETURNN uses):
- ``sgd``:      w -= lr g
- ``momentum``: a = mu a + g;  w -= lr a  (``nesterov``: w -= lr (g + mu a))
- ``adam``:     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  w -= lr_t m / (sqrt(v) + eps),
                lr_t = lr sqrt(1-b2^t) / (1-b1^t)
- ``nadam``:    as adam, but w -= lr_t (b1 m + (1-b1) g) / (sqrt(v) + eps)
- ``rmsprop``:  s = rho s + (1-rho) g^2;  a = mu a + lr g / sqrt(s + eps);  w -= a  (s starts at 1,
                as in TensorFlow 1, which damps the first steps; every other slot starts at 0)
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from engine.errors import ConfigError


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
    defaults = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
    aliases = {"beta_1": "beta1", "beta_2": "beta2"}

    def update(self, var, grad, slots, lr, step):
        b1, b2 = self.opts["beta1"], self.opts["beta2"]
        m = slots["m"].assign(b1 * slots["m"] + (1.0 - b1) * grad)
        v = slots["v"].assign(b2 * slots["v"] + (1.0 - b2) * tf.square(grad))
        lr_t = lr * tf.sqrt(1.0 - tf.pow(b2, step)) / (1.0 - tf.pow(b1, step))
        var.assign_sub(lr_t * self._direction(m, grad) / (tf.sqrt(v) + self.opts["epsilon"]))

    def _direction(self, m: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
        return m


class Nadam(Adam):
    def _direction(self, m, grad):
        b1 = self.opts["beta1"]
        return b1 * m + (1.0 - b1) * grad


class RmsProp(Optimizer):
    slots = ("rms", "momentum")
    slot_start = {"rms": 1.0}
    defaults = {"decay": 0.9, "momentum": 0.0, "epsilon": 1e-10}
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


def optimizer_from_config(value: Any) -> Optimizer:
    """``"adam"`` or ``{"class": "adam", "beta1": ...}`` (class names in any case) -> an ``Optimizer``."""
    if value is None:
        value = {"class": "adam"}
    if isinstance(value, str):
        value = {"class": value}
    if not isinstance(value, dict) or not isinstance(value.get("class"), str):
        raise ConfigError(
            f"Config key 'optimizer' must be a class name or a dict with 'class', got {value!r}."
        )
    name = value["class"].lower()
    if name not in OPTIMIZERS:
        raise ConfigError(
            f"Config key 'optimizer': unknown class {value['class']!r}; known: {', '.join(OPTIMIZERS)}."
        )
    return OPTIMIZERS[name](name, {k: v for k, v in value.items() if k != "class"})


class Updater:
    """Applies (already reduced) gradients to a fixed list of variables.

    ``variables`` is a sequence, or a dict name -> variable (e.g. ``model.named_variables()``) whose
    names then label the slots in ``named_variables()``.
    """

    def __init__(
        self,
        variables: Sequence[tf.Variable] | dict[str, tf.Variable],
        optimizer: Optimizer,
        *,
        learning_rate: float = 1.0,
        clip_global_norm: float | None = None,
        random_seed: int = 0,
    ) -> None:
        if isinstance(variables, dict):
            names, self.vars = list(variables), list(variables.values())
        else:
            self.vars = list(variables)
            names = [f"{i:03d}:{v.name.split(':')[0]}" for i, v in enumerate(self.vars)]
        self.optimizer = optimizer
        self.clip_global_norm = clip_global_norm
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
        """Keys: ``optimizer`` [adam], ``learning_rate`` [1.0] (the loop sets each epoch's rate with
        ``set_learning_rate``), ``gradient_clip_global_norm`` [none], ``random_seed`` (``step_seed``)."""
        clip = config.float("gradient_clip_global_norm")
        if clip is not None and clip <= 0:
            clip = None  # RETURNN configs use 0 for "off"
        return cls(
            variables,
            optimizer_from_config(config.typed("optimizer")),
            learning_rate=config.float("learning_rate"),
            clip_global_norm=clip,
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
        """int64 (2,): (random_seed, updates done so far), the key of this step's random numbers. Saved
        with the optimizer state (``iterations``), so a resumed run draws the same numbers."""
        return tf.stack([tf.constant(self.random_seed, tf.int64), tf.convert_to_tensor(self.iterations)])

    def apply_gradients(
        self, grads: Sequence[tf.Tensor | None], variables: Sequence[tf.Variable] | None = None
    ) -> None:
        """One update step; usable inside a ``tf.function``. A ``None`` gradient leaves its variable
        (and slots) unchanged. ``variables``, if given, must be the updater's variables in order."""
        if variables is not None and [id(v) for v in variables] != [id(v) for v in self.vars]:
            raise ValueError(
                "Updater.apply_gradients: variables differ from those the updater was built for."
            )
        if len(grads) != len(self.vars):
            raise ValueError(
                f"Updater.apply_gradients: {len(grads)} gradients for {len(self.vars)} variables."
            )
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        if self.clip_global_norm is not None:
            present = [g for g in grads if g is not None]
            clipped, _ = tf.clip_by_global_norm(present, self.clip_global_norm)
            it = iter(clipped)
            grads = [None if g is None else next(it) for g in grads]
        step = tf.cast(self.iterations.assign_add(1), tf.float32)
        lr = tf.convert_to_tensor(self._lr)
        for var, grad, slots in zip(self.vars, grads, self.slots):
            if grad is not None:
                self.optimizer.update(var, tf.cast(grad, var.dtype), slots, lr, step)
