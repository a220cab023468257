"""Data-parallel training with real mpirun and 2 ranks: grad and param mode give the updates the protocol
promises, uneven data never deadlocks, and a failing rank ends the job quickly with one clear message."""
import time

import numpy as np
import pytest

from helpers import ROOT, run, run_mpi

SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")
pytestmark = pytest.mark.mpi

NETWORK = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 8},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
NORMALIZED_NETWORK = {**NETWORK, "output": {**NETWORK["output"], "loss_opts": {"use_normalized_loss": True}}}


def base_config(**overrides):
    config = {
        "train": {"class": "DummyDataset", "input_dim": 5, "output_dim": 3, "num_seqs": 16, "seq_len": 10,
                  "fixed_random_seed": 7},
        "network": NETWORK, "optimizer": {"class": "sgd"}, "learning_rate": 0.5,
        "batch_size": 40, "num_epochs": 1, "log_verbosity": 2, "random_seed": 3,
    }
    config.update(overrides)
    return config


def train(tmp_path, ranks, config, *options, timeout=120, expect_ok=True):
    """One training (``config`` a dict), or several one after the other in one job (a list of dicts: the
    result is a list, one per run)."""
    out = tmp_path / f"job{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    args = [SCRIPT, str(out), repr(config), *options]
    if ranks == 1:
        import sys
        r = run([sys.executable, *args], timeout=timeout)
    else:
        r = run_mpi(ranks, args, timeout=timeout)
    if not expect_ok:
        return None, r
    assert r.returncode == 0, r.stdout + r.stderr
    if isinstance(config, dict):
        return [dict(np.load(out / f"rank{k}.npz")) for k in range(ranks)], r
    return [[dict(np.load(out / f"run{i}" / f"rank{k}.npz")) for k in range(ranks)]
            for i in range(len(config))], r


# The mpi backend also runs on the newest TensorFlow; Horovod exists only in the TF 2.15 environment.
BACKENDS = [pytest.param("mpi", marks=pytest.mark.tf_latest), "horovod"]


@pytest.mark.tf_latest_mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_mode_equals_one_process_on_concatenated_batches(tmp_path, backend):
    # RETURNN's objective is the loss sum, and the ranks' gradients are summed: the union batch's gradient
    parallel = base_config(use_horovod=True, distributed_backend=backend)
    ranks, _ = train(tmp_path, 2, parallel)
    single, _ = train(tmp_path, 1, base_config(batch_size=80))  # rank 0's and rank 1's batch together
    assert ranks[0]["num_steps"] == ranks[1]["num_steps"] == single[0]["num_steps"] == 2
    assert np.array_equal(ranks[0]["params"], ranks[1]["params"])  # bitwise identical across ranks
    assert not np.allclose(ranks[0]["params"], ranks[0]["after_step"][0])  # it did train
    np.testing.assert_allclose(ranks[0]["params"], single[0]["params"], rtol=1e-5, atol=1e-6)


@pytest.mark.tf_latest
def test_global_frames_normalization_equals_one_process_on_the_union_batch_with_unequal_lengths(tmp_path):
    from engine.datasets import Task12AXDataset

    corpus = {"class": "Task12AXDataset", "num_seqs": 16, "fixed_random_seed": 5}
    reference = Task12AXDataset(num_seqs=16, fixed_random_seed=5)
    reference.init_seq_order(1)
    lengths = reference.epoch_seq_lengths()[:, 0]
    rank_frames = [lengths[0:2].sum(), lengths[2:4].sum()]  # step 1: rank 0 takes seqs 0-1, rank 1 seqs 2-3
    assert rank_frames[0] != rank_frames[1], rank_frames  # the case the option exists for

    def config(**overrides):
        return base_config(train=corpus, batch_size=10000, num_epochs=1, **overrides)

    (exact, averaged), _ = train(tmp_path, 2, [
        config(max_seqs=2, use_horovod=True, distributed_backend="mpi", horovod_grad_normalization=rule)
        for rule in ("global_frames", "average")])
    # global_frames is use_normalized_loss over the union batch: each batch holds both ranks' batches
    single, _ = train(tmp_path, 1, config(max_seqs=4, network=NORMALIZED_NETWORK))
    assert exact[0]["num_steps"] == single[0]["num_steps"] == 4
    np.testing.assert_array_equal(exact[0]["params"], exact[1]["params"])
    np.testing.assert_allclose(exact[0]["params"], single[0]["params"], rtol=1e-5, atol=1e-6)
    # 'average' halves the sum of the ranks' loss sums: not the union batch's frame average
    assert not np.allclose(averaged[0]["params"], single[0]["params"], rtol=1e-4, atol=1e-5)


@pytest.mark.tf_latest
def test_param_mode_sync_every_step_equals_averaged_grad_mode(tmp_path):
    (grad, param), _ = train(tmp_path, 2, [
        base_config(use_horovod=True, horovod_avg_grad=True, distributed_backend="mpi"),
        base_config(use_horovod=True, horovod_reduce_type="param", horovod_param_sync_step=1,
                    distributed_backend="mpi")])
    np.testing.assert_allclose(param[0]["params"], grad[0]["params"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(param[0]["params"], param[1]["params"])


def test_param_mode_ranks_differ_between_syncs_and_agree_after(tmp_path):
    config = base_config(use_horovod=True, horovod_reduce_type="param", horovod_param_sync_step=5)
    config["train"]["num_seqs"] = 48  # 12 batches: 6 local steps per rank, a sync after step 4 and at the end
    ranks, _ = train(tmp_path, 2, config)
    r0, r1 = ranks
    assert list(r0["sync_steps"]) == list(r1["sync_steps"]) == [4, 5]
    for step in (0, 1, 2, 3, 5):  # between syncs every rank follows its own data
        assert not np.allclose(r0["after_step"][step], r1["after_step"][step])
    for k in range(2):  # after each sync (step 4 and epoch end) the ranks are identical
        np.testing.assert_array_equal(r0["after_sync"][k], r1["after_sync"][k])
    np.testing.assert_array_equal(r0["params"], r1["params"])


def test_uneven_data_never_deadlocks_in_grad_or_param_mode(tmp_path):
    modes = [{"horovod_reduce_type": "grad"},
             {"horovod_reduce_type": "param", "horovod_param_sync_step": 3,
              "horovod_dataset_distribution": "random_seed_offset"}]
    configs = [base_config(use_horovod=True, **mode, batch_size=200,  # variable-length sequences: the ranks
                           train={"class": "Task12AXDataset", "num_seqs": 203, "seq_ordering": "random"})
               for mode in modes]  # get different numbers of batches
    (grad, param), r = train(tmp_path, 2, configs, timeout=400)  # a deadlock: the stall watchdog ends it
    assert grad[0]["num_steps"] == grad[1]["num_steps"]  # shard: one rank's extra batch is dropped
    for ranks in (grad, param):
        np.testing.assert_array_equal(ranks[0]["params"], ranks[1]["params"])


def _assert_ends_quickly(r, started, bound=200.0):
    """Ended by the failure handling: start-up (seconds, more on a busy machine) and a few steps, well
    before the stall watchdog's 300 s would end a job that hangs."""
    elapsed = time.monotonic() - started
    assert r.returncode != 0, r.stdout + r.stderr
    assert elapsed < bound, f"the job took {elapsed:.1f}s to end"


def test_exception_in_a_step_on_rank_1_ends_the_job(tmp_path):
    config = base_config(use_horovod=True, distributed_stall_timeout=300)
    config["train"]["num_seqs"] = 400
    started = time.monotonic()
    _, r = train(tmp_path, 2, config, "fail=step", "fail_rank=1", "fail_step=2", expect_ok=False, timeout=400)
    _assert_ends_quickly(r, started)
    assert r.stderr.count("injected failure in train step 2 on rank 1") == 1, r.stderr


def test_loader_error_on_rank_1_stops_all_ranks_through_the_signal(tmp_path):
    config = base_config(use_horovod=True)
    config["train"]["num_seqs"] = 400
    started = time.monotonic()
    _, r = train(tmp_path, 2, config, "fail=loader", "fail_rank=1", "fail_step=30", expect_ok=False,
                 timeout=400)
    _assert_ends_quickly(r, started)
    assert r.stderr.count("injected corrupt sequence") == 1, r.stderr
    assert "[rank 1]" in r.stderr and "Another rank failed (rank 1)" in r.stderr
    assert "Traceback" not in r.stderr


def test_sigkill_of_a_rank_ends_the_job(tmp_path):
    config = base_config(use_horovod=True)
    config["train"]["num_seqs"] = 400
    started = time.monotonic()
    _, r = train(tmp_path, 2, config, "fail=kill", "fail_rank=1", "fail_step=2", expect_ok=False, timeout=400)
    _assert_ends_quickly(r, started)
