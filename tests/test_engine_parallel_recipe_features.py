"""L2, maximize_grad_norm, gradient noise and clipping with real mpirun and 2 ranks: every rank applies the
same update, the L2 term counts as in RETURNN (on every rank for 'sum'/'average', once for 'global_frames';
as decoupled weight decay once per update), and the norm term and the noise are those of the reduced
gradient (the effect of each is checked on one process in test_training_gradients.py,
test_training_clip_norm_decoupled_l2.py and test_model_recipe_layers.py)."""
import numpy as np
import pytest

from test_engine_parallel import base_config, train

pytestmark = [pytest.mark.mpi, pytest.mark.tf_latest]

NETWORK = {"hidden": {"class": "linear", "activation": "tanh", "n_out": 6, "L2": 0.02},
           "lstm": {"class": "rec", "unit": "NativeLstm2", "n_out": 5, "from": "hidden", "L2": 0.01},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
TRAINING = {"network": NETWORK, "gradient_noise": 0.01, "gradient_clip": 0.5,
            "gradient_clip_global_norm": 2.0}


def scaled_l2(network, factor):
    return {name: ({**layer, "L2": layer["L2"] * factor} if "L2" in layer else layer)
            for name, layer in network.items()}


FEED_FORWARD = {"hidden": NETWORK["hidden"], "output": {"class": "softmax", "loss": "ce", "from": "hidden"}}
GLOBAL_FRAMES = dict(train={"class": "Task12AXDataset", "num_seqs": 8, "fixed_random_seed": 5},  # unequal
                     batch_size=10000, maximize_grad_norm=0.1, use_horovod=True,  # lengths
                     distributed_backend="mpi", horovod_grad_normalization="global_frames",
                     **{**TRAINING, "network": FEED_FORWARD})
DECOUPLED = {**TRAINING, "gradient_clip_norm": 0.3, "decouple_constraints": True}
# name: (ranks, config). Every test here compares a 2-rank run with one process: all 2-rank runs train
# one after the other in one mpirun job, all single ones in one process (module fixture below).
RUNS = {
    # the ranks' sum of (CE_r + L2 R) is CE_union + 2 L2 R: the union batch with twice the L2; the norm
    # term and the noise belong to the reduced gradient
    "sum": (2, base_config(use_horovod=True, distributed_backend="mpi", **TRAINING)),
    "sum, one process": (1, base_config(batch_size=80, **{**TRAINING, "network": scaled_l2(NETWORK, 2)})),
    "global_frames": (2, base_config(max_seqs=2, **GLOBAL_FRAMES)),
    # one process with global_frames (it divides by the frames on one rank too): the L2 term once
    "global_frames, one process": (1, base_config(max_seqs=4, **GLOBAL_FRAMES)),
    # decouple_constraints: L2 leaves the loss, so the ranks' summed gradient is the union batch's, and the
    # decay 2 L2 w is applied once per update; as a loss term, the same L2 would count once per rank (see
    # the first test), so the single process would need twice the L2 to agree
    "decoupled": (2, base_config(use_horovod=True, distributed_backend="mpi", **DECOUPLED)),
    "decoupled, one process": (1, base_config(batch_size=80, **DECOUPLED)),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    results = {}
    for ranks in (2, 1):
        names = [name for name, (r, _) in RUNS.items() if r == ranks]
        runs, _ = train(tmp_path_factory.mktemp(f"ranks{ranks}"), ranks, [RUNS[name][1] for name in names])
        results.update(zip(names, runs))
    return results


def assert_ranks_equal_one_process(ranks: list[dict], single: list[dict]) -> None:
    assert ranks[0]["num_steps"] == single[0]["num_steps"] == 2
    np.testing.assert_array_equal(ranks[0]["params"], ranks[1]["params"])
    np.testing.assert_allclose(ranks[0]["params"], single[0]["params"], rtol=1e-4, atol=1e-5)


def test_sum_mode_counts_l2_on_every_rank_as_returnn_does(trained):
    assert_ranks_equal_one_process(trained["sum"], trained["sum, one process"])


def test_global_frames_counts_l2_once_and_equals_the_union_batch(trained):
    assert_ranks_equal_one_process(trained["global_frames"], trained["global_frames, one process"])


def test_decoupled_l2_decays_once_per_update_whatever_the_ranks(trained):
    assert_ranks_equal_one_process(trained["decoupled"], trained["decoupled, one process"])
