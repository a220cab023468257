"""RETURNN's ``dot`` between a layer's frames and one frame of another (2022-swb-conformer-hybrid-sat's
i-vector paths), its axes given as RETURNN numbers them batch-major: 0 the batch, 1 the time, 2 the
features of a (T, B, F) output.

The first source's time axis stays (``var1`` 1) and its features are reduced (``red1`` 2). The second
source is one frame (a ``reduce`` over time with ``keep_dims``: RETURNN's static axis of size 1), and
either
- its features are reduced against the first's (``red2`` 2) and its frame axis is the output's feature
  axis of size 1 (``var2`` 1): a score per frame; or
- its frame axis is reduced against the first's features of size 1 (``red2`` 1) and its features are
  the output's (``var2`` 2): those features weighted per frame.
Other combinations (two time axes, a reduced time axis of many frames) are refused with the reason: this
engine's outputs have one time axis and static features.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.axes import Layout
from engine.model.layers.base import Layer
from engine.runtime.errors import ConfigError

TIME, FEATURE = 1, 2  # RETURNN's batch-major axis numbers of a (T, B, F) output
_NAMED = {"t": TIME, "time": TIME, "f": FEATURE, "feature": FEATURE}


def _axis(name: str, key: str, value: object) -> int:
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, str) and value.lower() in _NAMED:
        return _NAMED[value.lower()]
    if value in (TIME, FEATURE) and not isinstance(value, bool):
        return int(value)
    raise ConfigError(f"Network layer '{name}': dot {key} {value!r} must name the time (1, 'T') or "
                      "feature (2, 'F') axis of its (batch, time, feature) source, as RETURNN numbers them "
                      "batch-major.")


class Dot(Layer):
    """``dot`` of a layer's frames (first source) and one frame (second source); see the module."""

    separate_sources = True

    def __init__(self, name: str, opts: dict, layouts: list[Layout]) -> None:
        if len(layouts) != 2 or any(layout.spatial for layout in layouts):
            raise ConfigError(f"Network layer '{name}': dot takes two sources of (time, batch, feature) "
                              f"here, got {[layout.describe() for layout in layouts]}.")
        super().__init__(layouts[0].feature)
        self.layer_name = name
        red1, red2, var1, var2 = (_axis(name, key, opts.get(key)) for key in ("red1", "red2", "var1", "var2"))
        first, second = layouts
        if (red1, var1) != (FEATURE, TIME) or red2 == var2:
            raise ConfigError(f"Network layer '{name}': dot with red1 {red1}, var1 {var1}, red2 {red2}, var2 "
                              f"{var2} is not implemented: the first source's features are reduced (red1 2) "
                              "and its frames kept (var1 1), and the second's other axis is kept; this "
                              "engine's outputs have one time axis.")
        self.weighted = red2 == TIME  # the second source's features, weighted per frame
        if self.weighted and first.feature != 1:
            raise ConfigError(f"Network layer '{name}': dot reduces the first source's {first.feature} "
                              "features against the second source's one frame: they must be 1.")
        if not self.weighted and first.feature != second.feature:
            raise ConfigError(f"Network layer '{name}': dot reduces the features of its sources, "
                              f"{first.feature} and {second.feature}: they must be equal.")
        self.n_out = second.feature if self.weighted else 1

    def __call__(self, xs: list[tf.Tensor], lengths: tf.Tensor, training: bool) -> tf.Tensor:
        frames, one = xs
        check = tf.debugging.assert_equal(
            tf.shape(one)[0], 1, message=f"Network layer '{self.layer_name}': dot's second source must be "
                                         "one frame (a reduce over time with keep_dims)")
        with tf.control_dependencies([check]):
            if self.weighted:  # (T, B, 1) x (1, B, F) -> (T, B, F)
                return frames * one
            return tf.einsum("tbf,sbf->tbs", frames, one)  # (T, B, 1)
