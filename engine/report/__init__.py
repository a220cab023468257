"""What rank 0 shows its user about a run: TensorBoard curves, progress, the end-of-run summary
(``tensorboard.py``, ``progress.py``, ``summary.py``, durations in ``clock.py``), and where the time goes:
phases (``phases.py``) and the per-rank timeline (``timeline.py``).

Stage 2 (report): may import runtime and config; imported by datasets and every stage above it.
"""
