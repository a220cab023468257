"""The benchmarks' parsing and verdicts, on made-up outputs and rows (no benchmark runs): a benchmark must
not print a PASS that its measurements do not support. The output lines are the engine's own (its
progress line and its epoch lines, printed by the engine's code), so a change of their format that the
benchmarks' patterns would misread fails here."""
from __future__ import annotations

import io
import re
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as scripts do

import bench_returnn  # noqa: E402
import bench_train  # noqa: E402
import timing  # noqa: E402
from engine.report.progress import Progress  # noqa: E402
from engine.runtime import log  # noqa: E402
from engine.training.report import EpochReport  # noqa: E402
from timing import Output, Row, RowFailed  # noqa: E402


def epoch_lines(capsys, epoch: int, frames: int) -> list[str]:
    """The two lines the engine prints when a train epoch ends (``EpochReport.finish``)."""
    log.init(verbosity=log.INFO)
    capsys.readouterr()
    report = EpochReport(f"train epoch {epoch}")
    report.scores.frames = frames
    report.finish()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"train epoch {epoch}: "), lines
    return lines


def progress_line(epoch: int) -> str:
    """The plain progress line of a long epoch (a pipe gets one every 60 seconds)."""
    progress = Progress(f"train epoch {epoch}", 50, stream=io.StringIO(), enabled=True)
    return progress.line(10, 51230.0, 0.5, 60.0)


def training_output(capsys, epochs: int = 3, frames: int = 1000, skip: int | None = None) -> Output:
    """A run's stamped output: each epoch a progress line 60 s in and its epoch lines 100 s apart."""
    stamps, now = [], 0.0
    for epoch in range(1, epochs + 1):
        stamps.append((now + 60.0, progress_line(epoch)))
        if epoch != skip:
            stamps += [(now + 100.0, line) for line in epoch_lines(capsys, epoch, frames * epoch)]
        now += 100.0
    return Output("\n".join(line for _, line in stamps), stamps)


def row(name: str, *values: float, failure: str = "") -> Row:
    return Row(name, lambda: 0.0, list(values), failure=failure)


# ----- bench_train: timing -----
def test_the_timing_runs_from_the_line_that_ends_epoch_1_not_from_a_progress_line(capsys):
    output = training_output(capsys)
    assert re.search(r"^train epoch 1: ", progress_line(1))  # what the old start pattern matched
    assert not re.search(bench_train.epoch_end_pattern(1), progress_line(1))
    # epochs 2 and 3 (2000 + 3000 frames) between the end of epoch 1 (100 s) and of epoch 3 (300 s)
    assert bench_train.epochs_rate(output, 3) == pytest.approx(5000 / 200.0)


def test_a_run_that_misses_an_epochs_line_has_no_rate(capsys):
    with pytest.raises(RowFailed, match=r"epoch\(s\) \[3\]"):
        bench_train.epochs_rate(training_output(capsys, skip=3), 3)


# ----- bench_train: the ceiling row -----
def test_the_ceiling_is_the_sum_of_all_processes_rates(capsys):
    assert bench_train.ceiling_rate([training_output(capsys), training_output(capsys)], 3) == \
        pytest.approx(2 * 5000 / 200.0)


@pytest.mark.parametrize("second, reason", [
    ("exit 1", "process 2 exited with 1"),
    ("no result", "process 2: None"),  # the thread ended without one (e.g. sys.exit in the thread)
    ("exception", "process 2: OSError"),
    ("no epoch line", "process 2: no frames/sec line"),
])
def test_a_ceiling_with_a_failed_process_fails(capsys, second, reason):
    good = training_output(capsys)
    failed = {"exit 1": Output(good.text, good.stamps, returncode=1), "no result": None,
              "exception": OSError("cannot start"), "no epoch line": training_output(capsys, skip=2)}[second]
    with pytest.raises(RowFailed, match=re.escape(reason)):
        bench_train.ceiling_rate([good, failed], 3)


def test_the_ceiling_row_of_a_run_whose_process_exits_in_its_thread_is_fail(capsys, monkeypatch):
    """Through ``independent_row`` and ``interleaved``: ``run_stamped``'s exit in a thread ends only that
    thread; the row must not report the other process's rate."""
    good = training_output(capsys)
    calls = []

    def run_stamped(cmd, env, timeout=1800, check=True):
        calls.append(check)
        if len(calls) == 2:
            sys.exit("benchmark run failed (exit 1)")  # what run_stamped does when checking
        return good

    monkeypatch.setattr(bench_train, "run_stamped", run_stamped)
    ceiling = bench_train.Trainer("config.py", 3).independent_row("2 single processes (ceiling)", 2)
    timing.interleaved([ceiling], runs=2, progress=False)
    assert ceiling.failed and ceiling.values == [], ceiling.failure
    assert re.search(r"^1 of 2 processes failed: process [12]: SystemExit\('benchmark run failed",
                     ceiling.failure), ceiling.failure
    assert calls == [False, False]  # measured once: a failed row runs no more
    assert ceiling.spread() == "FAIL"


def test_the_report_prints_a_failed_ceiling_as_fail_not_as_a_figure(capsys):
    single = [row("1 process, default", 30000, 29000, 31000), row("1 process, 1 thread", 26000, 26000, 26000)]
    ceiling = row("2 single processes (ceiling)", failure="1 of 2 processes failed: process 2 exited with 1")
    under_mpirun = row("1 rank under mpirun", 28000, 28000, 28000)
    parallel = {"mpi": {mode: row(f"2 ranks {mode}", 56000, 56000, 56000) for mode in bench_train.MODES}}
    trainer = bench_train.Trainer("config.py", 3)
    for r in [*single, under_mpirun, *parallel["mpi"].values()]:
        trainer.memory[r.name] = [(500.0, 300.0, 200.0)] * 3
    capsys.readouterr()
    bench_train.report(single, ceiling, under_mpirun, parallel, trainer, 2)
    out = capsys.readouterr().out
    ceiling_line = next(line for line in out.splitlines() if line.startswith(ceiling.name))
    assert "FAIL" in ceiling_line and not re.search(r"\d\.\d+x", ceiling_line), out
    assert "FAIL: 1 of 2 processes failed: process 2 exited with 1" in out
    assert "PASS: 2 ranks grad, default backend and threading: 1.87x" in out and "ceiling FAIL" in out


# ----- bench_train: the monitoring verdict -----
def test_the_monitoring_target_is_fixed_whatever_the_noise():
    off, on = row("off", 100.0, 99.8, 100.2), row("on", 97.0, 96.8, 97.2)
    # a disturbed control row once lowered the bar to 0.88: 3% slower was a PASS
    disturbed = bench_train.monitoring_verdict(on, off, row("off, again", 90.0, 90.0, 90.0))
    assert disturbed.startswith("MISS: everything on / everything off: 0.970 (target >= 0.98"), disturbed
    assert "off again / off: 0.900 (beyond the target's margin" in disturbed
    quiet = bench_train.monitoring_verdict(on, off, row("off, again", 100.5, 100.4, 100.6))
    assert quiet.startswith("MISS") and "0.970" in quiet and "off again / off: 1.005" in quiet
    assert "beyond" not in quiet
    assert bench_train.monitoring_verdict(row("on", 98.5, 98.4, 98.6), off,
                                          row("off, again", 103.0, 103.0, 103.0)).startswith("PASS")
    # 0.98 x (99.8..100.2) = 97.8..98.2 overlaps 97.5..98.0: no verdict either way
    assert bench_train.monitoring_verdict(row("on", 97.8, 97.5, 98.0), off, off).startswith(
        "INCONCLUSIVE: ranges overlap")


def test_a_monitoring_row_that_failed_makes_the_verdict_fail():
    text = bench_train.monitoring_verdict(row("on", 99.0), row("off", failure="exit 1"), row("again", 99.0))
    assert text.startswith("FAIL") and "off: exit 1" in text


# ----- bench_train: the memory verdict -----
def test_the_memory_verdict_follows_the_ranges_rule_on_the_peaks():
    base = row("1 rank under mpirun", 1.0)
    base_runs = [(540.0, 300.0, 240.0), (541.0, 301.0, 240.0), (542.0, 300.0, 240.0)]
    fused = 1.7  # the limit's range: 541.7..543.7

    def verdict(peaks: list[float]) -> str:
        runs = [(peak, 303.0, 248.0) for peak in peaks]
        return bench_train.memory_verdict(row("2 ranks grad", 1.0), runs, base, base_runs, fused)

    # every run above every run of the limit: MISS, though the old rule (the median at most the limit's
    # median + both rows' ranges, 541 + 1.7 + 1 + 2) passed it
    assert verdict([544.0, 545.0, 545.0]).startswith("MISS"), verdict([544.0, 545.0, 545.0])
    # a rank that peaks 20 MiB higher but has freed it by the end (same anonymous memory) misses
    assert verdict([565.0, 566.0, 565.0]).startswith("MISS")
    # a scattered row's range overlaps: no verdict either way (its noise no longer widens the limit)
    assert verdict([520.0, 545.0, 570.0]).startswith("INCONCLUSIVE: ranges overlap")
    assert verdict([541.0, 543.0, 545.0]).startswith("INCONCLUSIVE: ranges overlap")
    assert verdict([530.0, 531.0]).startswith("INCONCLUSIVE: 2 run(s) of 2 ranks grad")
    text = verdict([538.0, 540.0, 539.0])
    assert text.startswith("PASS: 2 ranks grad: peak memory per rank, MiB"), text
    assert "2 ranks grad 539.0 (538.0..540.0, 3 runs); 1 rank under mpirun + fused buffers 1.7 MiB 542.7 " \
           "(541.7..543.7, 3 runs)" in text, text


def test_the_memory_verdict_of_a_failed_row_is_fail():
    text = bench_train.memory_verdict(row("2 ranks grad", failure="exit 1"), [], row("base", 1.0),
                                      [(540.0, 300.0, 240.0)], 1.7)
    assert text.startswith("FAIL")


# ----- timing -----
def test_a_verdict_that_needs_a_failed_row_is_fail_even_when_its_figures_pass():
    assert timing.verdict(True, "x", failed=[row("a", 1.0)]) == "PASS: x"
    assert timing.verdict(False, "x", failed=[row("a", 1.0)]) == "MISS: x"
    assert timing.verdict(True, "x", failed=[row("a", 1.0), row("b", failure="exit 2")]) == \
        "FAIL: x [failed: b: exit 2]"


def side(name: str, *values: float, failure: str = "") -> timing.Side:
    return timing.Side(name, tuple(values), failure)


def test_a_verdict_decides_only_when_the_ranges_are_apart():
    fast, slow = side("a", 5.0, 5.2, 5.4), side("b", 5.9, 6.1, 6.6)
    assert timing.decide(fast, slow, better="lower") == ("PASS", "")
    assert timing.decide(slow, fast, better="lower") == ("MISS", "")
    assert timing.decide(fast, slow, better="higher") == ("MISS", "")
    # the medians differ (5.2 against 5.5), the ranges overlap: no winner
    assert timing.decide(fast, side("c", 5.3, 5.5, 7.0), better="lower") == ("INCONCLUSIVE", "ranges overlap")
    assert timing.decide(fast, side("d", 5.4, 5.5, 5.6), better="lower")[0] == "INCONCLUSIVE"  # touching
    # a factor scales the other side: a >= 1.8 x b
    assert timing.decide(side("a", 3.7, 3.8, 3.9), side("b", 2.0, 2.0, 2.05), factor=1.8)[0] == "PASS"
    assert timing.decide(side("a", 3.5, 3.6, 3.7), side("b", 2.0, 2.0, 2.1), factor=1.8)[0] == "INCONCLUSIVE"
    assert timing.decide(side("a", 3.2, 3.3, 3.4), side("b", 2.0, 2.0, 2.1), factor=1.8)[0] == "MISS"


def test_a_verdict_against_a_fixed_target_is_inconclusive_when_the_range_contains_it():
    target = timing.Side.target("85%", 10.0)
    assert timing.decide(side("t", 8.0, 9.0, 9.9), target, better="lower") == ("PASS", "")
    assert timing.decide(side("t", 9.0, 9.5, 10.5), target, better="lower") == \
        ("INCONCLUSIVE", "the range contains the target")
    assert timing.decide(side("t", 10.1, 11.0, 12.0), target, better="lower") == ("MISS", "")


def test_a_verdict_on_fewer_than_3_runs_or_a_failed_side_decides_nothing():
    status, why = timing.decide(side("a", 1.0, 1.1), side("b", 5.0, 5.1, 5.2), better="lower")
    assert status == "INCONCLUSIVE" and "2 run(s) of a" in why and "at least 3" in why
    status, why = timing.decide(side("a", 1.0, 1.1, 1.2), side("b", failure="exit 1"), better="lower")
    assert status == "FAIL" and why == "failed: b: exit 1"
    assert timing.decide(side("a"), side("b", 1.0, 1.0, 1.0))[0] == "FAIL"  # no run at all is no figure
    with pytest.raises(ValueError):
        timing.decide(side("a", 1.0), side("b", 1.0), better="faster")


def test_the_verdict_line_prints_both_sides_medians_and_ranges():
    line = timing.compare(side("engine s/step", 5.0, 5.2, 5.4), side("horovod s/step", 5.3, 5.9, 6.6),
                          "engine vs horovod", better="lower")
    assert line == ("INCONCLUSIVE: ranges overlap: engine vs horovod [engine s/step 5.200 (5.000..5.400, "
                    "3 runs); horovod s/step 5.900 (5.300..6.600, 3 runs)]")
    line = timing.compare(side("f32", 3.7, 3.8, 3.9), side("f16", 2.0, 2.0, 2.05), "x", factor=1.8,
                          fmt="{:.2f}")
    assert line == "PASS: x [f32 3.80 (3.70..3.90, 3 runs); f16 x 1.8 3.60 (3.60..3.69, 3 runs)]"
    assert timing.Side.of(row("r", 1.0, 2.0, 3.0), scale=2.0).values == (2.0, 4.0, 6.0)


def test_interleaved_keeps_measuring_the_other_rows_after_one_fails():
    def broken() -> float:
        raise RowFailed("exit 1")

    good, bad = Row("good", lambda: 5.0), Row("bad", broken)
    timing.interleaved([good, bad], runs=3, progress=False)
    assert good.values == [5.0, 5.0, 5.0] and bad.values == [] and bad.failure == "exit 1"
    assert bad.spread() == "FAIL" and bad.median != bad.median  # NaN: never above or below a target


# ----- bench_returnn -----
def test_returnn_is_judged_by_its_best_row():
    engine = [row("engine, 1 process, default threading", 30000.0, 29500.0, 30500.0),
              row("engine, 1 process, 1 thread(s)", 26000.0, 26000.0, 26000.0)]
    returnn = [row("RETURNN BasicLSTM, 1 process, 1 thread(s)", 16000.0, 15900.0, 16100.0),
               row("RETURNN BasicLSTM, 1 process, 2 thread(s)", 21000.0, 20800.0, 21200.0),
               row("RETURNN NativeLstm2, 1 process, 1 thread(s)", 8000.0, 8000.0, 8000.0),
               row("RETURNN NativeLstm2, 1 process, 2 thread(s)", 9000.0, 9000.0, 9000.0)]
    target, *info = bench_returnn.verdicts(engine, returnn, ["BasicLSTM", "NativeLstm2"])
    # against its 1-thread row alone the engine would be 1.88x (a PASS); its best row is the 2-thread one
    assert target.startswith("MISS: engine = 1.43x RETURNN's best row"), target
    assert "RETURNN BasicLSTM, 1 process, 2 thread(s) x 1.5 31500 (31200..31800, 3 runs)" in target
    assert "[engine, 1 process, default threading 30000 (29500..30500, 3 runs)" in target
    assert info == ["info: engine = 1.43x RETURNN BasicLSTM's best row ('RETURNN BasicLSTM, 1 process, 2 "
                    "thread(s)')", "info: engine = 3.33x RETURNN NativeLstm2's best row ('RETURNN "
                    "NativeLstm2, 1 process, 2 thread(s)')"]
    assert bench_returnn.verdicts(engine, returnn[2:], ["NativeLstm2"])[0].startswith("PASS")
    # 1.5 x 20000 = 30000 lies in the engine's range 29500..30500: no winner
    close = [row("RETURNN BasicLSTM, 1 process, 1 thread(s)", 20000.0, 19900.0, 20100.0)]
    assert bench_returnn.verdicts(engine, close, ["BasicLSTM"])[0].startswith("INCONCLUSIVE: ranges overlap")
    broken = [*returnn, row("RETURNN BasicLSTM, 1 process, 4 thread(s)", failure="exit 1")]
    failed = bench_returnn.verdicts(engine, broken, ["BasicLSTM"])[0]
    assert failed.startswith("FAIL: failed: RETURNN BasicLSTM, 1 process, 4 thread(s): exit 1"), failed


def test_each_returnn_thread_count_gets_its_own_config(tmp_path):
    from workload import write_returnn_config

    one = write_returnn_config(str(tmp_path), "corpus.hdf", 3, "BasicLSTM", 1)
    two = write_returnn_config(str(tmp_path), "corpus.hdf", 3, "BasicLSTM", 2)
    assert one != two
    assert '"intra_op_parallelism_threads": 1' in open(one).read()
    assert '"intra_op_parallelism_threads": 2, "inter_op_parallelism_threads": 2' in open(two).read()


def test_the_returnn_benchmark_times_from_the_end_of_epoch_1(capsys):
    output = training_output(capsys)
    assert bench_returnn.rate(output, 1000, 3) == pytest.approx(2000 / 200.0)


# ----- bench_returnn_ctc_demo -----
def test_each_program_runs_on_n_ranks_under_the_mpirun_beside_its_own_python():
    import bench_returnn_ctc_demo as demo

    assert demo.program_command("returnn", "/r/bin/python", 1) == ["/r/bin/python", "-m", "returnn"]
    two = demo.program_command("returnn", "/r/bin/python", 2)
    assert two[0] == "/r/bin/mpirun" and two[two.index("-np") + 1] == "2"
    assert two[-3:] == ["/r/bin/python", "-m", "returnn"]
    engine = demo.program_command("engine", "/e/bin/python", 3)
    assert engine[0] == "/e/bin/mpirun" and engine[engine.index("-np") + 1] == "3"
    assert engine[-1].endswith("rnn.py")


def test_returnn_with_horovod_scores_only_the_dev_batches_every_rank_has(tmp_path):
    """Measured with RETURNN 1.20261022 + Horovod 0.28.1 on 2 ranks: 20 dev utterances of corpus 1 (seed 2)
    make 3 batches, and RETURNN scored 2 of them (365 of the 545 labels)."""
    import numpy as np

    import bench_returnn_ctc_demo as demo

    dev = str(tmp_path / "dev.hdf")
    demo.make_corpus(dev, 20, 2, np.random.RandomState(0).standard_normal((demo.PHONES + 1, demo.INPUT_DIM)))
    assert demo.dev_batches(dev) == 3
    assert demo.returnn_dev_batches_scored(3, 2) == 2
    assert demo.returnn_dev_batches_scored(8, 2) == 8
    assert demo.returnn_dev_batches_scored(8, 3) == 6
