"""The layer classes of the ``network`` dict, one module per family; ``network.py`` builds them.

- ``base.py``: ``Layer`` (time-major in and out, owns its variables) and the helpers every family uses
  (``glorot_variable``, ``positive_int``);
- ``dense.py``: ``linear``, ``softmax`` (with its ``ce`` loss), ``copy`` / ``dropout``;
- ``recurrent.py``: ``rec`` with an LSTM unit; ``lstm.py``: its two LSTM kernels (fused, scan);
- ``time_chunking.py``: ``time_chunking`` / ``time_unchunking``, the structure family (layers that
  reshape time and batch).
New families get a module of their own here: convolution and pooling (``conv.py``), attention
(``attention.py``), more structure layers (``structure.py``, beside ``time_chunking.py``).

Stage 4 (model): may import runtime, config, report, datasets and the rest of ``engine.model`` (here:
``engine.model.losses``); imported by distributed, training, tasks, tools and main only. Importing this
package imports no layer module (they load TensorFlow).
"""
