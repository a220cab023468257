"""tools/supervise.py: reruns after abnormal ends with back-off, gives up on config/data errors, exits 99
for the scheduler on a stop request, forwards signals; small fake commands, and a real 2-rank mpirun."""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.training.checkpoints.stop_requests import REPEAT_GRACE_SECONDS
from helpers import ROOT, child_env, mpirun_cmd

pytestmark = pytest.mark.tf_latest

SUPERVISE = [sys.executable, str(ROOT / "tools" / "supervise.py")]

# Counts its runs in a file; exit code (or "kill") of each run from argv, the last one repeated; "CODE@S":
# exit with CODE after running S seconds.
FLAKY = """
import os, pathlib, signal, sys, time
counter = pathlib.Path(sys.argv[1])
run = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(run + 1))
outcome = sys.argv[2:][min(run, len(sys.argv) - 3)]
if "@" in outcome:
    outcome, seconds = outcome.split("@")
    time.sleep(float(seconds))
if outcome == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(outcome))
"""


def supervise(options: list[str], command: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
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


def test_a_crash_after_a_long_healthy_run_counts_as_the_first_again(tmp_path):
    # runs 1, 2: quick crashes; run 3 crashes after a healthy stretch (>= --reset-after), so it counts as
    # the first end: two more restarts with the first back-offs, then runs 4, 5 crash quickly and end it.
    # "Quick": a Python start, well below --reset-after also on a busy machine.
    r = supervise(["--max-restarts", "2", "--backoff", "0.05", "--reset-after", "5"],
                  flaky(tmp_path, "1", "1", "1@5.5", "1"), timeout=120)
    assert r.returncode == 1 and runs(tmp_path) == 5, r.stderr
    assert re.findall(r"restart (\d) of 2 in (\S+) s\.", r.stderr) == \
        [("1", "0.05"), ("2", "0.1"), ("1", "0.05"), ("2", "0.1")], r.stderr
    healthy = re.search(r"command ended after (\d+\.\d) s, exit code 1 \(attempt 3 of 3\), a run of "
                        r"--reset-after 5 s or more: counted as attempt 1; restart 1 of 2 in 0\.05 s\.",
                        r.stderr)
    assert healthy and float(healthy.group(1)) >= 5, r.stderr
    assert "(attempt 3 of 3); no restarts left (--max-restarts 2), giving up." in r.stderr


def test_without_reset_after_the_restarts_count_over_the_whole_supervision(tmp_path):
    r = supervise(["--max-restarts", "2", "--backoff", "0", "--reset-after", "0"],
                  flaky(tmp_path, "1", "1@1.2", "1"), timeout=120)
    assert r.returncode == 1 and runs(tmp_path) == 3, r.stderr
    assert "counted as attempt 1" not in r.stderr


@pytest.mark.parametrize("code, why", [(2, "a config error"),
                                       (3, "a data error (or an Inf/NaN in training)")])
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


def wait_for(path: Path, timeout: float = 120, lines: int = 0) -> float:
    """Waits until ``path`` exists (and has ``lines`` lines); returns the time it was seen so."""
    deadline = time.monotonic() + timeout
    while not path.exists() or len(path.read_text().splitlines()) < lines:
        assert time.monotonic() < deadline, f"{path} did not appear" + (f" with {lines} lines" * bool(lines))
        time.sleep(0.01)
    return time.monotonic()


def wait_for_stderr(proc: subprocess.Popen, text: str, timeout: float = 120) -> str:
    """What ``proc`` wrote to stderr up to and including ``text`` (communicate() returns the rest)."""
    seen, deadline = b"", time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0 and proc.poll() is None, f"no {text!r} on stderr:\n{seen.decode(errors='replace')}"
        ready, _, _ = select.select([proc.stderr], [], [], min(left, 1))
        if ready:
            seen += os.read(proc.stderr.fileno(), 65536)
    return seen.decode(errors="replace")


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM])
def test_signals_are_forwarded_and_end_the_supervision(tmp_path, signum):
    got, ready = tmp_path / "got", tmp_path / "ready"
    proc = start_supervisor(["--backoff", "0"],
                            [sys.executable, "-c", WAITS_FOR_SIGNAL, str(got), str(ready)])
    wait_for(ready)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 99, err
    # SIGTERM goes on as the engine's save-and-exit request that mpirun forwards (mpirun kills on SIGTERM)
    got_as = "SIGUSR2" if signum == signal.SIGTERM else signal.Signals(signum).name
    assert got.read_text() == got_as
    forwarded = signal.Signals(signum).name
    if signum == signal.SIGTERM:
        forwarded += " (as SIGUSR2, the save-and-exit request)"
    assert f"(attempt 1 of 4) after {forwarded} was forwarded to it; not restarting." in err


# Stops on SIGUSR2 only after a while (a save in progress); records every signal it gets.
SLOW_TO_STOP = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def note(signum, frame):
    with out.open("a") as f:
        f.write(signal.Signals(signum).name + "\\n")
signal.signal(signal.SIGUSR2, note)
pathlib.Path(sys.argv[2]).touch()
time.sleep(60)
"""


def test_a_later_second_sigterm_is_forwarded_as_sigterm(tmp_path):
    got, ready = tmp_path / "got", tmp_path / "ready"
    proc = start_supervisor(["--backoff", "0"], [sys.executable, "-c", SLOW_TO_STOP, str(got), str(ready)])
    wait_for(ready)
    proc.send_signal(signal.SIGTERM)
    # each next SIGTERM once the one before has been forwarded: the supervisor took it by then
    first_forwarded = wait_for(got, lines=1)
    proc.send_signal(signal.SIGTERM)  # the same stop delivered twice: still the save-and-exit request
    wait_for(got, lines=2)
    # past REPEAT_GRACE_SECONDS after the supervisor took the first, however late that was: now the sender
    # wants it gone
    time.sleep(max(0.0, first_forwarded + REPEAT_GRACE_SECONDS + 0.5 - time.monotonic()))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert got.read_text().split() == ["SIGUSR2", "SIGUSR2"], err


def test_stop_signal_while_waiting_to_restart_exits_resumable(tmp_path):
    proc = start_supervisor(["--backoff", "600"], flaky(tmp_path, "1"))
    try:
        before = wait_for_stderr(proc, "restart 1 of 3 in 600 s.")  # the first run has ended: it waits
        start = time.monotonic()
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = before + err
    assert proc.returncode == 99 and runs(tmp_path) == 1, err
    assert time.monotonic() - start < 60, err  # at once, not after the back-off
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
@pytest.mark.version_independent
def test_restarts_a_two_rank_mpirun_job_after_a_rank_is_killed(tmp_path):
    command = mpirun_cmd(2, [sys.executable, "-c", RANK_DIES_ONCE, str(tmp_path / "killed-once")])
    r = supervise(["--backoff", "0.1"], command, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ", exit code 137 (128 + SIGKILL) (attempt 1 of 4); restart 1 of 3 in 0.1 s." in r.stderr, r.stderr
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("rank")) == \
        ["rank 0 done", "rank 1 done"]


@pytest.mark.mpi
@pytest.mark.version_independent
def test_sigterm_to_the_supervisor_of_a_two_rank_training_saves_a_checkpoint_and_exits_99(tmp_path):
    """Open MPI's mpirun kills the ranks within 0.5 s of a SIGTERM: passed on as is, nothing would be
    saved and the job would not end with 99."""
    from test_engine_parallel import base_config

    ready = tmp_path / "ready"
    config = base_config(use_horovod=True, distributed_backend="mpi", num_epochs=100, checkpoint_interval=0,
                         model=str(tmp_path / "net"))
    script = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")
    command = mpirun_cmd(2, [sys.executable, script, str(tmp_path), repr(config), f"ready={ready}",
                             "step_sleep=0.2"])
    proc = start_supervisor(["--backoff", "0"], command)
    try:
        wait_for(ready, timeout=300)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 99, out + err
    assert re.search(r"stopping on request: SIGUSR2 received by rank \d.*; saved checkpoint \S*net\.\d{3}"
                     r"\.step\d+ ", out + err), out + err
    assert list(tmp_path.glob("net.*.step*")), out + err
    assert "after SIGTERM (as SIGUSR2, the save-and-exit request) was forwarded to it; not restarting." in err
