"""The cases of ``returnn_checkpoints.py``: each a ``network`` dict and its streams, run by RETURNN and by
the engine on fixed inputs (3 sequences of ``LENGTHS`` frames), and the cases whose gradients RETURNN
gets wrong."""
from __future__ import annotations

from returnn_unit_cases import UNIT_CASES

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
    # 2022-swb-factored-hybrid's targets: evals of class ids from the alignment, registered as streams that
    # losses read as targets and layers read as 'data:<stream>' (an embedding of the left context)
    # (RETURNN feeds the targets with train_flag only)
    "registered_ids": {"extern_data": DENSE, "train_flag": True, "network": {
        "state": {"class": "eval", "eval": "tf.math.floormod(source(0), 2)", "from": "data:classes",
                  "out_type": {"dim": 2, "dtype": "int32", "sparse": True}},
        "phone": {"class": "eval", "eval": "tf.math.floordiv(source(0), 2)", "from": "data:classes",
                  "out_type": {"dim": 2, "dtype": "int32", "sparse": True},
                  "register_as_extern_data": "phone"},
        "center": {"class": "eval", "eval": "source(0) * 2 + source(1)", "from": ["phone", "state"],
                   "out_type": {"dim": 4, "dtype": "int32", "sparse": True},
                   "register_as_extern_data": "center"},
        "phone_embed": {"class": "linear", "activation": None, "with_bias": False, "n_out": 3,
                        "from": "data:phone"},
        "state_embed": {"class": "linear", "activation": "tanh", "n_out": 3, "from": "state"},
        "output": {"class": "softmax", "loss": "ce", "target": "center",
                   "from": ["phone_embed", "state_embed"]}}},
    # 2022-swb-conformer-hybrid-sat's speaker branch: the frames pooled by attention into one vector per
    # sequence, a speaker classifier on it, its target a one-frame stream's label squeezed and registered;
    # the gradients are those of the classifier's output
    "speaker_pooling": {"extern_data": {**DENSE, "speaker": {"dim": 3, "sparse": True}}, "train_flag": True,
                        "one_frame_streams": ["speaker"], "gradient_of": "spk_out", "network": {
        "enc": {"class": "linear", "activation": "tanh", "n_out": 4, "from": "data"},
        "spk_label": {"class": "squeeze", "axis": "T", "from": "data:speaker",
                      "register_as_extern_data": "spk_label"},
        "att_ff": {"class": "linear", "activation": "tanh", "n_out": 3, "from": "enc"},
        "att_e": {"class": "linear", "activation": None, "with_bias": False, "n_out": 1, "from": "att_ff"},
        "att_w": {"class": "softmax_over_spatial", "from": "att_e"},
        "ctx": {"class": "generic_attention", "weights": "att_w", "base": "enc", "auto_squeeze": False},
        "vec": {"class": "merge_dims", "axes": "except_batch", "from": "ctx"},
        "vec_ff": {"class": "linear", "activation": None, "n_out": 5, "from": "vec"},
        "spk_out": {"class": "softmax", "loss": "ce", "target": "spk_label", "from": "vec_ff"},
        "two_heads": {"class": "linear", "activation": None, "n_out": 2, "from": "att_ff"},
        "w2": {"class": "softmax_over_spatial", "energy_factor": 0.5, "from": "two_heads"},
        "ctx2": {"class": "generic_attention", "weights": "w2", "base": "enc", "is_output_layer": True},
        "ctx1": {"class": "generic_attention", "weights": "att_w", "base": "att_ff", "is_output_layer": True},
        "output": {"class": "softmax", "loss": "ce", "from": "enc"}}},
})
CASES.update(UNIT_CASES)
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
