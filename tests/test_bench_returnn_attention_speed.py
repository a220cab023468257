"""The pure helpers of ``benchmarks/bench_returnn_attention_speed.py``'s rows on several ranks: RETURNN's
command under its own mpirun, the summed rate of processes run at once (a failed process fails the row),
and the engine's '% in collectives' read from its epoch lines."""
from __future__ import annotations

import sys

import pytest

from helpers import ROOT

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
