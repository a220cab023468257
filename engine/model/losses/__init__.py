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
