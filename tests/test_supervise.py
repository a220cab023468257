"""tools/supervise.py: reruns after abnormal ends with back-off, gives up on config/data errors, exits 99
for the scheduler on a stop request, forwards signals; small fake commands, and a real 2-rank mpirun."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, child_env, mpirun_cmd

pytestmark = pytest.mark.tf_latest

SUPERVISE = [sys.executable, str(ROOT / "tools" / "supervise.py")]

# Counts its runs in a file; exit code (or "kill") of each run from argv, the last one repeated.
FLAKY = """
import os, pathlib, signal, sys
counter = pathlib.Path(sys.argv[1])
run = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(run + 1))
outcome = sys.argv[2:][min(run, len(sys.argv) - 3)]
if outcome == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(outcome))
"""


def supervise(options: list[str], command: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*SUPERVISE, *options, "--", *command], capture_output=True, text=True,
                          timeout=timeout, env=child_env())


def flaky(tmp_path: Path, *outcomes: str) -> list[str]:
    return [sys.executable, "-c", FLAKY, str(tmp_path / "runs"), *outcomes]


def runs(tmp_path: Path) -> int:
    return int((tmp_path / "runs").read_text())


def test_fails_twice_then_succeeds(tmp_path):
    r = supervise(["--max-restarts", "3", "--backoff", "0.05"], flaky(tmp_path, "1", "1", "0"))
    assert r.returncode == 0, r.stderr
    assert runs(tmp_path) == 3
    lines = r.stderr.splitlines()
    assert len(lines) == 3, r.stderr
    assert re.search(r"command ended after \d+\.\d s, exit code 1 \(attempt 1 of 4\); restart 1 of 3 "
                     r"in 0\.05 s\.$", lines[0]), lines[0]
    assert lines[1].endswith(", exit code 1 (attempt 2 of 4); restart 2 of 3 in 0.1 s."), lines[1]
    assert "command finished after" in lines[2] and "(attempt 3 of 4)" in lines[2]


def test_death_by_signal_is_restarted_and_named(tmp_path):
    r = supervise(["--backoff", "0"], flaky(tmp_path, "kill", "0"))
    assert r.returncode == 0 and runs(tmp_path) == 2, r.stderr
    assert ", killed by SIGKILL (attempt 1 of 4); restart 1 of 3 in 0 s." in r.stderr, r.stderr


def test_gives_up_after_max_restarts_with_capped_backoff(tmp_path):
    r = supervise(["--max-restarts", "3", "--backoff", "0.1", "--max-backoff", "0.25"],
                  flaky(tmp_path, "kill"))
    assert r.returncode == 128 + signal.SIGKILL and runs(tmp_path) == 4, r.stderr
    waits = re.findall(r"restart \d of 3 in (\S+) s\.", r.stderr)
    assert waits == ["0.1", "0.2", "0.25"], r.stderr
    assert "(attempt 4 of 4); no restarts left (--max-restarts 3), giving up." in r.stderr


@pytest.mark.parametrize("code, why", [(2, "a config error"), (3, "a data error")])
def test_config_and_data_errors_stop_at_once(tmp_path, code, why):
    r = supervise(["--backoff", "0"], flaky(tmp_path, str(code), "0"))
    assert r.returncode == code and runs(tmp_path) == 1, r.stderr
    assert f", exit code {code} (attempt 1 of 4): {why}, which a restart cannot fix; giving up." in r.stderr


def test_resumable_exit_is_passed_to_the_scheduler(tmp_path):
    r = supervise(["--backoff", "0"], flaky(tmp_path, "99", "0"))
    assert r.returncode == 99 and runs(tmp_path) == 1, r.stderr
    assert "exiting 99 so that the scheduler requeues the job" in r.stderr


# Records the signal it gets in a file, then exits 99 as the engine does after saving a checkpoint.
WAITS_FOR_SIGNAL = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    out.write_text(signal.Signals(signum).name)
    sys.exit(99)
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, stop)
pathlib.Path(sys.argv[2]).touch()
time.sleep(60)
"""


def start_supervisor(options: list[str], command: list[str]) -> subprocess.Popen:
    return subprocess.Popen([*SUPERVISE, *options, "--", *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM])
def test_signals_are_forwarded_and_end_the_supervision(tmp_path, signum):
    got, ready = tmp_path / "got", tmp_path / "ready"
    proc = start_supervisor(["--backoff", "0"],
                            [sys.executable, "-c", WAITS_FOR_SIGNAL, str(got), str(ready)])
    wait_for(ready)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 99, err
    assert got.read_text() == signal.Signals(signum).name
    assert f"(attempt 1 of 4) after {signal.Signals(signum).name} was forwarded to it; not restarting." in err


def test_stop_signal_while_waiting_to_restart_exits_resumable(tmp_path):
    proc = start_supervisor(["--backoff", "60"], flaky(tmp_path, "1"))
    wait_for(tmp_path / "runs")
    time.sleep(0.5)  # the first run has ended; the supervisor now waits 60 s
    start = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 99 and runs(tmp_path) == 1, err
    assert time.monotonic() - start < 10
    assert "SIGUSR1 while waiting to restart: exiting 99" in err


def test_usage_errors():
    r = subprocess.run(SUPERVISE, capture_output=True, text=True, env=child_env())
    assert r.returncode == 2 and "no COMMAND given" in r.stderr
    r = subprocess.run([*SUPERVISE, "--", "/nonexistent/program"], capture_output=True, text=True,
                       env=child_env())
    assert r.returncode == 127 and "cannot run '/nonexistent/program'" in r.stderr


# Rank 1 dies by SIGKILL in the first run; in the second both ranks finish.
RANK_DIES_ONCE = """
import os, pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
if os.environ["OMPI_COMM_WORLD_RANK"] == "1" and not marker.exists():
    marker.touch()
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(0.5)
print("rank", os.environ["OMPI_COMM_WORLD_RANK"], "done", flush=True)
"""


@pytest.mark.mpi
def test_restarts_a_two_rank_mpirun_job_after_a_rank_is_killed(tmp_path):
    command = mpirun_cmd(2, [sys.executable, "-c", RANK_DIES_ONCE, str(tmp_path / "killed-once")])
    r = supervise(["--backoff", "0.1"], command, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ", exit code 137 (128 + SIGKILL) (attempt 1 of 4); restart 1 of 3 in 0.1 s." in r.stderr, r.stderr
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("rank")) == \
        ["rank 0 done", "rank 1 done"]
