"""Param mode with ``distributed_param_sync_overlap``: each average runs behind the following steps and is
applied as params += average(snapshot) - snapshot where the next one starts; the epoch still ends with
identical parameters on every rank. Checked step by step on a fake communicator and with real mpirun."""
import numpy as np
import pytest
import tensorflow as tf

from engine.distributed.backend import DoneReduction
from engine.distributed.param_overlap import ParamAverager, SyncStats
from test_engine_parallel import base_config, train

pytestmark = pytest.mark.tf_latest


class TwoRankFake:
    """Rank 0 of two, the other rank's values given by ``other``; counts reductions started."""

    rank, size = 0, 2

    def __init__(self, other):
        self.other = other
        self.started = []

    def start_allreduce(self, arrays, op="sum", *, wire=None):
        assert op == "average"
        self.started.append([a.copy() for a in arrays])
        results = [(a + b) / 2 for a, b in zip(arrays, self.other(len(self.started)))]
        return DoneReduction(results, seconds=2.0)


def test_overlapped_average_is_applied_where_the_next_starts():
    other = {1: [np.array([10.0, 20.0], np.float32)], 2: [np.array([0.0, 0.0], np.float32)]}
    comm = TwoRankFake(lambda k: other[k])
    params = [tf.Variable([2.0, 4.0])]
    averager = ParamAverager(comm, overlap=True)
    averager.start(params)  # snapshot [2, 4]; its average [6, 12] is not applied yet
    np.testing.assert_array_equal(params[0].numpy(), [2.0, 4.0])
    params[0].assign_add([1.0, 1.0])  # a local step meanwhile
    averager.start(params)  # applies [3, 5] + [6, 12] - [2, 4], then snapshots that
    np.testing.assert_array_equal(params[0].numpy(), [7.0, 13.0])
    np.testing.assert_array_equal(comm.started[1][0], [7.0, 13.0])
    averager.finish()  # (7 + 0) / 2 - 7 added
    np.testing.assert_array_equal(params[0].numpy(), [3.5, 6.5])
    averager.finish()  # nothing pending: no change
    np.testing.assert_array_equal(params[0].numpy(), [3.5, 6.5])
    stats = averager.take_stats()
    assert stats.reduce_seconds == [2.0, 2.0] and stats.hidden_share == 1.0  # the fake was done at once
    assert averager.take_stats().reduce_seconds == []


def test_sync_stats_hidden_share():
    stats = SyncStats()
    stats.add(4_000_000, reduce_seconds=2.0, waited_seconds=0.5)
    stats.add(4_000_000, reduce_seconds=2.0, waited_seconds=3.0)  # waited longer than it ran: all exposed
    assert stats.hidden_share == pytest.approx(0.375)
    assert stats.describe() == ("2 parameter averages of 4.0 MB, 2.000 s each (median), "
                                "38% of their time hidden behind training")


@pytest.mark.mpi
def test_two_ranks_apply_each_average_one_interval_later(tmp_path):
    config = base_config(use_horovod=True, horovod_reduce_type="param", horovod_param_sync_step=2,
                         distributed_param_sync_overlap=True, distributed_backend="mpi", log_verbosity=3)
    config["train"]["num_seqs"] = 48  # 12 batches: 6 steps per rank, syncs after steps 1, 3, 5 and at the end
    ranks, r = train(tmp_path, 2, config)
    r0, r1 = ranks
    assert list(r0["sync_steps"]) == list(r1["sync_steps"]) == [1, 3, 5, 5]
    synced = [r0["after_sync"], r1["after_sync"]]
    stepped = [r0["after_step"], r1["after_step"]]
    # the first sync only starts its average; each later one first applies the one before
    for rank in range(2):
        np.testing.assert_array_equal(synced[rank][0], stepped[rank][1])
        for k, step in ((1, 3), (2, 5)):
            mean = (synced[0][k - 1] + synced[1][k - 1]) / 2
            expected = stepped[rank][step] + mean - synced[rank][k - 1]
            np.testing.assert_allclose(synced[rank][k], expected, rtol=1e-6, atol=1e-6)
    assert not np.allclose(synced[0][1], synced[1][1])  # between epoch ends the ranks differ
    # the epoch ends with a synchronous average: identical parameters
    np.testing.assert_array_equal(synced[0][3], synced[1][3])
    np.testing.assert_array_equal(r0["params"], r1["params"])
    assert "parameters averaged every 2 steps, overlapped with the following steps" in r.stdout + r.stderr
    assert "param mode, this epoch: 4 parameter averages of" in r.stdout + r.stderr


def test_overlap_only_in_param_mode(tmp_path):
    config = base_config(use_horovod=True, distributed_param_sync_overlap=True)
    _, r = train(tmp_path, 1, config, expect_ok=False)
    assert r.returncode != 0
    assert ("Config key 'distributed_param_sync_overlap' only applies to horovod_reduce_type = 'param'"
            in r.stdout + r.stderr)


# ----- a 16-bit wire format: the change since the last average is reduced, not the parameters -----
def fp16_average(a, b) -> np.ndarray:
    """Two ranks' float32 values averaged as ``distributed_wire_format = "fp16"`` does it (Horovod's
    Compression.fp16): each rounded to fp16, summed in fp16, cast back, divided."""
    total = np.asarray(a, np.float32).astype(np.float16) + np.asarray(b, np.float32).astype(np.float16)
    return total.astype(np.float32) / np.float32(2)


class TwoRankFp16Fake:
    """Rank 0 of two with an fp16 wire: ``other(k)`` gives what rank 1 sends to the k-th reduction."""

    rank, size = 0, 2

    def __init__(self, other):
        self.other = other
        self.sent = []

    def _reduce(self, arrays, op, wire):
        assert op == "average" and wire == "fp16"
        self.sent.append([np.array(a) for a in arrays])
        return [fp16_average(a, b) for a, b in zip(arrays, self.other(len(self.sent)))]

    def allreduce_tensors(self, tensors, op="sum", *, timed_as=None, wire=None):
        return tf.numpy_function(lambda *arrays: self._reduce(arrays, op, wire), list(tensors),
                                 [tf.float32] * len(tensors))

    def start_allreduce(self, arrays, op="sum", *, wire=None):
        return DoneReduction(self._reduce(arrays, op, wire), seconds=1.0)


W = np.array([1.0, -0.5, 3.0, 1000.0, 0.25], np.float32)
D0 = np.array([1e-4, -2e-4, 3e-4, 0.01, 0.0], np.float32)  # rank 0's change since the last average
D1 = np.array([3e-4, 1e-4, 2e-4, 0.03, -5e-5], np.float32)  # rank 1's


def test_fp16_wire_averages_the_change_since_the_last_average():
    comm = TwoRankFp16Fake(lambda k: [D1 * k])
    params = [tf.Variable(W)]
    averager = ParamAverager(comm, wire="fp16")
    averager.set_base(params)
    params[0].assign(W + D0)
    averager.average_now(params)
    np.testing.assert_array_equal(comm.sent[0][0], (W + D0) - W)  # the change travels, not the parameters
    got = params[0].numpy()
    np.testing.assert_array_equal(got, W + fp16_average((W + D0) - W, D1))  # base + mean change, float32
    np.testing.assert_array_equal(averager.base_values()[0], got)
    exact = W.astype(np.float64) + (D0.astype(np.float64) + D1) / 2
    # only the change is rounded (fp16: 2^-11 of it, each rank's and their sum), then float32's rounding
    bound = 2.0 ** -10 * (np.abs(D0) + np.abs(D1)) + 2.0 ** -23 * np.abs(exact)
    assert (np.abs(got - exact) <= bound).all(), (got - exact, bound)
    # averaging the parameters themselves in fp16 loses these updates (below |w| * 2^-12 for 3.0, 1000)
    old = fp16_average(W + D0, W + D1)
    assert old[2] == 3.0 and old[3] == 1000.0 and got[2] > 3.0002 and got[3] > 1000.019
    # the next average reduces the change from the new base
    params[0].assign(got + D0)
    averager.average_now(params)
    np.testing.assert_array_equal(comm.sent[1][0], (got + D0) - got)
    np.testing.assert_array_equal(params[0].numpy(), got + fp16_average((got + D0) - got, 2 * D1))


def test_fp16_wire_overlapped_average_keeps_own_progress_on_top_of_the_new_base():
    comm = TwoRankFp16Fake(lambda k: [D1])
    params = [tf.Variable(W)]
    averager = ParamAverager(comm, overlap=True, wire="fp16")
    averager.set_base(params)
    params[0].assign(W + D0)
    averager.start(params)  # snapshot W + D0; sends its change D0
    np.testing.assert_array_equal(comm.sent[0][0], (W + D0) - W)
    local = np.array([1e-5, 0.0, -1e-5, 0.001, 2e-6], np.float32)
    params[0].assign_add(local)  # a local step while the average runs
    before = params[0].numpy()
    averager.finish()
    new_base = W + fp16_average((W + D0) - W, D1)
    np.testing.assert_array_equal(averager.base_values()[0], new_base)
    np.testing.assert_array_equal(params[0].numpy(), before + (new_base - (W + D0)))
    np.testing.assert_allclose(params[0].numpy(), new_base + local, rtol=0, atol=1e-6)
    averager.start(params)  # the next average sends the change from the new base
    np.testing.assert_array_equal(comm.sent[1][0], params[0].numpy() - new_base)


def test_base_only_with_a_wire_format():
    params = [tf.Variable(W)]
    plain = ParamAverager(TwoRankFake(lambda k: [W]))
    plain.set_base(params)  # float32: the parameters themselves are averaged; no base kept
    assert plain.base_values() is None
    with pytest.raises(RuntimeError, match="set_base"):
        ParamAverager(TwoRankFp16Fake(lambda k: [D1]), wire="fp16").average_now(params)
    averager = ParamAverager(TwoRankFp16Fake(lambda k: [D1]), wire="fp16")
    averager.restore_base([W - 1])  # e.g. from a mid-epoch checkpoint
    averager.average_now(params)
    np.testing.assert_array_equal(params[0].numpy(), (W - 1) + fp16_average(W - (W - 1), D1))
