"""``distributed_wire_format``: the fp16/bf16 sums against independent references (TensorFlow's and numpy's
half-precision arithmetic), the key's checking, and real 2-rank mpirun jobs on both backends: exact
compressed reductions, and training in grad and param mode that the key changes by rounding-sized amounts."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from engine.config.loader import Config
from engine.distributed.settings import DataParallelSettings
from engine.distributed.wire import (SUM_BLOCK, bf16_bits_to_float32, bf16_sum_into, float32_to_bf16_bits,
                                     fp16_sum_into, numpy_sum, wire_per_tensor)
from engine.runtime.errors import ConfigError
from helpers import ROOT, run, run_mpi, run_rnn

SCRIPTS = ROOT / "tests" / "mpi_scripts"


def edge_values() -> np.ndarray:
    """Random values over float32's whole exponent range, every kind of tie, and the special values."""
    rng = np.random.default_rng(5)
    random_bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32)
    upper = rng.integers(0, 2 ** 16, 2000, dtype=np.uint32) << 16
    ties = np.concatenate([upper | 0x8000, upper | 0x7FFF, upper | 0x8001])  # exact ties, just below, above
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.4028235e38, -3.4028235e38, 1e-45,
                        1.17549435e-38, 1.0, 1.00390625, 1.005859375], np.float32).view(np.uint32)
    return np.concatenate([random_bits, ties, special]).view(np.float32)


def tf_bf16_bits(values: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    return tf.bitcast(tf.cast(tf.constant(values), tf.bfloat16), tf.uint16).numpy()


def same_or_both_nan(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.all((got == want) | (np.isnan(got) & np.isnan(want))))


@pytest.mark.tf_latest
def test_bf16_rounding_is_tensorflows_round_to_nearest_even():
    values = edge_values()
    got, want = float32_to_bf16_bits(values), tf_bf16_bits(values)
    nan = np.isnan(values)
    np.testing.assert_array_equal(got[~nan], want[~nan])  # bit for bit, ties to even included
    assert np.all(np.isnan(bf16_bits_to_float32(got[nan])))  # NaN stays NaN (and keeps its sign)
    np.testing.assert_array_equal(got[nan] >> 15, values[nan].view(np.uint32) >> 31)
    # the ties by hand: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (goes to the even 1); 1 + 3 * 2^-8 is
    # halfway between 1 + 2^-7 and 1 + 2^-6 (goes to the even 1 + 2^-6); the largest float is inf
    halfway = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.4028235e38], np.float32)
    np.testing.assert_array_equal(bf16_bits_to_float32(float32_to_bf16_bits(halfway)),
                                  np.array([1.0, 1 + 2 ** -6, np.inf], np.float32))


def half_edge_pairs() -> tuple[np.ndarray, np.ndarray]:
    """fp16 operand pairs: subnormals (and their sums that become normal), exact ties of the sum (odd
    and even last bits), inf, NaN, sums that overflow to inf, -0 + -0, -0 + 0, x + -x; then every pair
    of a random sample, the lot tiled past several ``SUM_BLOCK`` blocks."""
    f16 = np.float16
    tiny, sub, big = f16(6.1035e-05), f16(5.96e-08), f16(65504.0)
    pairs = [(sub, sub), (f16(-5.96e-08), sub), (tiny, -sub), (f16(3.05e-05), f16(3.05e-05)),
             (f16(2048.0), f16(1.0)), (f16(2050.0), f16(1.0)), (f16(1.0), f16(0.00048828125)),
             (f16(1.0009765625), f16(0.00048828125)), (f16(np.inf), f16(-np.inf)), (f16(np.inf), big),
             (f16(np.nan), f16(1.0)), (f16(-np.nan), f16(-np.inf)), (big, big), (big, f16(16.0)),
             (big, f16(32.0)), (-big, f16(-32.0)), (f16(-0.0), f16(-0.0)), (f16(-0.0), f16(0.0)),
             (f16(0.0), f16(-0.0)), (f16(3.0), f16(-3.0)), (f16(-2.0), f16(2.0))]
    a = np.array([p[0] for p in pairs], f16).view(np.uint16)
    b = np.array([p[1] for p in pairs], f16).view(np.uint16)
    rng = np.random.default_rng(7)
    x, y = (rng.integers(0, 2 ** 16, 3000, dtype=np.uint32).astype(np.uint16) for _ in range(2))
    a, b = np.concatenate([a, x]), np.concatenate([b, y])
    reps = -(-3 * SUM_BLOCK // a.size) + 1
    return np.tile(a, reps), np.tile(b, reps)


def test_the_sums_in_blocks_equal_numpys_float16_add_and_the_exact_bf16_sum_bit_for_bit():
    """The engine's fp16 and bf16 sums over arrays of several blocks (``SUM_BLOCK``) give, element
    for element, numpy's float16 add (fp16) and the exact sum rounded once to bf16, on every edge case:
    subnormals, ties, inf, NaN, overflow to inf and the signs of zero."""
    a, b = half_edge_pairs()
    assert a.size > 3 * SUM_BLOCK
    with np.errstate(over="ignore", invalid="ignore"):
        want = (a.view(np.float16) + b.view(np.float16)).view(np.uint16)
    for add in (fp16_sum_into, lambda x, y: numpy_sum("fp16")(x, y, None)):
        out = b.copy()
        with np.errstate(over="ignore", invalid="ignore"):
            add(a, out)
        nan = np.isnan(want.view(np.float16))
        np.testing.assert_array_equal(out[~nan], want[~nan])  # -0 and +0 differ in their bits here
        assert np.all(np.isnan(out[nan].view(np.float16)))
    assert {0x8000, 0x0000, 0x7C00, 0xFC00} <= set(want[:21].tolist())  # -0, +0, +-inf really occur

    # bf16: the same pairs' bits as bf16, against float64's exact sum rounded once (by the engine's own
    # rounding, which test_bf16_rounding_is_tensorflows_round_to_nearest_even checks against TensorFlow)
    out = b.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        bf16_sum_into(a, out)
        exact = (bf16_bits_to_float32(a).astype(np.float64) + bf16_bits_to_float32(b)).astype(np.float32)
    want = float32_to_bf16_bits(exact)
    nan = np.isnan(exact)
    np.testing.assert_array_equal(out[~nan], want[~nan])
    assert np.all(np.isnan(bf16_bits_to_float32(out[nan])))
    whole = b.copy()  # one block at a time is one element at a time: the same bits as the whole array
    for start in range(0, a.size, 1000):
        with np.errstate(over="ignore", invalid="ignore"):
            bf16_sum_into(a[start:start + 1000], whole[start:start + 1000])
    np.testing.assert_array_equal(whole, out)


@pytest.mark.tf_latest
def test_bf16_and_fp16_sums_equal_tensorflows_half_precision_additions():
    import tensorflow as tf

    values = edge_values()
    rng = np.random.default_rng(6)
    with np.errstate(invalid="ignore"):  # small addends: ties after the sum
        others = np.concatenate([values[rng.permutation(values.size)][:-400],
                                 values[-400:] * np.float32(2 ** -8)])
    a, b = float32_to_bf16_bits(values), float32_to_bf16_bits(others)
    out = b.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        bf16_sum_into(a, out)
    want = tf.cast(tf.bitcast(tf.constant(a), tf.bfloat16) + tf.bitcast(tf.constant(b), tf.bfloat16),
                   tf.float32).numpy()
    # TensorFlow's kernels flush float32 subnormals to zero (bf16 shares float32's exponent range), the
    # MPI op keeps them, as IEEE addition does: there the reference is the exact sum (float64 holds it,
    # both addends being tiny), rounded by TensorFlow's cast
    x, y = bf16_bits_to_float32(a).astype(np.float64), bf16_bits_to_float32(b).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = (x + y).astype(np.float32)
    tiny = np.finfo(np.float32).tiny
    subnormal = np.isfinite(exact) & ((np.abs(x) < tiny) | (np.abs(y) < tiny) | (np.abs(exact) < tiny))
    assert 100 < subnormal.sum() < 0.2 * subnormal.size
    want[subnormal] = bf16_bits_to_float32(tf_bf16_bits(exact[subnormal]))
    assert same_or_both_nan(bf16_bits_to_float32(out), want)

    with np.errstate(over="ignore", invalid="ignore"):
        h_a, h_b = values.astype(np.float16), others.astype(np.float16)
    out16 = h_b.view(np.uint16).copy()
    numpy_sum("fp16")(h_a.view(np.uint16), out16, None)  # the MPI op's function, as MPI calls it
    want16 = (tf.constant(h_a) + tf.constant(h_b)).numpy()  # Eigen's half add, not numpy's
    assert same_or_both_nan(out16.view(np.float16), want16)
    direct = h_b.view(np.uint16).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        fp16_sum_into(h_a.view(np.uint16), direct)
    np.testing.assert_array_equal(direct, out16)


@pytest.mark.tf_latest
def test_wire_argument_is_checked():
    assert wire_per_tensor(None, 3, "max") == (None, [False] * 3)
    assert wire_per_tensor("fp16", 2, "sum") == ("fp16", [True, True])
    assert wire_per_tensor(["bf16", None], 2, "average") == ("bf16", [True, False])
    assert wire_per_tensor([None, None], 2, "min") == (None, [False, False])
    for wire, op, message in (("fp8", "sum", "unknown wire format 'fp8'"), ("fp16", "max", "not 'max'"),
                              (["fp16", "bf16"], "sum", "one wire format per call"),
                              (["fp16"], "sum", "1 entries for 2 tensors")):
        with pytest.raises(ValueError, match=message):
            wire_per_tensor(wire, 2, op)


@pytest.mark.tf_latest
def test_local_backend_leaves_tensors_alone_and_checks_the_argument():
    import tensorflow as tf

    from engine.distributed.local_backend import LocalCommunicator

    comm = LocalCommunicator()
    x = tf.constant([1.0 + 2 ** -20], tf.float32)
    assert comm.allreduce_tensors([x], "sum", wire="fp16")[0].numpy()[0] == np.float32(1.0 + 2 ** -20)
    with pytest.raises(ValueError, match="unknown wire format"):
        comm.allreduce_tensors([x], "sum", wire="float16")


@pytest.mark.tf_latest
@pytest.mark.parametrize("use_horovod", [True, False])
def test_settings_read_and_check_the_key(use_horovod):
    def settings(**values):
        return DataParallelSettings.from_config(Config({"use_horovod": use_horovod, **values}))

    assert settings().wire_format is None
    assert settings(distributed_wire_format=None).wire_format is None
    assert settings(distributed_wire_format="fp16").wire_format == "fp16"
    assert settings(distributed_wire_format="bf16").wire_format == "bf16"
    for bad in ("float16", "FP16", 16):
        with pytest.raises(ConfigError, match=r"Config key 'distributed_wire_format' is .*; expected None "
                                              r"\(float32 on the wire\) or one of 'fp16', 'bf16'"):
            settings(distributed_wire_format=bad)


@pytest.mark.tf_latest
def test_bad_value_ends_rnn_with_one_paragraph_naming_the_key(tmp_path):
    r = run_rnn([str(ROOT / "configs" / "12ax.py"), "++distributed_wire_format", "half",
                 "++model", str(tmp_path / "model")], timeout=120)
    assert r.returncode != 0
    assert "Config key 'distributed_wire_format' is 'half'; expected None (float32 on the wire) or one " \
           "of 'fp16', 'bf16'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# ----- real mpirun jobs -----
BACKENDS = [pytest.param("mpi", marks=pytest.mark.tf_latest), "horovod"]


@pytest.mark.tf_latest_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_reduce_exactly_as_the_references(backend):
    r = run_mpi(2, [str(SCRIPTS / "wire_reduce.py"), "--backend", backend], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = 154 if backend == "mpi" else 152  # the horovod backend has no uint16 tensor beside the others
    for rank in (0, 1):
        assert f"rank {rank}: {checks} wire checks passed ({backend})" in r.stdout, r.stdout + r.stderr


NETWORK = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 8},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}


def train_config(**overrides) -> dict:
    config = {"train": {"class": "DummyDataset", "input_dim": 5, "output_dim": 3, "num_seqs": 16,
                        "seq_len": 10, "fixed_random_seed": 7},
              "network": NETWORK, "optimizer": {"class": "sgd"}, "learning_rate": 0.5,
              "batch_size": 40, "num_epochs": 1, "log_verbosity": 2, "random_seed": 3}
    config.update(overrides)
    return config


def train(tmp_path, ranks: int, config: dict | list[dict]) -> tuple[list, str]:
    """Each rank's results of one training, or (``config`` a list) of each of several in one job."""
    out = tmp_path / f"job{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    args = [str(SCRIPTS / "engine_train.py"), str(out), repr(config)]
    r = run([sys.executable, *args], timeout=180) if ranks == 1 else run_mpi(ranks, args, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    folders = [out] if isinstance(config, dict) else [out / f"run{i}" for i in range(len(config))]
    results = [[dict(np.load(folder / f"rank{k}.npz")) for k in range(ranks)] for folder in folders]
    return (results[0] if isinstance(config, dict) else results), r.stdout + r.stderr


@pytest.fixture(scope="module")
def initial_params(tmp_path_factory) -> np.ndarray:
    """The parameters before training (a run with learning rate 0), the same for every test here."""
    (init,), _ = train(tmp_path_factory.mktemp("init"), 1, train_config(learning_rate=0.0))
    return init["params"]


GRAD, PARAM = {"horovod_reduce_type": "grad"}, {"horovod_reduce_type": "param", "horovod_param_sync_step": 1}


@pytest.mark.mpi
@pytest.mark.parametrize("backend, mode", [pytest.param("mpi", GRAD, marks=pytest.mark.tf_latest),
                                           pytest.param("mpi", PARAM, marks=pytest.mark.tf_latest),
                                           ("horovod", GRAD)])
def test_fp16_training_differs_from_float32_by_fp16_rounding(tmp_path, initial_params, backend, mode):
    parallel = dict(use_horovod=True, distributed_backend=backend, **mode)
    ((fp16, _), (fp32, _)), _ = train(tmp_path, 2, [train_config(distributed_wire_format="fp16", **parallel),
                                                    train_config(**parallel)])
    assert fp16["num_steps"] == fp32["num_steps"] == 2
    moved = np.abs(fp32["params"] - initial_params).max()
    diff = np.abs(fp16["params"] - fp32["params"]).max()
    assert moved > 1e-3  # it trained
    assert diff > 0  # the key has an effect
    print(f"{mode}: parameters moved {moved:.3g}, fp16 changed them by {diff:.3g}")
    if mode["horovod_reduce_type"] == "grad":
        # each gradient element: 3 roundings to fp16 (two ranks' values, their sum), 2^-11 each, relative
        # to the ranks' gradients; over 2 steps a few times 2^-11 of the parameters' movement
        assert diff <= 8 * 2.0 ** -11 * moved, (diff, moved)
    else:
        # param mode reduces each rank's change since the last average: it is rounded (2^-11 of the
        # change, each rank's and their sum), not the parameters, so fp16 stays as close to float32 as
        # in grad mode
        assert diff <= 8 * 2.0 ** -11 * moved, (diff, moved)


def fp16_average(a, b) -> np.ndarray:
    """Two ranks' float32 values averaged through the fp16 wire (rounded, summed in fp16, divided)."""
    total = np.asarray(a, np.float32).astype(np.float16) + np.asarray(b, np.float32).astype(np.float16)
    return total.astype(np.float64) / 2


@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_param_mode_fp16_averages_the_change_so_small_updates_survive(tmp_path, backend):
    """Each average is the last one's parameters plus the mean change, the change going through fp16:
    equal to the float32-exact average of the ranks' parameters up to the fp16 rounding of the change,
    also where the change is below |w| * 2^-12, which averaging the parameters in fp16 loses."""
    config = train_config(use_horovod=True, distributed_backend=backend, horovod_reduce_type="param",
                          horovod_param_sync_step=1, distributed_wire_format="fp16", learning_rate=0.005)
    config["train"]["num_seqs"] = 48  # 12 batches: 6 steps per rank, each followed by an average
    (r0, r1), _ = train(tmp_path, 2, config)
    synced = r0["after_sync"]
    np.testing.assert_array_equal(r1["after_sync"], synced)  # every average: the same on both ranks
    assert list(r0["sync_steps"]) == [0, 1, 2, 3, 4, 5, 5]
    np.testing.assert_array_equal(synced[6], synced[5])  # the epoch's end: no change, nothing rounded
    small = 0
    for k in range(1, 6):  # the base of average k is the result of average k - 1
        base, got = synced[k - 1], synced[k]
        d0, d1 = r0["after_step"][k] - base, r1["after_step"][k] - base
        exact = base + (d0 + d1) / 2
        # fp16 rounds each change and their sum: 2^-11 relative, or 2^-25 absolute below 2^-14 (its
        # subnormals); then the float32 subtraction and addition
        bound = 2.0 ** -10 * (np.abs(d0) + np.abs(d1)) + 2.0 ** -24 + 2.0 ** -23 * np.abs(exact)
        assert (np.abs(got - exact) <= bound).all(), np.max(np.abs(got - exact) - bound)
        moved = np.abs(exact - base)
        lost_before = (moved > 2.0 ** -20) & (moved < np.abs(base) * 2.0 ** -12)
        # these changes survive, to 2^-9 of their size where the ranks' changes do not cancel (the bound
        # above is relative to the ranks' changes), plus the float32 rounding of base + change ...
        kept = lost_before & (np.abs(d0) + np.abs(d1) <= 4.0 * moved)
        small += int(kept.sum())
        assert (np.abs(got - exact) <= 2.0 ** -9 * moved + 2.0 ** -23 * np.abs(exact))[kept].all()
        # ... where fp16 averages of the parameters themselves would round them away
        old = fp16_average(r0["after_step"][k], r1["after_step"][k])
        assert np.abs(old - exact)[lost_before].max() > 0.2 * moved[lost_before].max()
    print(f"{backend}: {small} parameter changes below |w| * 2^-12 kept")
    assert small > 20
