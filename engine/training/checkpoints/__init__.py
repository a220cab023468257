"""Checkpoints: the file format (``file_format.py``), saving and stopping at step boundaries and loading
(``policy.py``: ``Checkpointer``), how often (``interval.py``), what an exact resume needs
(``resume.py``), reading one whole and telling a damaged one (``reading.py``), the runs under one
model prefix and what a fresh start does about an earlier run's files (``runs.py``), which old ones to
delete (``cleanup.py``), and the scheduler's stop requests (``stop_requests.py``). Parameters from other
checkpoints, RETURNN's TensorFlow ones included: ``load``, ``import_model_train_epoch1`` and
``preload_from_files`` (``initial_params.py``, the entries' options in ``preload_options.py``), RETURNN's
files (``returnn_files.py``) and its names and layouts (``returnn_format.py``).

Stage 6 (training): may import runtime, config, report, datasets, model, distributed and
``engine.training.update``; imported by the rest of ``engine.training``, tasks, tools and main.
"""
