"""The losses of the ``network`` dict's layers, one module per loss.

- ``cross_entropy.py``: the ``ce`` loss of a ``softmax`` layer, with RETURNN's ``loss_opts``
  (``CrossEntropy``, ``CE_OPTIONS``);
- ``ctc.py``: the ``ctc`` loss of a ``softmax`` layer (``CtcLoss``): sums, label error, unalignable
  sequences;
- ``edit_distance.py``: the ``edit_distance`` loss of a ``copy`` layer (``EditDistance``);
- ``decoding.py``: CTC greedy and beam decoding, collapsing repeats, edit distances;
- ``data_checks.py``: checks of the batch inside a compiled step that end in a ``DataError``;
- ``regularization.py``: the layers' ``L2`` and ``darc1`` terms.

Stage 4 (model): may import runtime, config, report and datasets; imported by the rest of
``engine.model`` (layers, network), distributed, training, tasks, tools and main.
"""

from engine.runtime.errors import ConfigError

# the losses each layer class carries here; RETURNN's others (sampling_loss, mse, ...) are refused by name
LAYER_LOSSES = {"softmax": ("ce", "ctc"), "copy": ("edit_distance",), "decide": ("edit_distance",)}


def check_loss_name(where: str, cls: str, loss: object) -> None:
    """``--check`` and the layers refuse a loss this engine does not compute, naming the layer."""
    if loss is None or loss in LAYER_LOSSES.get(cls, ()):
        return
    supported = ", ".join(repr(name) for name in LAYER_LOSSES.get(cls, ())) or "none"
    raise ConfigError(f"{where}: loss {loss!r} is not supported on a {cls} layer; supported: {supported}.")
