#!rnn.py
# A BLSTM-CTC recogniser read straight from RETURNN's OggZipDataset: a zip of Ogg files with their
# transcriptions (the four-utterance corpus of the OggZipDataset tests; a real setup names e.g. LibriSpeech's
# zips), MFCC features computed with librosa as RETURNN computes them, BPE targets. Run from the repository:
#   python rnn.py configs/oggzip_ctc.py
#   hdf-dump configs/oggzip_ctc.py out/oggzip_ctc/train.hdf   # the same data as an HDF corpus

task = "train"

_corpus = "tests/fixtures/returnn_oggzip"
_bpe = {"bpe_file": f"{_corpus}/bpe02.codes", "vocab_file": f"{_corpus}/bpe02.vocab",
        "unknown_label": "<unk>"}
train = {"class": "OggZipDataset", "path": f"{_corpus}/corpus.zip", "audio": {"features": "mfcc"},
         "targets": _bpe, "partition_epoch": 2, "seq_ordering": "laplace:2", "use_cache_manager": True}
dev = {"class": "OggZipDataset", "path": f"{_corpus}/corpus.zip", "audio": {"features": "mfcc"},
       "targets": _bpe, "seq_ordering": "sorted"}
batch_size = 2000
max_seqs = 2

network = {
    "lstm0_fw": {"class": "rec", "unit": "NativeLstm2", "n_out": 32, "direction": 1, "from": "data"},
    "lstm0_bw": {"class": "rec", "unit": "NativeLstm2", "n_out": 32, "direction": -1, "from": "data"},
    "lstm0_pool": {"class": "pool", "mode": "max", "padding": "same", "pool_size": (2,),
                   "from": ["lstm0_fw", "lstm0_bw"]},
    "lstm1_fw": {"class": "rec", "unit": "NativeLstm2", "n_out": 32, "direction": 1, "from": "lstm0_pool"},
    "lstm1_bw": {"class": "rec", "unit": "NativeLstm2", "n_out": 32, "direction": -1, "from": "lstm0_pool"},
    # CTC over the 25 BPE labels plus the blank (index 25)
    "output": {"class": "softmax", "loss": "ctc", "from": ["lstm1_fw", "lstm1_bw"], "target": "classes"},
}

adam = True
learning_rate = 0.005
num_epochs = 4
model = "out/oggzip_ctc/model"
