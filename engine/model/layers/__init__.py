"""The layer classes of the ``network`` dict, one module per family; ``network.py`` builds them.

- ``base.py``: ``Layer`` (time-major in and out, owns its variables, maps input to output lengths with
  ``out_lengths``, casts them to its ``compute_dtype`` for ``tf_amp`` with ``param``) and the helpers
  every family uses (``glorot_variable``, ``positive_int``, ``one_of``, ``time_mask``);
- ``dense.py``: ``linear``, ``softmax`` (with its ``ce`` loss), ``copy`` / ``dropout``, and the activation
  functions (``ACTIVATIONS``);
- ``recurrent.py``: ``rec`` with an LSTM unit; ``lstm.py``: the engine's own LSTM kernels (fused, scan);
  ``lstm_cudnn.py``: the cuDNN kernel and its CPU twin; ``lstm_choice.py``: which one runs
  (``lstm_implementation``) and the check that it has a kernel on the GPU; ``lstm_norm.py``: ``rec`` with
  unit ``layernormvariantslstm`` (its ``unit_opts`` checked without TensorFlow in ``lstm_norm_options.py``);
- ``conv.py``: ``conv`` and ``pool`` over time (1-D), which may change the number of frames;
- ``attention.py``: ``self_attention`` (with ``key_shift``), ``positional_encoding`` and
  ``relative_positional_encoding`` (output (T, T, F) without batch axis);
- ``norm.py``: ``layer_norm``; ``batch_norm.py``: ``batch_norm`` (with running statistics that the train
  step updates); ``elementwise.py``: ``activation`` and ``combine``;
- ``eval.py``: ``eval``, a config's Python expression over its sources, which it sees in RETURNN's layout
  (whose padding is up to the expression);
- ``features.py``: layers that change each frame's features: ``gating``, ``reduce_out``, ``slice`` (feature
  axis);
- ``window_pad.py``: ``window`` (a window of frames on a new static axis), ``pad`` and ``swap_axes``;
- ``time_chunking.py``: ``time_chunking`` / ``time_unchunking``, the structure family (layers that
  reshape time and batch), and the check that every layer reads sources on one time axis.
A sequence's valid output frames never depend on what stands in the padding of a batch.
New families get a module of their own here (more structure layers: ``structure.py``).

Stage 4 (model): may import runtime, config, report, datasets and the rest of ``engine.model`` (here:
``engine.model.losses``); imported by distributed, training, tasks, tools and main only. Importing this
package imports no layer module (they load TensorFlow).
"""
