"""Mixed precision: ``tf_amp``, RETURNN's key for it in its TensorFlow engine (the counterpart of
``torch_amp``), with RETURNN's values: ``"bfloat16"``, ``"float16"``, or a dict ``{"dtype": ...}``.

What it means here, as in RETURNN (``returnn/frontend/amp.py``): the parameters stay float32 (the
master copy, which the optimizer, its state, the gradients and checkpoints see); each layer casts them
to the compute dtype where it uses them (matmuls, convolutions, attention), and the numerically
sensitive parts compute in float32: the softmax and every loss (logits are cast up first), layer norm,
the attention weights' softmax, and the LSTM's recurrence (its kernels have no bfloat16 version, and
its cell state sums over all time steps). With ``"float16"`` the training also scales the loss
(``engine/training/update/loss_scale.py``): float16's range ends at 65504 and small gradients would
vanish below its smallest numbers.
"""
from __future__ import annotations

from typing import Any

from engine.runtime.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")


def compute_dtype(value: Any) -> str:
    """The compute dtype ``tf_amp`` = ``value`` asks for: "float32" (None: off), "bfloat16" or "float16"."""
    dtype = value
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"dtype"})
        if unknown:
            raise ConfigError(f"Config key 'tf_amp' has {unknown}, which this engine does not take (nor "
                              "does RETURNN's TensorFlow engine); it takes "
                              "{'dtype': 'bfloat16' or 'float16'}.")
        dtype = value.get("dtype")
    if dtype is None and not isinstance(value, dict):
        return "float32"
    if dtype not in DTYPES:
        raise ConfigError(f"Config key 'tf_amp' is {value!r}; expected 'bfloat16' or 'float16' (the dtype "
                          "the layers compute in; the parameters stay float32), or a dict {'dtype': ...}, or "
                          "None for float32.")
    return dtype
