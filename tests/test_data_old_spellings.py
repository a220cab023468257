"""Dataset options in RETURNN's old spellings: ``partitionEpoch`` for ``partition_epoch``."""
import numpy as np
import pytest

from engine.datasets import create_dataset
from engine.runtime.errors import DataError

pytestmark = pytest.mark.tf_latest


def test_partition_epoch_old_spelling():
    spec = {"class": "Task12AXDataset", "num_seqs": 10, "fixed_random_seed": 3}
    old = create_dataset({**spec, "partitionEpoch": 3})
    new = create_dataset({**spec, "partition_epoch": 3})
    assert old.partition_epoch == 3
    for epoch in (1, 2, 3, 4):
        old.init_seq_order(epoch)
        new.init_seq_order(epoch)
        np.testing.assert_array_equal(old.order, new.order)
    assert len(old.order) == 4  # sub-epoch 4: the first part of full epoch 2 (RETURNN splits 10 as 4, 3, 3)
    assert create_dataset({**spec, "partitionEpoch": None}).partition_epoch == 1
    with pytest.raises(DataError, match="either 'partition_epoch' or its old spelling 'partitionEpoch'"):
        create_dataset({**spec, "partitionEpoch": 2, "partition_epoch": 2})
