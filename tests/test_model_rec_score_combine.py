"""A choice's ``custom_score_combine`` with ``explicit_search_sources`` (engine/model/rec/score_combine.py):
the function gets RETURNN's arguments and the sources' values per hypothesis, its scores decide the beam, and
what it cannot be given is refused by name. Equality with RETURNN's search: bench_returnn_search.py
--score-combine."""
from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import tensorflow as tf

from engine.runtime.errors import ConfigError
from test_model_rec import CLASSES, NETWORK, batch, model, searched_scores_checked

# a coverage measure of the attention (as RETURNN's coverage-penalty setups compute it) and a step counter
EXTRA_LAYERS = {
    "coverage_in": {"class": "eval", "from": ["accum_att_weights"], "eval": "tf.minimum(source(0), 0.5)"},
    "coverage": {"class": "reduce", "mode": "sum", "axes": "t", "from": ["coverage_in"]},
    "steps": {"class": "eval", "from": ["prev:steps"], "eval": "source(0) + 1.0",
              "out_type": {"dim": 1, "shape": (1,)},
              "initial_output": 0},
}


def plain_sum(layer, scores_in, scores_base, **kwargs):
    return scores_base + scores_in


def searched(combine=None, **choice):
    network = copy.deepcopy(NETWORK)
    network["output"]["unit"].update(copy.deepcopy(EXTRA_LAYERS))
    network["output"]["unit"]["output"].update(choice)
    if combine is not None:
        network["output"]["unit"]["output"]["custom_score_combine"] = combine
    return model(network)


def search(net):
    data, lengths, _, _ = batch()
    return {key: value.numpy() for key, value in net.search(data, lengths, "decision").items()}


def test_a_function_that_adds_the_scores_searches_as_the_choice_alone():
    seen = {}

    def adds(layer, scores_in, scores_base, t, end_flags, batch_dim, scores_beam_in, base_beam_in, **kwargs):
        prev, cur = [s.output.copy_as_batch_major().placeholder for s in layer.explicit_search_sources]
        seen.update(dim=layer.output.dim, sources=[s.name for s in layer.explicit_search_sources],
                    shapes=(prev.shape.as_list(), cur.shape.as_list()), beam=int(scores_beam_in))
        seen.setdefault("step0", (int(t), int(base_beam_in), scores_in.shape.as_list(),
                                  scores_base.shape.as_list(), end_flags.shape.as_list()))
        return scores_base + scores_in

    ours = search(searched(adds, explicit_search_sources=["prev:coverage", "coverage"]))
    plain = search(searched())
    for key in ("hyps", "hyp_lengths", "scores", "beam", "beam_lengths", "beam_scores"):
        np.testing.assert_allclose(ours[key], plain[key], rtol=1e-6, err_msg=key)
    # the first call is step 0 (eager: one call a step): RETURNN's beam of one, the sources' beam rows
    assert seen["dim"] == CLASSES and seen["sources"] == ["prev:coverage", "coverage"]
    assert seen["shapes"] == ([3 * 3, 1], [3 * 3, 1]) and seen["beam"] == 3
    assert seen["step0"] == (0, 1, [3, 1, CLASSES], [3, 1, 1], [3, 1])


def test_the_function_sees_the_sources_per_hypothesis_and_its_scores_decide():
    # a minimum length: label 0 (the end) forbidden while the step counter of each hypothesis is below 3;
    # the counter's previous value is the step index on every row
    def min_length(layer, scores_in, scores_base, t, batch_dim, scores_beam_in, base_beam_in, **kwargs):
        steps = layer.explicit_search_sources["count"].output.get_placeholder_as_batch_major()  # (B * K, 1)
        tf.debugging.assert_equal(steps, tf.cast(tf.fill(tf.shape(steps), t), tf.float32))
        early = tf.reshape(steps, [batch_dim, scores_beam_in])[:, :base_beam_in] < 3.0
        forbid = tf.where(early, -1e9, 0.0)[:, :, None] * tf.one_hot(0, CLASSES)
        return scores_base + scores_in + forbid

    def likely_eos(net):
        bias = net.named_variables()["output/output_prob/b"]
        bias.assign(bias + tf.one_hot(0, CLASSES) * 3.0)
        return net

    plain = search(likely_eos(searched(length_normalization=False)))
    assert plain["hyp_lengths"].min() < 3  # without the function some end early
    net = likely_eos(searched(min_length, length_normalization=False,
                              explicit_search_sources={"count": "prev:steps"}))
    found = search(net)
    assert found["hyp_lengths"].min() >= 3 and found["beam_lengths"].min() >= 3
    assert searched_scores_checked(net)  # the picks scored as the model scores them: nothing added


def test_a_function_in_a_compiled_search_gives_what_it_gives_eagerly():
    net = searched(plain_sum, explicit_search_source="coverage")
    data, lengths, _, _ = batch()
    eager = net.search(data, lengths, "decision")
    graph = tf.function(lambda d, n: net.search(d, n, "decision"))(data, lengths)
    for key in eager:
        np.testing.assert_allclose(eager[key].numpy(), graph[key].numpy(), rtol=1e-5)


def reads_the_network(layer, scores_in, scores_base, **kwargs):
    return scores_base + scores_in + layer.network.get_config().float("scale", 1.0)


@pytest.mark.parametrize("choice, message", [
    ({"custom_score_combine": "plain_sum"}, "custom_score_combine must be a function of the config"),
    ({"custom_score_combine": plain_sum, "explicit_search_sources": ["base:encoder"]},
     "explicit_search_sources names 'base:encoder'; here they are layers of the unit"),
    ({"custom_score_combine": plain_sum, "explicit_search_sources": ["nowhere"]},
     "reads 'nowhere', which is not a layer of the unit"),
    ({"custom_score_combine": plain_sum, "explicit_search_sources": ["target_embed"]},
     "cycle within one step: output -> target_embed -> output"),
    ({"explicit_search_sources": "coverage"}, "explicit_search_sources must be a list of layer names"),
    ({"explicit_search_source": "coverage", "explicit_search_sources": ["coverage"]}, "not both"),
    ({"cheating": True}, "choice 'cheating' True (the target kept in the beam) is not implemented"),
])
def test_what_a_choice_cannot_search_with_is_named(choice, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        search(searched(**choice))


@pytest.mark.parametrize("combine, message", [
    (reads_the_network, "custom_score_combine 'reads_the_network': it reads layer.network, which this "
                        "engine's stand-in for RETURNN's object does not provide"),
    (lambda layer, scores_in, scores_base, **kwargs: 0.0,
     "must return a tensor of (batch, base_beam_in, classes) scores"),
])
def test_a_function_that_reads_what_is_not_there_is_named(combine, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        search(searched(combine))
