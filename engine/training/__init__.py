"""Training: the epoch loop (``loop.py``), the compiled steps (``step.py``), the epoch report
(``report.py``) and the run's monitoring (``monitor.py``); parameter updates in ``update/`` (optimizer,
learning rate, clipping, learning-rate control) and checkpoints in ``checkpoints/`` (file format, when to
save, resume, cleanup, stop requests).

Stage 6 (training): may import runtime, config, report, datasets, model and distributed; imported by
tasks, tools and main.
"""
