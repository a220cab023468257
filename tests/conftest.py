import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402  (after the environment variable, which TensorFlow reads on import)

from prerequisites import in_ci  # noqa: E402

# The scheduler tests install and start SLURM and Grid Engine daemons: only `make test-schedulers` runs them.
if os.environ.get("ENGINE_SCHEDULER_TESTS") != "1":
    collect_ignore = ["schedulers"]


@pytest.fixture(autouse=True)
def no_communicator_left_behind():
    """A training run in the test's process leaves its (one-rank) communicator as the process's answer to
    "which rank am I"; the next test in the same pytest worker must start from the launcher's view."""
    yield
    from engine.runtime import process

    process.set_communicator(None)


@pytest.fixture
def timeline_stopped():
    """No timeline recording before or after the test (it is process-wide state)."""
    from engine.report import timeline

    timeline.stop()
    yield
    timeline.stop()


@pytest.fixture
def fresh_log(capsys):
    """The config's notes anew (each is logged once per process), on the default log."""
    from engine.config.key_check import _Logged
    from engine.runtime import log

    _Logged.messages.clear()
    log.init()
    yield
    log.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI every skip is a failure, whatever raised it: a green CI must mean that every test ran."""
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI=true), which counts as a failure: {reason}"


# The suite's cost is the number of TensorFlow processes it starts, most of them in mpirun jobs: every mpirun
# that a test starts through helpers.mpirun_cmd, or as `mpirun` on the PATH of helpers.child_env, goes
# through a counting shim, and the summary prints the count beside the suite's time (the job scripts on
# simulated hosts run the venv's mpirun by its path and are not counted).
MPIRUN_LOG = "ENGINE_TESTS_MPIRUN_LOG"
WARM_LOG = "ENGINE_TESTS_WARM_LOG"  # a line per process started through tests/warm: "warm" or "cold"


def pytest_configure(config):
    if hasattr(config, "workerinput") or MPIRUN_LOG in os.environ:
        return  # an xdist worker: the controller set the log up before it started the workers
    import tempfile

    folder = tempfile.mkdtemp(prefix="engine-tests-mpirun-")
    os.environ[MPIRUN_LOG] = os.path.join(folder, "launches.txt")
    os.environ[WARM_LOG] = os.path.join(folder, "warm.txt")
    config._mpirun_log_folder = folder


def pytest_terminal_summary(terminalreporter, config):
    if not hasattr(config, "_mpirun_log_folder"):
        return
    from collections import Counter

    try:
        with open(os.environ[MPIRUN_LOG]) as log:
            tests = Counter(line.split(" (")[0].strip() for line in log)
    except FileNotFoundError:
        tests = Counter()
    try:
        with open(os.environ[WARM_LOG]) as log:
            starts = Counter(line.strip() for line in log)
    except FileNotFoundError:
        starts = Counter()
    warm = f"tests/warm started {starts['warm']} processes warm, {starts['cold']} cold"
    terminalreporter.write_sep("=", f"{sum(tests.values())} mpirun jobs in {len(tests)} tests; {warm}")
    for name, count in tests.most_common(10):
        terminalreporter.write_line(f"{count:4d}  {name}")
