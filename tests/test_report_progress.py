"""Progress: a tqdm bar on a pseudo-terminal, plain lines every N seconds into a pipe, log_verbosity."""
from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest
from tqdm import tqdm

from engine.config.loader import Config
from engine.report.progress import Progress, interval_from_config
from engine.runtime import log
from engine.runtime.errors import ConfigError
from helpers import ROOT, child_env, screen

pytestmark = pytest.mark.tf_latest


@pytest.fixture(autouse=True)
def reset_log():
    yield
    log.init()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def read_all(fd: int) -> str:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


@pytest.fixture
def terminal():
    """A pseudo-terminal of 100 columns: (stream writing to it, fd to read what it shows)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    stream = os.fdopen(slave, "w", buffering=1)
    yield stream, master
    stream.close()
    os.close(master)


def test_bar_on_a_terminal_with_lines_printed_above_it(terminal):
    stream, master = terminal
    progress = Progress("train epoch 2", total_steps=8, stream=stream, enabled=True, bar_refresh=0)
    assert progress.terminal
    for step in range(1, 5):
        progress.update(step, frames=1000.0 * step, score=2.0 / step)
    tqdm.write("a log line printed meanwhile", file=stream)
    for step in range(5, 9):
        progress.update(step, frames=1000.0 * step, score=2.0 / step)
    shown_before_close = read_all(master)
    progress.close()
    raw = shown_before_close + read_all(master)
    assert "train epoch 2:  50%|" in raw and "4/8 [" in raw and "score 0.5000" in raw and "frames/s" in raw
    assert raw.index("a log line printed meanwhile") < raw.index("5/8 [")  # the bar is redrawn below it
    rows = screen(raw)
    assert "a log line printed meanwhile" in rows  # a line of its own, no bar through it
    assert rows[-1] == "a log line printed meanwhile"  # closed: the bar is gone


def test_plain_lines_every_interval_into_a_pipe():
    clock = FakeClock()
    out = io.StringIO()  # not a terminal, as a pipe or a job's log file
    progress = Progress("train epoch 3", total_steps=400, stream=out, interval=60, enabled=True, clock=clock)
    assert not progress.terminal
    for step in range(1, 401):
        clock.now += 0.5  # 2 steps a second: a line at steps 120, 240, 360
        progress.update(step, frames=100.0 * step, score=1.5)
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        f"train epoch 3: step {step} of 400 ({done}), {elapsed} elapsed, about {to_go} to go, 200 frames/s, "
        f"score 1.5000"
        for step, done, elapsed, to_go in ((120, "30.0%", "0:01:00", "0:02:20"),
                                           (240, "60.0%", "0:02:00", "0:01:20"),
                                           (360, "90.0%", "0:03:00", "0:00:20"))
    ]


def test_unknown_total_and_no_scores():
    clock = FakeClock()
    out = io.StringIO()
    progress = Progress("eval dev", stream=out, interval=10, enabled=True, clock=clock)
    clock.now += 10
    progress.update(7)
    assert out.getvalue() == "eval dev: step 7, 0:00:10 elapsed\n"
    seqs = Progress("dump", total_steps=20, stream=out, interval=10, enabled=True, clock=clock, unit="seq")
    clock.now += 10
    seqs.update(5)
    last = out.getvalue().splitlines()[-1]
    assert last == "dump: seq 5 of 20 (25.0%), 0:00:10 elapsed, about 0:00:30 to go"


def test_log_verbosity_decides(terminal):
    stream, master = terminal
    log.init(verbosity=2)
    quiet = Progress("train epoch 1", total_steps=5, stream=stream, bar_refresh=0)
    quiet.update(3, frames=10.0, score=1.0)
    quiet.close()
    assert not quiet.terminal and read_all(master) == ""
    log.init(verbosity=3)
    shown = Progress("train epoch 1", total_steps=5, stream=stream, bar_refresh=0)
    shown.update(3)
    assert shown.terminal and "3/5" in read_all(master)
    shown.close()


PIPED = """
import sys
from engine.report.progress import Progress
progress = Progress("train epoch 1", total_steps=3, interval=1e-9)
for step in (1, 2, 3):
    progress.update(step, frames=10.0 * step, score=0.5)
progress.close()
"""


def test_stdout_into_a_pipe_gets_plain_lines():
    proc = subprocess.run([sys.executable, "-c", PIPED.format(root=str(ROOT))], capture_output=True,
                          text=True, env=child_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    expected = [f"train epoch 1: step {s} of 3 ({p}%)" for s, p in ((1, "33.3"), (2, "66.7"), (3, "100.0"))]
    assert [line.split(",")[0] for line in lines] == expected
    assert "\r" not in proc.stdout and proc.stderr == ""


def test_interval_from_config():
    assert interval_from_config(Config({})) == 60.0
    assert interval_from_config(Config({"progress_interval": "15"})) == 15.0
    with pytest.raises(ConfigError, match="'progress_interval' must be a number of seconds above 0"):
        interval_from_config(Config({"progress_interval": 0}))
