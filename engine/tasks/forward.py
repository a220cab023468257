"""``task = "forward"``: run the model over the ``eval`` dataset and write its outputs to ``output_file``.

Sequences in the corpus' original order, each with as many frames as the model's ``output`` has for it:
one per input frame, or fewer after layers that subsample time (``SeqModel.output_lengths``). The
sequence lengths are known before anything is forwarded, so rank 0 lays the whole file out first
(``hdf_rows``: under a temporary name beside ``output_file``) and every rank then writes its shard's rows
straight into it, all at once: no part files, nothing merged afterwards (the merge had been rank 0
alone re-reading and re-writing every rank's output while the others waited). When every rank has
written, rank 0 renames the file to ``output_file``; after an error it removes it. All ranks write into
the one file, so ``output_file`` must be on storage that all ranks share.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from engine.config.loader import Config
from engine.datasets import BatchOptions, Dataset, dataset_from_config, generate_batches
from engine.datasets.hdf_rows import RowWriter, add_target, create_rows_file
from engine.distributed import Communicator, agree_on_failure, broadcast_initial, start
from engine.runtime import log
from engine.runtime.atomic_file import commit, create_temp_beside, discard
from engine.runtime.errors import ConfigError, DataError, EngineError
from engine.model.base import SeqModel
from engine.model.losses.decoding import greedy_labels
from engine.tasks.evaluate import load_model_for_inference
from engine.training.report import EpochReport
from engine.training.step import Steps


@dataclass(frozen=True)
class OutputLayout:
    """Where each sequence of the epoch goes in the output file: corpus order."""

    corpus_idx: np.ndarray  # the epoch's corpus indices, sorted: the file's sequence order
    first_row: dict[int, int]  # corpus index -> its first frame in ``inputs``
    lengths: np.ndarray  # output frames per sequence, in file order
    tags: list[str]

    @classmethod
    def of(cls, dataset: Dataset, model: SeqModel) -> OutputLayout:
        """From the dataset's current epoch order (every rank computes the same)."""
        column = dataset.data_keys.index("data")
        order = np.asarray(dataset.order)
        input_lengths = dataset.epoch_seq_lengths()[:, column].astype(np.int32)
        output_lengths = np.asarray(model.output_lengths(tf.constant(input_lengths))).astype(np.int64)
        lengths_by_idx = dict(zip(order.tolist(), output_lengths.tolist()))
        tags_by_idx = {int(idx): dataset.get_seq_tag(i) for i, idx in enumerate(order)}
        corpus_idx = np.array(sorted(lengths_by_idx), dtype=np.int64)
        lengths = np.array([lengths_by_idx[i] for i in corpus_idx.tolist()], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return cls(corpus_idx, dict(zip(corpus_idx.tolist(), starts.tolist())), lengths,
                   [tags_by_idx[i] for i in corpus_idx.tolist()])

    def lengths_of(self, corpus_idx: np.ndarray) -> np.ndarray:
        rows = np.searchsorted(self.corpus_idx, np.asarray(corpus_idx, np.int64))
        return self.lengths[rows]


def forward_shard(steps: Steps, dataset: Dataset, writer: RowWriter, layout: OutputLayout,
                  batching: BatchOptions, rank: int, size: int,
                  greedy_labels_of: dict[int, np.ndarray] | None = None) -> int:
    """Forward this rank's share of ``dataset`` into its rows; returns the number of sequences.
    ``greedy_labels_of``: filled with corpus index -> the best-path labels of a ctc output."""
    report = EpochReport(f"forward '{os.path.basename(writer.path)}'")
    done = 0
    for batch in generate_batches(dataset, batching, shard_rank=rank, shard_size=size, shard_by="frames"):
        with report.computing():
            outputs, lengths = steps.forward(batch)
        expected = layout.lengths_of(batch.corpus_seq_idx)
        if not np.array_equal(lengths, expected) or (len(lengths) and outputs.shape[1] < lengths.max()):
            raise EngineError(
                f"forward: the model's output has lengths {lengths.tolist()} (and {outputs.shape[1]} frames) "
                f"for inputs of {batch.lengths['data'].tolist()}, but its output_lengths() gave "
                f"{expected.tolist()}; a model from get_model that changes the number of frames must "
                "define output_lengths(lengths) to match (docs/config-and-cli.md).")
        for i, corpus_idx in enumerate(batch.corpus_seq_idx):
            writer.write(layout.first_row[int(corpus_idx)], outputs[i, :lengths[i]])
        if greedy_labels_of is not None:  # the blank is the last class; argmax of probabilities = of logits
            labels, label_lengths = (t.numpy() for t in greedy_labels(
                tf.constant(outputs), tf.constant(lengths), outputs.shape[-1] - 1))
            for i, corpus_idx in enumerate(batch.corpus_seq_idx):
                greedy_labels_of[int(corpus_idx)] = labels[i, :label_lengths[i]]
        done += batch.num_seqs
        report.steps += 1
        report.scores.frames += float(batch.lengths["data"].sum())  # input frames: the rate of the work
    report.finish()
    return done


def _create_output(comm: Communicator, output_file: str, layout: OutputLayout,
                   out_dim: int) -> tuple[str, int | None]:
    """Rank 0 lays the file out under a temporary name; every rank gets (temporary path, block offset)."""
    created, error = (None, None), None
    if comm.rank == 0:
        try:
            tmp = create_temp_beside(output_file)
        except OSError as exc:
            error = DataError(f"Cannot create the output file '{output_file}': {exc.strerror}.")
        else:
            try:
                created = (tmp, create_rows_file(tmp, layout.tags, layout.lengths, out_dim))
            except (OSError, EngineError) as exc:
                discard(tmp)
                error = exc if isinstance(exc, EngineError) else DataError(
                    f"Cannot write the output file '{output_file}': {exc}.")
    agree_on_failure(comm, error)
    return comm.broadcast_object(created, root=0)


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
        if config.bool("forward_greedy_labels") and not model.ctc_output:
            raise ConfigError("forward_greedy_labels is set, but the model's 'output' has no ctc loss: "
                              "best-path labels need the ctc blank (the output's last class).")
        dataset.init_seq_order(max(epoch, 1))
        batching = BatchOptions.from_config(config, train=False)
        steps = Steps(model)
        steps.trace("forward")
    except EngineError as exc:
        error = exc
    agree_on_failure(comm, error)
    broadcast_initial(comm, list(model.variables))
    out_dim = steps.output_dim()
    layout = OutputLayout.of(dataset, model)
    tmp, offset = _create_output(comm, output_file, layout, out_dim)
    log.info(f"forward: {len(layout.lengths)} sequences, {int(layout.lengths.sum())} frames, on {comm.size} "
             f"rank(s), into {output_file}")
    written, error = 0, None
    greedy = {} if config.bool("forward_greedy_labels") else None
    try:
        writer = RowWriter(tmp, offset, out_dim)
        try:
            written = forward_shard(steps, dataset, writer, layout, batching, comm.rank, comm.size, greedy)
        finally:
            writer.close()  # this rank's rows are on disk
    except EngineError as exc:
        error = exc
    _agree_or_discard(comm, error, tmp)  # also waits until every rank has written
    greedy_parts = comm.gather_object(greedy, root=0) if greedy is not None else None
    if comm.rank == 0:
        try:
            if greedy_parts is not None:
                merged = {idx: seq for part in greedy_parts for idx, seq in part.items()}
                add_target(tmp, "greedy", [merged[int(i)] for i in layout.corpus_idx], out_dim - 1,
                           dataset.labels.get(config.str("target"), []))
            commit(tmp, output_file)
        except (OSError, EngineError) as exc:
            error = exc if isinstance(exc, EngineError) else DataError(
                f"Cannot finish the output file '{output_file}': {exc}.")
    _agree_or_discard(comm, error, tmp)
    total = int(comm.allreduce([np.array([written], np.int64)], "sum")[0][0])
    log.info(f"forward: wrote {total} sequences to {output_file}")


def _agree_or_discard(comm: Communicator, error: EngineError | None, tmp: str) -> None:
    """``agree_on_failure``; rank 0 removes the unfinished file first when any rank failed."""
    try:
        agree_on_failure(comm, error)
    except BaseException:
        if comm.rank == 0:
            discard(tmp)
        raise
