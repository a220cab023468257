"""The pure helpers of ``benchmarks/bench_returnn_attention_speed.py``'s rows on several ranks: RETURNN's
command under its own mpirun, the summed rate of processes run at once (a failed process fails the row),
the engine's '% in collectives' and seconds per step read from its epoch lines, and the synchronous
bound's probe (``sync_probe.py``) on 2 ranks."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import ROOT, run_mpi

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_returnn_attention_speed as speed  # noqa: E402
from timing import Output, RowFailed  # noqa: E402


def test_returnn_command_runs_under_the_mpirun_beside_its_python():
    alone = ["/r/bin/python", "-m", "returnn", "c.config"]
    assert speed.returnn_command("/r/bin/python", "c.config", 1) == alone
    command = speed.returnn_command("/r/bin/python", "c.config", 2)
    assert command[0] == "/r/bin/mpirun"
    assert command[command.index("-np") + 1] == "2"
    assert command[-4:] == alone


def test_summed_rate_adds_the_processes_rates():
    outputs = [Output("a", []), Output("b", [])]
    assert speed.summed_rate(outputs, lambda output: {"a": 10.0, "b": 32.5}[output.text]) == 42.5


def test_summed_rate_fails_naming_every_failed_process():
    def rate_of(output: Output) -> float:
        if output.text == "no line":
            raise RuntimeError("no line matching 'x'\nthe output")
        return 1.0

    results = [Output("ok", []), Output("ok", [], returncode=3), ValueError("boom"), None,
               Output("no line", [])]
    with pytest.raises(RowFailed) as failed:
        speed.summed_rate(results, rate_of)
    message = str(failed.value)
    assert message.startswith("4 of 5 processes failed")
    assert "process 2 exited with 3" in message and "process 3: ValueError('boom')" in message
    assert "process 4: None" in message and "process 5: no line matching 'x'" in message
    assert "the output" not in message


def test_collective_shares_from_epoch_2_on_of_every_rank():
    waits = "in collectives, 0.0% waiting for data"
    text = "\n".join([
        f"train epoch 1: 900.0 frames/sec (9000 frames, 9.00s computing); 30.0% {waits}",
        "train epoch 2: step 5, score 1.0",
        f"train epoch 2: 1000.0 frames/sec (10000 frames, 9.00s computing); 12.5% {waits}",
        f"train epoch 2: 1000.0 frames/sec (10000 frames, 8.00s computing); 3.0% {waits}",
        f"train epoch 3: 1100.5 frames/sec (10000 frames, 8.50s computing); 7.25% {waits}"])
    assert speed.collective_shares(text) == [12.5, 3.0, 7.25]
    assert speed.collective_shares(text, first_epoch=1)[0] == 30.0


def test_seconds_per_step_over_epochs_2_on():
    lines = [(1.0, "train epoch 1, finished after 10 steps, 0:00:01 elapsed"),
             (3.0, "train epoch 2, finished after 20 steps, 0:00:02 elapsed"),
             (5.5, "train epoch 3, finished after 30 steps, 0:00:02 elapsed")]
    output = Output("\n".join(line for _, line in lines), lines)
    assert speed.seconds_per_step(output, 3) == pytest.approx(4.5 / 50)


@pytest.mark.mpi
def test_the_sync_probe_compares_meeting_every_step_with_running_free_on_two_ranks():
    result = run_mpi(2, [str(speed.SYNC_PROBE), "--step-ms", "4", "--blocks", "4", "--block-seconds", "0.3"],
                     timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    found = speed.PROBE_RATIO.search(result.stdout)
    assert found is not None, result.stdout
    # Meeting every step can only lose time, but a block of 0.3 s on a loaded machine can be slowed alone:
    # with 2 ranks the ratio stays within (0, 2] however the load falls on the blocks.
    assert 0.1 < float(found.group(1)) <= 2.0, result.stdout
    line = result.stdout.strip()
    assert re.search(r"2 ranks, steps of [\d.]+ ms: .*\(4 blocks\); slow steps \d+%, \d+%$", line), line


def test_the_sync_probe_refuses_a_single_block():
    result = subprocess.run([sys.executable, str(speed.SYNC_PROBE), "--blocks", "1"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "--blocks at least 2" in result.stderr
