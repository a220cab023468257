#!rnn.py
# A word-level LSTM language model read straight from RETURNN's LmDataset (the small corpus of the LmDataset
# tests; a real setup names e.g. LibriSpeech's LM text). The LmDataset options are those of RETURNN's
# published LM setups (e.g. 2021-transducer-thesis-merboldt/librispeech/lm_lstm_baseline_4_2048.bpe1k):
# key 'data' holds a line's words and the sentence end, 'delayed' the same shifted right by the sentence
# boundary. As in those setups, the network reads 'data:delayed' and trains on target 'data'.
# Run from the repository:
#   python rnn.py configs/lm_text.py
#   hdf-dump configs/lm_text.py out/lm_text/train.hdf   # the same data as an HDF corpus

task = "train"

_corpus = "tests/fixtures/returnn_text"


def _lm(files, partition_epoch, seq_ordering):
    return {"class": "LmDataset", "corpus_file": lambda: files, "orth_symbols_map_file": f"{_corpus}/words.map",
            "orth_replace_map_file": f"{_corpus}/replace.json", "word_based": True, "seq_end_symbol": "<sb>",
            "unknown_symbol": "<unk>", "auto_replace_unknown_symbol": True, "add_delayed_seq_data": True,
            "delayed_seq_data_start_symbol": "<sb>", "partition_epoch": partition_epoch,
            "seq_ordering": seq_ordering}


train = _lm([f"{_corpus}/a.txt", f"{_corpus}/b.txt.gz"], 2, "random")
dev = _lm([f"{_corpus}/b.txt.gz"], 1, "sorted")

network = {
    "input": {"class": "linear", "n_out": 16, "activation": "identity", "from": "data:delayed"},
    "lstm0": {"class": "rec", "unit": "lstm", "n_out": 32, "direction": 1, "from": "input"},
    "output": {"class": "softmax", "loss": "ce", "target": "data", "from": "lstm0"},
}

batch_size = 120
max_seqs = 16
adam = True
learning_rate = 0.01
num_epochs = 1
model = "out/lm_text/model"
