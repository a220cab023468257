#!rnn.py
# A BLSTM-CTC recogniser for spoken digits, on the espeak-ng corpus (log-mel features, word labels with
# their own lengths). Make the corpus first:
#   python demos/make_speech_corpus.py --out data/speech
# (`make demo-speech` does it when missing, then trains with 2 ranks.) Three BLSTM layers; max-pooling
# over time between them reduces the frame rate by 4 (10 ms -> 40 ms), which CTC allows as long as an
# utterance keeps more frames than labels (2-5 digits in 1-3 s here).

task = "train"

train = {"class": "HDFDataset", "files": ["data/speech/train.hdf"], "seq_ordering": "laplace:.100"}
dev = {"class": "HDFDataset", "files": ["data/speech/dev.hdf"]}
cache_size = "0"  # read straight from the file: with several ranks a cache would be copied per rank
batch_size = 1500
max_seqs = 40

network = {
    "lstm0_fw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": 1, "from": "data"},
    "lstm0_bw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": -1, "from": "data"},
    "lstm0_pool": {"class": "pool", "mode": "max", "padding": "same", "pool_size": (2,),
                   "from": ["lstm0_fw", "lstm0_bw"]},
    "lstm1_fw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": 1, "from": "lstm0_pool"},
    "lstm1_bw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": -1, "from": "lstm0_pool"},
    "lstm1_pool": {"class": "pool", "mode": "max", "padding": "same", "pool_size": (2,),
                   "from": ["lstm1_fw", "lstm1_bw"]},
    "lstm2_fw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": 1, "from": "lstm1_pool"},
    "lstm2_bw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": -1, "from": "lstm1_pool"},
    # CTC: 10 digit words plus the blank, which RETURNN's ctc loss puts last (index 10)
    "output": {"class": "softmax", "loss": "ctc", "from": ["lstm2_fw", "lstm2_bw"], "target": "classes",
               "darc1": 1e-4},
    # the label error by beam search, scored on dev only (training reports the ctc loss's greedy one)
    "edit_distance": {"class": "copy", "from": "output", "loss": "edit_distance", "target": "classes",
                      "loss_opts": {"ctc_decode": True}, "only_on_eval": True},
}

nadam = True
learning_rate = 0.005
gradient_noise = 0.01
gradient_clip_global_norm = 5.0
learning_rate_control = "newbob_multi_epoch"
newbob_multi_num_epochs = 1
num_epochs = 10
model = "out/speech_ctc/model"
