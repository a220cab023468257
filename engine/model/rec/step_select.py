"""Choosing per step inside a rec unit: the step index ``:i`` and the ``switch`` layer.

``:i`` (RETURNN's ``rec_step_info``) is the loop's step, 0 at the first label or frame; here one int per
row, read by ``compare`` layers (RETURNN's internal-LM setups: ``is_first_frame``). RETURNN keeps it in
the loop (its plan never moves it in front), and so every layer that reads it, unless it moves behind.

``switch``: ``condition``, ``true_from``, ``false_from``, each a layer of the unit (or ``base:``/``prev:``);
the output is ``true_from`` where the condition holds, else ``false_from``, broadcast by axis
(RETURNN's ``SwitchLayer`` with layers: ``tf.where``).
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.rec.frames import Template, Value, aligned, broadcast_axes
from engine.model.rec.step_layers import UnitContext, UnitLayer
from engine.runtime.errors import ConfigError

STEP = Template((), 1, sparse=True, dtype=tf.int32)


def step_value(rows: tf.Tensor, t: tf.Tensor) -> Value:
    """``:i`` at step ``t`` for ``rows`` rows."""
    return Value(tf.fill([rows], tf.cast(t, tf.int32)), STEP, looped=False)


def all_steps_value(rows: tf.Tensor, steps: tf.Tensor) -> Value:
    """``:i`` on every step at once, (B, L): for a layer the plan moved behind the loop."""
    return Value(tf.tile(tf.range(steps)[None], tf.stack([rows, 1])), STEP, looped=True)


class Switch(UnitLayer):
    @classmethod
    def switch_template(cls, name: str, condition: Template, true: Template, false: Template,
                        ctx: UnitContext) -> Template:
        if condition.dtype != tf.bool:
            raise ConfigError(f"{ctx.where(name)}: switch's condition must be a compare layer's output "
                              f"(bool), got {condition.describe()}.")
        if (true.dim, true.sparse) != (false.dim, false.sparse):
            raise ConfigError(f"{ctx.where(name)}: switch's true_from {true.describe()} and false_from "
                              f"{false.describe()} differ in their features.")
        if not condition.sparse and condition.dim not in (1, true.dim):
            raise ConfigError(f"{ctx.where(name)}: switch's condition {condition.describe()} does not "
                              f"broadcast to the features of its branches ({true.dim}).")
        return Template(broadcast_axes([true, false, condition]), true.dim, true.sparse, true.dtype)

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        condition = options["condition"]
        cond = aligned(condition, self.template.axes, looped)
        if condition.template.sparse and not self.template.sparse:
            cond = cond[..., None]  # a per-row condition holds for every feature
        true, false = (aligned(options[k], self.template.axes, looped) for k in ("true_from", "false_from"))
        return tf.where(cond, true, false)
