"""The cases of ``returnn_checkpoints.py``: each a ``network`` dict and its streams, run by RETURNN and by
the engine on fixed inputs (3 sequences of ``LENGTHS`` frames), and the cases whose gradients RETURNN
gets wrong."""
from __future__ import annotations

DENSE = {"data": {"dim": 5}, "classes": {"dim": 4, "sparse": True}}
SPARSE = {"data": {"dim": 7, "sparse": True}, "classes": {"dim": 4, "sparse": True}}
LENGTHS = [7, 5, 2]
UNITS = ("LSTM", "lstmp", "NativeLstm2", "NativeLstm", "NativeLstmLowMem", "VanillaLSTM", "StandardLSTM",
         "BasicLSTM", "LSTMBlock", "LSTMBlockFused", "CudnnLSTM")


def _rec_case(unit: str) -> dict:
    return {"extern_data": DENSE, "network": {
        "fw": {"class": "rec", "unit": unit, "n_out": 3, "from": "data"},
        "bw": {"class": "rec", "unit": unit, "n_out": 3, "direction": -1, "from": "data"},
        "output": {"class": "softmax", "loss": "ce", "from": ["fw", "bw"]}}}


CASES: dict[str, dict] = {
    "dense": {"extern_data": DENSE, "network": {
        "hidden": {"class": "linear", "activation": "tanh", "n_out": 6, "from": "data"},
        "output": {"class": "softmax", "loss": "ce", "from": "hidden"}}},
    "embedding": {"extern_data": SPARSE, "network": {
        "embed": {"class": "linear", "n_out": 4, "from": "data"},
        "output": {"class": "softmax", "loss": "ce", "from": "embed"}}},
    "transposed_weights": {"extern_data": SPARSE, "network": {  # W as (n_out, n_in): RETURNN's LM setups
        "embed": {"class": "linear", "n_out": 4, "use_transposed_weights": True, "from": "data"},
        "hidden": {"class": "linear", "activation": "tanh", "n_out": 5, "use_transposed_weights": True,
                   "from": "embed"},
        "output": {"class": "softmax", "loss": "ce", "use_transposed_weights": True, "from": "hidden"}}},
    **{f"rec_{unit}": _rec_case(unit) for unit in UNITS},
    # 2022-swb-conformer-hybrid-sat's i-vector path: an utterance's average (and max) over time as one frame,
    # a score per frame by dot with it, and its projection weighted by that score (dot with one frame)
    "ivector_dot": {"extern_data": DENSE, "network": {
        "frames": {"class": "linear", "activation": "tanh", "n_out": 4, "from": "data"},
        "ivec_avg": {"class": "reduce", "mode": "avg", "axis": "T", "keep_dims": True, "from": "data"},
        "ivec_max": {"class": "reduce", "mode": "max", "axes": ["T"], "keep_dims": True, "from": "data"},
        "ivec_ff": {"class": "linear", "activation": None, "n_out": 4, "from": "ivec_avg"},
        "ivec_norm": {"class": "eval", "eval": "tf.math.l2_normalize(source(0), axis=2)", "from": "ivec_ff"},
        "score": {"class": "dot", "red1": 2, "red2": 2, "var1": 1, "var2": 1,
                  "from": ["frames", "ivec_norm"]},
        "score_bm": {"class": "reinterpret_data", "enforce_batch_major": True, "set_axes": {"F": 2, "T": 1},
                     "from": "score"},
        "weight": {"class": "activation", "activation": "sigmoid", "from": "score_bm"},
        "bias": {"class": "linear", "activation": None, "n_out": 4, "from": ["ivec_norm", "ivec_max"]},
        "weighted": {"class": "dot", "red1": 2, "red2": 1, "var1": 1, "var2": 2, "from": ["weight", "bias"]},
        "added": {"class": "eval", "eval": "source(0) + source(1)", "from": ["frames", "weighted"]},
        "output": {"class": "softmax", "loss": "ce", "from": "added"}}},
    # reinterpret_data naming the axes its input has (2022-swb-conformer-hybrid-sat's i-vector paths)
    "reinterpret_axes": {"extern_data": DENSE, "network": {
        "hidden": {"class": "linear", "activation": "tanh", "n_out": 6, "from": "data"},
        "same": {"class": "reinterpret_data", "enforce_batch_major": True, "set_axes": {"F": 2, "T": 1},
                 "from": "hidden"},
        "copied": {"class": "reinterpret_data", "from": "same"},
        "output": {"class": "softmax", "loss": "ce", "from": "copied"}}},
    # NativeLstm2's unit_opts (2022-scale-learning's encoders): the weight dropout acts in training only
    "rec_weight_dropout": {"extern_data": DENSE, "network": {
        "fw": {"class": "rec", "unit": "nativelstm2", "n_out": 3, "from": "data",
               "unit_opts": {"rec_weight_dropout": 0.1}},
        "bw": {"class": "rec", "unit": "LSTMBlock", "n_out": 3, "direction": -1, "from": "data",
               "unit_opts": {"rec_weight_dropout": 0.3, "rec_weight_dropout_shape": (None, 1),
                             "forget_bias": 0.0}},
        "output": {"class": "softmax", "loss": "ce", "from": ["fw", "bw"]}}},
    "conv_attention": {"extern_data": DENSE, "network": {
        "conv": {"class": "conv", "filter_size": (3,), "padding": "same", "n_out": 6, "activation": "relu",
                 "with_bias": True, "from": "data"},
        "norm": {"class": "layer_norm", "from": "conv"},
        "att": {"class": "self_attention", "num_heads": 2, "total_key_dim": 4, "n_out": 6, "from": "norm"},
        "sum": {"class": "combine", "kind": "add", "with_bias": True, "from": ["att", "norm"]},
        "output": {"class": "softmax", "loss": "ce", "from": "sum"}}},
    "gating": {"extern_data": DENSE, "network": {
        "hidden": {"class": "linear", "activation": None, "n_out": 6, "from": "data"},
        "glu": {"class": "gating", "activation": "identity", "from": "hidden"},
        "left": {"class": "linear", "activation": None, "n_out": 3, "from": "data"},
        "tanh_gate": {"class": "gating", "activation": "tanh", "gate_activation": "relu",
                      "from": ["left", "glu"]},
        "output": {"class": "softmax", "loss": "ce", "from": "tanh_gate"}}},
    "features": {"extern_data": DENSE, "network": {
        "hidden": {"class": "linear", "activation": None, "n_out": 12, "from": "data"},
        "maxout": {"class": "reduce_out", "mode": "max", "num_pieces": 2, "from": "hidden"},
        "mean3": {"class": "reduce_out", "mode": "mean", "num_pieces": 3, "from": "hidden"},
        "head": {"class": "slice", "axis": "F", "slice_start": 0, "slice_end": 4, "from": "data"},
        "odd": {"class": "slice", "axis": "F", "slice_start": 1, "slice_step": 2, "from": "maxout"},
        "tail": {"class": "slice", "axis": "F", "slice_end": -1, "from": "mean3"},
        "output": {"class": "softmax", "loss": "ce", "from": ["head", "odd", "tail"]}}},
    "rel_pos_attention": {"extern_data": DENSE, "network": {  # a Conformer's self-attention, tiny
        "hidden": {"class": "linear", "activation": None, "n_out": 8, "from": "data"},
        "rel3": {"class": "relative_positional_encoding", "n_out": 4, "clipping": 3, "from": "hidden"},
        "rel": {"class": "relative_positional_encoding", "n_out": 4, "from": "hidden"},
        "rel_fixed": {"class": "relative_positional_encoding", "n_out": 5, "clipping": 2, "fixed": True,
                      "from": "hidden"},
        "att": {"class": "self_attention", "num_heads": 2, "total_key_dim": 8, "n_out": 8,
                "key_shift": "rel3", "from": "hidden"},
        "att_left": {"class": "self_attention", "num_heads": 2, "total_key_dim": 8, "n_out": 6,
                     "key_shift": "rel", "attention_left_only": True, "from": "hidden"},
        "att_fixed": {"class": "self_attention", "num_heads": 1, "total_key_dim": 5, "n_out": 4,
                      "key_shift": "rel_fixed", "from": "data"},
        "output": {"class": "softmax", "loss": "ce", "from": ["att", "att_left", "att_fixed"]}}},
    # a VGG-like front end: time windows over padding read the data's zeros only (RETURNN reads whatever
    # padding a layer's output has; the engine zeros), and a time stride whose "same" padding is TF's at T=7
    "conv2d": {"extern_data": DENSE, "network": {
        "split": {"class": "split_dims", "axis": "F", "dims": (-1, 1), "from": "data"},
        "c1": {"class": "conv", "filter_size": (2, 3), "padding": "same", "strides": (2, 1), "n_out": 3,
               "from": "split"},
        "act": {"class": "activation", "activation": "swish", "from": "c1"},
        "p1": {"class": "pool", "mode": "max", "pool_size": (1, 2), "padding": "same", "from": "act"},
        "c2": {"class": "conv", "filter_size": (1, 2), "padding": "valid", "n_out": 4,
               "from": "c1"},
        "depthwise": {"class": "conv", "filter_size": (1, 3), "padding": "same", "groups": 3, "n_out": 6,
                      "from": "p1"},
        "avg": {"class": "pool", "mode": "avg", "pool_size": (1, 2), "strides": (1, 1), "from": "depthwise"},
        "merged": {"class": "merge_dims", "axes": "static", "from": "p1"},
        "merged2": {"class": "merge_dims", "axes": "except_time", "from": "c2"},
        "merged3": {"class": "merge_dims", "axes": "static", "from": "avg"},
        "output": {"class": "softmax", "loss": "ctc", "from": ["merged", "merged2", "merged3"]}}},
    "conv2d_added_axis": {"extern_data": DENSE, "network": {
        "added": {"class": "conv", "filter_size": (2, 2), "strides": (2, 1), "padding": "same",
                  "input_add_feature_dim": True, "n_out": 2, "from": "data"},
        "avg": {"class": "pool", "mode": "avg", "pool_size": (1, 2), "padding": "same", "from": "added"},
        "merged": {"class": "merge_dims", "axes": "static", "from": "avg"},
        "output": {"class": "softmax", "loss": "ctc", "from": "merged"}}},
    "split_merge": {"extern_data": DENSE, "network": {
        "hidden": {"class": "linear", "activation": None, "n_out": 6, "from": "data"},
        "heads": {"class": "split_dims", "axis": "F", "dims": (2, -1), "from": "hidden"},
        "per_head": {"class": "linear", "activation": "tanh", "n_out": 4, "from": "heads"},
        "swapped": {"class": "merge_dims", "axes": ["f", "s:1"], "keep_order": True, "from": "per_head"},
        "sorted": {"class": "merge_dims", "axes": ["f", "s:1"], "from": "per_head"},
        "depthwise": {"class": "conv", "filter_size": (3,), "padding": "same", "groups": 5, "n_out": 10,
                      "from": "data"},
        "output": {"class": "softmax", "loss": "ce", "from": ["swapped", "sorted", "depthwise"]}}},
    # eval: RETURNN's defaults (behavior_version 0) use the running statistics moved towards the batch's, by
    # momentum 0.99; param_version 1 and 2 name and shape their parameters otherwise
    "batch_norm": {"extern_data": DENSE, "network": {
        "hidden": {"class": "linear", "activation": None, "n_out": 6, "from": "data"},
        "bn": {"class": "batch_norm", "from": "hidden"},
        "bn_v2": {"class": "batch_norm", "param_version": 2, "momentum": 0.1, "epsilon": 1e-5,
                  "update_sample_only_in_training": True, "delay_sample_update": True, "masked_time": True,
                  "from": "data"},
        "bn_mixed": {"class": "batch_norm", "param_version": 1, "force_sample": True, "use_sample": 0.25,
                     "use_shift": False, "from": "hidden"},
        "bn_delayed": {"class": "batch_norm", "delay_sample_update": True, "use_std": False, "from": "data"},
        "output": {"class": "softmax", "loss": "ce", "from": ["bn", "bn_v2", "bn_mixed", "bn_delayed"]}}},
    # eval: source(i) comes in RETURNN's layout (data batch-major, an LSTM's output time-major), so fixed
    # axes mean what they mean in RETURNN; as_data names the axes; safe_log of a softmax
    "eval": {"extern_data": DENSE, "network": {
        "hidden": {"class": "linear", "activation": None, "n_out": 6, "from": "data"},
        "half": {"class": "eval", "eval": "0.5 * source(0)", "from": "hidden"},
        "gate": {"class": "linear", "activation": None, "n_out": 6, "from": "data"},
        "mul": {"class": "eval", "eval": "tf.tanh(source(0)) * source(1)", "from": ["half", "gate"]},
        "lstm": {"class": "rec", "unit": "nativelstm2", "n_out": 6, "from": "data"},
        "cum_time": {"class": "eval", "eval": "tf.cumsum(source(0), axis=0)", "from": "lstm"},
        "cum_data": {"class": "eval", "eval": "tf.cumsum(source(0, enforce_batch_major=True), axis=1)",
                     "from": "data"},
        "by_length": {"class": "eval", "from": "lstm", "eval": (
            "source(0) * tf.expand_dims(tf.expand_dims(tf.cast(source(0, as_data=True)"
            ".get_sequence_lengths(), tf.float32), source(0, as_data=True).time_dim_axis),"
            " source(0, as_data=True).feature_dim_axis)")},
        "centered": {"class": "eval", "from": "mul", "eval": (
            "source(0) - tf.reduce_mean(source(0), axis=source(0, as_data=True).feature_dim_axis,"
            " keepdims=True)")},
        "probs": {"class": "softmax", "n_out": 5, "from": "hidden"},
        "log_probs": {"class": "eval", "eval": "safe_log(source(0))", "from": "probs"},
        "output": {"class": "softmax", "loss": "ce",
                   "from": ["mul", "cum_time", "cum_data", "by_length", "centered", "log_probs"]}}},
    # a Conformer hybrid's output: down by a strided conv (whose "same" padding is TF's at T=7), up by a
    # transposed conv, cut to the targets' frames; two layers share the transposed conv's parameters
    "transposed_conv": {"extern_data": DENSE, "network": {
        "down": {"class": "conv", "filter_size": (2,), "strides": 2, "padding": "same", "n_out": 6,
                 "with_bias": True, "from": "data"},
        "up": {"class": "transposed_conv", "filter_size": [3], "strides": [3], "n_out": 5,
               "activation": "tanh", "from": "down"},
        "up_shared": {"class": "transposed_conv", "filter_size": [3], "strides": [3], "n_out": 5,
                      "reuse_params": "up", "from": "down"},
        "aligned": {"class": "reinterpret_data", "size_base": "data:classes", "from": "up"},
        "aligned_shared": {"class": "reinterpret_data", "size_base": "data:classes", "from": "up_shared"},
        "output": {"class": "softmax", "loss": "ce", "from": ["aligned", "aligned_shared"]}}},
    "transposed_conv_valid": {"extern_data": DENSE, "network": {
        "wide": {"class": "transposed_conv", "filter_size": [4], "strides": [2], "padding": "valid",
                 "remove_padding": 1, "n_out": 3, "with_bias": False, "from": "data"},
        "output": {"class": "softmax", "loss": "ctc", "from": "wide"}}},
}
# RETURNN's LayerNormVariantsLSTMCell with the unit_opts of the published configs (2019-asr-layer-norm-lstm:
# global norm (the default), global norm joined, per-gate norm, each with and without cell norm), as
# bidirectional pairs; lnlstm_pgn adds a layer with the options no published config sets (its dropouts
# have no effect in eval)
_LN_OPTS = {"gn": {}, "gnj": {"global_norm": False, "global_norm_joined": True, "cell_norm": False},
            "pgn": {"global_norm": False, "per_gate_norm": True}}
for _name, _opts in _LN_OPTS.items():
    _layer = {"class": "rec", "unit": "layernormvariantslstm", "unit_opts": _opts, "n_out": 4, "dropout": 0.1,
              "L2": 0.01, "from": "data"}
    CASES[f"lnlstm_{_name}"] = {"extern_data": DENSE, "network": {
        "fw": {**_layer, "direction": 1}, "bw": {**_layer, "direction": -1},
        "output": {"class": "softmax", "loss": "ce", "from": ["fw", "bw"]}}}
CASES["lnlstm_pgn"]["network"]["concat"] = {
    "class": "rec", "unit": "LayerNormVariantsLSTM", "n_out": 3, "direction": -1, "from": ["fw", "bw"],
    "unit_opts": {"global_norm": False, "with_concat": True, "hidden_norm": True,
                  "cell_norm_in_output": False, "forget_bias": 1.0, "norm_gain": 0.5, "norm_shift": 0.1,
                  "variance_epsilon": 1e-3, "dropout": 0.2, "dropout_h": 0.3}}
CASES["lnlstm_pgn"]["network"]["output"]["from"] = ["fw", "bw", "concat"]
# window, pad and swap_axes with the options of the published configs (2016-ctc-paper, 2020-rnn-transducer,
# 2021-tts-asr-librispeech100h, 2022-approx-recombination, 2019-asr-resnet-lace-cnn) and the rest they take;
# windows read the padding of their input, zero here (data, a linear layer without bias), as in the engine
_OUT = {"is_output_layer": True}
CASES.update({
    "window": {"extern_data": DENSE, "network": {
        "w17": {"class": "window", "window_size": 3, "trainable": False, "from": "data"},
        "ff_in": {"class": "merge_dims", "axes": "except_time", "from": "w17"},
        "lm": {"class": "linear", "activation": "tanh", "n_out": 6, "with_bias": False, "from": "data"},
        "left": {"class": "window", "window_left": 4, "window_size": 5, "from": "lm"},
        "concat": {"class": "merge_dims", "axes": "static", "from": "left"},
        "split": {"class": "split_dims", "axis": "F", "dims": (-1, 1), "from": "data"},
        "even": {"class": "window", "window_size": 2, "axis": "T", "from": "split"},
        "flat": {"class": "merge_dims", "axes": "static", "from": "even"},
        "output": {"class": "softmax", "loss": "ce", "from": ["ff_in", "concat", "flat"]}}},
    "window_stride": {"extern_data": DENSE, "network": {
        "stacked": {"class": "window", "stride": 3, "window_right": 2, "window_size": 3, "from": "data"},
        "merged": {"class": "merge_dims", "axes": "static", "from": "stacked"},
        "valid": {"class": "window", "window_size": 3, "padding": "valid", **_OUT, "from": "data"},
        "valid_stride": {"class": "window", "window_size": 2, "padding": "valid", "stride": 2, **_OUT,
                         "from": "data"},
        "centred": {"class": "window", "window_size": 4, "stride": 2, **_OUT, "from": "data"},
        "output": {"class": "softmax", "loss": "ctc", "from": "merged"}}},
    "pad_time": {"extern_data": DENSE, "network": {
        "prefix": {"class": "pad", "axes": "T", "mode": "constant", "padding": (1, 0), "value": 0,
                   "from": "data"},
        "both": {"class": "pad", "axes": "t", "padding": (2, 1), "value": -0.5, "handle_dynamic_dims": True,
                 "from": "prefix"},
        "output": {"class": "softmax", "loss": "ctc", "from": "both"}}},
    "pad_swap": {"extern_data": DENSE, "network": {
        "split": {"class": "split_dims", "axis": "F", "dims": (-1, 1), "from": "data"},
        "padded": {"class": "pad", "axes": ("s:0", "s:1"), "padding": [(0, 0), (2, 2)], "from": "split"},
        "conv": {"class": "conv", "filter_size": (1, 3), "padding": "valid", "n_out": 2, "from": "padded"},
        "merged": {"class": "merge_dims", "axes": "static", "from": "conv"},
        "hidden": {"class": "linear", "activation": None, "n_out": 6, "from": "data"},
        "heads": {"class": "split_dims", "axis": "F", "dims": (2, 3), "from": "hidden"},
        "swapped": {"class": "swap_axes", "axis1": "s:1", "axis2": "f", "from": "heads"},
        "reflect": {"class": "pad", "axes": "F", "padding": (1, 0), "mode": "REFLECT", "from": "swapped"},
        "symmetric": {"class": "pad", "axes": ["s:1"], "padding": 2, "mode": "symmetric", "value": 3,
                      "from": "reflect"},
        "edge": {"class": "pad", "axes": "F", "padding": (0, 2), "mode": "replication", "from": "symmetric"},
        "valued": {"class": "pad", "axes": ["F", "s:1"], "padding": 1, "value": 0.25, "from": "edge"},
        "flat": {"class": "merge_dims", "axes": "static", "from": "valued"},
        "output": {"class": "softmax", "loss": "ce", "from": ["merged", "flat"]}}},
    # 2019-asr-resnet-lace-cnn's frequency average after its 2-D convolutions, and the other modes
    "reduce_static": {"extern_data": DENSE, "network": {
        "hidden": {"class": "linear", "activation": "tanh", "n_out": 6, "from": "data"},
        "freq": {"class": "split_dims", "axis": "F", "dims": (3, 2), "from": "hidden"},
        "avg": {"class": "reduce", "mode": "avg", "axes": "s:1", "keep_dims": False, "from": "freq"},
        "max": {"class": "reduce", "mode": "max", "axes": ["s:1"], "keep_dims": True, "from": "freq"},
        "max_flat": {"class": "merge_dims", "axes": "static", "from": "max"},
        "sum": {"class": "reduce", "mode": "sum", "axis": "spatial_except_time", "from": "freq"},
        "lse": {"class": "reduce", "mode": "logsumexp", "axes": "s:1", "use_time_mask": False, **_OUT,
                "from": "freq"},
        "output": {"class": "softmax", "loss": "ce", "from": ["avg", "max_flat", "sum"]}}},
})
# a unit's own variable, a rec layer's LSTM step, LSTM states (get_last_hidden_state of prev:s and s, keys
# '*' and 'c'), a
# reduce over the features and reinterpret_data, as 2019-asr-local-attention, 2019-asr-e2e-trafo-vs-lstm and
# 2022-scale-learning use them in their decoders, here in a loop over the input frames
CASES["unit_state"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "loop": {"class": "rec", "from": "data", "unit": {
        "s": {"class": "rnn_cell", "unit": "LSTMBlock", "from": ["data:source", "prev:s_proj"], "n_out": 3},
        "prev_state": {"class": "get_last_hidden_state", "from": "prev:s", "n_out": 6},
        "state": {"class": "get_last_hidden_state", "from": "s", "n_out": 3, "key": "c"},
        "scale": {"class": "variable", "shape": [3],
                  "init": "random_normal_initializer(mean=1.0, stddev=0.5)"},
        "lstm": {"class": "rec", "unit": "nativelstm2", "from": ["data:source", "prev:s_proj"], "n_out": 2},
        "s_proj": {"class": "linear", "activation": "tanh",
                   "from": ["prev_state", "state", "prev:energy_bm", "lstm"], "n_out": 3},
        "energy": {"class": "reduce", "axes": "f", "mode": "sum", "keep_dims": True, "from": "s_proj"},
        "energy_bm": {"class": "reinterpret_data", "enforce_batch_major": True, "from": "energy"},
        "output": {"class": "combine", "kind": "mul", "from": ["s_proj", "scale"]}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# rnn_cell ZoneoutLSTM (2021-internal-lm-attention's and 2022-scale-learning's decoders), its output and its
# zoned state, with RETURNN's default output (the LSTM's own) and with use_zoneout_output
CASES["unit_zoneout"] = {"extern_data": DENSE, "network": {
    "loop": {"class": "rec", "from": "data", "unit": {
        "s": {"class": "rnn_cell", "unit": "ZoneoutLSTM", "from": ["data:source", "prev:s2"], "n_out": 3,
              "unit_opts": {"zoneout_factor_cell": 0.15, "zoneout_factor_output": 0.05}},
        "state": {"class": "get_last_hidden_state", "from": "prev:s", "n_out": 6},
        "s2": {"class": "rnn_cell", "unit": "zoneoutlstm", "from": ["s", "state"], "n_out": 2,
               "unit_opts": {"zoneout_factor_cell": 0.3, "zoneout_factor_output": 0.4,
                             "use_zoneout_output": True}},
        "output": {"class": "linear", "activation": None, "from": ["s", "s2"], "n_out": 4}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# rnn_cell layernormvariantslstm in a decoder's recurrence (2019-asr-layer-norm-lstm's attention setups, their
# unit_opts: global_norm_joined without cell_norm, per_gate_norm, the defaults); no dropout, so RETURNN's
# loop runs with train_flag and both sides' gradients are compared
CASES["unit_lnlstm"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "loop": {"class": "rec", "from": "data", "unit": {
        "s": {"class": "rnn_cell", "unit": "layernormvariantslstm", "from": ["data:source", "prev:s3"],
              "n_out": 3,
              "unit_opts": {"global_norm": False, "global_norm_joined": True, "cell_norm": False}},
        "s2": {"class": "rnn_cell", "unit": "LayerNormVariantsLSTM", "from": ["s"], "n_out": 2,
               "unit_opts": {"global_norm": False, "per_gate_norm": True, "forget_bias": 1.0}},
        "state": {"class": "get_last_hidden_state", "from": "prev:s2", "n_out": 4},
        "s3": {"class": "rnn_cell", "unit": "layernormvariantslstm", "from": ["s2", "state"], "n_out": 2,
               "unit_opts": {"hidden_norm": True, "with_concat": True, "global_norm": False}},
        "output": {"class": "linear", "activation": None, "from": ["s", "s3"], "n_out": 4}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# a subnetwork inside a rec unit (the LM of shallow fusion in 2020-lm-integration, 2022-scale-learning):
# 'data' its input, a layer without 'from' reading it, 'base:' the unit around it, 'prev:' its own layers,
# an LSTMBlock rnn_cell with unit_opts forget_bias 0 (the published LMs'), transposed output weights
CASES["unit_subnetwork"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "loop": {"class": "rec", "from": "data", "unit": {
        "am": {"class": "linear", "activation": "tanh", "from": "data:source", "n_out": 3},
        "lm": {"class": "subnetwork", "from": ["prev:output", "data:source"], "n_out": 4, "subnetwork": {
            "input": {"class": "linear", "activation": "identity", "n_out": 3},
            "lstm0": {"class": "rnn_cell", "unit": "LSTMBlock", "n_out": 2, "unit_opts": {"forget_bias": 0.0},
                      "from": ["input", "base:am"]},
            "mix": {"class": "combine", "kind": "add", "from": ["lstm0", "prev:lstm0"]},
            "output": {"class": "linear", "activation": "identity", "use_transposed_weights": True,
                       "n_out": 4, "from": "mix"}}},
        "output": {"class": "linear", "activation": "tanh", "from": ["am", "lm"], "n_out": 4}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# the step ':i' and switch inside a rec unit (2021-internal-lm-attention's ILM: is_first_frame chooses
# between a zero attention and another): at step 0 the one branch, then the other
CASES["unit_switch_step"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "loop": {"class": "rec", "from": "data", "unit": {
        "first": {"class": "compare", "from": ":i", "kind": "equal", "value": 0},
        "h": {"class": "linear", "activation": "tanh", "from": ["data:source", "prev:output"], "n_out": 4},
        "zero": {"class": "eval", "from": "h", "eval": "tf.zeros_like(source(0))"},
        "sel": {"class": "switch", "condition": "first", "true_from": "zero", "false_from": "prev:h"},
        "later": {"class": "switch", "condition": "first", "true_from": "h", "false_from": "sel"},
        "output": {"class": "linear", "activation": None, "from": ["h", "sel", "later"], "n_out": 3}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# a reduce over time without keep_dims (one vector per sequence) read by a rec unit as base: at every step
# (2021-internal-lm-attention's encoder_mean: a linear's source and a switch's branch)
CASES["unit_base_vector"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "mean": {"class": "reduce", "mode": "mean", "axes": ["t"], "keep_dims": False, "from": "data"},
    "loop": {"class": "rec", "from": "data", "unit": {
        "first": {"class": "compare", "from": ":i", "kind": "equal", "value": 0},
        "h": {"class": "linear", "activation": "tanh", "from": ["data:source", "base:mean"], "n_out": 5},
        "sel": {"class": "switch", "condition": "first", "true_from": "base:mean", "false_from": "prev:h"},
        "output": {"class": "linear", "activation": None, "from": ["h", "sel"], "n_out": 3}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# length and a compare of it (a flag per sequence), read by a rec unit's switch as base: (the multi-input
# decoders of 2019-e2e-speech-to-text-comparison choose their attention by whether a sequence has audio)
CASES["seq_length_switch"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "len": {"class": "length", "from": "data"},
    "short": {"class": "compare", "from": "len", "kind": "less_equal", "value": 4},
    "loop": {"class": "rec", "from": "data", "unit": {
        "a": {"class": "linear", "activation": "tanh", "from": "data:source", "n_out": 3},
        "b": {"class": "linear", "activation": "tanh", "from": ["data:source", "prev:output"], "n_out": 3},
        "sel": {"class": "switch", "condition": "base:short", "true_from": "a", "false_from": "b"},
        "output": {"class": "linear", "activation": None, "from": ["sel", "b"], "n_out": 3}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# a rec unit attending to base layers of two time axes (the data's frames, and half as many after a
# pooling), each with its own lengths: 2019-e2e-speech-to-text-comparison's decoders attend to an audio and
# a text encoder
CASES["unit_two_time_axes"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "pooled": {"class": "pool", "mode": "max", "padding": "same", "pool_size": (2,), "from": "data"},
    "ctx_a": {"class": "linear", "activation": "tanh", "from": "data", "n_out": 3},
    "val_a": {"class": "split_dims", "axis": "F", "dims": (1, 5), "from": "data"},
    "ctx_b": {"class": "linear", "activation": "tanh", "from": "pooled", "n_out": 3},
    "val_b": {"class": "split_dims", "axis": "F", "dims": (1, 5), "from": "pooled"},
    "loop": {"class": "rec", "from": "data", "unit": {
        "s": {"class": "rnn_cell", "unit": "LSTMBlock", "from": ["data:source", "prev:att_a", "prev:att_b"],
              "n_out": 3},
        "s_a": {"class": "linear", "activation": None, "from": "s", "n_out": 3},
        "in_a": {"class": "combine", "kind": "add", "from": ["base:ctx_a", "s_a"]},
        "en_a": {"class": "linear", "activation": None, "with_bias": False, "from": "in_a", "n_out": 1},
        "w_a": {"class": "softmax_over_spatial", "from": "en_a"},
        "att0_a": {"class": "generic_attention", "weights": "w_a", "base": "base:val_a"},
        "att_a": {"class": "merge_dims", "axes": "except_batch", "from": "att0_a"},
        "s_b": {"class": "linear", "activation": None, "from": "s", "n_out": 3},
        "in_b": {"class": "combine", "kind": "add", "from": ["base:ctx_b", "s_b"]},
        "en_b": {"class": "linear", "activation": None, "with_bias": False, "from": "in_b", "n_out": 1},
        "w_b": {"class": "softmax_over_spatial", "from": "en_b"},
        "att0_b": {"class": "generic_attention", "weights": "w_b", "base": "base:val_b"},
        "att_b": {"class": "merge_dims", "axes": "except_batch", "from": "att0_b"},
        "output": {"class": "linear", "activation": "tanh", "from": ["s", "att_a", "att_b"], "n_out": 3}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# a unit layer read outside its rec layer ("<rec>/<layer>", the triangle models' "output2/readout"): its
# output on every step, with the loop's lengths
CASES["unit_layer_outside"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "loop": {"class": "rec", "from": "data", "unit": {
        "h": {"class": "linear", "activation": "tanh", "from": ["data:source", "prev:h"], "n_out": 4,
              "is_output_layer": True},
        "output": {"class": "linear", "activation": None, "from": "h", "n_out": 3}}},
    "hh": {"class": "linear", "activation": "tanh", "from": "loop/h", "n_out": 3},
    "output": {"class": "softmax", "loss": "ce", "from": ["loop", "hh"]}}}
# reduce over the time axis of the base layers inside a rec unit (2019-asr-e2e-trafo-vs-lstm's coverage:
# accumulated attention weights, thresholded, summed over the encoder frames), sum and mean
CASES["unit_reduce_time"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "enc": {"class": "linear", "activation": "tanh", "from": "data", "n_out": 3},
    "loop": {"class": "rec", "from": "data", "unit": {
        "s": {"class": "rnn_cell", "unit": "LSTMBlock", "from": ["data:source", "prev:cov"], "n_out": 3},
        "energy": {"class": "combine", "kind": "add", "from": ["base:enc", "s"]},
        "w": {"class": "softmax_over_spatial", "from": "energy"},
        "acc": {"class": "eval", "from": ["prev:acc", "w"], "eval": "source(0) + source(1)",
                "out_type": {"dim": 3, "shape": (None, 3)}},
        "cov_": {"class": "eval", "from": "acc",
                 "eval": "where_bc(tf.greater_equal(source(0), 0.5), 1.0, 0.0)"},
        "cov": {"class": "reduce", "axes": "t", "mode": "sum", "from": "cov_"},
        "avg": {"class": "reduce", "axis": "T", "mode": "mean", "from": "energy"},
        "output": {"class": "linear", "activation": None, "from": ["s", "cov", "avg"], "n_out": 3}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# layer classes whose output has no batch axis: relative_positional_encoding's (T, T, F) over the batch's
# padded T, every entry of which RETURNN computes too; both sides keep it as it is and compare it whole
WITHOUT_BATCH = ("relative_positional_encoding",)


# cases RETURNN gives no gradient to compare with, and why (its side computes none)
NO_RETURNN_GRADIENT = {
    "unit_zoneout": "RETURNN's rec loop has no gradient outside training (its while_loop without back_prop), "
                    "and in training its zoneout draws random masks; the outputs are compared (eval)",
}
# cases whose gradients are compared on the outputs only, and why
RETURNN_GRADIENT_WRONG = {
    "rec_NativeLstmLowMem": (
        "RETURNN's gradient op of NativeLstmLowMem (GradOfLstmLowMem) disagrees with finite differences of "
        "RETURNN's own output in the bias of the backward layer: d/d bw/rec/b[1] is 0.0676 by the op, 0.0833 "
        "by central differences (eps 1e-2 and 3e-3), 0.0832 by the engine; the gradients of fw/rec/b and "
        "both W equal the engine's to 5e-8 (2026-11-28)"),
}

# the cases whose gradients are not compared, and why
GRADIENTS_NOT_COMPARED = {**RETURNN_GRADIENT_WRONG, **NO_RETURNN_GRADIENT}
