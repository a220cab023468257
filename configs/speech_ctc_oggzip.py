#!rnn.py
# The BLSTM-CTC of configs/speech_ctc.py on the same spoken digits kept as RETURNN's LibriSpeech setups
# keep their corpora: Ogg zips read by OggZipDataset, MFCCs computed while training (normalised with the
# training set's statistics), BPE labels. Make the corpus first:
#   python demos/make_oggzip_corpus.py --out data/speech_oggzip
# (`make demo-oggzip` does it when missing, then trains with 2 ranks.) The network is speech_ctc.py's:
# three BLSTM layers with max-pooling over time between them (10 ms -> 40 ms), a CTC softmax over the BPE
# labels plus the blank (last), and the label error by beam search on dev.

task = "train"

_corpus = "data/speech_oggzip"
_audio = {"features": "mfcc", "num_feature_filters": 40, "norm_mean": f"{_corpus}/stats.mean.txt",
          "norm_std_dev": f"{_corpus}/stats.std_dev.txt"}
_bpe = {"bpe_file": f"{_corpus}/bpe.codes", "vocab_file": f"{_corpus}/bpe.vocab", "unknown_label": "<unk>"}
train = {"class": "OggZipDataset", "path": f"{_corpus}/train.zip", "audio": _audio, "targets": _bpe,
         "seq_ordering": "laplace:.100", "use_cache_manager": True}
dev = {"class": "OggZipDataset", "path": f"{_corpus}/dev.zip", "audio": _audio, "targets": _bpe,
       "seq_ordering": "sorted_reverse"}
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
    "output": {"class": "softmax", "loss": "ctc", "from": ["lstm2_fw", "lstm2_bw"], "target": "classes",
               "darc1": 1e-4},
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
model = "out/speech_ctc_oggzip/model"
