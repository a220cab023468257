"""Training: the epoch loop (``loop.py``), the compiled steps (``step.py``), the epoch report
(``report.py``), the run's monitoring (``monitor.py``) and the model's running state across ranks
(``running_state.py``: batch_norm's statistics); parameter updates in ``update/`` (optimizer,
learning rate, clipping, learning-rate control) and checkpoints in ``checkpoints/`` (file format, when to
save, resume, cleanup, stop requests).

Stage 6 (training): may import runtime, config, report, datasets, model and distributed; imported by
tasks, tools and main.
"""
