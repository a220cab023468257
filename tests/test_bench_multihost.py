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
from multihost_rows import MODELS, Setting, settings  # noqa: E402
from multihost_runs import STEP_LINE, UNLIMITED, Segment, segment_plan, unknown_key  # noqa: E402
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
    assert [int(STEP_LINE.match(line).group(1)) for line in lines] == [1, 2]
    assert not STEP_LINE.match("train epoch 1: step 1200 of 5000")  # a progress line
    assert not STEP_LINE.match("train epoch 2, step 1, score 1.0")  # epoch 1 only


def test_a_key_the_engine_does_not_know_makes_its_row_na(capsys):
    log.init(verbosity=log.INFO)
    capsys.readouterr()
    log_notes([Finding("config", (), "", "distributed_bucket_mb", UNKNOWN)])
    captured = capsys.readouterr()
    (line,) = (captured.out + captured.err).splitlines()
    rows = {s.name: s for s in settings("large", full=True)}
    assert unknown_key(line, rows["grad, mpi, bucket 1 MB"])
    assert unknown_key(line, rows["grad, mpi, no overlap (bucket 0)"])
    assert not unknown_key(line, rows["grad, mpi, fp16"])  # another row's key
    assert not unknown_key(line, rows["grad, mpi, default (25 MB buckets)"])
    hinted = "config key 'distributed_bucket_mb' (did you mean 'distributed_backend'?): not a key of this " \
             "engine nor of RETURNN"
    assert unknown_key(hinted, rows["grad, mpi, bucket 1 MB"])  # the engine's hint for a near name


@pytest.mark.parametrize("model", list(MODELS))
def test_segments_are_whole_periods(model):
    for setting in settings(model, full=True):
        warmup, steps, total = segment_plan(setting, MODELS[model], 3)
        assert warmup >= 2 and warmup % setting.period == 0, setting
        assert steps >= MODELS[model].segment and steps % setting.period == 0, setting
        assert total == warmup + 3 * steps


def measured(name: str, period: int, seconds: dict[str, list[float]], ranks: int = 2, refused: str = "",
             tag: str = "engine", failure: str = "") -> bench.Measured:
    m = bench.Measured(Setting(name, period=period, ranks=ranks, tag=tag), refused=refused,
                       failure=failure)
    runs = len(next(iter(seconds.values())))
    for i in range(runs):
        m.runs.append([Segment(link, s[i] * 4, 4, 1e6) for link, s in seconds.items()])
    return m


def test_param_verdict_pass_miss_inconclusive_and_na():
    single = measured("1 process", 1, {UNLIMITED: [1.0, 1.02, 0.98]}, ranks=1)
    rows = {"single": single,
            "param, sync every 10": measured("param, sync every 10", 10,
                                             {UNLIMITED: [1.05] * 3, "100mbit": [1.05, 1.0, 1.08]}),
            "param, sync every 20": measured("param, sync every 20", 20,
                                             {UNLIMITED: [1.05] * 3, "100mbit": [1.2, 1.3, 1.25]}),
            "param, sync every 30": measured("param, sync every 30", 30,
                                             {UNLIMITED: [1.05] * 3, "100mbit": [1.0, 1.1, 1.2]}),
            "param, sync every 50": measured("param, sync every 50", 50, {UNLIMITED: [1.0]},
                                             refused="config key 'x': not a key of this engine")}
    lines = bench.verdicts({"small": rows}, {}, {"100mbit": 95e6}, ["100mbit"])
    param = [line for line in lines if "param" in line]
    # 2 x 1.0 / 1.05 = 1.90x; the slowest step 1.08 is below the fastest single x 2/1.8 = 1.089
    assert param[0].startswith("PASS") and "1.90x" in param[0], param[0]
    assert "(1.000..1.080, 3 runs)" in param[0] and "(1.089..1.133, 3 runs)" in param[0], param[0]
    assert param[1].startswith("MISS") and "1.60x" in param[1]  # 2 x 1.0 / 1.25
    # a median of 1.82x, but the slowest run (1.2 s) is past the target: the ranges overlap
    assert param[2].startswith("INCONCLUSIVE: ranges overlap") and "1.82x" in param[2], param[2]
    assert param[3].startswith("n/a") and "not a key" in param[3]


def large_rows(engine: dict[str, list[float]], horovod: dict[str, list[float]],
               failed: dict[str, str] = {}) -> dict:  # noqa: B006 (read only)
    rows = {}
    for tag, seconds in (("engine", engine), ("horovod", horovod)):
        for name, values in seconds.items():
            rows[name] = measured(name, 1, {UNLIMITED: [1.0] * len(values), "100mbit": values},
                                  tag=tag, failure=failed.get(name, ""))
    return rows


def test_allreduce_and_fp16_verdicts_on_the_allreduce_alone():
    bits = MODELS["large"].grad_bytes * 8
    alone = {("large", "100mbit", "float32"): {"times": [bits / 90e6, bits / 89e6, bits / 91e6]},
             ("large", "100mbit", "fp16"): {"times": [bits / 90e6 / 1.7] * 3}}
    lines = bench.verdicts({"large": large_rows({"grad, mpi": [8.0] * 3}, {"grad, horovod": [7.5] * 3})},
                           alone, {"100mbit": 95e6}, ["100mbit"])
    # 90 of the measured 95 Mbit/s = 94.7% (93.7..95.8%): all above the 85% target
    assert lines[0].startswith("PASS: allreduce") and "94.7% (93.7..95.8%)" in lines[0], lines[0]
    assert lines[1].startswith("n/a: overlap")  # no bucket row
    assert lines[2].startswith("MISS: fp16") and "1.70x" in lines[2]
    slow = {key: {"times": [t * 1.12 for t in r["times"]]} for key, r in alone.items()}  # 84.6% (83.7..85.5)
    line = bench.verdicts({}, slow, {"100mbit": 95e6}, ["100mbit"])[0]
    assert line.startswith("INCONCLUSIVE: the range contains the target"), line
    refused = {**alone, ("large", "100mbit", "fp16"): {"refused": "no fp16 here"}}
    assert bench.verdicts({}, refused, {"100mbit": 95e6}, ["100mbit"])[2].startswith("FAIL: failed: ")


def test_horovod_verdict_takes_each_sides_best_row_and_its_range():
    engine = {"grad, mpi, fp16": [5.0, 5.2, 5.4], "grad, mpi, default": [8.0, 8.1, 8.2]}
    won = bench.horovod_verdict(large_rows(engine, {"grad, horovod, fp16": [5.9, 6.0, 6.6],
                                                    "grad, horovod": [9.0, 9.1, 9.2]}))
    assert won.startswith("PASS") and "engine 'grad, mpi, fp16' s/step 5.200 (5.000..5.400" in won, won
    assert "horovod 'grad, horovod, fp16' s/step 6.000 (5.900..6.600" in won and "1.15x" in won, won
    lost = bench.horovod_verdict(large_rows(engine, {"grad, horovod, fp16": [4.0, 4.5, 4.9]}))
    assert lost.startswith("MISS"), lost
    close = bench.horovod_verdict(large_rows(engine, {"grad, horovod, fp16": [5.3, 5.9, 6.6]}))
    assert close.startswith("INCONCLUSIVE: ranges overlap"), close


@pytest.mark.parametrize("failed_side", ["engine", "horovod"])
def test_a_failed_or_refused_row_fails_the_horovod_verdict_naming_it(failed_side):
    engine = {"grad, mpi, fp16": [5.0, 5.2, 5.4], "grad, mpi, bucket 1 MB": [1.0]}
    horovod = {"grad, horovod, 25 MB buckets + fp16": [5.9, 6.0, 6.6], "grad, horovod, bucket 1 MB": [1.0]}
    broken = "grad, mpi, bucket 1 MB" if failed_side == "engine" else "grad, horovod, bucket 1 MB"
    line = bench.horovod_verdict(large_rows(engine, horovod, {broken: "exit 1: horovod crashed"}))
    # the failed row's one figure (1.0 s/step) would win either side; it is named, never dropped or used
    assert line.startswith("FAIL") and f"'{broken}' FAIL: exit 1: horovod crashed" in line, line
    rows = large_rows(engine, horovod)
    rows[broken].refused = "config key 'x': not a key of this engine"
    line = bench.horovod_verdict(rows)
    assert line.startswith("FAIL") and f"'{broken}' n/a: config key 'x'" in line, line


@pytest.mark.parametrize("model", list(MODELS))
def test_horovod_gets_its_best_settings_buckets_fp16_and_tuned_cycle(model):
    """The default plan gives Horovod what it gives the engine: bucketed rows (one grouped allreduce per
    bucket, overlapped), fp16 on the wire, and its tuned cycle time, so its best row is a fair one."""
    rows = [s for s in settings(model, full=False) if s.tag == "horovod"]
    assert rows and all(s.backend == "horovod" for s in rows)
    buckets = [dict(zip(s.overrides[::2], s.overrides[1::2])).get("++distributed_bucket_mb") for s in rows]
    assert any(b != "0" for b in buckets), buckets  # None: the default 25 MB buckets
    engine = [s for s in settings(model, full=False) if s.tag == "engine"]
    for wire in ("fp16",):
        if any("++distributed_wire_format" in s.overrides and wire in s.overrides for s in engine):
            tuned = [s for s in rows if wire in s.overrides and dict(s.env).get("HOROVOD_CYCLE_TIME") == "1"]
            assert any(dict(zip(s.overrides[::2], s.overrides[1::2])).get("++distributed_bucket_mb") != "0"
                       for s in tuned), [s.name for s in tuned]
    for s in rows:  # the row's name says what it runs
        argv = s.argv()
        assert argv[argv.index("++distributed_backend") + 1] == "horovod"
        if "fp16" in s.name:
            assert "fp16" in argv
        if "bucket 1 MB" in s.name:
            assert argv[argv.index("++distributed_bucket_mb") + 1] == "1"
        if "cycle 1ms" in s.name:
            assert dict(s.env)["HOROVOD_CYCLE_TIME"] == "1"
