"""Convert any dataset into an HDF corpus file in RETURNN's layout.

The file is the one RETURNN's ``tools/hdf_dump.py`` writes (``HDFWriter``'s ``returnn_dump``): every key of
the dataset but 'orth' and 'raw'.

    hdf-dump CONFIG_OR_DATASET OUT.hdf [--start_seq N] [--end_seq N] [--epoch N] [--dataset train|dev|eval]

(or ``python tools/hdf_dump.py ...``).

CONFIG_OR_DATASET: a config file (its ``train`` dataset unless ``--dataset``), a dataset dict literal
(``"{'class': 'Task12AXDataset', 'num_seqs': 100}"``), a ``"Class:kw=v,..."`` string, a ``.npz`` file or
a comma-separated HDF file list. ``--end_seq`` is inclusive, as in RETURNN's tool. The file is written
under a temporary name and renamed at the end; an existing OUT.hdf is kept unless ``--overwrite``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from engine.datasets import HDFWriter, dataset_from_cli_arg
from engine.report.progress import Progress
from engine.runtime.errors import DataError, EngineError


def dump(args: argparse.Namespace) -> None:
    if os.path.exists(args.out) and not args.overwrite:
        raise DataError(f"Output file '{args.out}' exists already; pass --overwrite to replace it.")
    dataset = dataset_from_cli_arg(args.dataset_arg, which=args.dataset)
    dataset.init_seq_order(args.epoch)
    end = min(dataset.num_seqs - 1, args.end_seq if args.end_seq is not None else dataset.num_seqs - 1)
    if args.start_seq < 0 or args.start_seq > end:
        raise DataError(f"No sequences to dump: --start_seq {args.start_seq} / --end_seq {args.end_seq} "
                        f"select nothing of the {dataset.num_seqs} sequences of epoch {args.epoch}.")
    started = time.monotonic()
    # RETURNN's dump_from_dataset leaves out 'orth' and 'raw' (the text and raw audio of OggZip and
    # LibriSpeech), and so does this one: the file is the one RETURNN's tool writes.
    keys = [key for key in dataset.data_keys if key not in ("orth", "raw")]
    if not keys:
        raise DataError(f"Nothing to dump: the dataset's only keys are {dataset.data_keys} (RETURNN's dump "
                        "leaves out 'orth' and 'raw').")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    # A bar on a terminal; elsewhere a line a minute, so that a long dump in a job's log shows it lives.
    with HDFWriter(args.out, {key: dataset.key_info(key) for key in keys}, labels=dataset.labels,
                   overwrite=args.overwrite, returnn_dump=True,
                   input_patt_size=getattr(dataset, "returnn_num_inputs", None)) as writer, \
            Progress("hdf_dump", end - args.start_seq + 1, stream=sys.stderr, unit="seq") as progress:
        for done, seq_idx in enumerate(range(args.start_seq, end + 1), 1):
            writer.insert(dataset.get_seq_tag(seq_idx), {key: dataset.get_data(seq_idx, key) for key in keys})
            progress.update(done)
    frames = ", ".join(f"{key} {n}" for key, n in writer.num_frames.items())
    size_mb = os.path.getsize(args.out) / 2**20
    print(f"Wrote {writer.num_seqs} sequences to {args.out}: frames {frames}; {size_mb:.1f} MiB; "
          f"{time.monotonic() - started:.1f} s.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset_arg", metavar="CONFIG_OR_DATASET")
    parser.add_argument("out", metavar="OUT.hdf")
    parser.add_argument("--start_seq", type=int, default=0)
    parser.add_argument("--end_seq", type=int, default=None, help="last sequence to dump (inclusive)")
    parser.add_argument("--epoch", type=int, default=1)
    parser.add_argument("--dataset", default="train", choices=["train", "dev", "eval"],
                        help="which dataset of a config file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    args = parser.parse_args(argv)
    try:
        dump(args)
    except EngineError as exc:
        print(f"hdf_dump: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\nhdf_dump: interrupted; no output file written.", file=sys.stderr)
        return 130
    return 0
