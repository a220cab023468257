"""The cases of ``returnn_checkpoints.py`` whose networks have a rec layer with a unit of layers (a loop of
RETURNN's decoders, here mostly over the input frames); ``returnn_cases.py`` merges them into ``CASES``."""
from __future__ import annotations

DENSE = {"data": {"dim": 5}, "classes": {"dim": 4, "sparse": True}}
UNIT_CASES: dict[str, dict] = {}
# a unit's own variable, a rec layer's LSTM step, LSTM states (get_last_hidden_state of prev:s and s, keys
# '*' and 'c'), a
# reduce over the features and reinterpret_data, as 2019-asr-local-attention, 2019-asr-e2e-trafo-vs-lstm and
# 2022-scale-learning use them in their decoders, here in a loop over the input frames
UNIT_CASES["unit_state"] = {"extern_data": DENSE, "train_flag": True, "network": {
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
UNIT_CASES["unit_zoneout"] = {"extern_data": DENSE, "network": {
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
UNIT_CASES["unit_lnlstm"] = {"extern_data": DENSE, "train_flag": True, "network": {
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
UNIT_CASES["unit_subnetwork"] = {"extern_data": DENSE, "train_flag": True, "network": {
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
UNIT_CASES["unit_switch_step"] = {"extern_data": DENSE, "train_flag": True, "network": {
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
UNIT_CASES["unit_base_vector"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "mean": {"class": "reduce", "mode": "mean", "axes": ["t"], "keep_dims": False, "from": "data"},
    "loop": {"class": "rec", "from": "data", "unit": {
        "first": {"class": "compare", "from": ":i", "kind": "equal", "value": 0},
        "h": {"class": "linear", "activation": "tanh", "from": ["data:source", "base:mean"], "n_out": 5},
        "sel": {"class": "switch", "condition": "first", "true_from": "base:mean", "false_from": "prev:h"},
        "output": {"class": "linear", "activation": None, "from": ["h", "sel"], "n_out": 3}}},
    "output": {"class": "softmax", "loss": "ce", "from": "loop"}}}
# length and a compare of it (a flag per sequence), read by a rec unit's switch as base: (the multi-input
# decoders of 2019-e2e-speech-to-text-comparison choose their attention by whether a sequence has audio)
UNIT_CASES["seq_length_switch"] = {"extern_data": DENSE, "train_flag": True, "network": {
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
UNIT_CASES["unit_two_time_axes"] = {"extern_data": DENSE, "train_flag": True, "network": {
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
UNIT_CASES["unit_layer_outside"] = {"extern_data": DENSE, "train_flag": True, "network": {
    "loop": {"class": "rec", "from": "data", "unit": {
        "h": {"class": "linear", "activation": "tanh", "from": ["data:source", "prev:h"], "n_out": 4,
              "is_output_layer": True},
        "output": {"class": "linear", "activation": None, "from": "h", "n_out": 3}}},
    "hh": {"class": "linear", "activation": "tanh", "from": "loop/h", "n_out": 3},
    "output": {"class": "softmax", "loss": "ce", "from": ["loop", "hh"]}}}
# reduce over the time axis of the base layers inside a rec unit (2019-asr-e2e-trafo-vs-lstm's coverage:
# accumulated attention weights, thresholded, summed over the encoder frames), sum and mean
UNIT_CASES["unit_reduce_time"] = {"extern_data": DENSE, "train_flag": True, "network": {
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
