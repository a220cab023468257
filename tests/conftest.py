import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402  (after the environment variable, which TensorFlow reads on import)


@pytest.fixture
def timeline_stopped():
    """No timeline recording before or after the test (it is process-wide state)."""
    from engine.report import timeline

    timeline.stop()
    yield
    timeline.stop()
