"""A user's own model from the config function ``get_model``, wrapped as a ``SeqModel``.

Calling convention (keyword arguments only; accept ``**kwargs`` for forward compatibility)::

    def get_model(*, input_dim, output_dim, input_sparse, target_dims, random_seed, epoch, **kwargs):
        return keras_model_or_tf_module

The config key ``model_loss`` picks the loss against the ``classes`` target:

- ``"ce"`` (default): cross-entropy summed over the non-padded frames (RETURNN's objective; the reported
  score is its frame average); ``output_dim`` is the dim of ``classes`` and the model gives one output
  frame per input frame.
- ``"ctc"``: the ``ctc`` loss of a softmax layer (``engine/model/losses/ctc.py``, with ``model_loss_opts``
  as that layer's ``loss_opts``); ``output_dim`` is the dim of ``classes`` + 1, the blank being the last.
  The model may subsample time.

The returned object is called as ``model(data, training=training)``, plus ``lengths=lengths`` when its
``call`` (Keras) or ``__call__`` (``tf.Module``) takes a ``lengths`` argument; ``data`` and ``lengths``
are as for ``SeqModel``. It returns the **logits**, (B, T', output_dim): alone, as a pair
``(logits, out_lengths)``, or as a dict ``{"output": logits, "lengths": out_lengths}``. Without
``out_lengths`` the output has the input's lengths. A model that changes the number of frames defines
``output_lengths(lengths) -> out_lengths`` too: the forward task lays its file out by it before running.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import tensorflow as tf

from engine.model.base import LossResult, SeqModel, masked_ce_sums
from engine.model.losses.ctc import CtcLoss
from engine.runtime.errors import ConfigError

TARGET = "classes"


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind == p.VAR_KEYWORD for p in params)


def _as_tf_variable(var: Any) -> tf.Variable:
    """Keras 3 wraps each ``tf.Variable`` in its own class; the engine works on the ``tf.Variable``."""
    if isinstance(var, tf.Variable):
        return var
    inner = getattr(var, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise ConfigError(f"get_model: the model has a variable of unsupported type {type(var).__name__}.")


class CustomModel(SeqModel):
    """Wraps the object ``get_model`` returned; creates its variables with one call on a dummy batch."""

    def __init__(
        self,
        get_model: Callable,
        *,
        input_dim: int,
        input_sparse: bool,
        target_dims: dict[str, int],
        random_seed: int,
        epoch: int = 1,
        loss: str = "ce",
        loss_opts: dict | None = None,
    ) -> None:
        """``loss``, ``loss_opts``: the config's ``model_loss`` and ``model_loss_opts``."""
        super().__init__(
            input_dim=input_dim, input_sparse=input_sparse, target_dims=target_dims, name="custom"
        )
        if TARGET not in target_dims:
            raise ConfigError(
                f"get_model: the data has no '{TARGET}' target to train against "
                f"(targets: {sorted(target_dims)})."
            )
        if loss not in ("ce", "ctc"):
            raise ConfigError(f"Config key 'model_loss' must be 'ce' or 'ctc', got {loss!r}.")
        if loss == "ce" and loss_opts:
            raise ConfigError("Config key 'model_loss_opts' is given, but model_loss 'ce' takes none.")
        self.ctc = CtcLoss.from_layer_options("get_model output", {"loss_opts": loss_opts}) if loss == "ctc" \
            else None
        output_dim = target_dims[TARGET] + (1 if self.ctc else 0)
        tf.keras.utils.set_random_seed(random_seed)  # Keras initialisers draw from the global seed
        kwargs = dict(
            input_dim=input_dim,
            output_dim=output_dim,
            input_sparse=input_sparse,
            target_dims=dict(target_dims),
            random_seed=random_seed,
            epoch=epoch,
        )
        try:
            inspect.signature(get_model).bind(**kwargs)
        except TypeError as exc:
            raise ConfigError(
                f"get_model(...) cannot take the engine's keyword arguments ({exc}); "
                f"define it as get_model(*, input_dim, output_dim, input_sparse, **kwargs)."
            ) from None
        self.model = get_model(**kwargs)
        if not callable(self.model) or not hasattr(type(self.model), "variables"):  # unbuilt Keras raises
            raise ConfigError(
                f"get_model must return a Keras model or tf.Module, got {type(self.model).__name__}."
            )
        self._pass_lengths = _accepts(getattr(self.model, "call", self.model.__call__), "lengths")
        self._pass_training = _accepts(getattr(self.model, "call", self.model.__call__), "training")
        frames = 32  # enough for a model that subsamples time to give an output
        dummy_shape = [1, frames] if input_sparse else [1, frames, input_dim]
        outputs = self(
            tf.zeros(dummy_shape, tf.int32 if input_sparse else tf.float32), tf.constant([frames], tf.int32)
        )
        if outputs["output"].shape[-1] != output_dim:
            blank = " + 1 (the ctc blank)" if self.ctc else ""
            raise ConfigError(
                f"get_model: the model's output has dim {outputs['output'].shape[-1]}, but target "
                f"'{TARGET}' has dim {target_dims[TARGET]}{blank}."
            )
        self._named = self._name_variables()
        if not any(v.trainable for v in self._named.values()):
            raise ConfigError("get_model: the returned model has no trainable variables after a first call.")

    def _name_variables(self) -> dict[str, tf.Variable]:
        named: dict[str, tf.Variable] = {}
        for original in self.model.variables:
            var = _as_tf_variable(original)
            name = (getattr(original, "path", None) or var.name).split(":")[0]  # Keras 3: "dense/kernel"
            key, i = name, 1
            while key in named:  # Keras 2 and 3 may repeat short names across layers
                key, i = f"{name}_{i}", i + 1
            named[key] = var
        return named

    @property
    def loss_targets(self) -> set[str]:
        return {TARGET}

    def named_variables(self) -> dict[str, tf.Variable]:
        return dict(self._named)  # tf.Module tracking wraps the attribute; callers want a plain dict

    def __call__(self, data: tf.Tensor, lengths: tf.Tensor, training: bool = False,
                 seed: tf.Tensor | None = None, train_step: tf.Tensor | None = None,
                 stream_lengths: dict[str, tf.Tensor] | None = None) -> dict[str, tf.Tensor]:
        # the user's model draws its own random numbers, keeps its own counts and reads only its input
        kwargs: dict[str, Any] = {}
        if self._pass_training:
            kwargs["training"] = training
        if self._pass_lengths:
            kwargs["lengths"] = lengths
        out = self.model(data, **kwargs)
        out_lengths = lengths
        if isinstance(out, dict):
            logits, out_lengths = out["output"], out.get("lengths", lengths)
        elif isinstance(out, (tuple, list)):
            logits, out_lengths = out
        else:
            logits = out
        return {"output": tf.nn.softmax(logits), "output:logits": logits,
                "output:lengths": tf.cast(out_lengths, tf.int32)}

    @property
    def ctc_output(self) -> bool:
        return self.ctc is not None

    def output_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        own = getattr(self.model, "output_lengths", None)
        return lengths if own is None else tf.cast(own(lengths), tf.int32)

    def compute_losses(
        self,
        model_outputs: dict[str, tf.Tensor],
        targets: dict[str, tf.Tensor],
        target_lengths: dict[str, tf.Tensor],
        training: bool = False,
    ) -> LossResult:
        if self.ctc:
            value, err, n = self.ctc.sums(
                model_outputs["output:logits"], model_outputs["output:lengths"], targets[TARGET],
                target_lengths[TARGET], layer="get_model output", target=TARGET, training=training)
            objective = self.ctc.scale * value
            if self.ctc.normalized:
                objective = objective / tf.maximum(n, 1.0)
        else:
            value, err, n = masked_ce_sums(model_outputs["output:logits"], targets[TARGET],
                                           target_lengths[TARGET], where="get_model output")
            objective = value
        return LossResult(loss=value, error=err, num_frames=n, objective=objective)
