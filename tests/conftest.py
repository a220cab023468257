import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402  (after the environment variable, which TensorFlow reads on import)

from prerequisites import in_ci  # noqa: E402

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI every skip is a failure, whatever raised it: a green CI must mean that every test ran."""
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI=true), which counts as a failure: {reason}"
