"""RETURNN's ``eval`` layer (``engine/model/layers/eval.py``) and RETURNN's module names in config code
(``engine/config/returnn_imports.py``): expressions against numpy, RETURNN's layout of ``source(i)``, a
SpecAugment-style config function in training and eval mode, ``global_train_step`` from the train step,
and each refusal's message. Parity with RETURNN itself: the ``eval`` case of
``tests/test_returnn_checkpoints.py``."""
from __future__ import annotations

import os
import re
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.config.returnn_tf_util import safe_log, where_bc
from engine.datasets import Batch
from engine.distributed.local_backend import LocalCommunicator
from engine.distributed.strategy import Strategy
from engine.model import build_model
from engine.model.layers.eval import returnn_time_major
from engine.runtime.errors import ConfigError
from engine.training.step import Steps
from engine.training.update.updater import Updater

pytestmark = pytest.mark.tf_latest

LENGTHS = np.array([7, 5, 2], np.int32)


def data(dim: int = 5, seed: int = 0, lengths: np.ndarray = LENGTHS) -> np.ndarray:
    x = np.random.RandomState(seed).randn(len(lengths), int(max(lengths)), dim).astype(np.float32)
    for b, n in enumerate(lengths):
        x[b, n:] = 0.0  # the engine zeroes the padding of data too
    return x


def model_of(layers: dict, config: Config | None = None, input_dim: int = 5, sparse: bool = False):
    network = {name: {"is_output_layer": True, **opts} for name, opts in layers.items()}  # build every one
    network.setdefault("output", {"class": "copy", "from": list(layers)[-1]})
    if config is None:
        return build_model(network, input_dim=input_dim, input_sparse=sparse, target_dims={"classes": 4})
    config.set("network", network)
    return build_model(config, input_dim=input_dim, input_sparse=sparse, target_dims={"classes": 4})


def run(layers: dict, x: np.ndarray | None = None, **kwargs) -> dict:
    out = model_of(layers)(data() if x is None else x, LENGTHS, **kwargs)
    return {k: v.numpy() for k, v in out.items()}


def test_expressions_against_numpy():
    x = data()
    out = run({"half": {"class": "eval", "eval": "0.5 * source(0)", "from": "data"},
               "sq": {"class": "eval", "eval": "source(0) ** 2", "from": "data"},
               "mix": {"class": "eval", "eval": "tf.tanh(source(0)) * source(1) + k",
                       "eval_locals": {"k": 2.0}, "from": ["half", "sq"], "activation": "relu"},
               "func": {"class": "eval", "from": ["mix", "half"],
                        "eval": lambda source, self, **_: source(0) - source(1)},
               "v1": {"class": "eval", "eval": "tf.to_float(tf.log_sigmoid(source(0)))", "from": "half"}}, x)
    np.testing.assert_allclose(out["half"], 0.5 * x, rtol=1e-6)
    mix = np.maximum(np.tanh(0.5 * x) * x ** 2 + 2.0, 0.0)
    np.testing.assert_allclose(out["mix"], mix, rtol=1e-5)
    np.testing.assert_allclose(out["func"], mix - 0.5 * x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["v1"], -np.log1p(np.exp(-0.5 * x)), rtol=1e-5)  # TF 1's names


def test_sources_come_in_returnns_layout():
    """data is batch-major in RETURNN, an LSTM's output time-major; fixed axes mean what they mean there."""
    x = data()
    out = run({"lstm": {"class": "rec", "unit": "lstm", "n_out": 3, "from": "data"},
               "cum_data": {"class": "eval", "eval": "tf.cumsum(source(0), axis=1)", "from": "data"},
               "cum_lstm": {"class": "eval", "eval": "tf.cumsum(source(0), axis=0)", "from": "lstm"},
               "cum_bm": {"class": "eval", "from": "lstm", "eval": (
                   "tf.transpose(tf.cumsum(source(0, enforce_batch_major=True), axis=1), [1, 0, 2])")},
               "lin": {"class": "linear", "n_out": 3, "from": "lstm"},  # keeps the LSTM's layout
               "axes": {"class": "eval", "from": ["lin", "cum_data"], "out_type": {"shape": (None, 1)},
                        "eval": "tf.zeros_like(source(0)[:, :, :1])"
                                " + 10 * source(0, as_data=True, auto_convert=False).time_dim_axis"
                                " + source(1, as_data=True, auto_convert=False).time_dim_axis"}}, x)
    np.testing.assert_allclose(out["cum_data"], np.cumsum(x, axis=1), atol=1e-5)
    np.testing.assert_allclose(out["cum_lstm"], np.cumsum(out["lstm"], axis=1), atol=1e-5)
    np.testing.assert_allclose(out["cum_bm"], out["cum_lstm"], atol=1e-6)
    # the shape given: RETURNN's default layout (batch-major); lin time-major (0), data batch-major (1)
    assert out["axes"].shape == (3, 7, 1) and np.all(out["axes"] == 1.0)


def test_as_data_describes_the_layout():
    specs = model_of({"lstm": {"class": "rec", "unit": "lstm", "n_out": 3, "from": "data"},
                      "conv": {"class": "conv", "filter_size": (3,), "padding": "same", "n_out": 3,
                               "from": "lstm"},
                      "norm": {"class": "layer_norm", "from": "lstm"},
                      "after_conv": {"class": "copy", "from": "conv"},
                      "output": {"class": "copy", "from": ["norm", "after_conv"]}}).specs
    names = ("data", "lstm", "conv", "norm", "after_conv", "output")
    assert [returnn_time_major(specs, n) for n in names] == [False, True, False, True, False, True]
    lengths = "tf.cast(d.get_sequence_lengths(), tf.float32)"
    out = run({"lstm": {"class": "rec", "unit": "lstm", "n_out": 3, "from": "data"},
               "by_len": {"class": "eval", "from": "lstm", "eval": (
                   f"(lambda d: source(0) * tf.reshape({lengths}, [1, -1, 1]) if d.time_dim_axis == 0 "
                   "and d.batch_dim_axis == 1 and d.feature_dim_axis == 2 and d.dim == 3 and d.is_time_major "
                   "and d.shape == (None, 3) else None)(source(0, as_data=True))")}})
    np.testing.assert_allclose(out["by_len"], out["lstm"] * LENGTHS[:, None, None], rtol=1e-6)


def test_refusals_name_the_layer_and_the_reason():
    def refused(opts: dict, match: str, sources=("data",), **kwargs) -> None:
        layers = {"a": {"class": "linear", "n_out": 5, "from": "data"},
                  "b": {"class": "linear", "n_out": 3, "from": "data"},
                  "ev": {"class": "eval", "from": list(sources), **opts}}
        with pytest.raises(ConfigError, match=match):
            model_of(layers, **kwargs)(data(), LENGTHS)

    refused({"eval": "source(0)", "with_bias": True},
            "'ev': eval option 'with_bias' = True is not supported")
    refused({"eval": "source(0)", "dropout": 0.1}, "'ev': RETURNN's eval layer takes no 'dropout'")
    refused({"eval": "source(0)", "allow_broadcast_all_sources": True}, "broadcasts differing feature dims")
    refused({"eval": "source(0)", "eval_for_output_loss": True}, "no output loss")
    refused({"eval": "source(0)", "n_out": 4}, "n_out 4 differs from the output's dim 5; RETURNN refuses")
    refused({"eval": "source(0)", "out_type": {"dim": 4}}, "out_type dim 4 differs from the sources' dim 5")
    refused({"eval": "source(0)", "out_type": {"dim": 3, "sparse": True}},
            r"an eval of class ids \(out_type sparse\) reads class ids here")
    refused({"eval": "source(0)", "out_type": {"batch_dim_axis": 0}},
            r"out_type keys \['batch_dim_axis'\]")
    refused({"eval": "source(0)", "out_type": {"shape": ()}}, r"out_type shape \(\) is not supported")
    refused({"eval": "source(0)", "out_type": lambda **kw: None}, "a function is refused")
    refused({"eval": "source(0) +"}, "'ev': eval 'source\\(0\\) \\+' is no Python expression")
    refused({"eval": "source(0)"}, "sources have different feature dims \\[5, 3\\]", sources=("a", "b"))
    refused({"eval": "source(0)"}, r"does not use source\(s\) \[1\]; RETURNN requires",
            sources=("a", "a"))
    refused({"eval": "(source(0), 1.0)[1]"}, "returned float, not a tensor")
    refused({"eval": "tf.cast(source(0), tf.int32)"}, "returned int32 values")
    refused({"eval": "source(0)[:, :, :2]"},
            r"returned shape \(3, 7, 2\); the output must be \(batch, time, dim\)")
    refused({"eval": "source(0)[:, :, 0]"}, "returned shape")
    refused({"eval": "source(0) * nope"}, r"'ev': eval 'source\(0\) \* nope' failed: NameError: name 'nope' "
                                          r"is not defined \(names besides tf, source, self and eval_locals: "
                                          "where_bc")
    refused({"eval": "source(0, as_layer=True)"}, "RETURNN's layer objects are not provided")
    refused({"eval": "source(0, as_data=True).dim_tags"}, "RETURNN's Data.dim_tags is not provided")
    refused({"eval": "self.sources[0]"}, "self.sources is not provided to eval expressions")
    refused({"eval": "self.network.get_layer('a')"}, "TFNetwork.get_layer is not provided")
    refused({"eval": "source(0)"}, "'ev': source 'data' is sparse", input_dim=5, sparse=True)


def test_config_errors_point_at_the_config_line(tmp_path):
    path = tmp_path / "c.py"
    path.write_text(textwrap.dedent("""\
        def f(x):
            import tensorflow as tf
            return tf.no_such_op(tf.shape(x))
        """))
    config = Config.from_sources([str(path)], [])
    layers = {"ev": {"class": "eval", "eval": "self.network.get_config().typed_value('f')(source(0))",
                     "from": "data"}}
    with pytest.raises(ConfigError, match=f"'ev': eval .* failed at {re.escape(str(path))} line 3: "
                                          "AttributeError: module 'tensorflow' has no attribute "
                                          "'no_such_op'"):
        model_of(layers, config)(data(), LENGTHS)


def test_config_code_written_for_tensorflow_1_gets_its_api(tmp_path, capsys):
    """RETURNN's 2019-2020 SpecAugment functions import tensorflow and call TF 1's names: they get
    tf.compat.v1, whose tf.where selects rows by a vector condition (TF 2's broadcasts and fails)."""
    from engine.runtime import log

    log.init()
    tf1 = load(tmp_path, """\
        import tensorflow as tf

        def rows(x):
            import tensorflow as tf
            keep = tf.to_float(tf.range(tf.shape(x)[0]) % 2 > 0) > 0.5
            return tf.where(keep, x, tf.zeros_like(x)) + tf.log(tf.ones_like(x))
        """)
    x = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    np.testing.assert_array_equal(tf1.value("rows")(x).numpy(), [[0, 0], [3, 4], [0, 0]])
    assert tf1.value("tf") is tf.compat.v1
    out = capsys.readouterr().out
    assert out.count("calls TensorFlow 1's names (tf.log, tf.to_float): it gets tf.compat.v1") == 1
    (tmp_path / "tf2").mkdir()
    tf2 = load(tmp_path / "tf2", """\
        import tensorflow as tf
        value = tf.where([True, False], [1, 2], [3, 4])
        """)
    assert tf2.value("tf") is tf and tf2.value("value").numpy().tolist() == [1, 4]
    assert "TensorFlow 1" not in capsys.readouterr().out


SPECAUG_CONFIG = '''
from Pretrain import WrapEpochValue  # imported at the top as many setups do, never used
import numpy

def _span_mask(x, batch_axis, axis, max_width):
    """Zero one random span of 1..max_width entries along ``axis`` in each sequence."""
    from returnn.tf.compat import v1 as tf
    from TFUtil import where_bc
    n_batch, size = tf.shape(x)[batch_axis], tf.shape(x)[axis]
    start = tf.random_uniform((n_batch,), 0, size, dtype=tf.int32)
    width = tf.random_uniform((n_batch,), 1, max_width + 1, dtype=tf.int32)
    pos = tf.range(size)[None, :]
    inside = tf.logical_and(pos >= start[:, None], pos < (start + width)[:, None])  # (batch, size)
    if batch_axis > axis:
        inside = tf.transpose(inside)
    shape = [tf.shape(x)[i] if i in (batch_axis, axis) else 1 for i in range(x.get_shape().ndims)]
    return where_bc(tf.reshape(inside, shape), 0.0, x)

def specaug(data, network):
    from returnn.tf.compat import v1 as tf
    x = data.placeholder
    n_spans = tf.where(tf.greater_equal(network.global_train_step, 2), 2, 1)  # more once training is on

    def masked():
        _, y = tf.while_loop(lambda i, _: tf.less(i, n_spans),
                             lambda i, y: (i + 1, _span_mask(y, data.batch_dim_axis, data.time_dim_axis, 3)),
                             (0, x))
        in_features = _span_mask(y, data.batch_dim_axis, data.feature_dim_axis, data.dim // 4)
        even = tf.equal(tf.range(tf.shape(y)[data.batch_dim_axis]) % 2, 0)
        return tf.where(even, in_features, y)  # TF 1's where picks along axis 0: RETURNN's batch axis

    return network.cond_on_train(masked, lambda: x)

network = {
    "specaug": {"class": "eval", "from": "data",
                "eval": "self.network.get_config().typed_value('specaug')(source(0, as_data=True), "
                        "network=self.network)"},
    "lstm": {"class": "rec", "unit": "nativelstm2", "n_out": 4, "from": "specaug"},
    "output": {"class": "softmax", "loss": "ce", "from": "lstm"},
}
optimizer = {"class": "adam"}
learning_rate = 0.01
'''


def runs(mask: np.ndarray) -> int:
    return int(np.sum(mask[1:] & ~mask[:-1]) + mask[0])


def check_specaug(x: np.ndarray, y: np.ndarray, max_spans: int) -> list[int]:
    """``y`` is ``x`` with, per sequence, up to ``max_spans`` spans of 1..3 frames zeroed, and for the even
    sequences one span of 1..2 features over all frames; returns the number of frame spans per sequence."""
    found = []
    for b in range(len(x)):
        zero = y[b] == 0.0
        np.testing.assert_array_equal(y[b][~zero], x[b][~zero])  # the rest unchanged
        frames, features = zero.all(axis=1), zero.all(axis=0)
        assert np.all(zero == (frames[:, None] | features[None, :])), "zeros outside whole frames/features"
        assert 1 <= runs(frames) <= max_spans and frames.sum() <= 3 * max_spans, frames
        if b % 2:
            assert not features.any()
        else:
            assert runs(features) == 1 and 1 <= features.sum() <= 2, features
        found.append(runs(frames))
    return found


def test_specaug_function_in_training_and_eval_mode(tmp_path):
    path = tmp_path / "specaug.py"
    path.write_text(SPECAUG_CONFIG)
    config = Config.from_sources([str(path)], [])
    assert "returnn" not in sys.modules and "TFUtil" not in sys.modules and "Pretrain" not in sys.modules
    model = build_model(config, input_dim=8, input_sparse=False, target_dims={"classes": 4})
    lengths = np.full(6, 12, np.int32)  # full sequences: every masked frame is visible
    x = data(8, seed=3, lengths=lengths)
    call = tf.function(lambda d, n, step: model(d, n, training=True, train_step=step), autograph=False)
    tf.random.set_seed(5)
    masked = {step: call(x, lengths, tf.constant(step, tf.int64))["specaug"].numpy() for step in (0, 1, 2, 9)}
    early = [check_specaug(x, masked[step], 1) for step in (0, 1)]
    late = [check_specaug(x, masked[step], 2) for step in (2, 9)]
    assert max(max(r) for r in late) == 2 and max(max(r) for r in early) == 1
    np.testing.assert_array_equal(model(x, lengths, training=False)["specaug"].numpy(), x)  # eval: unchanged


def test_specaug_config_trains_and_the_step_counts_batches(tmp_path):
    path = tmp_path / "specaug.py"
    path.write_text(SPECAUG_CONFIG)
    seen = tf.Variable(-1, dtype=tf.int64)

    def record(x, network):
        with tf.control_dependencies([seen.assign(network.global_train_step)]):
            return tf.identity(x)

    for accum in (1, 2):
        config = Config.from_sources([str(path)], [])
        config.set("record", record)
        network = dict(config.value("network"))
        network["recorded"] = {"class": "eval", "from": "specaug",
                               "eval": "self.network.get_config().typed_value('record')(source(0), "
                                       "self.network)"}
        network["lstm"] = {"class": "linear", "activation": "tanh", "n_out": 4, "from": "recorded"}  # quicker
        config.set("network", network)
        model = build_model(config, input_dim=8, input_sparse=False, target_dims={"classes": 4})
        updater = Updater.from_config(config, model.named_trainable_variables())
        steps = Steps(model, updater, Strategy(LocalCommunicator()), accum_steps=accum)
        before = [v.numpy().copy() for v in model.trainable_variables]
        rng = np.random.RandomState(0)
        lengths = np.array([12, 9, 5], np.int32)
        batch = Batch(data={"data": data(8, lengths=lengths), "classes": rng.randint(0, 4, (3, 12))},
                      lengths={"data": lengths, "classes": lengths}, seq_tags=["a", "b", "c"],
                      seq_idx=np.arange(3), corpus_seq_idx=np.arange(3),
                      num_frames={"data": 26, "classes": 26})
        for index in range(2 * accum):
            scores = steps.train(batch) if accum == 1 else steps.train_accumulating(batch)[0]
            assert np.all(np.isfinite(scores)) and int(seen.numpy()) == index  # RETURNN counts batches
        assert int(updater.iterations.numpy()) == 2
        assert any(np.any(v.numpy() != b) for v, b in zip(model.trainable_variables, before))
        steps.eval(batch)
        assert int(seen.numpy()) == 2 * accum  # eval: the batches trained so far


def load(tmp_path, text: str) -> Config:
    path = tmp_path / "c.py"
    path.write_text(textwrap.dedent(text))
    return Config.from_sources([str(path)], [])


def test_returnn_module_names_in_config_code(tmp_path, monkeypatch):
    config = load(tmp_path, """\
        import json  # any other module is Python's own import
        import TFUtil
        from TFUtil import DimensionTag  # a time axis that streams of extern_data share
        import returnn.tf.util.basic as tf_util
        from returnn.tf.util.data import Dim
        from Util import cleanup_env_var_path, cf
        cleanup_env_var_path("ENGINE_TEST_PATH", "/opt/old")
        cached = cf("/data/corpus.hdf")  # i6's cache manager: off its cluster, the file itself

        def f(x):
            from returnn.tf.compat import v1 as tf
            from TFUtil import where_bc
            from TFCompat import v1 as tf1
            noise = tf.random_uniform(tf.shape(x), 0.5, 0.6)  # TF 1's names inside a tf.function
            return where_bc(tf.less(x, 0.0), 0.0, x) + tf1.to_float(noise > 1.0) + TFUtil.safe_log(x) * 0

        def unknown():
            from TFUtil import nd_indices

        def dim_tag():
            return DimensionTag(kind=DimensionTag.Types.Spatial, description="time")

        def static_dim_tag():
            return DimensionTag(kind=DimensionTag.Types.Feature, description="feature", dimension=40)

        def dim():
            return Dim(kind=Dim.Types.Spatial, description="time")  # importable; an error only when used

        def dropped(x):
            from TFUtil import dropout  # imported beside SpecAugment (13 published configs; 2 call it)
            return dropout(x, keep_prob=0.5, noise_shape=(None, 1), apply_correction_factor=False)

        def lexicon():
            from LmDataset import Lexicon  # imported at the top, never called
            return Lexicon("lexicon.xml.gz")
        """)
    assert "returnn" not in sys.modules and "TFUtil" not in sys.modules and "TFCompat" not in sys.modules
    assert config.value("cached") == "/data/corpus.hdf"
    x = tf.constant([[-1.0, 2.0], [3.0, -4.0]])
    in_graph = tf.function(config.value("f"), autograph=False)
    np.testing.assert_array_equal(in_graph(x).numpy(), [[0, 2], [3, 0]])
    with pytest.raises(ConfigError, match=r"RETURNN's TFUtil.nd_indices is not provided by this engine. "
                                          r"Config code can import from RETURNN: .*returnn.tf.util.basic "
                                          r"\(TFUtil\): DimensionTag, dropout, get_shape, safe_exp, "
                                          r"safe_log, where_bc"):
        config.value("unknown")()
    tag = config.value("dim_tag")()
    assert (tag.kind, tag.description, tag.dimension) == ("spatial", "time", None)
    with pytest.raises(ConfigError, match=r"dimension=40 is not supported. This engine's DimensionTag stands "
                                          r"for one dynamic time axis"):
        config.value("static_dim_tag")()
    with pytest.raises(ConfigError, match=r"RETURNN's returnn.tf.util.data.Dim \(RETURNN's tensor "
                                          r"descriptions and dim tags; .*\) is not available in this engine"):
        config.value("dim")()
    rows = config.value("dropped")(tf.ones([400, 3])).numpy()
    assert set(np.unique(rows)) <= {0.0, 1.0} and (rows == rows[:, :1]).all()  # one draw per row
    assert 0.4 < rows[:, 0].mean() < 0.6
    with pytest.raises(ConfigError, match=r"RETURNN's LmDataset.Lexicon \(RETURNN's reader of a Bliss "
                                          r"lexicon file .*\) is not available in this engine"):
        config.value("lexicon")()
    assert "returnn" not in sys.modules and "TFUtil" not in sys.modules
    monkeypatch.setenv("ENGINE_TEST_PATH", "/usr/lib:/opt/old:/opt/old/lib:/opt/older")
    load(tmp_path, "from Util import cleanup_env_var_path\n"
                   "cleanup_env_var_path('ENGINE_TEST_PATH', '/opt/old')\n")
    assert sys.modules.get("Util") is None and os.environ["ENGINE_TEST_PATH"] == "/usr/lib:/opt/older"


@pytest.mark.parametrize("line, match", [
    ("from TFNetworkLayer import LayerBase", "RETURNN's module 'TFNetworkLayer' is not provided by this"),
    ("import returnn.tf.layers.basic", "RETURNN's module 'returnn.tf.layers.basic' is not provided"),
    ("from returnn.tf.util.basic import nd_indices", "RETURNN's returnn.tf.util.basic.nd_indices is not"),
])
def test_returnn_names_this_engine_lacks_are_named(tmp_path, line, match):
    with pytest.raises(ConfigError, match=match):
        load(tmp_path, line + "\n")


def test_tf_util_functions():
    cond = tf.constant([True, False])  # (2,) against (2, 3): broadcast at the end, as RETURNN's where_bc does
    np.testing.assert_array_equal(where_bc(cond, tf.ones([2, 3]), 0.0).numpy(), [[1, 1, 1], [0, 0, 0]])
    z = tf.constant([[0.0, -100.0]])
    np.testing.assert_allclose(safe_log(tf.nn.softmax(z)).numpy(), [[0.0, np.log(1e-20)]], rtol=1e-6)
    # in a graph (where training runs) log of a softmax is its log_softmax, also through a transpose
    graph = tf.function(lambda v: safe_log(tf.transpose(tf.nn.softmax(v))), autograph=False)
    np.testing.assert_allclose(graph(z).numpy(), [[0.0], [-100.0]], rtol=1e-6)
    x = tf.constant([0.0, 2.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = safe_log(x)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), [1e20, 0.5], rtol=1e-5)  # the max passes it on


def test_tf_util_dropout_is_returnns():
    """RETURNN's TFUtil.dropout: a mask kept at probability keep_prob (a float or a tensor), divided by it
    with apply_correction_factor, a draw per entry of noise_shape; keep_prob 1 returns x."""
    from engine.config.returnn_tf_util import dropout

    # 400 columns: the kept share of the one-per-column draw lies 8 sd inside its bounds
    x = tf.random.stateless_normal([300, 400], seed=[1, 2]) + 5.0
    np.testing.assert_array_equal(dropout(x, 1.0).numpy(), x.numpy())
    y = dropout(x, tf.constant(0.8)).numpy()
    kept = y != 0
    assert 0.77 < kept.mean() < 0.83
    np.testing.assert_allclose(y[kept], x.numpy()[kept] / 0.8, rtol=1e-6)
    z = dropout(x, 0.3, noise_shape=(1, None), apply_correction_factor=False).numpy()
    assert ((z != 0) == (z != 0)[:1]).all() and 0.1 < (z[0] != 0).mean() < 0.5  # a draw per column
    np.testing.assert_array_equal(z[z != 0], x.numpy()[z != 0])
    with pytest.raises(ConfigError, match=r"cond_on_train=True\) is not available .*network.cond_on_train"):
        dropout(x, 0.5, cond_on_train=True)
    with pytest.raises(ConfigError, match=r"keep_prob must be in \(0, 1\], got 0"):
        dropout(x, 0)
