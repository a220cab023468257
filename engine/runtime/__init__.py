"""Who and where this process is: its rank and the launcher that started it (``launch.py``,
``process.py``), logging (``log.py``), user-facing errors (``errors.py``), files written atomically
(``atomic_file.py``), hosts and GPUs of the job (``cluster.py``), and this rank's device and TensorFlow
threads (``device.py``, ``tf_threads.py``).

Stage 0 (runtime), the lowest: imports no other part of the engine (the communicator and the config are
typed by protocols here, ``process.CommunicatorView`` and ``config_view.ConfigView``); every stage may
import it.
"""
