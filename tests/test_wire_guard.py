"""fp16's range guard (engine/distributed/wire_guard.py): each reduction's fp16 values are scaled by a
power of two from the peaks of all ranks before the cast, and unscaled in float32 after it, so no cast
and no partial sum overflows; a genuinely non-finite value travels unscaled and still stops training
with ``stop_on_nonfinite_train_score``'s message. The bit-for-bit checks of the reductions with the
guard (one call, buckets, ``start_allreduce``, both backends) are in tests/test_wire_format.py. Marked
``tf_latest``: what runs TensorFlow (the graph's peaks and casts, the mpi backend's trainings)."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import tensorflow as tf

from engine.distributed.wire import compress, decompress, from_wire_bits, to_wire_bits
from engine.distributed.wire_guard import (FP16_MAX, MAX_EXPONENT, RangeGuard, exponents_for, factors_for,
                                           headroom, peaks_in_graph, peaks_of)
from engine.runtime.errors import DATA_ERROR_EXIT_CODE
from helpers import ROOT, run, run_mpi

SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")
SIZES = (2, 3, 5, 8, 64, 1000)


# ----- the factors -----
def test_the_factor_is_the_largest_power_of_two_that_keeps_the_peak_within_the_headroom():
    rng = np.random.default_rng(0)
    peaks = np.float32(10.0 ** rng.uniform(-30, 30, 2000))
    for size in SIZES:  # and the peaks next to the headroom's powers of two, where rounding could mislead
        edges = np.float32(headroom(size) / 2.0 ** np.arange(-20, 40))
        below, above = np.nextafter(edges, np.float32(0)), np.nextafter(edges, np.float32(np.inf))
        peaks = np.concatenate([peaks, edges, below, above])
    for size in SIZES:
        factors = factors_for(peaks, size).astype(np.float64)
        assert factors.dtype == np.float64 and (np.log2(factors) % 1 == 0).all()  # powers of two
        assert (peaks * factors <= headroom(size)).all()
        assert (peaks * 2 * factors > headroom(size)).all()  # the next power would not fit
    assert headroom(2) == pytest.approx(32720.0, abs=0.1)  # 65504 / (2 (1 + 2^-11)^2)
    assert factors_for(np.float32([1.0]), 2)[0] == 2.0 ** 14  # 16384 <= 32720 < 32768
    assert factors_for(np.float32([1e6]), 2)[0] == 2.0 ** -5


def test_nothing_to_scale_or_a_nonfinite_peak_gives_factor_one_and_extremes_stay_normal_floats():
    special = np.float32([0.0, np.inf, np.nan, 1e-45, 3.4e38])
    e = exponents_for(special, 2)
    assert list(e[:3]) == [0, 0, 0]
    assert e[3] == MAX_EXPONENT  # a subnormal peak: scaled up as far as a normal float32 factor goes
    assert e[4] == -114 and 3.4e38 * 2.0 ** -114 <= headroom(2)  # float32's largest still fits
    factors = factors_for(special, 2)
    assert factors.dtype == np.float32 and np.isfinite(factors).all() and (factors > 0).all()


@pytest.mark.parametrize("size", SIZES)
def test_no_sum_of_scaled_values_can_leave_fp16s_range(size):
    """The worst case: every rank sends the largest magnitude that still gets its factor, all of one sign;
    summed rank after rank and as a tree (MPI's, the ring's and Horovod's orders are of these kinds),
    each addition rounded to fp16."""
    for peak in (np.nextafter(np.float32(headroom(size) / 8), np.float32(0)), np.float32(1e6),
                 np.float32(65504.0), np.float32(3.0e38)):
        factor = factors_for(np.float32([peak]), size)[0]
        value = (peak * factor).astype(np.float16)
        assert np.isfinite(value)
        with np.errstate(over="raise"):
            chain = np.float16(0)
            for _ in range(size):
                chain = chain + value
            level = [value] * size
            while len(level) > 1:
                level = [a + b for a, b in zip(level[::2], level[1::2])] + level[len(level) // 2 * 2:]
        assert chain <= FP16_MAX and level[0] <= FP16_MAX
    # without the factor the 2-rank sum of the headroom's double overflows: the bound is not loose by 2x
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(2 * headroom(2)) + np.float16(2 * headroom(2)))


@pytest.mark.tf_latest
def test_peaks_take_nan_as_inf_and_are_the_same_in_numpy_and_in_the_graph():
    arrays = [np.float32([-3.0, 2.0]), np.float32([np.nan, 1.0]), np.float32([-np.inf]),
              np.zeros(0, np.float32), np.float32([[-0.0]]),
              np.float32(np.random.default_rng(1).standard_normal(1000) * 1e20), np.float32(7.5)]
    want = np.float32([3.0, np.inf, np.inf, 0.0, 0.0, np.abs(arrays[5]).max(), 7.5])
    np.testing.assert_array_equal(peaks_of(arrays), want)
    tensors = [tf.constant(a) for a in arrays]
    np.testing.assert_array_equal(peaks_in_graph(tensors).numpy(), want)
    np.testing.assert_array_equal(tf.function(peaks_in_graph)(tensors).numpy(), want)


# ----- compress and decompress with the guard (two ranks that send the same values) -----
def two_ranks(tensors, wire="fp16", op="sum", guarded=True, compiled=False):
    """What a 2-rank reduction of ``tensors`` (both ranks sending them) gives through ``compress``: the
    exchange of equal peaks is the identity, the fp16 sum is TensorFlow's (each addition rounded)."""
    def exchange(peaks):
        return tf.numpy_function(lambda p: factors_for(p, 2), [peaks], tf.float32, stateful=True)

    def reduce(ts):
        on_wire = compress(ts, wire, op, as_bits=False, exchange=exchange if guarded else None)
        summed = [t + t for t in on_wire.tensors]
        return decompress(summed, on_wire, 2 if op == "average" else 0)

    return [t.numpy() for t in (tf.function(reduce) if compiled else reduce)(tensors)]


@pytest.mark.tf_latest
@pytest.mark.parametrize("compiled", [False, True])
def test_values_past_fp16s_range_are_summed_within_its_rounding_and_small_ones_gain_bits(compiled):
    big = np.float32([1e6, -7e4, 40000.0, 3.0, 1e-3])
    small = np.float32([3e-9, -2.0 ** -26, 1e-7, 0.0])  # all lost or subnormal in an unscaled fp16 wire
    scores = np.float32([5.0, 1e9])  # float32 beside them: never compressed, never scaled
    tensors = [tf.constant(big), tf.constant(small), tf.constant(scores)]
    got = two_ranks(tensors, wire=["fp16", "fp16", None], compiled=compiled)
    for g, v in zip(got[:2], (big, small)):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, 2 * v, rtol=2.0 ** -10)
    np.testing.assert_array_equal(got[2], 2 * scores)  # a float32 tensor the wire leaves alone: exact
    unguarded = two_ranks(tensors, wire=["fp16", "fp16", None], guarded=False, compiled=compiled)
    assert np.isinf(unguarded[0][:3]).all()  # the overflow the guard prevents
    assert (unguarded[1][[0, 1]] == 0).all()  # and the bits it gains
    average = two_ranks(tensors[:2], op="average", compiled=compiled)
    np.testing.assert_allclose(average[0], big, rtol=2.0 ** -10)


@pytest.mark.tf_latest
def test_a_nonfinite_value_travels_unscaled_and_stays_nonfinite():
    values = np.float32([1e6, np.inf, 1.0])
    got = two_ranks([tf.constant(values), tf.constant(np.float32([np.nan, 2.0]))])
    assert np.isinf(got[0][1]) and np.isinf(got[0][0])  # factor 1: 1e6 overflows beside the inf, as before
    assert got[0][2] == 2.0 and np.isnan(got[1][0]) and got[1][1] == 4.0


@pytest.mark.tf_latest
def test_bf16_has_float32s_range_and_no_guard():
    seen = []

    def exchange(peaks):
        seen.append(peaks)
        return peaks

    on_wire = compress([tf.constant(np.float32([1e30]))], "bf16", "sum", as_bits=False, exchange=exchange)
    assert on_wire.factors is None and not seen
    assert np.isfinite(decompress([on_wire.tensors[0] + on_wire.tensors[0]], on_wire)[0].numpy()).all()


def test_wire_bits_of_numpy_arrays_with_a_factor():
    values = np.float32([1e6, -3.0, 2.0 ** -30])
    bits = to_wire_bits(values, "fp16", 2.0 ** -5)
    np.testing.assert_array_equal(bits, (values * np.float32(2.0 ** -5)).astype(np.float16).view(np.uint16))
    back = from_wire_bits(bits, "fp16", divisor=2, factor=2.0 ** -5)
    np.testing.assert_array_equal(back, bits.view(np.float16).astype(np.float32) * np.float32(2.0 ** 5) / 2)
    with np.errstate(over="ignore"):  # unscaled, 1e6 is inf in fp16
        np.testing.assert_array_equal(to_wire_bits(values, "fp16"), values.astype(np.float16).view(np.uint16))


# ----- what the log says -----
def test_the_first_scaled_step_is_logged_once_and_each_epoch_counts_them(capsys):
    guard = RangeGuard(2)
    guard.factors(np.float32([3.0, 0.5]))  # fits: a factor above 1, nothing to say
    guard.note_step(1, 1, 1)
    guard.factors(np.float32([3.0, 2e5]))
    guard.factors(np.float32([1e6]))  # two reductions (buckets) of one step: the larger peak is named
    guard.note_step(1, 2, 2)
    guard.factors(np.float32([9e4]))
    guard.note_step(1, 3, 3)
    guard.log_epoch(1)
    guard.factors(np.float32([1.0]))
    guard.note_step(2, 1)
    guard.log_epoch(2)
    guard.factors(np.float32([7e4]))  # param mode: only the average that closes epoch 3
    guard.log_epoch(3)
    out = capsys.readouterr().out
    assert out.count("distributed_wire_format = 'fp16': in train epoch 1, step 2 (global step 2) the values "
                     "to reduce reached 1e+06 (the largest magnitude over the 2 ranks)") == 1, out
    assert "scaled them by 2^-5 before the cast to fp16" in out and out.count("Logged once") == 1, out
    assert out.count("train epoch 1: 2 step(s) scaled the values they reduced below 1") == 1, out
    assert "train epoch 2:" not in out, out
    assert "train epoch 3: 0 step(s) and its closing parameter average scaled" in out, out


# ----- whole runs under mpirun: one rank's gradient past fp16's range -----
NETWORK = {"hidden": {"class": "linear", "activation": None, "n_out": 6},  # no saturation: loud input,
           "output": {"class": "softmax", "loss": "ce", "from": "hidden"}}  # large gradients


def run_config(**overrides) -> dict:
    config = {"train": {"class": "DummyDataset", "input_dim": 5, "output_dim": 3, "num_seqs": 48,
                        "seq_len": 10, "fixed_random_seed": 7},
              "network": NETWORK, "optimizer": {"class": "adam"}, "learning_rate": 0.01, "batch_size": 40,
              "num_epochs": 1, "log_verbosity": 3, "random_seed": 3, "use_horovod": True,
              "distributed_wire_format": "fp16", "horovod_grad_normalization": "global_frames"}
    config.update(overrides)
    return config


def train(folder, config: dict | list, *options: str, ranks: int = 2):
    """One training, or several one after the other in one job (engine_train.py's list form)."""
    folder.mkdir()
    args = [SCRIPT, str(folder), repr(config), *options]
    r = run_mpi(ranks, args, timeout=240) if ranks > 1 else run([sys.executable, *args], timeout=180)
    return r, r.stdout + r.stderr


def results(folder, ranks: int = 2) -> list[dict]:
    return [dict(np.load(folder / f"rank{k}.npz")) for k in range(ranks)]


LOUD = ("fail=scale", "fail_rank=1", "fail_step=2")  # rank 1's 3rd batch: its input times 1e6
SCALED = r"distributed_wire_format = 'fp16': in train epoch 1, step 3 \(global step 3\) the values to " \
         r"reduce reached ([0-9.e+]+) \(the largest magnitude over the 2 ranks\)"


def assert_scaled_once(output: str) -> float:
    import re

    found = re.findall(SCALED, output)
    assert len(found) == 1 and output.count("Logged once") == 1, output
    assert "train epoch 1: 1 step(s) scaled the values they reduced below 1" in output, output
    return float(found[0])


@pytest.mark.tf_latest_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("backend", [pytest.param("mpi", marks=pytest.mark.tf_latest), "horovod"])
def test_a_gradient_past_fp16s_range_is_scaled_into_it_and_both_ranks_train_on_alike(tmp_path, backend):
    """Loss sums (global_frames) of rank 1's loud batch: its gradients reach about 3e7, which an unscaled
    fp16 cast makes inf (the unguarded run then stops as if the gradient were non-finite). Guarded,
    both ranks scale by the same factor, train on to the same parameters, and end within fp16's rounding
    of the float32 wire."""
    config = run_config(distributed_backend=backend)
    float32 = run_config(distributed_backend=backend, distributed_wire_format=None)
    runs = [config, float32]
    if backend == "mpi":  # the same run without the guard (it ends the job, so it comes last)
        runs.append([config, ["fp16_guard=off"]])
    r, output = train(tmp_path / "job", runs, *LOUD)  # one job: one TensorFlow start-up per rank
    guarded, unguarded = output.split("=== run 1")[0], output.split("=== run 2")[-1]
    assert assert_scaled_once(guarded) > 2 * FP16_MAX
    rank0, rank1 = results(tmp_path / "job" / "run0")
    assert int(rank0["num_steps"]) == 6
    np.testing.assert_array_equal(rank0["after_step"], rank1["after_step"])  # every step: the same update
    assert np.isfinite(rank0["params"]).all()
    fp32 = results(tmp_path / "job" / "run1")[0]
    assert "distributed_wire_format = 'fp16'" not in output.split("=== run 1")[1].split("=== run 2")[0]
    moved = np.abs(fp32["params"] - fp32["after_step"][0]).max()
    diff = np.abs(rank0["params"] - fp32["params"]).max()
    print(f"{backend}: parameters moved {moved:.3g} after the first step, fp16 changed them by {diff:.3g}")
    assert diff <= 8 * 2.0 ** -11 * moved, (diff, moved)
    if backend == "mpi":  # unguarded, the overflow looked like a non-finite gradient
        assert r.returncode == DATA_ERROR_EXIT_CODE, output
        assert "stop_on_nonfinite_train_score: in train epoch 1, step 3 (global step 3) had a non-finite " \
               "gradient" in unguarded, output
    else:
        assert r.returncode == 0, output


@pytest.mark.tf_latest
@pytest.mark.mpi
def test_param_mode_scales_a_change_past_fp16s_range_into_it(tmp_path):
    """Param mode averages the change since the last average through the wire: rank 1's loud batch with
    SGD moves its parameters by about 3e5 in one step. Guarded, both ranks hold the same average after
    every step; unguarded, the average is inf and the next step's loss stops training."""
    config = run_config(distributed_backend="mpi", horovod_reduce_type="param", horovod_param_sync_step=1,
                        optimizer={"class": "sgd"}, learning_rate=0.1)
    del config["horovod_grad_normalization"]  # grad mode's
    loud = ("fail=scale", "fail_rank=1", "fail_step=3", "fail_scale=1e7")
    r, output = train(tmp_path / "job", [config, [config, ["fp16_guard=off"]]], *loud)  # guarded, then not
    guarded, unguarded = output.split("=== run 1")
    assert "in train epoch 1, step 4 (global step 4) the values to reduce reached" in guarded, output
    rank0, rank1 = results(tmp_path / "job" / "run0")
    np.testing.assert_array_equal(rank0["after_sync"], rank1["after_sync"])
    assert np.isfinite(rank0["params"]).all() and np.abs(rank0["params"]).max() > FP16_MAX
    assert r.returncode == DATA_ERROR_EXIT_CODE and "stop_on_nonfinite_train_score" in unguarded, output


@pytest.mark.tf_latest
@pytest.mark.mpi
def test_a_nan_still_stops_training_with_the_existing_message(tmp_path):
    """A NaN feature on rank 1: its peak is inf, so its values travel unscaled and the reduced loss and
    gradient are NaN on both ranks, which stop together with stop_on_nonfinite_train_score's message."""
    r, output = train(tmp_path / "nan", run_config(distributed_backend="mpi"), "fail=nan", "fail_rank=1",
                      "fail_step=3")
    assert r.returncode == DATA_ERROR_EXIT_CODE, output
    assert output.count("stop_on_nonfinite_train_score: in train epoch 1, step 4 (global step 4) had a "
                        "non-finite loss. That update was not applied") == 1, output
    assert "Traceback" not in output and "distributed_wire_format = 'fp16': in" not in output, output
