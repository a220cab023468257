"""``task = "forward"``: run the model over the ``eval`` dataset and write its outputs to ``output_file``.

Every rank forwards its shard into a part file beside ``output_file``; rank 0 then merges the parts
into one HDF file in the corpus' original sequence order and removes them. The parts go through the
file system (as checkpoints do), so ``output_file`` must be on storage that all ranks share.
"""
from __future__ import annotations

import os

from engine import log
from engine.config import Config
from engine.datasets import (BatchOptions, DataKeyInfo, Dataset, HDFWriter, create_dataset,
                             dataset_from_config, generate_batches)
from engine.distributed import agree_on_failure, broadcast_initial, start
from engine.errors import ConfigError, EngineError
from engine.tasks.evaluate import load_model_for_inference
from engine.training.report import EpochReport
from engine.training.step import Steps


def part_path(output_file: str, rank: int, size: int) -> str:
    return f"{output_file}.part-{rank}-of-{size}"


def forward_shard(steps: Steps, dataset: Dataset, path: str, out_dim: int, batching: BatchOptions, rank: int,
                  size: int) -> list[int]:
    """Write this rank's share of ``dataset``; returns the corpus indices in the order written."""
    written: list[int] = []
    report = EpochReport(f"forward '{os.path.basename(path)}'")
    with HDFWriter(path, {"data": DataKeyInfo(dim=out_dim)}) as writer:
        for batch in generate_batches(dataset, batching, shard_rank=rank, shard_size=size):
            with report.computing():
                outputs = steps.forward(batch)
            lengths = batch.lengths["data"]
            for i, tag in enumerate(batch.seq_tags):
                writer.insert(tag, {"data": outputs[i, :lengths[i]]})
            written.extend(int(x) for x in batch.corpus_seq_idx)
            report.steps += 1
            report.scores.frames += float(lengths.sum())
    report.finish()
    return written


def merge_parts(output_file: str, parts: list[str], order_per_part: list[list[int]], out_dim: int) -> int:
    """One file in corpus order from the ranks' part files; returns the number of sequences."""
    location = {corpus_idx: (p, pos)
                for p, order in enumerate(order_per_part) for pos, corpus_idx in enumerate(order)}
    readers = [create_dataset({"class": "HDFDataset", "files": [path], "cache_size": "0"}) for path in parts]
    for reader in readers:
        reader.init_seq_order(1)
    with HDFWriter(output_file, {"data": DataKeyInfo(dim=out_dim)}) as writer:
        for corpus_idx in sorted(location):
            p, pos = location[corpus_idx]
            writer.insert(readers[p].get_seq_tag(pos), {"data": readers[p].get_data(pos, "data")})
    for reader, path in zip(readers, parts):
        reader.close()
        os.remove(path)
    return len(location)


def run_forward(config: Config) -> None:
    comm = start(config).comm
    output_file = config.str("output_file")
    dataset, model, error = None, None, None
    try:
        if not output_file:
            raise ConfigError("Task 'forward' needs 'output_file', the HDF file to write the outputs to.")
        dataset = dataset_from_config(config, "eval")
        if dataset is None:
            raise ConfigError("Task 'forward' needs an 'eval' dataset in the config: the data to forward.")
        if dataset.chunking is not None:
            raise ConfigError("Task 'forward' writes one output per sequence, but the 'eval' dataset is "
                              "chunked (its own 'chunking', or 'chunk_eval'); remove the chunking for "
                              "forwarding.")
        model, epoch = load_model_for_inference(config, comm, dataset)
        dataset.init_seq_order(max(epoch, 1))
        batching = BatchOptions.from_config(config, train=False)
        steps = Steps(model)
        steps.trace("forward")
    except EngineError as exc:
        error = exc
    agree_on_failure(comm, error)
    broadcast_initial(comm, list(model.variables))
    out_dim = steps.output_dim()
    path = part_path(output_file, comm.rank, comm.size) if comm.size > 1 else output_file
    written, error = [], None
    try:
        written = forward_shard(steps, dataset, path, out_dim, batching, comm.rank, comm.size)
    except EngineError as exc:
        error = exc
    agree_on_failure(comm, error)
    if comm.size > 1:
        order_per_part = comm.allgather_object(written)
        error = None
        if comm.rank == 0:
            try:
                parts = [part_path(output_file, r, comm.size) for r in range(comm.size)]
                merge_parts(output_file, parts, order_per_part, out_dim)
            except EngineError as exc:
                error = exc
        agree_on_failure(comm, error)
    total = sum(map(len, order_per_part)) if comm.size > 1 else len(written)
    log.info(f"forward: wrote {total} sequences to {output_file}")
