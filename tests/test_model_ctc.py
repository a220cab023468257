"""The ``ctc`` loss (RETURNN's CtcLoss): its value against a numpy forward algorithm and a brute-force sum
over alignments, the label error (greedy and beam decoding, edit distance), RETURNN's normalisation by
target labels, ``darc1``, ``only_on_eval`` and the errors for bad targets and options."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from engine.model import build_model
from engine.model.losses.data_checks import data_error_from
from engine.model.losses.decoding import collapse_repeated, edit_distance_sum, edit_distances, greedy_labels
from engine.runtime.errors import ConfigError, DataError

pytestmark = pytest.mark.tf_latest


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def ctc_forward(logits, labels):
    """-log p(labels | logits (T, C)) by the CTC forward recursion in log space; blank = C - 1."""
    lp = log_softmax(logits.astype(np.float64))
    blank = lp.shape[1] - 1
    ext = [blank]
    for label in labels:
        ext += [label, blank]
    alpha = np.full(len(ext), -np.inf)
    alpha[0] = lp[0, blank]
    if len(ext) > 1:
        alpha[1] = lp[0, ext[1]]
    for t in range(1, len(lp)):
        new = np.full(len(ext), -np.inf)
        for s in range(len(ext)):
            terms = [alpha[s]] + ([alpha[s - 1]] if s >= 1 else [])
            if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]:
                terms.append(alpha[s - 2])
            new[s] = np.logaddexp.reduce(terms) + lp[t, ext[s]]
        alpha = new
    return -np.logaddexp.reduce(alpha[-2:] if len(ext) > 1 else alpha[-1:])


def collapse(path, blank):
    out = [k for i, k in enumerate(path) if i == 0 or k != path[i - 1]]
    return [k for k in out if k != blank]


def ctc_brute_force(logits, labels):
    """-log of the summed probability of every frame labelling that collapses to ``labels``."""
    lp = log_softmax(logits.astype(np.float64))
    T, C = lp.shape
    total = [sum(lp[t, k] for t, k in enumerate(path)) for path in itertools.product(range(C), repeat=T)
             if collapse(path, C - 1) == list(labels)]
    return -np.logaddexp.reduce(total)


def ctc_network(**softmax_opts):
    return {"output": {"class": "softmax", "loss": "ctc", "from": "data", **softmax_opts}}


def model_for(network, target_dim=3, input_dim=4):
    return build_model(network, input_dim=input_dim, input_sparse=False, target_dims={"classes": target_dim})


def losses(model, x, lengths, targets, target_lengths, training=False):
    outputs = model(tf.constant(x), tf.constant(lengths, tf.int32))
    targets = {"classes": tf.constant(targets, tf.int32)}
    target_lengths = {"classes": tf.constant(target_lengths, tf.int32)}
    return outputs, model.compute_losses(outputs, targets, target_lengths, training=training)


def test_dims_blank_is_the_last_class_and_n_out_must_agree():
    assert model_for(ctc_network()).layers["output"].n_out == 4  # target dim 3 + blank
    assert model_for(ctc_network(n_out=4)).layers["output"].n_out == 4
    with pytest.raises(ConfigError, match=r"'output': n_out 3 does not match the dim 3 of its target "
                                          r"'classes' plus 1 for the ctc loss's blank"):
        model_for(ctc_network(n_out=3))


# targets with repeated labels (0 0, 1 1 1), a single label, an empty target, one-frame sequences
CASES = [([0, 1], 4), ([0, 0], 4), ([2], 1), ([1, 1, 1], 5), ([2, 0, 2], 3), ([], 3), ([1], 4)]


@pytest.mark.parametrize("labels,frames", CASES)
def test_value_equals_numpy_forward_and_brute_force_with_finite_gradients(labels, frames):
    rng = np.random.RandomState(len(labels) * 10 + frames)
    model = model_for(ctc_network())
    x = rng.randn(2, 6, 4).astype("float32")  # sequence 1 is padding for the other sequence's batch
    lengths = [frames, 6]
    targets = np.zeros([2, 4], np.int32)
    targets[0, :len(labels)] = labels
    targets[1, :2] = [2, 1]
    with tf.GradientTape() as tape:
        outputs, result = losses(model, x, lengths, targets, [len(labels), 2])
    logits = outputs["output:logits"].numpy()
    expected = [ctc_forward(logits[0, :frames], labels), ctc_forward(logits[1], [2, 1])]
    if frames <= 5:
        np.testing.assert_allclose(ctc_brute_force(logits[0, :frames], labels), expected[0], rtol=1e-9)
    np.testing.assert_allclose(result.loss.numpy(), sum(expected), rtol=1e-5)
    assert result.num_frames.numpy() == len(labels) + 2  # target labels, not frames
    np.testing.assert_allclose(result.objective.numpy(), sum(expected), rtol=1e-5)  # RETURNN's: the sum
    grads = tape.gradient(result.objective, model.trainable_variables)
    assert all(np.isfinite(g.numpy()).all() for g in grads)


def test_loss_scale_and_subsampled_lengths_from_the_layer():
    rng = np.random.RandomState(3)
    x = rng.randn(1, 5, 4).astype("float32")
    plain = losses(model_for(ctc_network()), x, [5], [[0, 1]], [2])[1]
    scaled = losses(model_for(ctc_network(loss_opts={"scale": 0.5})), x, [5], [[0, 1]], [2])[1]
    np.testing.assert_allclose(scaled.objective.numpy(), 0.5 * plain.objective.numpy(), rtol=1e-6)
    np.testing.assert_allclose(scaled.loss.numpy(), plain.loss.numpy(), rtol=1e-6)  # reported unscaled
    model = model_for(ctc_network())
    outputs = model(tf.constant(x), tf.constant([5]))
    outputs["output:lengths"] = tf.constant([3])  # what a subsampling layer before it would report
    result = model.compute_losses(outputs, {"classes": tf.constant([[0, 1]])}, {"classes": tf.constant([2])})
    expected = ctc_forward(outputs["output:logits"].numpy()[0, :3], [0, 1])
    np.testing.assert_allclose(result.loss.numpy(), expected, rtol=1e-5)


def onehot_logits(path, dim=4):
    """Logits whose best class per frame follows ``path`` (blank = dim - 1)."""
    logits = np.zeros([len(path), dim], np.float32)
    logits[np.arange(len(path)), path] = 5.0
    return logits


def test_greedy_decoding_merges_repeats_then_drops_blanks():
    paths = [[0, 0, 3, 0, 1, 1, 3, 3], [3, 3, 2, 3, 2, 2, 0, 0], [3] * 8, [1, 2, 1, 0, 0, 0, 0, 0]]
    logits = tf.constant(np.stack([onehot_logits(p) for p in paths]))
    labels, lengths = greedy_labels(logits, tf.constant([8, 6, 8, 3]), blank=3)
    assert lengths.numpy().tolist() == [3, 2, 0, 3]
    assert labels.numpy()[0, :3].tolist() == [0, 0, 1]
    assert labels.numpy()[1, :2].tolist() == [2, 2]  # frames 6, 7 are past the length
    assert labels.numpy()[3, :3].tolist() == [1, 2, 1]


def test_edit_distance_and_collapse_against_hand_counts():
    hyp = tf.constant([[0, 1, 2, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    ref = tf.constant([[0, 2, 2, 0], [1, 0, 0, 0], [2, 1, 0, 0]])
    # kitten-style counts: 1 substitution; 1 deletion from the hyp (1 1 vs 1); empty hyp vs 2 labels
    distances = edit_distances(hyp, tf.constant([3, 2, 0]), ref, tf.constant([3, 1, 2]))
    assert distances.numpy().tolist() == [1.0, 1.0, 2.0]
    assert edit_distance_sum(hyp, tf.constant([4, 2, 0]), ref, tf.constant([3, 1, 2])).numpy() == 5.0
    labels, lengths = collapse_repeated(tf.constant([[1, 1, 2, 1, 1], [0, 0, 0, 0, 3]]), tf.constant([5, 4]))
    assert lengths.numpy().tolist() == [3, 1]
    assert labels.numpy()[0, :3].tolist() == [1, 2, 1] and labels.numpy()[1, 0] == 0


def test_label_error_is_the_edit_distance_over_the_target_labels():
    paths = [[0, 3, 1, 1, 3, 2], [2, 2, 3, 2, 3, 3]]  # decode to 0 1 2 and 2 2
    x = np.stack([onehot_logits(p) for p in paths])
    model = model_for({"output": {"class": "softmax", "loss": "ctc", "from": "data",
                                  "loss_opts": {"beam_width": 1}}})
    model.layers["output"].params["W"].assign(np.eye(4, dtype=np.float32))
    model.layers["output"].params["b"].assign(np.zeros(4, np.float32))
    # targets 0 2 (1 insertion in the hyp) and 2 2 1 (1 deletion): 2 errors over 5 labels
    _, result = losses(model, x, [6, 6], [[0, 2, 0], [2, 2, 1]], [2, 3])
    assert result.error.numpy() == 2.0 and result.num_frames.numpy() == 5.0
    # beam search (the default in eval) finds the same best labels here; greedy in training
    model.layers["output"].criterion = type(model.layers["output"].criterion)()
    for training in (False, True):
        _, result = losses(model, x, [6, 6], [[0, 2, 0], [2, 2, 1]], [2, 3], training=training)
        assert result.error.numpy() == 2.0


def test_beam_search_can_differ_from_greedy_as_in_returnn():
    # frame probabilities where the best path is blank blank but label 0 is the most probable labelling
    p = np.array([[0.4, 0.6], [0.4, 0.6]])  # classes: 0, blank; best path: "", p("0") = 0.64 > p("") = 0.36
    x = np.log(p)[None].astype(np.float32)
    model = build_model(ctc_network(), input_dim=2, input_sparse=False, target_dims={"classes": 1})
    model.layers["output"].params["W"].assign(np.eye(2, dtype=np.float32))
    _, eval_result = losses(model, x, [2], [[0]], [1])
    _, train_result = losses(model, x, [2], [[0]], [1], training=True)
    assert eval_result.error.numpy() == 0.0 and train_result.error.numpy() == 1.0


def test_returnn_normalisation_sums_then_divides_by_target_labels():
    rng = np.random.RandomState(5)
    model = model_for(ctc_network())
    x = rng.randn(3, 7, 4).astype("float32")
    targets = np.array([[0, 1, 2], [1, 1, 0], [2, 0, 0]], np.int32)
    whole = losses(model, x, [7, 6, 4], targets, [3, 2, 1])[1]
    parts = [losses(model, x[i:i + 1], [[7, 6, 4][i]], targets[i:i + 1], [[3, 2, 1][i]])[1]
             for i in range(3)]
    np.testing.assert_allclose(whole.loss.numpy(), sum(r.loss.numpy() for r in parts), rtol=1e-5)
    assert whole.num_frames.numpy() == 6.0
    np.testing.assert_allclose(whole.objective.numpy(), whole.loss.numpy(), rtol=1e-6)
    normalized = model_for(ctc_network(loss_opts={"use_normalized_loss": True, "scale": 2.0}))
    for mine, theirs in zip(normalized.variables, model.variables):
        mine.assign(theirs)
    result = losses(normalized, x, [7, 6, 4], targets, [3, 2, 1])[1]
    np.testing.assert_allclose(result.objective.numpy(), 2.0 * whole.loss.numpy() / 6.0, rtol=1e-6)
    np.testing.assert_allclose(result.loss.numpy(), whole.loss.numpy(), rtol=1e-6)


def test_darc1_against_numpy():
    rng = np.random.RandomState(7)
    model = model_for(ctc_network(darc1=0.25))
    x = rng.randn(2, 5, 4).astype("float32")
    x[1, 3:] = 100.0  # padding: must not count
    outputs, result = losses(model, x, [5, 3], [[0, 1], [2, 0]], [2, 1])
    logits = outputs["output:logits"].numpy()
    summed = np.abs(logits[0, :5]).sum(0) + np.abs(logits[1, :3]).sum(0)
    np.testing.assert_allclose(result.data_regularizer.numpy(), 0.25 * summed.max(), rtol=1e-5)
    assert result.regularizer == 0.0


def test_only_on_eval_is_left_out_of_training():
    network = {"aux": {"class": "softmax", "loss": "ctc", "from": "data", "only_on_eval": True},
               "output": {"class": "softmax", "loss": "ce", "from": "data"}}
    model = build_model(network, input_dim=4, input_sparse=False, target_dims={"classes": 3})
    rng = np.random.RandomState(2)
    x = rng.randn(1, 4, 4).astype("float32")
    train = losses(model, x, [4], [[0, 1, 2, 0]], [4], training=True)[1]
    evaluated = losses(model, x, [4], [[0, 1, 2, 0]], [4])[1]
    assert evaluated.objective.numpy() > train.objective.numpy() > 0
    np.testing.assert_allclose(evaluated.loss.numpy(), train.loss.numpy(), rtol=1e-6)  # the main layer's
    with pytest.raises(ConfigError, match="every loss has only_on_eval"):
        build_model(ctc_network(only_on_eval=True), input_dim=4, input_sparse=False,
                    target_dims={"classes": 3})


def test_target_id_outside_the_dim_is_a_data_error():
    model = model_for(ctc_network())
    x = np.zeros([2, 4, 4], np.float32)
    with pytest.raises(DataError, match=r"'output' \(ctc loss\): target 'classes' holds ids outside \[0, 3\)"
                                        r".*batch positions: \[1\] ids: \[3\]"):
        losses(model, x, [4, 4], [[0, 1, 3], [3, 1, 9]], [2, 2])  # the 9 is padding


def test_unalignable_sequences_are_a_data_error_naming_them_or_ignored_on_request():
    x = np.random.RandomState(0).randn(3, 4, 4).astype("float32")
    # 0 1 2 0 0 needs 6 frames (a blank between the two 0), 1 1 1 needs 5; 0 0 fits in 4
    targets = [[0, 1, 2, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]
    lengths = [4, 4, 4]
    with pytest.raises(DataError, match=r"cannot be aligned\. Count: 2 batch positions: \[0, 1\] frames: "
                                        r"\[4, 4\] labels needing frames: \[6, 5\]"):
        losses(model_for(ctc_network()), x, lengths, targets, [5, 3, 2])
    model = model_for(ctc_network(loss_opts={"ctc_opts": {"ignore_longer_outputs_than_inputs": True}}))
    outputs, result = losses(model, x, lengths, targets, [5, 3, 2])
    only = ctc_forward(outputs["output:logits"].numpy()[2], [0, 0])
    np.testing.assert_allclose(result.loss.numpy(), only, rtol=1e-5)
    assert result.num_frames.numpy() == 10.0 and np.isfinite(result.error.numpy())


def test_the_check_inside_a_graph_becomes_the_same_data_error():
    model = model_for(ctc_network())

    @tf.function
    def scores(x, targets, target_lengths):
        outputs = model(x, tf.constant([2]))
        return model.compute_losses(outputs, {"classes": targets}, {"classes": target_lengths}).loss

    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        scores(tf.zeros([1, 2, 4]), tf.constant([[1, 1]]), tf.constant([2]))
    error = data_error_from(caught.value.message)
    assert isinstance(error, DataError)
    assert "Network layer 'output' (ctc loss, target 'classes')" in str(error)
    assert "Count: 1 batch positions: 0 frames: 2 labels needing frames: 3" in str(error)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:  # an id the CTC op itself rejects
        scores(tf.zeros([1, 2, 4]), tf.constant([[3, 1]]), tf.constant([2]))
    assert "target 'classes' holds ids outside [0, 3)" in str(data_error_from(caught.value.message))


def test_options_that_change_the_labels():
    x = np.random.RandomState(4).randn(1, 6, 4).astype("float32")
    targets, length = [[1, 1, 2, 2, 2]], [5]
    collapsed = model_for(ctc_network(loss_opts={"target_collapse_repeated": True}))
    outputs, result = losses(collapsed, x, [6], targets, length)
    np.testing.assert_allclose(result.loss.numpy(), ctc_forward(outputs["output:logits"].numpy()[0], [1, 2]),
                               rtol=1e-5)
    assert result.num_frames.numpy() == 5.0  # RETURNN normalises by the targets as given
    clipped = model_for(ctc_network(loss_opts={"auto_clip_target_len": True}))
    outputs, result = losses(clipped, x[:, :3], [3], [[0, 1, 2, 0]], [4])  # clipped to 2 labels
    np.testing.assert_allclose(result.loss.numpy(), ctc_forward(outputs["output:logits"].numpy()[0], [0, 1]),
                               rtol=1e-5)


@pytest.mark.parametrize("loss_opts,message", [
    ({"use_viterbi": True}, "use_viterbi=True is not supported for the 'ctc' loss: training on the best"),
    ({"use_native": True}, "use_native=True needs beam_width 1"),
    ({"use_native": True, "beam_width": 1, "ctc_opts": {"ignore_longer_outputs_than_inputs": True}},
     "RETURNN's native CTC op takes only ctc_merge_repeated"),
    ({"output_in_log_space": True}, "a softmax layer's output is probabilities"),
    ({"focal_loss_factor": 2.0},
     r"loss_opts \['focal_loss_factor'\] are not options of RETURNN's 'ctc' loss"),
    ({"ctc_opts": {"time_major": True}}, r"ctc_opts \['time_major'\] are not supported"),
    ({"ctc_opts": {"ctc_merge_repeated": 1}}, "ctc_opts ctc_merge_repeated must be True or False"),
    ({"beam_width": -1}, "beam_width must be an int >= 0"),
    ({"use_normalized_loss": 1}, "use_normalized_loss must be True or False"),
])
def test_unknown_or_unsupported_loss_opts_are_refused(loss_opts, message):
    with pytest.raises(ConfigError, match=message):
        model_for(ctc_network(loss_opts=loss_opts))


def test_ctc_merge_repeated_false_and_preprocess_collapse_are_passed_to_the_op():
    x = np.random.RandomState(6).randn(1, 5, 4).astype("float32")
    plain = model_for(ctc_network())
    merged = model_for(ctc_network(loss_opts={"ctc_opts": {"preprocess_collapse_repeated": True}}))
    out, a = losses(plain, x, [5], [[1, 2]], [2])
    _, b = losses(merged, x, [5], [[1, 1, 2]], [3])
    np.testing.assert_allclose(b.loss.numpy(), a.loss.numpy(), rtol=1e-6)
    no_merge = model_for(ctc_network(loss_opts={"ctc_opts": {"ctc_merge_repeated": False}}))
    _, c = losses(no_merge, x, [5], [[1, 2]], [2])
    assert np.isfinite(c.loss.numpy()) and c.loss.numpy() != a.loss.numpy()


def edit_distance_network(**loss_opts):
    return {"ctc": {"class": "softmax", "loss": "ctc", "from": "data"},
            "output": {"class": "copy", "from": "ctc", "loss": "edit_distance", "only_on_eval": True,
                       "loss_opts": {"ctc_decode": True, **loss_opts}}}


def test_layers_after_a_softmax_see_its_probabilities():
    model = model_for({"sm": {"class": "softmax", "n_out": 4, "from": "data"},
                       "output": {"class": "copy", "from": "sm"}})
    outputs = model(tf.constant(np.random.RandomState(0).randn(1, 3, 4).astype("float32")), tf.constant([3]))
    np.testing.assert_allclose(outputs["output"].numpy().sum(-1), 1.0, rtol=1e-6)
    assert outputs["output:lengths"].numpy().tolist() == [3]


def test_edit_distance_decodes_the_copied_ctc_output_and_maps_labels():
    paths = [[0, 3, 1, 1, 3, 2], [2, 2, 3, 2, 3, 3]]  # decode to 0 1 2 and 2 2
    x = np.stack([onehot_logits(p) for p in paths]) * 2.0
    model = model_for(edit_distance_network())
    model.layers["ctc"].params["W"].assign(np.eye(4, dtype=np.float32))
    targets, target_lengths = [[0, 2, 0], [2, 2, 1]], [2, 3]  # 1 insertion, 1 deletion
    _, result = losses(model, x, [6, 6], targets, target_lengths)
    assert result.error.numpy() == 2.0 and result.num_frames.numpy() == 5.0
    assert result.loss.numpy() > 0  # the ctc layer's loss; edit_distance adds nothing
    _, trained = losses(model, x, [6, 6], targets, target_lengths, training=True)
    assert trained.error.numpy() == 2.0  # in training the main layer is 'ctc' (greedy: the same labels)
    np.testing.assert_allclose(trained.loss.numpy(), result.loss.numpy(), rtol=1e-6)
    # label_map 1 -> 2: the hyp 0 2 2 against 0 2 is 1 error, 2 2 against 2 2 2 is 1 error
    mapped = model_for(edit_distance_network(label_map={1: 2}))
    mapped.layers["ctc"].params["W"].assign(np.eye(4, dtype=np.float32))
    _, result = losses(mapped, x, [6, 6], targets, target_lengths)
    assert result.error.numpy() == 2.0
    _, result = losses(mapped, x, [6, 6], [[0, 1, 1], [2, 2, 0]], [3, 2])  # 0 2 2 vs 0 2 2; 2 2 vs 2 2
    assert result.error.numpy() == 0.0


@pytest.mark.parametrize("loss_opts,message", [
    ({"ctc_decode": False}, "needs loss_opts ctc_decode True here"),
    ({"ctc_decode": True, "label_map": {1: "a"}}, "label_map must be a dict of label id -> label id"),
    ({"ctc_decode": True, "beam_width": 4}, r"loss_opts \['beam_width'\] are not supported for the "
                                            r"'edit_distance' loss"),
])
def test_edit_distance_options_are_checked(loss_opts, message):
    network = edit_distance_network()
    network["output"]["loss_opts"] = loss_opts
    with pytest.raises(ConfigError, match=message):
        model_for(network)
    with pytest.raises(ConfigError, match=r"input dim, but it is 3"):
        model_for({"output": {"class": "copy", "loss": "edit_distance", "loss_opts": {"ctc_decode": True}},
                   "x": {"class": "softmax", "loss": "ce", "from": "data"}}, input_dim=3)
