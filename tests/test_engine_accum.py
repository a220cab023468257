"""accum_grad_multiple_step with real mpirun: k accumulated batches make one update equal to one process
on the union of those batches, with the L2 term once per batch as RETURNN sums whole gradients, on 1 and 2
ranks; an epoch's incomplete
last group makes no update (as in RETURNN's PyTorch engine); a stop inside a group waits for its end;
bad values and unsupported combinations are refused naming the key."""
import numpy as np
import pytest

import test_engine_resume as resume
from test_engine_parallel import BACKENDS, base_config, train

pytestmark = pytest.mark.mpi
tf_latest = pytest.mark.tf_latest

# unequal sequence lengths, so a mean of per-batch averages would differ from the union's average
CORPUS = {"class": "Task12AXDataset", "num_seqs": 10, "fixed_random_seed": 5}
FEED_FORWARD = {"hidden": {"class": "linear", "activation": "tanh", "n_out": 6, "L2": 0.02},
                "output": {"class": "softmax", "loss": "ce", "from": "hidden"}}
L2_TIMES_4 = {**FEED_FORWARD, "hidden": {**FEED_FORWARD["hidden"], "L2": 0.08}}
# clipping and noise act on the update's gradient, so they must act once per group
COMMON = dict(train=CORPUS, batch_size=10000, network=FEED_FORWARD, gradient_clip=0.5,
              gradient_noise=0.01, gradient_clip_global_norm=2.0)


@tf_latest
def test_one_process_accumulation_equals_the_union_batch_and_drops_the_last_short_group(tmp_path):
    # 10 batches of one sequence in groups of 4: updates on sequences 0-3 and 4-7; 8-9 make none
    # each of the 4 batches' gradients holds the L2 term (RETURNN's accum_grad_multiple_step sums them)
    first_8 = {**COMMON, "train": {**CORPUS, "num_seqs": 8}, "network": L2_TIMES_4}
    (accumulated, union, per_batch), out = train(tmp_path, 1, [  # one process trains the three
        base_config(max_seqs=1, accum_grad_multiple_step=4, **COMMON, log_verbosity=4),
        base_config(max_seqs=4, **first_8),
        base_config(max_seqs=1, **COMMON)])
    assert accumulated[0]["num_steps"] == 10 and union[0]["num_steps"] == 2
    np.testing.assert_allclose(accumulated[0]["params"], union[0]["params"], rtol=1e-5, atol=1e-6)
    # the batches inside a group leave the parameters alone; the group's last one updates them
    after = accumulated[0]["after_step"]
    np.testing.assert_array_equal(after[0], after[2])
    assert not np.array_equal(after[2], after[3])
    np.testing.assert_array_equal(after[3], after[6])
    np.testing.assert_array_equal(after[7], accumulated[0]["params"])  # batches 8 and 9: no update
    assert "the epoch's last 2 batch(es) of this rank form an incomplete group" in out.stdout + out.stderr
    assert not np.allclose(per_batch[0]["params"], union[0]["params"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_global_frames_accumulation_equals_one_process_on_the_union_batch(tmp_path, backend):
    # 12 sequences, one per batch, 6 per rank in groups of 4: one update sees 8 sequences (0-7, the
    # ranks take turns), the last 2 batches of each rank make none
    common = {**COMMON, "train": {**CORPUS, "num_seqs": 12}}
    ranks, _ = train(tmp_path, 2, base_config(max_seqs=1, accum_grad_multiple_step=4, use_horovod=True,
                                              distributed_backend=backend,
                                              horovod_grad_normalization="global_frames", **common))
    # one process (global_frames divides by the frames on one rank too); rank 0 adds the L2 term to each
    # of its 4 batches of a group
    first_8 = {**common, "train": {**CORPUS, "num_seqs": 8}, "network": L2_TIMES_4}
    single, _ = train(tmp_path, 1, base_config(max_seqs=8, use_horovod=True, distributed_backend=backend,
                                               horovod_grad_normalization="global_frames", **first_8))
    assert ranks[0]["num_steps"] == ranks[1]["num_steps"] == 6 and single[0]["num_steps"] == 1
    np.testing.assert_array_equal(ranks[0]["params"], ranks[1]["params"])
    np.testing.assert_allclose(ranks[0]["params"], single[0]["params"], rtol=1e-5, atol=1e-6)


@tf_latest
def test_two_ranks_average_mode_with_equal_lengths_equals_the_union_batch_at_half_the_rate(tmp_path):
    # 'average': half the sum of the ranks' group sums, i.e. the union batch's gradient at half the rate
    # (without L2, which 'average' counts once per rank as RETURNN does)
    network = {**FEED_FORWARD, "hidden": {**FEED_FORWARD["hidden"], "L2": 0.0}}
    common = {**COMMON, "train": base_config()["train"], "network": network, "gradient_clip": 0.0,
              "gradient_noise": 0.0, "gradient_clip_global_norm": 0.0, "learning_rate": 0.05}
    ranks, _ = train(tmp_path, 2, base_config(max_seqs=1, accum_grad_multiple_step=2, use_horovod=True,
                                              distributed_backend="mpi", horovod_avg_grad=True, **common))
    common["learning_rate"] = 0.025
    single, _ = train(tmp_path, 1, base_config(max_seqs=4, **common))
    assert ranks[0]["num_steps"] == 8 and single[0]["num_steps"] == 4
    np.testing.assert_array_equal(ranks[0]["params"], ranks[1]["params"])
    np.testing.assert_allclose(ranks[0]["params"], single[0]["params"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value, message", [
    (0, "Config key 'accum_grad_multiple_step' must be an integer >= 1"),
    (-3, "Config key 'accum_grad_multiple_step' must be an integer >= 1"),
    (2.5, "Config key 'accum_grad_multiple_step' must be int"),
])
def test_bad_values_are_refused_naming_the_key(tmp_path, value, message):
    _, r = train(tmp_path, 1, base_config(accum_grad_multiple_step=value), expect_ok=False)
    assert r.returncode != 0
    assert message in r.stdout + r.stderr, r.stdout + r.stderr


def test_param_mode_is_refused(tmp_path):
    config = base_config(accum_grad_multiple_step=2, use_horovod=True, horovod_reduce_type="param",
                         distributed_backend="mpi")
    _, r = train(tmp_path, 2, config, expect_ok=False)
    assert r.returncode != 0
    message = "accum_grad_multiple_step > 1 is not supported with horovod_reduce_type = 'param'"
    assert message in r.stdout + r.stderr


def test_a_stop_inside_a_group_saves_at_the_groups_end_and_resumes_bitwise(tmp_path):
    # 6 steps per rank and epoch: a group of 4, then 2 batches without an update. The checkpoint due
    # at global step 8 (epoch 2, step 2) and rank 1's SIGUSR1 in its 8th step (epoch 2, step 1) both
    # wait for the group's end after epoch 2's step 4 (global step 10): a checkpoint never holds a
    # half-filled accumulator.
    def values(folder):
        return dict(resume.config(folder, "grad"), accum_grad_multiple_step=4)

    reference, _ = resume.train(tmp_path / "reference", values(tmp_path / "reference"))
    folder = tmp_path / "stopped"
    _, stopped = resume.train(folder, values(folder), "fail=SIGUSR1", "fail_rank=1", "fail_step=7", expect=99)
    assert f"SIGUSR1 received by rank 1; saved checkpoint {folder}/net.002.step10 " in stopped, stopped
    assert "(epoch 2, step 4 of the epoch)" in stopped, stopped
    assert not (folder / "net.002.step8.index").exists() and not list(folder.glob("*step8*")), stopped
    resumed, output = resume.train(folder, values(folder))
    assert "train epoch 2: continuing after step 4 (8 batches of the epoch's plan done)" in output, output
    assert [int(r["num_steps"]) for r in resumed] == [2, 2], output
    for rank in range(2):
        np.testing.assert_array_equal(resumed[rank]["params"], reference[rank]["params"])
