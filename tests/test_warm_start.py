"""The tests' warm start (tests/warm): a rank forked from a process that has imported TensorFlow behaves,
to whoever started the client, as ``python SCRIPT ARGS`` would: its output, exit status, death by a
signal, the signals it is sent, its environment and directory; and a client that dies takes its rank."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import warm_start
from helpers import child_env

pytestmark = pytest.mark.tf_latest

WARM = Path(__file__).resolve().parent / "warm"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A warm-start server of its own (the suite's are per worker); its socket path once it accepts."""
    folder = str(tmp_path_factory.mktemp("warm"))
    process, path = warm_start.start_server(folder)
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        assert process.poll() is None and time.monotonic() < deadline, open(f"{folder}/server.log").read()
        time.sleep(0.1)
    yield path
    warm_start.stop_server(process, folder)


def client(server: str, tmp_path: Path, body: str, *args: str, env: dict | None = None, **popen):
    script = tmp_path / "script.py"
    script.write_text(body)
    return subprocess.Popen([sys.executable, str(WARM / "client.py"), server, str(script), *args],
                            env=child_env(env), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


REPORT = """
import os, sys
print("warm" if "tensorflow" in sys.modules else "cold", sys.argv[1:], os.getcwd(), os.environ["MARK"])
print("to stderr", file=sys.stderr)
sys.exit(7)
"""


def test_a_warm_rank_has_the_command_line_directory_environment_output_and_exit_status(server, tmp_path):
    proc = client(server, tmp_path, REPORT, "a", "b c", env={"MARK": "m1"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    assert out.split("\n")[0] == f"warm ['a', 'b c'] {tmp_path} m1" and "to stderr" in err


def test_an_environment_that_tensorflow_reads_on_import_starts_cold(server, tmp_path):
    proc = client(server, tmp_path, REPORT, env={"MARK": "m2", "TF_CPP_MIN_LOG_LEVEL": "0"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, err
    assert out.startswith("cold [] ") and "m2" in out


def test_a_rank_killed_by_a_signal_ends_its_client_by_the_same_signal(server, tmp_path):
    proc = client(server, tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err


def test_a_signal_to_the_client_reaches_the_rank(server, tmp_path):
    body = ("import signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(5))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    proc = client(server, tmp_path, body)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGUSR1)
    proc.communicate(timeout=30)
    assert proc.returncode == 5


def test_a_killed_client_takes_its_rank_with_it(server, tmp_path):
    body = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n"
    proc = client(server, tmp_path, body)
    rank = int(proc.stdout.readline())
    assert rank != proc.pid  # the rank is the server's child, not the client itself
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{rank}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{rank}").exists(), f"rank {rank} outlived its client"


def test_a_client_started_while_its_server_imports_tensorflow_waits_and_runs_warm(tmp_path):
    """The suite's first ranks on a worker start while its server still imports TensorFlow: they wait
    for it instead of importing TensorFlow themselves."""
    folder = tmp_path / "server"
    folder.mkdir()
    process, path = warm_start.start_server(str(folder))
    try:
        assert not os.path.exists(path)  # importing TensorFlow takes seconds
        proc = client(path, tmp_path, REPORT, env={"MARK": "m5"})
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 7, err
        assert out.startswith("warm [] ") and "m5" in out
    finally:
        warm_start.stop_server(process, str(folder))


def test_a_client_whose_server_ended_before_it_accepted_runs_cold(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    process, path = warm_start.start_server(str(folder))
    warm_start.stop_server(process, str(folder))
    folder.mkdir()
    (folder / "server.pid").write_text(str(process.pid))  # a pid that has ended
    proc = client(path, tmp_path, REPORT, env={"MARK": "m6"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, err
    assert out.startswith("cold [] ") and "m6" in out
