"""Models: the ``network`` layer dict or a ``get_model``/``get_network`` config function -> ``SeqModel``.

Use::

    model = build_model(config, input_dim=40, input_sparse=False, target_dims={"classes": 50})
    outputs = model(data, lengths, training=True)           # {"output": (B, T, 50) probs, ...}
    result = model.compute_losses(outputs, {"classes": y}, {"classes": y_lengths})

All variables exist when ``build_model`` returns, with values that depend only on ``random_seed``.
``engine.model.spec`` (the layer dict as data, checked) needs no TensorFlow, so importing this package
does not load it either: the names below load TensorFlow on first use. The layer classes are in
``layers/``, the losses in ``losses/``; ``initializers.py`` reads RETURNN's initialisers of their
parameters (``forward_weights_init`` & co.), ``precision.py`` reads ``tf_amp`` (the layers' compute dtype),
``placement.py`` makes the line at start that names the device and each layer's kernel.

Stage 4 (model): may import runtime, config, report and datasets; imported by distributed, training,
tasks, tools and main.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"build_model": "engine.model.build", "SeqModel": "engine.model.base",
         "LossResult": "engine.model.base"}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'engine.model' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
