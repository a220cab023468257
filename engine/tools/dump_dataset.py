"""Print what a corpus holds, for checking it by eye: keys, dims, sequence count, length statistics and
the first few sequences.

    dump-dataset CONFIG_OR_DATASET [--dataset train|dev|eval] [--epoch N] [--num_seqs N]

(or ``python tools/dump_dataset.py ...``). CONFIG_OR_DATASET takes the same forms as in ``hdf-dump``.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from engine.datasets import Dataset, dataset_from_cli_arg
from engine.runtime.errors import EngineError


def describe(dataset: Dataset, num_seqs: int) -> str:
    lines = [f"Dataset: {dataset!r}",
             f"Sequences: {dataset.corpus_num_seqs} in the corpus, "
             f"{dataset.num_seqs} in epoch {dataset.epoch}",
             f"{'key':<12} {'dim':>7} {'sparse':>6} {'dtype':>8} {'frame shape':>12} {'frames':>12} "
             f"{'min len':>8} {'max len':>8} {'mean len':>9}"]
    lengths = dataset.epoch_seq_lengths()
    for col, key in enumerate(dataset.data_keys):
        info, lens = dataset.key_info(key), lengths[:, col]
        stats = (lens.sum(), lens.min(), lens.max(), lens.mean()) if len(lens) else (0, 0, 0, 0.0)
        lines.append(f"{key:<12} {info.dim:>7} {'yes' if info.sparse else 'no':>6} {info.dtype:>8} "
                     f"{str(info.shape):>12} {stats[0]:>12} {stats[1]:>8} {stats[2]:>8} {stats[3]:>9.1f}")
    for key, names in dataset.labels.items():
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        lines.append(f"Labels of {key} ({len(names)}): {shown}")
    for seq_idx in range(min(num_seqs, dataset.num_seqs)):
        lines.append(f"Sequence {seq_idx} '{dataset.get_seq_tag(seq_idx)}' "
                     f"(corpus index {dataset.get_corpus_seq_idx(seq_idx)}):")
        for key in dataset.data_keys:
            data = dataset.get_data(seq_idx, key)
            text = np.array2string(data, threshold=12, edgeitems=3, precision=3).replace("\n", "")
            names = dataset.labels.get(key) if dataset.is_sparse(key) else None
            if names and len(data):
                text += "  " + " ".join(names[i] for i in data[:20]) + (" ..." if len(data) > 20 else "")
            lines.append(f"  {key} {data.shape} {data.dtype}: {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset_arg", metavar="CONFIG_OR_DATASET")
    parser.add_argument("--dataset", default="train", choices=["train", "dev", "eval"])
    parser.add_argument("--epoch", type=int, default=1)
    parser.add_argument("--num_seqs", type=int, default=3, help="sequences to print")
    args = parser.parse_args(argv)
    try:
        dataset = dataset_from_cli_arg(args.dataset_arg, which=args.dataset)
        dataset.init_seq_order(args.epoch)
        print(describe(dataset, args.num_seqs))
    except EngineError as exc:
        print(f"dump_dataset: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
