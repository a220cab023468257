"""A data-parallel training engine for speech and sequence models (TensorFlow 2, MPI/Horovod).

Folders by stage, lowest first; a module imports only its own stage and lower ones
(``tests/test_layout.py`` checks): runtime < config < report < datasets < model < distributed <
training < tasks < tools < ``main.py``.
"""

__version__ = "0.1.0"
