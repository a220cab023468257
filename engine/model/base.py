"""What the training loop sees of any model: ``SeqModel`` (call + losses) and ``LossResult``.

Losses are returned as sums over non-padded frames together with the frame count, so that the loop can
reduce across ranks by sum-then-divide and report frame-averaged scores that do not depend on how the
frames were split into batches or ranks.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import tensorflow as tf

from engine.model.losses.cross_entropy import CrossEntropy
from engine.model.losses.data_checks import require
from engine.runtime.errors import DataError


class LossResult(NamedTuple):
    """Scalar float32 tensors for one batch (a NamedTuple, so it can leave a ``tf.function``).

    ``loss``: the main loss layer's loss (cross-entropy with the layer's ``loss_opts`` summed over
    non-padded frames; CTC: -log p summed over sequences), unscaled: the reported score, as RETURNN's
    ``score_output``.
    ``error``: of the main loss layer: frame errors (argmax != target) summed over non-padded frames;
    CTC: the edit distances of the decoded labels to the targets, summed.
    ``num_frames``: what the main loss layer's scores are divided by: the non-padded frames of its
    target, for CTC its target labels (RETURNN's normalisation of both).
    ``objective``: RETURNN's objective for the batch: over the loss layers, ``loss_scale`` * the loss
    summed over the batch (divided by the layer's own count where ``use_normalized_loss`` says so).
    ``regularizer``: the layers' ``L2`` terms (not normalised by frames; ``Steps`` decides how it
    enters the differentiated quantity), 0 without any.
    ``data_regularizer``: the layers' ``darc1`` terms: like ``regularizer``, but they depend on the
    batch, so every rank adds its own (and ``decouple_constraints`` leaves them in).
    """

    loss: tf.Tensor
    error: tf.Tensor
    num_frames: tf.Tensor
    objective: tf.Tensor
    regularizer: tf.Tensor | float = 0.0
    data_regularizer: tf.Tensor | float = 0.0


def _frame_labels(labels: tf.Tensor, frames: tf.Tensor, where: str) -> tf.Tensor:
    """``labels`` as int32 (B, T), checked to be class ids with one per frame of the output's ``frames``
    time steps (the check runs before any op that combines the two)."""
    labels = tf.cast(labels, tf.int32)
    if labels.shape.rank is not None and labels.shape.rank != 2:
        raise DataError(
            f"Loss of layer '{where}': the target must be sparse class ids of shape "
            f"(batch, time), but it has shape {labels.shape}."
        )
    # a frame-wise loss needs one target per output frame; targets with their own lengths (labels for
    # CTC) would otherwise end in a shape error deep inside TensorFlow
    return require(
        tf.equal(tf.shape(labels)[1], frames),
        [f"Loss of layer '{where}' is frame-wise: its target must have one entry per output frame, but the "
         "target's padded length differs from the output's (a target with its own lengths, such as a "
         "label sequence, needs a sequence loss like 'ctc')."], labels)


def masked_ce_sums(
    logits: tf.Tensor, labels: tf.Tensor, lengths: tf.Tensor, where: str,
    criterion: CrossEntropy | None = None,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Cross-entropy sum (unscaled; ``criterion`` adds RETURNN's ``loss_opts``), frame-error sum and frame
    count over the frames ``t < lengths[b]``.

    ``logits`` (B, T, C), ``labels`` (B, T) int, ``lengths`` (B,). Padded labels may hold anything
    (even out-of-range ids): they are replaced before the loss op sees them. ``where`` names the layer
    for error messages.
    """
    labels = _frame_labels(labels, tf.shape(logits)[1], where)
    mask = tf.sequence_mask(lengths, tf.shape(logits)[1])
    safe_labels = tf.where(mask, labels, tf.zeros_like(labels))
    ce = (criterion or CrossEntropy()).frame_losses(logits, safe_labels)
    zeros = tf.zeros_like(ce)
    loss_sum = tf.reduce_sum(tf.where(mask, ce, zeros))
    wrong = tf.not_equal(tf.argmax(logits, axis=-1, output_type=tf.int32), safe_labels)
    error_sum = tf.reduce_sum(tf.cast(tf.logical_and(mask, wrong), tf.float32))
    num_frames = tf.reduce_sum(tf.cast(mask, tf.float32))
    return loss_sum, error_sum, num_frames


def packed_ce_sums(
    inputs: tf.Tensor, project: Callable[[tf.Tensor], tf.Tensor], labels: tf.Tensor, lengths: tf.Tensor,
    where: str, criterion: CrossEntropy | None = None,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``masked_ce_sums`` of the logits ``project(inputs)``, projecting only the frames it scores.

    ``inputs`` (T, B, F), time-major as the layers compute it: what ``project`` maps row by row to logits
    (a softmax layer's input); ``labels`` (B, T). The frames ``t < lengths[b]`` are gathered first, so the
    padding gets neither logits nor a softmax: RETURNN computes the logits of every frame and flattens them
    by this mask before its loss (the same values); with thousands of classes and chunked batches a third
    of a step's time went to the padding. Gathering time-major spares a transpose of the inputs and one of
    their gradient.
    """
    labels = _frame_labels(labels, tf.shape(inputs)[0], where)
    frames = tf.where(tf.transpose(tf.sequence_mask(lengths, tf.shape(inputs)[0])))  # (N, 2): (time, seq)
    logits = project(tf.gather_nd(inputs, frames))  # (N, C)
    frame_labels = tf.gather_nd(labels, tf.reverse(frames, [1]))
    loss_sum = tf.reduce_sum((criterion or CrossEntropy()).frame_losses(logits, frame_labels))
    wrong = tf.not_equal(tf.argmax(logits, axis=-1, output_type=tf.int32), frame_labels)
    return loss_sum, tf.reduce_sum(tf.cast(wrong, tf.float32)), tf.cast(tf.shape(frames)[0], tf.float32)


class SeqModel(tf.Module):
    """A sequence model the engine can train: all variables exist after construction.

    ``__call__(data, lengths, training)`` takes batch-major ``data`` ((B, T, input_dim) float32, or (B, T)
    int32 class ids when ``input_sparse``) and ``lengths`` (B,) int32, and returns a dict of layer outputs
    (B, T, dim); it contains at least ``"output"``. Softmax layers add ``"<name>:logits"`` and
    ``"<name>:lengths"`` (B,) (their frames, which subsampling may have made fewer than the input's).
    """

    def __init__(
        self, *, input_dim: int, input_sparse: bool, target_dims: dict[str, int], name: str | None = None
    ) -> None:
        super().__init__(name=name)
        self.input_dim = int(input_dim)
        self.input_sparse = bool(input_sparse)
        self.target_dims = dict(target_dims)

    @property
    def input_signature(self) -> tuple[tf.TensorSpec, tf.TensorSpec]:
        """Specs of ``(data, lengths)``, unknown batch and time: for ``tf.function(input_signature=...)``."""
        if self.input_sparse:
            data = tf.TensorSpec([None, None], tf.int32, name="data")
        else:
            data = tf.TensorSpec([None, None, self.input_dim], tf.float32, name="data")
        return data, tf.TensorSpec([None], tf.int32, name="lengths")

    @property
    def loss_targets(self) -> set[str]:
        """The target keys the losses are computed against."""
        raise NotImplementedError

    @property
    def input_streams(self) -> set[str]:
        """The data streams besides ``data`` that layers read as input (``"from": "data:delayed"``): the
        steps load and feed them as they load the targets."""
        return set()

    @property
    def recurrent(self) -> bool:
        """Whether the order of frames matters (RETURNN chunks the training data only then)."""
        return True

    @property
    def ctc_output(self) -> bool:
        """Whether ``"output"`` is trained with the ctc loss (its last class is the blank)."""
        return False

    def output_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        """The lengths of ``"output"`` for inputs of ``lengths`` (B,): what the forward task lays its file
        out by before it runs the model. The same as the input's unless a layer subsamples time."""
        return lengths

    def named_variables(self) -> dict[str, tf.Variable]:
        """All variables by a stable name (same names and order on every rank), for checkpoints."""
        raise NotImplementedError

    def running_state(self) -> dict[str, tf.Variable]:
        """The non-trainable variables that the model's training call updates itself (batch_norm's running
        statistics), by their names in ``named_variables``: each data-parallel rank updates its own, and
        ``engine/training/running_state.py`` averages them over the ranks. None in most models."""
        return {}

    def named_trainable_variables(self) -> dict[str, tf.Variable]:
        """The trainable ones, in the order of ``trainable_variables`` (build an ``Updater`` from this)."""
        return {name: v for name, v in self.named_variables().items() if v.trainable}

    def l2_factors(self) -> dict[str, float]:
        """Trainable variable name (as in ``named_trainable_variables``) -> the ``L2`` of the layer it
        belongs to, for those with an L2; with ``decouple_constraints`` the updater decays these instead
        of ``LossResult.regularizer`` carrying them. A model without layer L2 options has none."""
        return {}

    def score_layers(self) -> list[str]:
        """The loss layers RETURNN reports a score for (``dev_score_<layer>``), the main one first: the one
        whose score and error this engine reports (``dev_score``, ``dev_error``)."""
        return ["output"]

    def returnn_parts(self) -> dict[str, tuple[int, ...]]:
        """Trainable variable name -> the row counts of the separate variables RETURNN keeps it as, for
        the variables this engine merges (an LSTM's input and recurrent weights in one ``W``). What RETURNN
        does to each of its variables on its own (``gradient_clip_norm``) the updater does to each part.
        A model whose variables are RETURNN's one to one has none."""
        return {}

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return tuple(self.named_variables().values())

    @property
    def trainable_variables(self) -> tuple[tf.Variable, ...]:
        return tuple(self.named_trainable_variables().values())

    def __call__(self, data: tf.Tensor, lengths: tf.Tensor, training: bool = False,
                 seed: tf.Tensor | None = None, train_step: tf.Tensor | None = None,
                 stream_lengths: dict[str, tf.Tensor] | None = None) -> dict[str, tf.Tensor]:
        """``seed``: int64 (2,), the key of the random numbers (dropout) of this call in training;
        ``train_step``: int64 scalar, RETURNN's ``global_train_step`` (the batches trained before this one),
        which config code in ``eval`` layers may read; None where no training counts (it reads 0 then);
        ``stream_lengths``: the (B,) lengths of the other data streams of the batch (its targets), where
        the step has them."""
        raise NotImplementedError

    def compute_losses(
        self,
        model_outputs: dict[str, tf.Tensor],
        targets: dict[str, tf.Tensor],
        target_lengths: dict[str, tf.Tensor],
        training: bool = False,
    ) -> LossResult:
        """``training``: for the train step (losses with ``only_on_eval`` are left out, and CTC's label
        error decodes greedily)."""
        raise NotImplementedError
