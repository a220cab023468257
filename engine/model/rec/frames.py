"""What a unit layer's output is: a tensor with named axes, so that layers broadcast and reduce by axis, not
by position (RETURNN does this with dim tags).

A ``Template`` describes one step's output: (batch, *axes, dim), or (batch, *axes) of class ids where it
is ``sparse``. Each axis has a label: ``T:<layer>`` for the time axis of a layer of the network around the
rec layer (an encoder's frames, with their lengths), ``S:<size>:<origin>`` for a static axis (a head axis
from split_dims). A ``Value`` is a template with its tensor, one step ((B, *axes, F)) or, where the
layer runs outside the loop, all steps ((B, L, *axes, F)): ``looped``.
"""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class Axis:
    label: str
    size: int | None  # None: dynamic, its lengths come with the base layer (``Value.lengths``)

    @property
    def dynamic(self) -> bool:
        return self.size is None


@dataclass(frozen=True)
class Template:
    axes: tuple[Axis, ...]
    dim: int
    sparse: bool = False
    dtype: tf.DType = tf.float32

    def describe(self) -> str:
        axes = ", ".join(a.label if a.dynamic else str(a.size) for a in self.axes)
        kind = f"ids of {self.dim} classes" if self.sparse else f"dim {self.dim}"
        return f"(batch{', ' + axes if axes else ''}) {kind}"


@dataclass
class Value:
    tensor: tf.Tensor
    template: Template
    looped: bool  # has the loop's time axis at position 1 (computed outside the loop)

    @property
    def first_axis(self) -> int:
        """The position of ``template.axes[0]`` in the tensor."""
        return 2 if self.looped else 1

    def axis_position(self, label: str) -> int:
        labels = [a.label for a in self.template.axes]
        return self.first_axis + labels.index(label)


def broadcast_axes(templates: list[Template]) -> tuple[Axis, ...]:
    """The union of the templates' axes, in the order they first appear."""
    axes: list[Axis] = []
    for template in templates:
        for axis in template.axes:
            if axis.label not in [a.label for a in axes]:
                axes.append(axis)
    return tuple(axes)


def pair_static(first: tuple[Axis, ...], second: tuple[Axis, ...]) -> dict[str, str]:
    """Labels of ``second``'s static axes -> the label of the axis of ``first`` each pairs with, where the
    label differs: the first unpaired static axis of ``first`` of the same size (RETURNN matches static
    axes of two sources by size)."""
    pairs: dict[str, str] = {}
    free = [a for a in first if not a.dynamic and a.label not in [b.label for b in second]]
    for axis in second:
        if axis.dynamic or axis.label in [a.label for a in first]:
            continue
        match = next((a for a in free if a.size == axis.size), None)
        if match is not None:
            free.remove(match)
            pairs[axis.label] = match.label
    return pairs


def aligned(value: Value, axes: tuple[Axis, ...], looped: bool) -> tf.Tensor:
    """The value's tensor laid out as (B, [L], *axes, [F]) with size-1 axes where it has none, so that
    values of different axes broadcast against each other."""
    x = value.tensor
    own = [a.label for a in value.template.axes]
    if own != [a.label for a in axes if a.label in own]:  # reorder to the target's order
        first = value.first_axis
        order = [first + own.index(a.label) for a in axes if a.label in own]
        rest = list(range(first + len(own), len(x.shape)))
        x = tf.transpose(x, list(range(first)) + order + rest)
        own = [a.label for a in axes if a.label in own]
    if looped and not value.looped:
        x = tf.expand_dims(x, 1)
    first = 2 if looped else 1
    for index, axis in enumerate(axes):
        if axis.label not in own:
            x = tf.expand_dims(x, first + index)
    return x


def step_slice(value: Value, step: tf.Tensor) -> Value:
    """One step of a value computed outside the loop."""
    return Value(value.tensor[:, step], value.template, looped=False)


def loose_batch(x: tf.Tensor) -> tf.Tensor:
    """``x`` with its batch size unknown to the graph: a loop variable's first value must be no more
    specific than what the loop body makes of it."""
    return tf.raw_ops.PlaceholderWithDefault(input=x, shape=[None] + x.shape.as_list()[1:])
