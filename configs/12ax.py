#!rnn.py
# The 12AX memory task with an LSTM: the engine's hello world. Runs as it is, single process or
# data-parallel:
#   python rnn.py configs/12ax.py
#   mpirun -np 2 python rnn.py configs/12ax.py ++use_horovod 1
# The data is generated (no download); dev frame error falls below 2% within 5 epochs.

task = "train"

# data
train = {"class": "Task12AXDataset", "num_seqs": 3000, "fixed_random_seed": 1, "seq_ordering": "random"}
dev = {"class": "Task12AXDataset", "num_seqs": 100, "fixed_random_seed": 2}
batch_size = 5000
max_seqs = 40

# model
network = {
    "lstm": {"class": "rec", "unit": "NativeLstm2", "n_out": 64},
    "output": {"class": "softmax", "loss": "ce", "from": "lstm"},
}

# training
optimizer = {"class": "adam"}
learning_rate = 0.01
num_epochs = 5
model = "out/12ax/model"  # the learning-rate history goes beside it: out/12ax/model.learning_rates
log_verbosity = 3

# data-parallel (with ++use_horovod 1)
horovod_reduce_type = "grad"
horovod_dataset_distribution = "shard"
