#!rnn.py
# A BLSTM frame classifier trained on HDF corpora in RETURNN's layout. Make the corpora first:
#   python tools/hdf_dump.py "DummyDataset:input_dim=40,output_dim=10,num_seqs=800,seq_len=60,fixed_random_seed=1" data/train.hdf
#   python tools/hdf_dump.py "DummyDataset:input_dim=40,output_dim=10,num_seqs=100,seq_len=60,fixed_random_seed=1" data/dev.hdf
# (`make blstm` does both, then trains with 2 ranks.)

task = "train"

train = {"class": "HDFDataset", "files": ["data/train.hdf"], "seq_ordering": "laplace:.100"}
dev = {"class": "HDFDataset", "files": ["data/dev.hdf"]}
cache_size = "0"  # read straight from the file: with several ranks a cache would be copied per rank
batch_size = 4000
max_seqs = 50

network = {
    "fw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": 1},
    "bw": {"class": "rec", "unit": "NativeLstm2", "n_out": 64, "direction": -1},
    "output": {"class": "softmax", "loss": "ce", "from": ["fw", "bw"], "dropout": 0.1},
}

optimizer = {"class": "adam"}
learning_rate = 0.005
learning_rate_control = "newbob_rel"
num_epochs = 4
model = "out/blstm/model"
