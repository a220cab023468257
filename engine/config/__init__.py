"""The config and the command line: ``loader.py`` (``Config``: config files, ``++`` overrides, typed
getters), ``cli.py`` (command line, ``--help``), ``keys.py`` (every key with type, default and help), and
the verdict on each name of a config (``key_check.py``, with ``no_effect.py`` and RETURNN's names in
``returnn_names_table.py``, which ``gen-returnn-keys`` generates). Config code imports RETURNN's module
names (``TFUtil``, ``returnn.tf.compat``, ...) as ``returnn_imports.py`` resolves them, with the few TFUtil
functions of ``returnn_tf_util.py`` (which loads TensorFlow when first used).

Stage 1 (config): may import runtime; imported by report and every stage above it.
"""
