"""bench_multihost's parsing, row plans and verdicts, on the engine's own lines and made-up figures (no
namespaces, no training): a row is timed from the engine's per-step lines, a row whose key the engine
does not know is n/a (never a figure of a run without the feature), every link segment holds the same
number of reductions, and a verdict says PASS only where its figures support it."""
from __future__ import annotations

import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as scripts do

import bench_multihost as bench  # noqa: E402
from engine.config.key_check import UNKNOWN, Finding, log_notes  # noqa: E402
from engine.runtime import log  # noqa: E402
from engine.training.report import EpochReport  # noqa: E402


def test_the_engines_step_line_is_what_a_segment_is_timed_by(capsys):
    log.init(verbosity=log.TRACE)
    capsys.readouterr()
    report = EpochReport("train epoch 1")
    report.step_done(2, [3.0, 1.0, 10.0, 100.0], 0.5)
    report.step_done(2, [3.0, 1.0, 10.0, 100.0], 0.5)
    lines = capsys.readouterr().out.splitlines()
    assert [int(bench.STEP_LINE.match(line).group(1)) for line in lines] == [1, 2]
    assert not bench.STEP_LINE.match("train epoch 1: step 1200 of 5000")  # a progress line
    assert not bench.STEP_LINE.match("train epoch 2, step 1, score 1.0")  # epoch 1 only


def test_a_key_the_engine_does_not_know_makes_its_row_na(capsys):
    log.init(verbosity=log.INFO)
    capsys.readouterr()
    log_notes([Finding("config", (), "", "distributed_bucket_mb", UNKNOWN)])
    captured = capsys.readouterr()
    (line,) = (captured.out + captured.err).splitlines()
    rows = {s.name: s for s in bench.settings("large", full=True)}
    assert bench.unknown_key(line, rows["grad, mpi, bucket 1 MB"])
    assert bench.unknown_key(line, rows["grad, mpi, no overlap (bucket 0)"])
    assert not bench.unknown_key(line, rows["grad, mpi, fp16"])  # another row's key
    assert not bench.unknown_key(line, rows["grad, mpi, default (25 MB buckets)"])
    hinted = "config key 'distributed_bucket_mb' (did you mean 'distributed_backend'?): not a key of this " \
             "engine nor of RETURNN"
    assert bench.unknown_key(hinted, rows["grad, mpi, bucket 1 MB"])  # the engine's hint for a near name


@pytest.mark.parametrize("model", list(bench.MODELS))
def test_segments_are_whole_periods(model):
    for setting in bench.settings(model, full=True):
        warmup, steps, total = bench.segment_plan(setting, bench.MODELS[model], 3)
        assert warmup >= 2 and warmup % setting.period == 0, setting
        assert steps >= bench.MODELS[model].segment and steps % setting.period == 0, setting
        assert total == warmup + 3 * steps


def measured(name: str, period: int, seconds: dict[str, list[float]], ranks: int = 2, refused: str = "",
             tag: str = "engine") -> bench.Measured:
    m = bench.Measured(bench.Setting(name, period=period, ranks=ranks, tag=tag), refused=refused)
    runs = len(next(iter(seconds.values())))
    for i in range(runs):
        m.runs.append([bench.Segment(link, s[i] * 4, 4, 1e6) for link, s in seconds.items()])
    return m


def test_param_verdict_pass_miss_and_na():
    single = measured("1 process", 1, {bench.UNLIMITED: [1.0, 1.1, 0.9]}, ranks=1)
    rows = {"single": single,
            "param, sync every 10": measured("param, sync every 10", 10,
                                             {bench.UNLIMITED: [1.05] * 3, "100mbit": [1.1, 1.0, 1.2]}),
            "param, sync every 20": measured("param, sync every 20", 20,
                                             {bench.UNLIMITED: [1.05] * 3, "100mbit": [1.2, 1.3, 1.25]}),
            "param, sync every 50": measured("param, sync every 50", 50, {bench.UNLIMITED: [1.0]},
                                             refused="config key 'x': not a key of this engine")}
    lines = bench.verdicts({"small": rows}, {}, {"100mbit": 95e6}, ["100mbit"])
    param = [line for line in lines if "param" in line]
    assert param[0].startswith("PASS") and "1.82x" in param[0]  # 2 x 1.0 / 1.1
    assert param[1].startswith("MISS") and "1.60x" in param[1]  # 2 x 1.0 / 1.25
    assert param[2].startswith("n/a") and "not a key" in param[2]


def test_allreduce_and_horovod_verdicts():
    grad_bytes = bench.MODELS["large"].grad_bytes
    alone = {("large", "100mbit", "float32"): {"times": [grad_bytes * 8 / 90e6] * 3},
             ("large", "100mbit", "fp16"): {"times": [grad_bytes * 8 / 90e6 / 1.7] * 3}}
    large = {"grad, mpi": measured("grad, mpi", 1, {bench.UNLIMITED: [1.0], "100mbit": [8.0]}),
             "grad, horovod": measured("grad, horovod", 1, {bench.UNLIMITED: [1.0], "100mbit": [7.5]},
                                       tag="horovod")}
    lines = bench.verdicts({"large": large}, alone, {"100mbit": 95e6}, ["100mbit"])
    assert lines[0].startswith("PASS: allreduce") and "94.7%" in lines[0]  # 90 of the measured 95
    assert lines[1].startswith("n/a: overlap")  # no bucket row
    assert lines[2].startswith("MISS: fp16") and "1.70x" in lines[2]
    assert lines[3].startswith("MISS: 100mbit") and "'grad, horovod' 7.500s" in lines[3]
