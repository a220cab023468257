"""A Transformer decoder inside a rec unit (engine/model/rec/step_attention.py), built like RETURNN's 2019
Transformer ASR setups (causal self_attention, dot / softmax_over_spatial / generic_attention over the
encoder, layer_norm, residual combine): RETURNN's plan of it, the loop of every layer (self_attention
keeping the keys and values of the steps so far) computing what the parallel decoder computes, beam search
(the states follow their hypotheses: a searched hypothesis' score is the model's log-probability of it),
RETURNN's parameter names, and the refusals. bench_returnn_trafo.py compares it with RETURNN itself."""
import copy
import re

import numpy as np
import pytest
import tensorflow as tf

from engine.model.network import NetworkModel
from engine.model.rec.unit import parse_unit, plan_loop
from engine.runtime.errors import ConfigError
from test_model_rec import CLASSES, batch, scores_and_gradients

DIM, HEADS, FF = 8, 2, 12


def block(unit: dict, inp: str, out: str) -> None:
    """One decoder block of the setup's layers (its layer names; dropout and its noise shapes kept)."""
    def lin(source, n_out, activation=None, bias=False, **extra):
        return {"class": "linear", "activation": activation, "with_bias": bias, "from": [source],
                "n_out": n_out, **extra}

    unit.update({
        f"{out}_self_att_laynorm": {"class": "layer_norm", "from": [inp]},
        f"{out}_self_att_att": {"class": "self_attention", "num_heads": HEADS, "total_key_dim": DIM,
                                "n_out": DIM, "from": [f"{out}_self_att_laynorm"],
                                "attention_left_only": True, "attention_dropout": 0.1},
        f"{out}_self_att_lin": lin(f"{out}_self_att_att", DIM),
        f"{out}_self_att_drop": {"class": "dropout", "from": [f"{out}_self_att_lin"], "dropout": 0.1},
        f"{out}_self_att_out": {"class": "combine", "kind": "add", "from": [inp, f"{out}_self_att_drop"],
                                "n_out": DIM},
        f"{out}_att_laynorm": {"class": "layer_norm", "from": [f"{out}_self_att_out"]},
        f"{out}_att_query0": lin(f"{out}_att_laynorm", DIM),
        f"{out}_att_query": {"class": "split_dims", "axis": "F", "dims": (HEADS, DIM // HEADS),
                             "from": [f"{out}_att_query0"]},
        f"{out}_att_energy": {"class": "dot", "red1": -1, "red2": -1, "var1": "T", "var2": "T?",
                              "from": ["base:att_key", f"{out}_att_query"]},
        f"{out}_att_weights": {"class": "softmax_over_spatial", "from": [f"{out}_att_energy"],
                               "energy_factor": (DIM // HEADS) ** -0.5},
        f"{out}_att_weights_drop": {"class": "dropout", "dropout_noise_shape": {"*": None},
                                    "from": [f"{out}_att_weights"], "dropout": 0.1},
        f"{out}_att0": {"class": "generic_attention", "weights": f"{out}_att_weights_drop",
                        "base": "base:att_value"},
        f"{out}_att_att": {"class": "merge_dims", "axes": "static", "from": [f"{out}_att0"]},
        f"{out}_att_lin": lin(f"{out}_att_att", DIM),
        f"{out}_att_drop": {"class": "dropout", "from": [f"{out}_att_lin"], "dropout": 0.1},
        f"{out}_att_out": {"class": "combine", "kind": "add", "n_out": DIM,
                           "from": [f"{out}_self_att_out", f"{out}_att_drop"]},
        f"{out}_ff_laynorm": {"class": "layer_norm", "from": [f"{out}_att_out"]},
        f"{out}_ff_conv1": lin(f"{out}_ff_laynorm", FF, "relu", True),
        f"{out}_ff_conv2": lin(f"{out}_ff_conv1", DIM, None, True, dropout=0.1),
        f"{out}_ff_drop": {"class": "dropout", "from": [f"{out}_ff_conv2"], "dropout": 0.1},
        f"{out}_ff_out": {"class": "combine", "kind": "add", "from": [f"{out}_att_out", f"{out}_ff_drop"],
                          "n_out": DIM},
        out: {"class": "copy", "from": [f"{out}_ff_out"]},
    })


UNIT = {
    "output": {"class": "choice", "target": "classes", "beam_size": 3, "from": ["output_prob"],
               "initial_output": 0},
    "end": {"class": "compare", "from": ["output"], "value": 0},
    "target_embed_raw": {"class": "linear", "activation": None, "with_bias": False, "from": ["prev:output"],
                         "n_out": DIM},
    "target_embed_weighted": {"class": "eval", "from": ["target_embed_raw"],
                              "eval": f"source(0) * {DIM ** 0.5}"},
    "target_embed": {"class": "dropout", "from": ["target_embed_weighted"], "dropout": 0.0},
    "decoder": {"class": "layer_norm", "from": ["dec_02"]},
    "output_prob": {"class": "softmax", "from": ["decoder"], "target": "classes", "loss": "ce",
                    "loss_opts": {"label_smoothing": 0.1}},
}
block(UNIT, "target_embed", "dec_01")
block(UNIT, "dec_01", "dec_02")
NETWORK = {
    "embed": {"class": "linear", "activation": None, "from": "data", "n_out": DIM},
    "enc_att": {"class": "self_attention", "num_heads": HEADS, "total_key_dim": DIM, "n_out": DIM,
                "from": ["embed"]},
    "encoder": {"class": "layer_norm", "from": ["enc_att"]},
    "att_key0": {"class": "linear", "activation": None, "with_bias": False, "from": ["encoder"],
                 "n_out": DIM},
    "att_value0": {"class": "linear", "activation": None, "with_bias": False, "from": ["encoder"],
                   "n_out": DIM},
    "att_key": {"class": "split_dims", "axis": "F", "dims": (HEADS, DIM // HEADS), "from": ["att_key0"]},
    "att_value": {"class": "split_dims", "axis": "F", "dims": (HEADS, DIM // HEADS), "from": ["att_value0"]},
    "output": {"class": "rec", "from": [], "unit": UNIT, "target": "classes",
               "max_seq_len": "max_len_from('base:encoder')"},
    "decision": {"class": "decide", "from": ["output"], "loss": "edit_distance", "target": "classes"},
}


def model(network=NETWORK):
    return NetworkModel(copy.deepcopy(network), input_dim=4, input_sparse=False,
                        target_dims={"classes": CLASSES}, random_seed=5)


def returnn_order(unit: dict) -> list[str]:
    """RETURNN 1.20261022's "Output layers moved out of loop" of this unit in training (measured with the
    setup's own two-block network by bench_returnn_trafo.py): every layer, from the loss backwards."""
    names = ["output_prob", "decoder"]
    for out in ("dec_02", "dec_01"):
        names += [out, f"{out}_ff_out", f"{out}_ff_drop", f"{out}_ff_conv2", f"{out}_ff_conv1",
                  f"{out}_ff_laynorm", f"{out}_att_out", f"{out}_att_drop", f"{out}_att_lin",
                  f"{out}_att_att", f"{out}_att0", f"{out}_att_weights_drop", f"{out}_att_weights",
                  f"{out}_att_energy", f"{out}_att_query", f"{out}_att_query0",
                  f"{out}_att_laynorm", f"{out}_self_att_out", f"{out}_self_att_drop", f"{out}_self_att_lin",
                  f"{out}_self_att_att", f"{out}_self_att_laynorm"]
    return names + ["target_embed", "target_embed_weighted", "target_embed_raw", "output"]


def test_in_training_the_whole_decoder_moves_out_of_the_loop_as_in_returnn():
    plan = plan_loop(parse_unit("output", UNIT), search=False)
    assert plan.inputs_moved_out == () and plan.in_loop == ()
    assert list(plan.outputs_moved_out) == returnn_order(UNIT)
    search = plan_loop(parse_unit("output", UNIT), search=True)
    assert set(search.in_loop) == set(UNIT) and not search.outputs_moved_out


def test_the_loop_of_every_layer_computes_what_the_parallel_decoder_computes():
    network = copy.deepcopy(NETWORK)
    network["output"]["optimize_move_layers_out"] = False
    parallel, looped = scores_and_gradients(model()), scores_and_gradients(model(network))
    assert float(parallel[0].loss) > 0
    np.testing.assert_allclose(float(parallel[0].loss), float(looped[0].loss), rtol=1e-5)
    for name, grad in parallel[1].items():
        assert grad is not None, name
        np.testing.assert_allclose(grad.numpy(), looped[1][name].numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_positional_encoding_of_the_step_in_the_loop_is_that_of_the_parallel_decoder():
    network = copy.deepcopy(NETWORK)
    unit = network["output"]["unit"]
    unit["target_embed_pos"] = {"class": "positional_encoding", "add_to_input": True,
                                "from": ["target_embed"]}
    unit["dec_01_self_att_laynorm"]["from"] = unit["dec_01_self_att_out"]["from"][0] = "target_embed_pos"
    assert "target_embed_pos" in plan_loop(parse_unit("output", unit), search=False).outputs_moved_out
    data, lengths, labels, label_lengths = batch()
    out = model(network)(data, lengths, streams={"classes": labels},
                         stream_lengths={"classes": label_lengths})
    added = out["output/target_embed_pos"].numpy() - out["output/target_embed"].numpy()  # (B, L, DIM)
    parallel = scores_and_gradients(model(network))
    network["output"]["optimize_move_layers_out"] = False
    looped = scores_and_gradients(model(network))
    np.testing.assert_allclose(float(parallel[0].loss), float(looped[0].loss), rtol=1e-5)
    steps = np.arange(labels.shape[1])[:, None] * np.exp(-np.arange(DIM // 2) * np.log(1e4) / (DIM // 2 - 1))
    np.testing.assert_allclose(added[1], np.concatenate([np.sin(steps), np.cos(steps)], -1), atol=1e-5)


def test_the_causal_self_attention_sees_no_later_step():
    net = model()
    data, lengths, labels, label_lengths = batch()
    changed = labels.copy()
    changed[:, 2:] = (changed[:, 2:] % (CLASSES - 1)) + 1
    outs = [net(data, lengths, streams={"classes": x}, stream_lengths={"classes": label_lengths})
            for x in (labels, changed)]
    # step t reads labels < t (prev:output): steps 0..2 cannot see the change at label 2
    first = [o["output/output_prob"].numpy()[:, :3] for o in outs]
    np.testing.assert_allclose(first[0], first[1], rtol=1e-6)
    later = [o["output/output_prob"].numpy()[:, 3] for o in outs]
    assert not np.allclose(later[0], later[1])


def log_prob(net, data, length, labels):
    """log p(labels | data) by the model in scoring (the decoder fed the labels)."""
    out = net(data[None], np.array([length], np.int32), streams={"classes": labels[None]},
              stream_lengths={"classes": np.array([len(labels)], np.int32)})
    log_probs = tf.nn.log_softmax(out["output/output_prob:logits"])[0].numpy()
    return float(sum(log_probs[t, label] for t, label in enumerate(labels)))


@pytest.mark.parametrize("beam", [1, 3])
def test_a_searched_hypothesis_scores_its_log_probability(beam):
    network = copy.deepcopy(NETWORK)
    network["output"]["unit"]["output"].update(beam_size=beam, length_normalization=False)
    net = model(network)
    data, lengths, _, _ = batch(seed=1)  # a batch where beam 3 reorders its hypotheses
    found = {key: value.numpy() for key, value in net.search(data, lengths, "decision").items()}
    for b in range(3):
        n = int(found["hyp_lengths"][b])
        # a hypothesis that ended scores its EOS too; one cut at max_seq_len (the longest input) does not
        labels = found["hyps"][b][:n].astype(np.int32)
        if n < lengths.max():
            labels = np.append(labels, 0).astype(np.int32)
        expected = log_prob(net, data[b, :lengths[b]], lengths[b], labels)
        np.testing.assert_allclose(found["scores"][b], expected, rtol=1e-4)


def test_the_parameters_have_returnns_names():
    names = set(model().named_variables())
    assert {"output/dec_01_self_att_att/QKV", "output/dec_01_self_att_laynorm/scale",
            "output/dec_01_self_att_laynorm/bias", "output/dec_02_ff_conv1/W", "output/dec_02_ff_conv1/b",
            "output/target_embed_raw/W", "output/output_prob/W"} <= names


@pytest.mark.parametrize("layer, change, message", [
    ("dec_01_self_att_att", {"attention_left_only": False}, "needs attention_left_only True"),
    ("dec_01_att_energy", {"red1": -2}, "red1 -2 is not implemented inside a rec unit"),
    ("dec_01_att_energy", {"var2": "T"}, "var2 'T' (add_var2_if_empty True) is not implemented"),
    ("dec_01_att_weights_drop", {"dropout_noise_shape": {"F": 1}}, "dropout_noise_shape {'F': 1}"),
    ("dec_01_att_query", {"dims": (HEADS, 3)}, "do not multiply to the source's dim"),
    ("dec_01_self_att_att", {"num_heads": 3}, "total_key_dim 8 is not divisible by num_heads 3"),
    ("dec_01_self_att_att", {"key_shift": "x"}, "option(s) ['key_shift']"),
])
def test_what_the_transformer_unit_refuses_is_named(layer, change, message):
    network = copy.deepcopy(NETWORK)
    network["output"]["unit"][layer].update(change)
    with pytest.raises(ConfigError, match=re.escape(message)):
        model(network)
