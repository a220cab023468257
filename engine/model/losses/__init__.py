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
LAYER_LOSSES = {"softmax": ("ce", "ctc"), "copy": ("edit_distance",), "decide": ("edit_distance",),
                "eval": ("ce",)}  # eval: inside a rec unit (engine/model/rec/)


def check_loss_name(where: str, cls: str, loss: object) -> None:
    """``--check`` and the layers refuse a loss this engine does not compute, naming the layer."""
    if loss is None or loss in LAYER_LOSSES.get(cls, ()):
        return
    supported = ", ".join(repr(name) for name in LAYER_LOSSES.get(cls, ())) or "none"
    raise ConfigError(f"{where}: loss {loss!r} is not supported on a {cls} layer; supported: {supported}.")


# loss_opts RETURNN takes that change what is optimised in a way this engine does not do, and why; refused
# by --check (the layer dicts' option values are checked without TensorFlow) and by the layers
REFUSED_LOSS_OPTS = {"ctc": {
    "use_viterbi": "training on the best alignment only (Viterbi) is not implemented",
    "output_in_log_space": "a softmax layer's output is probabilities, not log-probabilities (RETURNN "
                           "would treat the probabilities as logits)",
    "custom_norm_factor": "scores and use_normalized_loss divide by the target labels (RETURNN's default)",
    "custom_inv_norm_factor": "scores and use_normalized_loss divide by the target labels (RETURNN's "
                              "default)",
}}


def check_loss_opts(where: str, loss: object, loss_opts: object) -> None:
    """The ``loss_opts`` this engine refuses for ``loss`` (``REFUSED_LOSS_OPTS``), named."""
    if not isinstance(loss_opts, dict):
        return  # the loss's own parsing names a loss_opts that is no dict
    for key, why in REFUSED_LOSS_OPTS.get(str(loss), {}).items():
        if loss_opts.get(key) not in (None, False):
            raise ConfigError(f"{where}: loss_opts {key}={loss_opts[key]!r} is not supported for the "
                              f"{loss!r} loss: {why}.")
    if loss == "ctc" and loss_opts.get("use_native"):
        # RETURNN's native CTC (its Baum-Welch op): the same loss and gradient as TensorFlow's op, but its
        # label error decodes greedily only, and the op takes only ctc_merge_repeated of ctc_opts
        if loss_opts.get("beam_width", 100) != 1:
            raise ConfigError(f"{where}: loss_opts use_native=True needs beam_width 1: RETURNN's label "
                              "error with its native CTC decodes greedily only (it asserts beam_width 1).")
        ctc_opts = loss_opts.get("ctc_opts") or {}
        if isinstance(ctc_opts, dict) and set(ctc_opts) - {"ctc_merge_repeated"}:
            raise ConfigError(f"{where}: loss_opts use_native=True with ctc_opts "
                              f"{sorted(set(ctc_opts) - {'ctc_merge_repeated'})}: RETURNN's native CTC op "
                              "takes only ctc_merge_repeated.")


def check_loss_only_on_non_search(where: str, opts: dict) -> None:
    """RETURNN's ``loss_only_on_non_search``: True drops the layer's loss in a search: it is not in the
    search's closing line (``engine/tasks/search.py``)."""
    if not isinstance(opts.get("loss_only_on_non_search", False), bool):
        raise ConfigError(f"{where}: loss_only_on_non_search must be True or False, got "
                          f"{opts['loss_only_on_non_search']!r}.")
