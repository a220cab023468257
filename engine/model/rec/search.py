"""Beam search through a rec unit, as RETURNN's ``choice`` layer searches (RETURNN 1.2026, ``ChoiceLayer``
in search, ``RecLayer``'s loop with an ``end`` layer).

Every hypothesis is one row of a (batch * beam) batch from the first step on; at step 0 only the first beam
entry of each sequence is live (the others start at a score of -1e30, which top-k never picks while the
classes outnumber the beam: RETURNN's beam of 1 at step 0). At each step the unit's layers run in order
until the choice: its source's probabilities as log scores (``input_type`` "prob"; "log_prob" as they
are), an ended hypothesis' scores replaced by 0 for label 0 and -1e30 for the others, with
``length_normalization`` the ended hypotheses' beam scores times ((t + 1) / t) ** exponent, added to
the beam scores, and the best ``beam_size`` of (beam * classes) kept (``tf.math.top_k``). Everything
computed so far that is still needed (this step's values that later layers or the next step read, the
previous step's that later layers read, the cells' states, the end flags and lengths) then follows its
hypothesis to its new row, and the layers after the choice run on the chosen labels.
``end`` (ORed with the previous step's) stops a hypothesis: its length counts the steps before its end
(RETURNN's ``include_eos`` False). The loop stops when every hypothesis ended or at ``max_seq_len``. The
labels are traced back from the last step through each step's source beams; the decision is the
hypothesis with the best score (divided by its length with the decide layer's ``length_normalization``).
With the choice's ``length_normalization`` the final scores are divided by the longest length of the
batch + 1, as RETURNN ends it: an ended hypothesis' score is then its log probability over its length + 1.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from engine.model.rec.frames import Value, loose_batch
from engine.model.rec.score_combine import ChoiceView, SourceView, combined_scores
from engine.model.rec.step_select import step_value
from engine.model.rec.unit import Ref
from engine.runtime.errors import ConfigError

LOW_SCORE = -1.0e30  # RETURNN's score of the labels an ended hypothesis may not take
BEAM_KEYS = ("beam", "beam_lengths", "beam_scores")  # the final beam in the outputs: "<rec>:<key>"


def choice_options(where: str, opts: dict) -> tuple[int, str, float]:
    """(beam_size, input_type, length normalisation exponent or 0 when off) of a choice layer."""
    beam = opts.get("beam_size")
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ConfigError(f"{where}: choice needs 'beam_size', a positive int, got {beam!r}.")
    input_type = opts.get("input_type", "prob")
    if input_type not in ("prob", "log_prob"):
        raise ConfigError(f"{where}: choice input_type {input_type!r} is not one of 'prob', 'log_prob'.")
    normalization = opts.get("length_normalization", True)
    if not isinstance(normalization, bool):
        raise ConfigError(f"{where}: choice length_normalization must be True or False.")
    return beam, input_type, 1.0 if normalization else 0.0


def _regroup(x: tf.Tensor, src_beams: tf.Tensor, beam: int) -> tf.Tensor:
    """Rows of (batch * beam, ...) moved to their new hypotheses: row (b, k) takes row
    (b, src_beams[b, k])."""
    shape = tf.shape(x)
    grouped = tf.reshape(x, tf.concat([[-1, beam], shape[1:]], 0))
    moved = tf.reshape(tf.gather(grouped, src_beams, batch_dims=1), shape)
    moved.set_shape(x.shape)
    return moved


class BeamSearch:
    """One search through the unit of a ``LoopRun`` (loop_run.py) whose base values are already tiled."""

    def __init__(self, run: Any, loop: list[str], batch: tf.Tensor, beam: int, max_len: tf.Tensor) -> None:
        self.run, self.loop, self.batch, self.beam, self.max_len = run, loop, batch, beam, max_len
        net = run.net
        choice = net.spec["output"]
        _, self.input_type, self.exponent = choice_options(net.ctx.where("output"), choice.opts)
        self.choice_source = choice.sources[0].name
        opts = choice.opts
        self.combine = opts.get("custom_score_combine")
        self.explicit = opts.get("explicit_search_sources") or opts.get("explicit_search_source")

        def reads(names: list[str], kind: str) -> set[str]:
            return {r.name for n in names for r in net.spec[n].refs(training=False) if r.kind == kind}

        self.read_prev = sorted(reads(loop, "prev"))
        self.cells = [n for n in loop if n in net.units and net.units[n].stateful]
        # What must follow its hypothesis at the choice: of this step's values, those that a layer after
        # the choice reads, the next step's prev: values and 'end'; of the previous step's, those that a
        # layer after the choice reads. The rest was used up before the choice (most of a Transformer
        # decoder's layers), and moving it would cost a gather per layer and step for nothing.
        after = loop[loop.index("output") + 1:]
        self.frame_moved = reads(after, "cur") | set(self.read_prev) | {"end"}
        self.prev_moved = reads(after, "prev")

    def search(self, decide_by_length: bool) -> tuple[tuple[tf.Tensor, tf.Tensor, tf.Tensor],
                                                      tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
        """The decided hypotheses: labels (B, T), lengths (B,), scores (B,); and the final beam, best
        first (as RETURNN's rec layer keeps it): labels (B, K, T), lengths (B, K), scores (B, K)."""
        run, net, rows = self.run, self.run.net, self.batch * self.beam
        prev0 = {n: run._initial(n, rows) for n in self.read_prev}
        cells0 = {n: net.units[n].initial_state(rows) for n in self.cells}
        first = tf.one_hot(0, self.beam, on_value=0.0, off_value=LOW_SCORE)
        scores0 = tf.tile(first[None], tf.stack([self.batch, 1]))
        ended0, lengths0 = tf.zeros([rows], tf.bool), tf.zeros([rows], tf.int32)
        prev0, cells0, scores0, ended0, lengths0 = tf.nest.map_structure(
            loose_batch, (prev0, cells0, scores0, ended0, lengths0))
        labels0 = tf.TensorArray(tf.int32, size=0, dynamic_size=True)
        sources0 = tf.TensorArray(tf.int32, size=0, dynamic_size=True)

        def cond(t, prev, cells, scores, ended, lengths, labels, sources):
            return tf.logical_and(t < self.max_len, tf.logical_not(tf.reduce_all(ended)))

        def body(t, prev, cells, scores, ended, lengths, labels, sources):
            frame: dict[str, Value] = {}
            new_cells: dict = {}
            state = {"prev": dict(prev), "cells": dict(cells), "ended": ended, "lengths": lengths}

            def resolve(ref: Ref) -> Value:
                if ref.kind == "base":
                    return run.base[ref.name]
                if ref.kind == "step":
                    return step_value(rows, t)
                if ref.kind == "cur":
                    return frame[ref.name]
                return Value(state["prev"][ref.name], net.templates[ref.name], looped=False)

            for name in self.loop:
                if name == "output":
                    layer = self._choice_view(resolve) if self.combine else None
                    probs = frame[self.choice_source].tensor
                    label, src, scores = self._choose(probs, scores, t, ended, layer)
                    self._follow(src, frame, state, new_cells)
                    frame[name] = Value(label, net.templates[name], looped=False)
                    continue
                cell_states = state["cells"]
                frame[name] = run.step_layer(name, resolve, t, cell_states, new_cells)
            is_end = tf.reshape(frame["end"].tensor, [rows]) if "end" in frame else tf.zeros([rows], tf.bool)
            ended = tf.logical_or(state["ended"], is_end)
            lengths = state["lengths"] + tf.where(ended, 0, 1)
            labels = labels.write(t, tf.reshape(frame["output"].tensor, [self.batch, self.beam]))
            sources = sources.write(t, self._src)
            prev = {n: frame[n].tensor for n in self.read_prev}
            cells = {n: new_cells.get(n, state["cells"][n]) for n in self.cells}
            return t + 1, prev, cells, scores, ended, lengths, labels, sources

        steps, _, _, scores, _, lengths, labels, sources = tf.while_loop(
            cond, body, (tf.constant(0), prev0, cells0, scores0, ended0, lengths0, labels0, sources0))
        hyps = self._trace_back(labels.stack(), sources.stack(), steps)  # (B, K, T)
        if self.exponent:
            # RETURNN's choice ends its length normalisation so: each ended hypothesis' score was grown by
            # steps / (its length + 1), so dividing by the steps (the longest length of the batch + 1, the
            # end included) leaves every ended score divided by its own length + 1
            scores = scores / tf.cast(tf.reduce_max(lengths) + 1, tf.float32)
        lengths = tf.reshape(lengths, [self.batch, self.beam])
        final = scores / tf.cast(tf.maximum(lengths, 1), tf.float32) if decide_by_length else scores
        best = tf.argmax(final, axis=1, output_type=tf.int32)
        pick = tf.stack([tf.range(self.batch), best], axis=1)
        decided = tf.gather_nd(hyps, pick), tf.gather_nd(lengths, pick), tf.gather_nd(scores, pick)
        return decided, (hyps, lengths, scores)

    def _choice_view(self, resolve: Any) -> ChoiceView:
        """The ``layer`` a custom_score_combine reads: the explicit search sources' values at this step."""
        spec = self.run.net.spec["output"]
        views = [SourceView(str(ref), resolve(ref).tensor, self.run.net.templates[ref.name].dim,
                            self.run.net.templates[ref.name].sparse) for ref in spec.search_refs]
        if isinstance(self.explicit, dict):  # the config's keys, in its order, as search_refs
            sources: Any = dict(zip(self.explicit, views))
        elif self.explicit:
            sources = views
        else:
            sources = None
        return ChoiceView("output", self.run.net.templates["output"].dim, sources)

    def _choose(self, probs: tf.Tensor, scores: tf.Tensor, t: tf.Tensor, ended: tf.Tensor,
                layer: ChoiceView | None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        classes = tf.shape(probs)[-1]
        log_probs = tf.math.log(probs) if self.input_type == "prob" else probs
        only_end = tf.one_hot(0, classes, on_value=0.0, off_value=LOW_SCORE)
        log_probs = tf.where(ended[:, None], only_end[None], log_probs)
        if self.exponent:
            grown = tf.pow(tf.cast(t + 1, tf.float32) / tf.cast(t, tf.float32), self.exponent)
            scores = scores * tf.where(tf.reshape(ended, [self.batch, self.beam]), grown, 1.0)
        log_probs = tf.reshape(log_probs, [self.batch, self.beam, classes])
        if layer is None:
            combined = scores[:, :, None] + log_probs
        else:
            where = self.run.net.ctx.where("output")
            combined = combined_scores(self.combine, where, layer, log_probs, scores,
                                       tf.reshape(ended, [self.batch, self.beam]), t, self.batch, self.beam,
                                       LOW_SCORE)
        top, index = tf.math.top_k(tf.reshape(combined, [self.batch, -1]), k=self.beam)
        self._src = index // classes
        return tf.reshape(index % classes, [-1]), self._src, top

    def _follow(self, src: tf.Tensor, frame: dict, state: dict, new_cells: dict) -> None:
        """What is still needed of the old rows (``frame_moved``, ``prev_moved``, the cells' states, the
        end flags and lengths) moves to the new hypotheses' rows."""
        move = lambda x: _regroup(x, src, self.beam)  # noqa: E731
        for name in self.frame_moved & set(frame):
            value = frame[name]
            frame[name] = Value(move(value.tensor), value.template, value.looped)
        state["prev"] = {n: move(x) if n in self.prev_moved else x for n, x in state["prev"].items()}
        state["cells"] = {n: tuple(move(x) for x in c) for n, c in state["cells"].items()}
        for name, cell in new_cells.items():
            new_cells[name] = tuple(move(x) for x in cell)
        state["ended"], state["lengths"] = move(state["ended"]), move(state["lengths"])

    def _trace_back(self, labels: tf.Tensor, sources: tf.Tensor, steps: tf.Tensor) -> tf.Tensor:
        """(T, B, K) labels and source beams -> (B, K, T) label sequences of the final hypotheses."""
        def back(carry, step):
            beams = carry
            step_labels, step_sources = step
            picked = tf.gather(step_labels, beams, batch_dims=1)
            return tf.gather(step_sources, beams, batch_dims=1), picked

        start = loose_batch(tf.tile(tf.range(self.beam)[None], tf.stack([self.batch, 1])))
        _, picked = tf.scan(lambda c, s: back(c[0], s), (labels, sources), initializer=(start, start),
                            reverse=True)
        return tf.transpose(picked, [1, 2, 0])
