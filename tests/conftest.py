import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402  (after the environment variable, which TensorFlow reads on import)

# The scheduler tests install and start SLURM and Grid Engine daemons: only `make test-schedulers` runs them.
if os.environ.get("ENGINE_SCHEDULER_TESTS") != "1":
    collect_ignore = ["schedulers"]


@pytest.fixture
def timeline_stopped():
    """No timeline recording before or after the test (it is process-wide state)."""
    from engine.report import timeline

    timeline.stop()
    yield
    timeline.stop()
