"""A dataset of this engine against RETURNN's stored sequences of the same dict, epoch by epoch: the
comparison the dataset fixture scripts (``returnn_oggzip_fixtures.py``, ``returnn_librispeech_fixtures.py``)
share. Only numpy is imported: RETURNN's Python imports those scripts too."""
from __future__ import annotations

import numpy as np


def compare_epochs(dataset, name: str, expected: dict, arrays, epochs, problems: list[str]) -> float:
    """Appends to ``problems`` each difference of ``dataset`` from RETURNN's record of case ``name``
    (``expected``: tags per epoch and ``dims``; ``arrays``: ``name/epoch/seq/key`` -> array): tags, every
    key's dtype, shape and (non-float) values, the dims. Returns the largest float difference relative to
    the larger of 1 and the largest value of RETURNN's."""
    worst = 0.0
    for epoch in epochs:
        dataset.init_seq_order(epoch)
        tags = [dataset.get_seq_tag(i) for i in range(dataset.num_seqs)]
        if tags != expected[str(epoch)]:
            problems.append(f"{name} epoch {epoch}: tags {tags} != RETURNN's {expected[str(epoch)]}")
            continue
        for i in range(dataset.num_seqs):
            for key in dataset.data_keys:
                ours, theirs = dataset.get_data(i, key), arrays[f"{name}/{epoch}/{i}/{key}"]
                if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
                    problems.append(f"{name} epoch {epoch} seq {i} {key}: {ours.dtype}{ours.shape} != "
                                    f"RETURNN's {theirs.dtype}{theirs.shape}")
                elif ours.dtype.kind == "f":
                    scale = max(1.0, float(np.abs(theirs).max(initial=0)))
                    worst = max(worst, float(np.abs(ours - theirs).max(initial=0)) / scale)
                elif not np.array_equal(ours, theirs):
                    problems.append(f"{name} epoch {epoch} seq {i} {key}: {ours} != RETURNN's {theirs}")
    dims = {k: dataset.get_data_dim(k) for k in dataset.data_keys}
    if dims != expected["dims"]:
        problems.append(f"{name}: dims {dims} != RETURNN's {expected['dims']}")
    return worst
