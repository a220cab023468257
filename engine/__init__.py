"""A data-parallel training engine for speech and sequence models (TensorFlow 2, MPI/Horovod)."""

__version__ = "0.1.0"
