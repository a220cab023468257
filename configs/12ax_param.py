#!rnn.py
# The 12AX LSTM in param mode: every rank trains on its own copy of the data in its own random order
# (random_seed_offset) and the ranks average their parameters every 20 steps and at each epoch's end.
#   mpirun -np 2 python rnn.py configs/12ax_param.py ++use_horovod 1
# Train scores are per rank in this mode; dev scores are global.

import os

exec(open(os.path.join(os.path.dirname(__file__), "12ax.py")).read())

horovod_reduce_type = "param"
horovod_param_sync_step = 20
horovod_dataset_distribution = "random_seed_offset"
train = {"class": "Task12AXDataset", "num_seqs": 1500, "seq_ordering": "random"}
model = "out/12ax_param/model"
