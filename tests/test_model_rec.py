"""RETURNN's rec layer with a subnetwork unit (engine/model/rec/): the loop plan, the decoder loop in
training (the optimised plan computes what the all-in-loop one does), beam search (its score is the
model's log-probability of its hypothesis), the refusals, and training through rnn.py on 1 and 2 ranks."""
import copy
import re

import numpy as np
import pytest
import tensorflow as tf

from engine.model.losses.cross_entropy import ProbabilityCrossEntropy
from engine.model.network import NetworkModel
from engine.model.rec.unit import parse_unit, plan_loop
from engine.runtime.errors import ConfigError
from helpers import ROOT, run_mpi, run_rnn

CLASSES = 7
# an LSTM attention decoder as RETURNN's 2019 LibriSpeech setup builds it (MLP attention with fertility,
# rnn_cell state, maxout readout), small
UNIT = {
    "output": {"class": "choice", "target": "classes", "beam_size": 3, "from": ["output_prob"],
               "initial_output": 0},
    "end": {"class": "compare", "from": ["output"], "value": 0},
    "target_embed": {"class": "linear", "activation": None, "with_bias": False, "from": ["output"],
                     "n_out": 5,
                     "initial_output": 0},
    "weight_feedback": {"class": "linear", "activation": None, "with_bias": False,
                        "from": ["prev:accum_att_weights"], "n_out": 6},
    "s_transformed": {"class": "linear", "activation": None, "with_bias": False, "from": ["s"], "n_out": 6},
    "energy_in": {"class": "combine", "kind": "add",
                  "from": ["base:enc_ctx", "weight_feedback", "s_transformed"],
                  "n_out": 6},
    "energy_tanh": {"class": "activation", "activation": "tanh", "from": ["energy_in"]},
    "energy": {"class": "linear", "activation": None, "with_bias": False, "from": ["energy_tanh"],
               "n_out": 1},
    "att_weights": {"class": "softmax_over_spatial", "from": ["energy"]},
    "accum_att_weights": {"class": "eval",
                          "from": ["prev:accum_att_weights", "att_weights", "base:inv_fertility"],
                          "eval": "source(0) + source(1) * source(2) * 0.5",
                          "out_type": {"dim": 1, "shape": (None, 1)}},
    "att0": {"class": "generic_attention", "weights": "att_weights", "base": "base:enc_value"},
    "att": {"class": "merge_dims", "axes": "except_batch", "from": ["att0"]},
    "s": {"class": "rnn_cell", "unit": "LSTMBlock", "from": ["prev:target_embed", "prev:att"], "n_out": 8},
    "readout_in": {"class": "linear", "from": ["s", "prev:target_embed", "att"], "activation": None,
                   "n_out": 8},
    "readout": {"class": "reduce_out", "mode": "max", "num_pieces": 2, "from": ["readout_in"]},
    "output_prob": {"class": "softmax", "from": ["readout"], "target": "classes", "loss": "ce"},
}
NETWORK = {
    "fw": {"class": "rec", "unit": "nativelstm2", "n_out": 6, "direction": 1, "from": "data"},
    "bw": {"class": "rec", "unit": "nativelstm2", "n_out": 6, "direction": -1, "from": "data"},
    "encoder": {"class": "pool", "mode": "max", "padding": "same", "pool_size": (2,), "from": ["fw", "bw"]},
    "enc_ctx": {"class": "linear", "activation": None, "from": ["encoder"], "n_out": 6},
    "inv_fertility": {"class": "linear", "activation": "sigmoid", "with_bias": False, "from": ["encoder"],
                      "n_out": 1},
    "enc_value": {"class": "split_dims", "axis": "F", "dims": (1, 12), "from": ["encoder"]},
    "output": {"class": "rec", "from": [], "unit": UNIT, "target": "classes",
               "max_seq_len": "max_len_from('base:encoder') * 2"},
    "decision": {"class": "decide", "from": ["output"], "loss": "edit_distance", "target": "classes"},
}
# the same decoder with the layers of RETURNN's other LSTM attention setups: the state read through
# get_last_hidden_state (2019-asr-local-attention, 2018-attention), energies by a learned positive vector
# and a reduce over the features (2019-asr-e2e-trafo-vs-lstm), reinterpret_data (local attention)
STATE_UNIT = {**{k: v for k, v in UNIT.items() if k != "s_transformed"},
              "prev_s_state": {"class": "get_last_hidden_state", "from": ["prev:s"], "n_out": 16},
              "s_transformed": {"class": "linear", "activation": None, "with_bias": False,
                                "from": ["prev_s_state"], "n_out": 6},
              "energy_v": {"class": "variable", "shape": [6], "init": 0.3},
              "energy_v2": {"class": "activation", "from": "energy_v", "activation": "exp"},
              "energy_tanh2": {"class": "combine", "kind": "mul", "from": ["energy_tanh", "energy_v2"]},
              "energy_sum": {"class": "reduce", "axes": "f", "mode": "sum", "keep_dims": True,
                             "from": ["energy_tanh2"], "n_out": 1},
              "energy": {"class": "reinterpret_data", "enforce_batch_major": True, "from": "energy_sum"}}
STATE_NETWORK = {**NETWORK, "output": {**NETWORK["output"], "unit": STATE_UNIT}}
# RETURNN 1.20261022's log of this unit (_SubnetworkRecCell._move_outside_loop), training and search
TRAIN_PLAN = (["output", "target_embed"], ["output_prob", "readout", "readout_in"],
              ["s", "att", "att0", "att_weights", "energy", "energy_tanh", "energy_in", "weight_feedback",
               "accum_att_weights", "s_transformed"])


def model(network=NETWORK, **options):
    return NetworkModel(copy.deepcopy(network), input_dim=4, input_sparse=False,
                        target_dims={"classes": CLASSES}, random_seed=3, **options)


def batch(seed=0):
    rng = np.random.RandomState(seed)
    data = rng.randn(3, 10, 4).astype(np.float32)
    lengths = np.array([10, 8, 6], np.int32)
    label_lengths = np.array([4, 3, 2], np.int32)
    labels = rng.randint(1, CLASSES, size=(3, 4)).astype(np.int32)
    for b, n in enumerate(label_lengths):
        labels[b, n - 1:] = 0  # EOS 0 ends each, as RETURNN's BPE setups' seq_postfix [0]
    return data, lengths, labels, label_lengths


def test_the_plan_moves_out_what_returnn_moves_out():
    unit = parse_unit("output", UNIT)
    plan = plan_loop(unit, search=False)
    assert (list(plan.inputs_moved_out), list(plan.outputs_moved_out), list(plan.in_loop)) == TRAIN_PLAN
    assert plan.unused == ("end",)
    search = plan_loop(unit, search=True)
    assert search.inputs_moved_out == search.outputs_moved_out == () and set(search.in_loop) == set(UNIT)
    assert plan_loop(unit, search=False, optimize=False).in_loop == tuple(sorted(UNIT))


def scores_and_gradients(net):
    data, lengths, labels, label_lengths = batch()
    with tf.GradientTape() as tape:
        out = net(data, lengths, streams={"classes": labels}, stream_lengths={"classes": label_lengths})
        losses = net.compute_losses(out, {"classes": labels}, {"classes": label_lengths})
    grads = tape.gradient(losses.objective, net.trainable_variables)
    return losses, dict(zip(net.named_trainable_variables(), grads))


@pytest.mark.tf_latest  # the loop's ops: the newest TensorFlow runs them too
@pytest.mark.parametrize("base", [NETWORK, STATE_NETWORK], ids=["rnn_cell", "state-variable-reduce"])
def test_the_optimised_loop_computes_what_the_loop_of_every_layer_computes(base):
    network = copy.deepcopy(base)
    network["output"]["optimize_move_layers_out"] = False
    optimised, plain = scores_and_gradients(model(base)), scores_and_gradients(model(network))
    assert float(optimised[0].loss) > 0
    np.testing.assert_allclose(float(optimised[0].loss), float(plain[0].loss), rtol=1e-6)
    assert float(optimised[0].error) == float(plain[0].error) and float(optimised[0].num_frames) == 9
    assert optimised[1].keys() == plain[1].keys()
    for name, grad in optimised[1].items():
        assert grad is not None, name
        np.testing.assert_allclose(grad.numpy(), plain[1][name].numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_checkpoint_names_are_returnns():
    names = set(model().named_variables())
    assert {"output/s/rec/lstm_cell/kernel", "output/s/rec/lstm_cell/bias", "output/output_prob/W",
            "output/target_embed/W", "output/energy/W"} <= names


def sequence_log_prob(net, data, lengths, hyp, hyp_length):
    """log p(hyp + EOS | data) by the model in scoring (the decoder fed the hypothesis)."""
    labels = np.zeros((1, hyp_length + 1), np.int32)
    labels[0, :hyp_length] = hyp[:hyp_length]
    out = net(data[None], lengths[None], streams={"classes": labels},
              stream_lengths={"classes": np.array([hyp_length + 1], np.int32)})
    log_probs = tf.nn.log_softmax(out["output/output_prob:logits"])[0].numpy()
    return float(sum(log_probs[t, labels[0, t]] for t in range(hyp_length + 1)))


@pytest.mark.tf_latest
@pytest.mark.parametrize("beam, base", [(1, NETWORK), (3, NETWORK), (3, STATE_NETWORK)],
                         ids=["1", "3", "3-state-variable-reduce"])
def test_a_searched_hypothesis_scores_its_log_probability(beam, base):
    network = copy.deepcopy(base)
    network["output"]["unit"]["output"].update(beam_size=beam, length_normalization=False)
    net = model(network)
    data, lengths, _, _ = batch()
    found = {key: value.numpy() for key, value in net.search(data, lengths, "decision").items()}
    for b in range(3):
        length = int(found["hyp_lengths"][b])
        if length == 2 * 5:  # no EOS within max_seq_len: the score has no EOS term
            continue
        expected = sequence_log_prob(net, data[b, :lengths[b]], lengths[b], found["hyps"][b], length)
        np.testing.assert_allclose(found["scores"][b], expected, rtol=1e-4)
    # the final beam (what search_output_layer writes for the rec layer): best first, the decided one
    # first (no length normalisation), each entry scoring its own log probability
    assert found["beam"].shape[:2] == found["beam_scores"].shape == (3, beam)
    for b in range(3):
        assert list(found["beam_scores"][b]) == sorted(found["beam_scores"][b], reverse=True)
        assert found["beam_lengths"][b, 0] == found["hyp_lengths"][b]
        np.testing.assert_array_equal(found["beam"][b, 0, :found["hyp_lengths"][b]],
                                      found["hyps"][b, :found["hyp_lengths"][b]])
        for k in range(beam):
            length = int(found["beam_lengths"][b, k])
            if length < 2 * 5:
                hyp = found["beam"][b, k]
                expected = sequence_log_prob(net, data[b, :lengths[b]], lengths[b], hyp, length)
                np.testing.assert_allclose(found["beam_scores"][b, k], expected, rtol=1e-4)


def searched_scores_checked(net, per_label: bool = False) -> int:
    """Search the test batch; each decided hypothesis that ended scores its log probability when the
    network runs on it as a target (divided by its length + 1 ``per_label``). Returns how many ended."""
    data, lengths, _, _ = batch()
    found = {key: value.numpy() for key, value in net.search(data, lengths, "decision").items()}
    checked = 0
    for b in range(3):
        length = int(found["hyp_lengths"][b])
        if length == 2 * 5:  # no EOS within max_seq_len: the score has no EOS term
            continue
        expected = sequence_log_prob(net, data[b, :lengths[b]], lengths[b], found["hyps"][b], length)
        np.testing.assert_allclose(found["scores"][b], expected / (length + 1 if per_label else 1), rtol=1e-4)
        checked += 1
    return checked


def test_a_length_normalised_search_scores_its_log_probability_per_label():
    # RETURNN's default length_normalization: an ended hypothesis' final score is log p / (length + 1)
    net = model()
    bias = net.named_variables()["output/output_prob/b"]
    bias.assign(bias + tf.one_hot(0, CLASSES) * 2.0)  # EOS likelier, so that hypotheses end
    assert searched_scores_checked(net, per_label=True)


def test_a_wider_beam_finds_no_worse_hypothesis():
    network = copy.deepcopy(NETWORK)
    data, lengths, _, _ = batch(seed=4)
    scores = {}
    for beam in (1, 4):
        network["output"]["unit"]["output"].update(beam_size=beam, length_normalization=False)
        scores[beam] = model(network).search(data, lengths, "decision")["scores"].numpy()
    assert np.all(scores[4] >= scores[1] - 1e-5)


def test_search_in_a_graph_gives_what_it_gives_eagerly():
    net = model()
    data, lengths, _, _ = batch()
    eager = net.search(data, lengths, "decision")
    graph = tf.function(lambda d, n: net.search(d, n, "decision"))(data, lengths)
    for key in eager:
        np.testing.assert_allclose(eager[key].numpy(), graph[key].numpy(), rtol=1e-5)


@pytest.mark.parametrize("change, message", [
    ({"x": {"class": "conv", "from": "s"}}, "class 'conv' is not implemented inside a rec unit"),
    ({"x": {"class": "linear", "from": "data:source", "n_out": 2}},
     "unit layer 'x': 'data:source' is the rec layer's input frame, but the rec layer has no sources"),
    ({"x": {"class": "linear", "from": "y", "n_out": 2}, "y": {"class": "linear", "from": "x", "n_out": 2}},
     "cycle within one step"),
    ({"x": {"class": "linear", "from": "s", "n_out": 2, "darc1": 0.1}}, "option(s) ['darc1']"),
    ({"x": {"class": "linear", "from": "s", "n_out": 2, "L2": -1}}, "'output/x': L2 must be a number >= 0"),
    ({"target_embed": {"class": "linear", "from": "output", "n_out": 5, "dropout": 0.1}},
     "'dropout' on class ids"),
    ({"s": {"class": "rnn_cell", "unit": "NativeLstm2", "from": ["prev:att"], "n_out": 8}},
     "rnn_cell unit 'NativeLstm2'"),
    ({"x": {"class": "linear", "from": "s", "n_out": 2, "reuse_params": "readout_in"}},
     "'reuse_params' 'readout_in' is not implemented inside a rec unit"),
    ({"x": {"class": "get_last_hidden_state", "from": "prev:att", "n_out": 8}},
     "get_last_hidden_state reads the state of rnn_cell layers of the unit"),
    ({"x": {"class": "rec", "unit": "NativeLstm", "from": "s", "n_out": 2}},
     "a rec layer inside a rec unit is implemented with the units RETURNN runs as NativeLstm2"),
    ({"x": {"class": "get_last_hidden_state", "from": "prev:s", "n_out": 8}},
     "n_out 8 is not the size of the state it reads (16: key '*' of cells of [8] units)"),
    ({"s_state": {"class": "get_last_hidden_state", "from": "s", "n_out": 16},
      "readout_in": {"class": "linear", "from": ["s_state", "att"], "activation": None, "n_out": 8}},
     "get_last_hidden_state layers ['s_state'] are read by no layer of the loop"),
    ({"x": {"class": "reduce", "axes": "f", "mode": "sum", "from": "s"}}, "with keep_dims True (axes 'f')"),
    ({"x": {"class": "reduce", "axes": "t", "mode": "sum", "keep_dims": True, "from": "att_weights"}},
     "reduce over time inside a rec unit is implemented without keep_dims"),
    ({"x": {"class": "reduce", "axes": "t", "mode": "logsumexp", "from": "att_weights"}},
     "and with mode sum, max, min, mean, avg; got mode 'logsumexp'"),
    ({"x": {"class": "reduce", "axes": "t", "mode": "sum", "from": "s"}},
     "reduce over time takes one source of dense features with a time axis here"),
    ({"x": {"class": "variable", "shape": [2, 3]}}, "variable 'shape' [2, 3] is not implemented"),
    ({"x": {"class": "combine", "kind": "add", "from": [":i", "s"]}},
     "reads ':i' (the step); here a compare layer reads it, a combine layer does not"),
])
def test_what_the_unit_refuses_is_named(change, message):
    network = copy.deepcopy(NETWORK)
    network["output"]["unit"].update(change)
    with pytest.raises(ConfigError, match=re.escape(message)):
        model(network)


def test_a_decide_layer_reads_a_searched_rec_layer():
    network = copy.deepcopy(NETWORK)
    network["decision"]["from"] = ["encoder"]
    with pytest.raises(ConfigError, match="a decide layer reads a rec layer with a subnetwork unit"):
        model(network)


def write_corpus(path, num_seqs, seed):
    """Symbols held for 2-4 frames each; the target: the symbols + 1 and EOS 0."""
    from engine.datasets import DataKeyInfo, HDFWriter

    rng = np.random.RandomState(seed)
    keys = {"data": DataKeyInfo(dim=4), "classes": DataKeyInfo(dim=CLASSES, sparse=True)}
    with HDFWriter(str(path), keys) as w:
        for i in range(num_seqs):
            symbols = rng.randint(4, size=rng.randint(1, 4))
            frames = np.concatenate([[s] * rng.randint(2, 5) for s in symbols])
            x = np.eye(4, dtype=np.float32)[frames] + 0.2 * rng.randn(len(frames), 4).astype(np.float32)
            w.insert(f"seq-{i}", {"data": x, "classes": np.append(symbols + 1, 0).astype(np.int32)})
    return str(path)


def config_file(tmp_path):
    train, dev = write_corpus(tmp_path / "train.hdf", 60, 1), write_corpus(tmp_path / "dev.hdf", 20, 2)
    path = tmp_path / "attention.py"
    path.write_text(
        f"train = {{'class': 'HDFDataset', 'files': [{train!r}]}}\n"
        f"dev = {{'class': 'HDFDataset', 'files': [{dev!r}]}}\n"
        f"network = {NETWORK!r}\n"
        "adam = True\nlearning_rate = 0.01\nbatch_size = 300\nnum_epochs = 2\n"
        f"model = {str(tmp_path / 'out' / 'model')!r}\n")
    return str(path)


@pytest.mark.slow
@pytest.mark.mpi
def test_an_attention_decoder_trains_through_rnn_py_on_one_and_two_ranks(tmp_path):
    config = config_file(tmp_path)
    one = run_rnn([config], timeout=300)
    assert one.returncode == 0, one.stdout + one.stderr
    assert "Output layers moved out of loop: (#: 3)" in one.stdout + one.stderr
    scores = [float(s) for s in re.findall(r"^dev: score (\S+)", one.stdout, re.M)]
    assert len(scores) == 2 and scores[1] < scores[0], one.stdout
    two = run_mpi(2, [str(ROOT / "rnn.py"), config, "++use_horovod", "1", "++model",
                      str(tmp_path / "two" / "model")], timeout=300)
    assert two.returncode == 0, two.stdout + two.stderr
    assert len(re.findall(r"^dev: score ", two.stdout, re.M)) == 2, two.stdout


def test_trainable_param_device_and_no_reuse_params_in_a_unit():
    network = copy.deepcopy(NETWORK)
    network["output"]["unit"]["target_embed"].update(trainable=False, param_device="CPU", reuse_params=None)
    net = model(network)
    assert "output/target_embed/W" in net.named_variables()
    assert "output/target_embed/W" not in net.named_trainable_variables()
    network["output"]["unit"]["target_embed"]["trainable"] = "no"
    with pytest.raises(ConfigError, match="'trainable' must be True or False"):
        model(network)


FRAME_LOOP = {
    "proj": {"class": "linear", "n_out": 3, "activation": None, "from": "data"},
    "rnn": {"class": "rec", "from": "proj", "unit": {
        "x": {"class": "linear", "from": "data:source", "n_out": 4, "with_bias": False},
        "output": {"class": "eval", "from": ["x", "prev:output"],
                   "eval": "tf.tanh(source(0) + 0.5 * source(1))"},
    }},
    "output": {"class": "softmax", "loss": "ce", "from": "rnn"},
}


@pytest.mark.tf_latest
@pytest.mark.parametrize("optimize", [True, False])
def test_a_unit_loops_over_its_sources_frames(optimize):
    network = copy.deepcopy(FRAME_LOOP)
    network["rnn"]["optimize_move_layers_out"] = optimize
    net = NetworkModel(network, input_dim=5, input_sparse=False, target_dims={"classes": 4}, random_seed=1)
    plan = net.layers["rnn"].plan
    expected_plan = (("x",), ("output",)) if optimize else ((), ("output", "x"))
    assert (plan.inputs_moved_out, plan.in_loop) == expected_plan
    x = np.random.RandomState(0).randn(2, 6, 5).astype(np.float32)
    out = net(x, np.array([6, 4], np.int32))
    weights = net.layers["rnn"].params["x/W"].numpy()
    state, expected = np.zeros((2, 4)), []
    for t in range(6):  # the recurrence by hand
        state = np.tanh(out["proj"].numpy()[:, t] @ weights + 0.5 * state)
        expected.append(state)
    np.testing.assert_allclose(out["rnn"].numpy(), np.stack(expected, 1), rtol=1e-5, atol=1e-6)
    assert out["rnn:lengths"].numpy().tolist() == [6, 4]


def test_a_frame_loop_needs_a_dense_output_and_no_choice():
    network = copy.deepcopy(FRAME_LOOP)
    network["rnn"]["unit"]["output"] = {"class": "choice", "target": "classes", "beam_size": 2, "from": "x"}
    with pytest.raises(ConfigError, match="a choice in a loop over the rec layer's input frames"):
        NetworkModel(network, input_dim=5, input_sparse=False, target_dims={"classes": 4}, random_seed=1)


def test_base_layers_of_other_frames_are_named():
    network = copy.deepcopy(NETWORK)
    network["inv_fertility"]["from"] = ["fw"]  # before the pooling: twice the encoder's frames
    with pytest.raises(ConfigError, match=r"its sources are on different time axes \(\['T:encoder', "
                                          r"'T:data'\]: base layers whose frames differ"):
        model(network)


def test_l2_on_unit_layers_regularizes_their_parameters_as_returnn_does():
    """RETURNN adds each unit layer's L2 over that layer's parameters to the rec layer's constraints
    (checked against RETURNN 1.20261022's get_total_constraints on the fixture case unit_state: 0.286598
    for L2 0.01, 0.02, 0.03 on s_proj, s and the output, equal to these sums of squares)."""
    network = copy.deepcopy(NETWORK)
    network["output"]["unit"]["readout_in"]["L2"] = 0.01
    network["output"]["unit"]["s"]["L2"] = 0.02
    network["fw"]["L2"] = 0.03
    net = model(network)
    data, lengths, labels, label_lengths = batch()
    out = net(data, lengths, streams={"classes": labels}, stream_lengths={"classes": label_lengths})
    losses = net.compute_losses(out, {"classes": labels}, {"classes": label_lengths})
    variables = net.named_variables()

    def squares(prefix):
        return sum(float(tf.reduce_sum(tf.square(v))) for k, v in variables.items() if k.startswith(prefix))

    expected = 0.01 * squares("output/readout_in/") + 0.02 * squares("output/s/") + 0.03 * squares("fw/")
    assert expected > 0
    np.testing.assert_allclose(float(losses.regularizer), expected, rtol=1e-6)
    factors = net.l2_factors()
    assert factors["output/readout_in/W"] == 0.01 and factors["output/s/rec/lstm_cell/kernel"] == 0.02
    assert "output/output_prob/W" not in factors and factors["fw/W"] == 0.03


# 2022-scale-learning's and 2020-lm-integration's decoders: the CE loss on an eval layer's probabilities
COMBO_UNIT = {**UNIT, "output_prob": {"class": "softmax", "from": ["readout"], "target": "classes"},
              "combo_log_prob": {"class": "eval", "from": ["output_prob"], "eval": "safe_log(source(0))"},
              "combo_prob": {"class": "eval", "from": ["combo_log_prob"], "eval": "tf.exp(source(0))",
                             "loss": "ce", "target": "classes", "loss_scale": 0.5}}
COMBO_NETWORK = {**NETWORK, "output": {**NETWORK["output"], "unit": COMBO_UNIT}}


def test_a_ce_loss_on_an_eval_layer_reads_its_output_as_probabilities():
    """exp(log softmax) is the softmax: the loss, error and gradients equal those of the softmax's own CE
    (RETURNN: -log(max(p_y, 1e-20)) of a layer that is no softmax), and loss_scale scales the objective."""
    combo, plain = scores_and_gradients(model(COMBO_NETWORK)), scores_and_gradients(model())
    in_loop = copy.deepcopy(COMBO_NETWORK)
    in_loop["output"]["optimize_move_layers_out"] = False  # the eval's probabilities from inside the loop
    np.testing.assert_allclose(float(scores_and_gradients(model(in_loop))[0].loss), float(plain[0].loss),
                               rtol=1e-5)
    np.testing.assert_allclose(float(combo[0].loss), float(plain[0].loss), rtol=1e-5)
    np.testing.assert_allclose(float(combo[0].objective), 0.5 * float(plain[0].objective), rtol=1e-5)
    assert float(combo[0].error) == float(plain[0].error) and float(combo[0].num_frames) == 9
    for name, grad in combo[1].items():
        np.testing.assert_allclose(grad.numpy(), 0.5 * plain[1][name].numpy(), rtol=1e-3, atol=1e-6,
                                   err_msg=name)


def test_the_probability_ce_clips_at_1e_20_and_passes_the_gradient():
    probabilities = tf.Variable([[0.0, 1.0], [0.25, 0.75]])
    with tf.GradientTape() as tape:
        losses = ProbabilityCrossEntropy().frame_losses(probabilities, tf.constant([0, 1]))
    np.testing.assert_allclose(losses.numpy(), [-np.log(1e-20), -np.log(0.75)], rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(losses, probabilities).numpy(), [[-1e20, 0], [0, -1 / 0.75]],
                               rtol=1e-6)


@pytest.mark.parametrize("change, message", [
    ({"target": "bpe"}, r"target 'bpe' \(known: \['classes'\]\) must be a sparse stream with as many"),
    ({"loss_opts": {"label_smoothing": 0.1}}, r"option\(s\) \['loss_opts'\] of a eval layer"),
    ({"loss": "ctc"}, "loss 'ctc' is not supported on a eval layer"),
])
def test_an_eval_loss_refuses_what_it_does_not_compute(change, message):
    network = copy.deepcopy(COMBO_NETWORK)
    network["output"]["unit"]["combo_prob"].update(change)
    with pytest.raises(ConfigError, match=message):
        model(network)
