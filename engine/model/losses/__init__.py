"""The losses of the ``network`` dict's layers, one module per loss.

- ``cross_entropy.py``: the ``ce`` loss of a ``softmax`` layer, with RETURNN's ``loss_opts``
  (``CrossEntropy``, ``CE_OPTIONS``);
- ``regularization.py``: the layers' ``L2`` term (``l2_factor``, ``l2_term``).
Room for the losses to come, a module each: ``ctc.py``, ``edit_distance.py``.

Stage 4 (model): may import runtime, config, report and datasets; imported by the rest of
``engine.model`` (layers, network), distributed, training, tasks, tools and main.
"""
