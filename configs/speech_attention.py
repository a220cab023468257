#!rnn.py
# An attention encoder-decoder for spoken digits, built as RETURNN's 2019 LibriSpeech attention system
# (2019-librispeech-system/attention/base2.config) builds its network, small: a BLSTM encoder with
# max-pooling over time, MLP attention with fertility, an LSTM decoder state, a maxout readout, and CTC
# beside it. The corpus is make demo-speech's, with label 0 the end of sequence that every label sequence
# ends with (`python demos/make_speech_corpus.py --out data/speech_eos --eos`). `make demo-attention` makes
# it when missing, trains with 2 ranks, then searches the dev set with 2 ranks (task "search", beam 12)
# and prints the WER.

task = "train"

train = {"class": "HDFDataset", "files": ["data/speech_eos/train.hdf"], "seq_ordering": "laplace:.100"}
dev = {"class": "HDFDataset", "files": ["data/speech_eos/dev.hdf"]}
cache_size = "0"
batch_size = 2000
max_seqs = 40
target = "classes"

network = {
    "lstm0_fw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": 1, "from": "data"},
    "lstm0_bw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": -1, "from": "data"},
    "lstm0_pool": {"class": "pool", "mode": "max", "padding": "same", "pool_size": (2,),
                   "from": ["lstm0_fw", "lstm0_bw"]},
    "lstm1_fw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": 1, "from": "lstm0_pool"},
    "lstm1_bw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": -1, "from": "lstm0_pool"},
    "lstm1_pool": {"class": "pool", "mode": "max", "padding": "same", "pool_size": (2,),
                   "from": ["lstm1_fw", "lstm1_bw"]},
    "encoder": {"class": "copy", "from": "lstm1_pool"},
    "enc_ctx": {"class": "linear", "activation": None, "with_bias": True, "from": "encoder", "n_out": 64},
    "inv_fertility": {"class": "linear", "activation": "sigmoid", "with_bias": False, "from": "encoder",
                      "n_out": 1},
    "enc_value": {"class": "split_dims", "axis": "F", "dims": (1, 128), "from": "encoder"},
    "output": {"class": "rec", "from": [], "target": "classes",
               "max_seq_len": "max_len_from('base:encoder')", "unit": {
        "output": {"class": "choice", "target": "classes", "beam_size": 12, "from": "output_prob",
                   "initial_output": 0},
        "end": {"class": "compare", "from": "output", "value": 0},
        "target_embed": {"class": "linear", "activation": None, "with_bias": False, "from": "output",
                         "n_out": 32, "initial_output": 0},
        "weight_feedback": {"class": "linear", "activation": None, "with_bias": False,
                            "from": "prev:accum_att_weights", "n_out": 64},
        "s_transformed": {"class": "linear", "activation": None, "with_bias": False, "from": "s",
                          "n_out": 64},
        "energy_in": {"class": "combine", "kind": "add",
                      "from": ["base:enc_ctx", "weight_feedback", "s_transformed"], "n_out": 64},
        "energy_tanh": {"class": "activation", "activation": "tanh", "from": "energy_in"},
        "energy": {"class": "linear", "activation": None, "with_bias": False, "from": "energy_tanh",
                   "n_out": 1},
        "att_weights": {"class": "softmax_over_spatial", "from": "energy"},
        "accum_att_weights": {"class": "eval", "from": ["prev:accum_att_weights", "att_weights",
                                                        "base:inv_fertility"],
                              "eval": "source(0) + source(1) * source(2) * 0.5",
                              "out_type": {"dim": 1, "shape": (None, 1)}},
        "att0": {"class": "generic_attention", "weights": "att_weights", "base": "base:enc_value"},
        "att": {"class": "merge_dims", "axes": "except_batch", "from": "att0"},
        "s": {"class": "rnn_cell", "unit": "LSTMBlock", "from": ["prev:target_embed", "prev:att"],
              "n_out": 64},
        "readout_in": {"class": "linear", "from": ["s", "prev:target_embed", "att"], "activation": None,
                       "n_out": 64},
        "readout": {"class": "reduce_out", "mode": "max", "num_pieces": 2, "from": "readout_in"},
        "output_prob": {"class": "softmax", "from": "readout", "dropout": 0.1, "target": "classes",
                        "loss": "ce", "loss_opts": {"label_smoothing": 0.1}},
    }},
    "decision": {"class": "decide", "from": "output", "loss": "edit_distance", "target": "classes"},
    # CTC on the encoder beside the decoder, as in RETURNN's setup (11 labels + the blank)
    "ctc": {"class": "softmax", "from": "encoder", "loss": "ctc", "target": "classes"},
}

adam = True
learning_rate = 0.003
gradient_clip_global_norm = 5.0
learning_rate_control = "newbob_multi_epoch"
newbob_multi_num_epochs = 1
num_epochs = 20
model = "out/speech_attention/model"

# task "search" (make demo-attention runs it with ++task search): the dev set, beam 12 (the choice's)
search_data = "dev"
search_output_layer = "decision"
search_output_file = "out/speech_attention/dev.hyps.txt"
