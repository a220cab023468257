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
