"""bench_chaos counts a fault as survived only when its effect is in the job's log: a restart by supervise
(kill), a requeue (preempt), the stall watchdog's end and a restart (stall), the resume's fallback from
the cut checkpoint (truncate), a line showing the lost link and a restart (cut), mpirun_guard naming the
killed host and a restart (hostkill). The log lines are made by the real code (supervise, the watchdog, the
checkpoint reader), so a change of their wording that the benchmark would misread fails here. No mpirun,
no training."""
from __future__ import annotations

import os
import sys

import h5py
import numpy as np
import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_chaos as chaos  # noqa: E402
from engine.distributed.watchdog import StallLimits, Watchdog  # noqa: E402
from engine.tools.mpirun_guard import Report  # noqa: E402
from engine.tools.supervise import Supervisor  # noqa: E402
from engine.training.checkpoints.reading import CheckpointDamaged, read_checkpoint  # noqa: E402


def supervise_lines(capfd, exit_code: int) -> str:
    """What supervise logs for a command that exits ``exit_code`` once (then 0)."""
    script = ("import os, sys; flag = sys.argv[1]; first = not os.path.exists(flag); open(flag, 'w'); "
              f"sys.exit({exit_code} if first else 0)")
    capfd.readouterr()
    flag = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"chaos-test-{os.getpid()}-{exit_code}")
    if os.path.exists(flag):
        os.remove(flag)
    try:
        Supervisor([sys.executable, "-c", script, flag], max_restarts=2, backoff=0.0, max_backoff=0.0).run()
    finally:
        if os.path.exists(flag):
            os.remove(flag)
    return capfd.readouterr().err


def stall_end_line(missing_rank: int = 1) -> str:
    """Rank 0's watchdog ending a 2-rank job whose other rank stopped (SIGSTOP) before a collective."""
    now, ended = [100.0], []

    class Channel:
        def report_wait(self, *args) -> None:
            pass

        def collect_waits(self) -> list:
            return []

    def abort(message: str, code: int) -> None:
        ended.append(message)

    dog = Watchdog(StallLimits(None, chaos.STALL_TIMEOUT), abort, rank=0, size=2, channel=Channel(),
                   clock=lambda: now[0], start=False)
    with dog.collective("step signal (allreduce)"):
        now[0] += chaos.STALL_TIMEOUT + 1
        dog.check()
    assert ended and f"rank {missing_rank}" in ended[0]
    return ended[0]


def fallback_line(path: str) -> str:
    """The resume's warning for a cut checkpoint (``resume._newest_usable``)."""
    with h5py.File(path, "w") as f:
        f["params/x"] = np.zeros(10000)
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(CheckpointDamaged) as exc:
        read_checkpoint(path)
    return f"{exc.value} Falling back to the checkpoint before it."


def guard_line(host: str) -> str:
    """mpirun_guard's message after mpirun lost its daemon on ``host`` and exited 137."""
    report = Report()
    for line in ["hosts: 2 ranks on 2 hosts: simhost0 rank 0; simhost1 rank 1",
                 "A daemon failed to report back after being spawned. This could", "",
                 "  Local host:    simhost0", f"  Remote host:   {host}", "  Daemon exit status: 137"]:
        report.note(line.encode())
    return report.message(137) + "\n"


TRAIN = "train epoch 3, step 12, score 0.5\n"
PRTERUN_ABORT = ("-" * 74 + "\nprterun has exited due to process rank 0 with PID 0 on node vm calling\n"
                 "\"abort\". This may have caused other processes in the application to be\n"
                 + "-" * 74 + "\n")


def test_each_fault_is_survived_only_with_its_own_effect_in_its_part_of_the_log(capfd, tmp_path):
    restart, requeue = supervise_lines(capfd, 137), supervise_lines(capfd, 99)
    assert "; restart 1 of 2" in restart and "exiting 99" in requeue
    cut = str(tmp_path / "net.003.step40")
    parts = [("kill", TRAIN + restart),
             ("preempt", TRAIN + requeue),
             # as in a real log: Open MPI's abort message ends in a NUL byte before supervise's line
             ("stall", TRAIN + "[rank 0] " + stall_end_line() + "\n" + PRTERUN_ABORT + "\x00" + restart),
             ("truncate", TRAIN + restart + fallback_line(cut) + "\n" + TRAIN),
             ("cut", TRAIN + "[rank 0] " + stall_end_line() + "\n" + guard_line("simhost1") + restart),
             ("cut", TRAIN + "Timeout, server 198.18.0.2 not responding.\n" + restart),
             ("hostkill", TRAIN + guard_line("simhost1") + restart)]
    log, faults = b"", []
    for kind, text in parts:
        faults.append(chaos.Fault(kind, "x", len(log), cut if kind == "truncate" else ""))
        log += text.encode()
    effects = chaos.fault_effects(log, faults)
    assert all(effects), list(zip(parts, effects))
    assert "restart 1 of 2" in effects[0] and "exiting 99" in effects[1]
    assert "distributed_stall_timeout" in effects[2] and "net.003.step40" in effects[3]
    assert "distributed_stall_timeout" in effects[4] and "Timeout, server" in effects[5]
    assert "lost its daemon on simhost1 (rank 1)" in effects[6]


def test_a_fault_without_its_effect_is_not_survived(capfd, tmp_path):
    restart, requeue = supervise_lines(capfd, 137), supervise_lines(capfd, 99)
    cut = str(tmp_path / "net.003.step40")
    other = str(tmp_path / "net.002")
    cases = [
        ("kill", TRAIN),  # the signal was sent, nothing happened: no restart
        ("kill", TRAIN + requeue),  # a requeue is not a restart
        ("preempt", TRAIN + restart),  # the rank died instead of saving: a restart, not a requeue
        ("stall", TRAIN + restart),  # ended by something else than the watchdog
        ("stall", TRAIN + stall_end_line()),  # ended, but never restarted
        ("truncate", TRAIN + restart),  # the cut file was read as if whole (or not read at all)
        ("truncate", TRAIN + restart + fallback_line(other) + "\n"),  # another checkpoint fell back
        ("cut", TRAIN + restart),  # a restart, with nothing that shows a lost link
        ("cut", TRAIN + stall_end_line()),  # the link's loss ended the job, but it was never restarted
        ("hostkill", TRAIN + restart),  # a restart, with no lost host named
        ("hostkill", TRAIN + guard_line("simhost0") + restart),  # another host was lost
    ]
    for kind, text in cases:
        fault = chaos.Fault(kind, "x", 0, cut if kind == "truncate" else "")
        assert chaos.fault_effect(fault, text) is None, (kind, text)


def test_an_effect_after_the_next_fault_does_not_count_for_the_earlier_one(capfd):
    restart = supervise_lines(capfd, 137)
    log = (TRAIN + TRAIN + restart).encode()
    faults = [chaos.Fault("kill", "x", 0), chaos.Fault("kill", "y", len(TRAIN))]
    assert chaos.fault_effects(log, faults) == [None, chaos.fault_effect(faults[1], TRAIN + restart)]
    with pytest.raises(ValueError):
        chaos.fault_effect(chaos.Fault("flood", "x", 0), restart)
