"""What happens to the (reduced) gradients before the optimizer sees them, in RETURNN's order.

Keys (0 = off):
- ``maximize_grad_norm`` f: the gradient of -f * ||g|| is added, g being all gradients (the training
  also pushes the gradient norm up). ``Steps`` computes that term, since it needs the gradient tape.
- ``gradient_noise`` s: Gaussian noise with standard deviation s, truncated at 2 s (drawn again
  beyond), is added to every gradient; the same s at every step.
- ``gradient_clip`` c: every gradient value is clipped to [-c, c].
- ``gradient_clip_norm`` n: each gradient tensor on its own is scaled by n / max(||t||, n), ||t|| being
  that tensor's L2 norm after the steps above (``tf.clip_by_norm``, as RETURNN calls it). The tensors are
  RETURNN's variables: where this engine keeps two of them in one (an LSTM's ``W`` holds RETURNN's ``W``
  and ``W_re``: ``parts``), each part is clipped on its own.
- ``gradient_clip_global_norm`` n: all gradients are scaled by n / max(||g||, n), where ||g|| is the
  norm of the gradients as they came (before the steps above), as RETURNN computes it.

With data-parallel training all of this happens after the ranks' gradients are reduced, so every rank
applies the same update. The noise is a pure function of (``random_seed``, the global step, the
variable's index): the same on every rank, and the same again when a run is resumed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import tensorflow as tf

from engine.runtime.errors import ConfigError

NOISE_STREAM = 0x6E6F6973  # keeps the noise's random numbers apart from other users of the step's seed


def _non_negative(config, key: str) -> float:
    value = config.float(key) or 0.0
    if not value >= 0:  # also NaN, which would turn every gradient into NaN
        raise ConfigError(f"Config key '{key}' must be a number >= 0 (0: off), got {value}.")
    return value


@dataclass(frozen=True)
class GradientOptions:
    noise: float = 0.0
    clip_value: float = 0.0
    clip_norm: float = 0.0
    clip_global_norm: float = 0.0
    maximize_norm: float = 0.0

    @classmethod
    def from_config(cls, config) -> "GradientOptions":
        return cls(noise=_non_negative(config, "gradient_noise"),
                   clip_value=_non_negative(config, "gradient_clip"),
                   clip_norm=_non_negative(config, "gradient_clip_norm"),
                   clip_global_norm=_non_negative(config, "gradient_clip_global_norm"),
                   maximize_norm=_non_negative(config, "maximize_grad_norm"))


def global_norm(grads: Sequence[tf.Tensor | None]) -> tf.Tensor:
    return tf.linalg.global_norm([g for g in grads if g is not None])


def clip_by_norm(grad: tf.Tensor, clip_norm: float, rows: Sequence[int] | None = None) -> tf.Tensor:
    """``tf.clip_by_norm``, or with ``rows`` on each block of that many rows (axis 0) on its own."""
    if not rows:
        return tf.clip_by_norm(grad, clip_norm)
    parts = tf.split(grad, list(rows), axis=0)
    return tf.concat([tf.clip_by_norm(part, clip_norm) for part in parts], axis=0)


def process_gradients(grads: Sequence[tf.Tensor | None], options: GradientOptions, seed: tf.Tensor,
                      extra: Sequence[tf.Tensor | None] | None = None,
                      parts: Sequence[Sequence[int] | None] | None = None) -> list[tf.Tensor | None]:
    """The gradients to apply. ``extra``: the ``maximize_grad_norm`` term per gradient (or None);
    ``seed``: int64 (2,), the step's key for the noise; ``parts``: per gradient None, or the row counts
    of the RETURNN variables its variable holds (``gradient_clip_norm`` clips each on its own). A None
    gradient stays None (no update)."""
    norm = global_norm(grads) if options.clip_global_norm else None
    out = []
    for index, grad in enumerate(grads):
        if grad is None:
            out.append(None)
            continue
        if extra is not None and extra[index] is not None:
            grad = grad + extra[index]
        if options.noise:
            var_seed = tf.random.experimental.stateless_fold_in(
                tf.random.experimental.stateless_fold_in(seed, NOISE_STREAM), index)
            grad = grad + tf.random.stateless_truncated_normal(tf.shape(grad), seed=var_seed,
                                                               stddev=options.noise, dtype=grad.dtype)
        if options.clip_value:
            grad = tf.clip_by_value(grad, -options.clip_value, options.clip_value)
        if options.clip_norm:
            grad = clip_by_norm(grad, options.clip_norm, parts[index] if parts is not None else None)
        if norm is not None:
            grad = grad * (options.clip_global_norm / tf.maximum(norm, options.clip_global_norm))
        out.append(grad)
    return out
