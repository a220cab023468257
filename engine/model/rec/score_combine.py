"""A choice's ``custom_score_combine``: the config's function that combines the label scores with the beam
scores at each step of a search, in place of their sum, as RETURNN's ``ChoiceLayer`` calls it (RETURNN
1.2026): ``fn(layer=, scores_in=, scores_base=, t=, end_flags=, batch_dim=, scores_beam_in=, base_beam_in=)``.

RETURNN hands it the choice layer itself; such functions read ``layer.explicit_search_sources[i].output``
(each source's value per hypothesis, ``.copy_as_batch_major().placeholder``) and ``layer.output.dim``. The
engine hands a stand-in with those attributes (``ChoiceView``, ``SourceView``); an attribute of RETURNN's
layers it lacks ends the search with a ConfigError naming it, not with a traceback deep in the function.
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from engine.runtime.errors import ConfigError


class _StandInError(AttributeError):
    """An attribute of RETURNN's objects that the stand-in does not provide."""


class _View:
    _what = ""
    _offers = ""

    def __getattr__(self, name: str) -> Any:
        raise _StandInError(f"it reads {self._what}.{name}, which this engine's stand-in for RETURNN's "
                            f"object does not provide (it provides {self._offers})")


class SourceView(_View):
    """``layer.explicit_search_sources[i].output`` (and the layer itself, whose ``output`` it is): the
    source's value at this step, one row per hypothesis, batch-major (batch outer, beam inner), the engine's
    layout of a unit layer (batch, its axes, features)."""

    _offers = ("name, output, and of output: placeholder, copy_as_batch_major(), "
               "get_placeholder_as_batch_major(), batch_dim_axis, dim, shape, sparse, dtype")

    def __init__(self, name: str, value: tf.Tensor, dim: int, sparse: bool) -> None:
        self._what = f"the explicit search source '{name}'"
        self.name, self.placeholder, self.dim, self.sparse = name, value, dim, sparse
        self.batch_dim_axis, self.dtype = 0, value.dtype.name
        self.shape = tuple(value.shape[1:])
        self.output = self

    def copy_as_batch_major(self) -> "SourceView":
        return self

    def get_placeholder_as_batch_major(self) -> tf.Tensor:
        return self.placeholder


class _OutputView(_View):
    _what = "layer.output"
    _offers = "dim, sparse (the choice's output is computed after the function)"

    def __init__(self, dim: int) -> None:
        self.dim, self.sparse = dim, True


class ChoiceView(_View):
    """The ``layer`` argument: the choice's name, its output's ``dim``, its ``explicit_search_sources`` (as
    the config gave them: a list, a dict by the config's keys, or None) and ``cheating`` (False)."""

    _what = "layer"
    _offers = "name, output (dim, sparse), explicit_search_sources, cheating"

    def __init__(self, name: str, dim: int, sources: list[SourceView] | dict[str, SourceView] | None) -> None:
        self.name, self.output, self.cheating = name, _OutputView(dim), False
        self.explicit_search_sources = sources


def combined_scores(fn: Callable, where: str, layer: ChoiceView, scores_in: tf.Tensor, scores_base: tf.Tensor,
                    ended: tf.Tensor, t: tf.Tensor, batch: tf.Tensor, beam: int, low: float) -> tf.Tensor:
    """(batch, beam, classes) scores to pick the best ``beam`` of, from the function's result.

    ``scores_in`` (batch, beam, classes): the labels' log scores (an ended hypothesis' already restricted
    to label 0); ``scores_base`` (batch, beam): the beam scores (length-normalised); ``ended`` (batch, beam).
    RETURNN's beam at step 0 is one hypothesis wide (``base_beam_in`` 1; the layers' values still have
    ``scores_beam_in`` = beam rows per sequence, as here): the function sees that one, and the other entries
    get ``low``, which top-k never picks while the classes outnumber the beam.
    """
    base_beam_in = tf.where(tf.equal(t, 0), 1, beam)
    name = getattr(fn, "__name__", fn)
    try:
        result = fn(layer=layer, scores_in=scores_in[:, :base_beam_in],
                    scores_base=scores_base[:, :base_beam_in, None], t=t, end_flags=ended[:, :base_beam_in],
                    batch_dim=batch, scores_beam_in=tf.constant(beam), base_beam_in=base_beam_in)
    except _StandInError as error:
        raise ConfigError(f"{where}: custom_score_combine {name!r}: {error}.") from None
    if not isinstance(result, tf.Tensor) or result.shape.rank != 3:
        raise ConfigError(f"{where}: custom_score_combine {name!r} must return a "
                          "tensor of (batch, base_beam_in, classes) scores, as RETURNN asserts; got "
                          f"{result!r:.200}.")
    fill = tf.fill(tf.stack([batch, beam - base_beam_in, tf.shape(scores_in)[-1]]), low)
    return tf.concat([tf.cast(result, tf.float32), fill], axis=1)
