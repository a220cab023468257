"""``task = "search"``: beam search over the ``search_data``, the best hypotheses into one text file.

The model searches with its rec layers' ``choice`` beams; ``search_output_layer`` names what is written per
sequence: a ``decide`` layer's best hypothesis, a rec layer's whole final beam, or several of them
(``search_layers.py``; ``search_output.py``: formats and scores). As in
RETURNN: ``search_data`` is ``"eval"`` by default (or ``"train"``/``"dev"``, or a dataset of its own),
``batch_size`` defaults to 1, ``max_seq_length`` must be 0 (every sequence gets a hypothesis), an
existing output file is not overwritten, and when a file is written the data is searched longest
sequence first (``sorted_reverse``), the order RETURNN picks for that.

Data-parallel (``mpirun -np N``): the batches are planned once, as on one rank, and rank r searches
batches r, r + N, ... . A hypothesis can depend on the other sequences of its batch (a rec layer's
``max_seq_len`` from the longest input of the batch), so this keeps every rank count's file the same as
one rank's. Rank 0 gathers the hypotheses, their error counts and the loss sums of the loss layers outside
the loop (each rank scores its own batches), and writes the file under a temporary name beside
``search_output_file``, renamed when complete; after an error on any rank it is removed, and every rank
ends with the failing rank's message.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tensorflow as tf

from engine.config.loader import Config
from engine.datasets import BatchOptions, Dataset, dataset_from_config, generate_batches
from engine.datasets.ordering import parse_seq_ordering
from engine.distributed import Communicator, agree_on_failure, broadcast_initial, start
from engine.model.base import SeqModel
from engine.runtime import log
from engine.runtime.atomic_file import commit, create_temp_beside, discard
from engine.runtime.errors import ConfigError, DataError, EngineError
from engine.tasks.evaluate import load_model_for_inference
from engine.tasks.search_layers import SearchLayers, end_label, scored_loss_layers, search_layers
from engine.tasks.search_output import (BeamScore, HypothesisText, SeqResult, check_format, score_sequence,
                                        write_hypotheses)
from engine.training.compiled_step import CompiledStep
from engine.training.report import EpochReport

NAMED_DATASETS = ("train", "dev", "eval")
# what a search step returns (NetworkModel.search): the decided hypotheses, the rec layer's final beam, the
# scored loss layers' sums
STEP_OUTPUTS = ("hyps", "hyp_lengths", "scores", "beam", "beam_lengths", "beam_scores", "sums")


@dataclass
class SearchSetup:
    dataset: Dataset
    model: SeqModel
    layers: SearchLayers
    target: str | None  # the reference stream, when scored (search_do_eval)
    scored: list[str]  # the loss layers scored besides the decide layer (scored_loss_layers)
    streams: list[str]  # the target streams a search step reads: the scored layers' targets
    text: HypothesisText | None
    batching: BatchOptions
    step: CompiledStep
    output_file: str
    output_format: str


def search_dataset(config: Config) -> Dataset:
    """``search_data``: the name of the ``train``, ``dev`` or ``eval`` dataset, or a dataset of its own."""
    spec = config.typed("search_data")
    key = spec if isinstance(spec, str) and spec in NAMED_DATASETS else "search_data"
    dataset = dataset_from_config(config, key)
    if dataset is None:
        raise ConfigError(f"Task 'search' searches the dataset search_data names ({spec!r}), but the config "
                          f"has no {key!r} dataset.")
    if dataset.chunking is not None:
        raise ConfigError(f"Task 'search' needs whole sequences, but the {key!r} dataset is chunked (its own "
                          "'chunking', or 'chunk_eval'); remove the chunking for searching.")
    return dataset


def _prepare(config: Config, comm: Communicator) -> SearchSetup:
    output_file = config.str("search_output_file") or ""
    output_format = config.str("search_output_file_format")
    check_format(output_file, output_format)
    if config.typed("max_seq_length"):
        raise ConfigError("Task 'search' needs max_seq_length = 0 (as RETURNN): a longer sequence would be "
                          "left without a hypothesis. Set ++max_seq_length 0.")
    dataset = search_dataset(config)
    model, epoch = load_model_for_inference(config, comm, dataset)
    if not hasattr(model, "search"):
        raise ConfigError("Task 'search' needs a model from a 'network' dict with a decide layer; the "
                          "config's get_model model has no beam search.")
    layers = search_layers(config, model)
    if layers.as_dict and output_file and output_format != "py":
        raise ConfigError(f"search_output_layer {layers.outputs} lists several layers, written as a dict per "
                          "sequence: that needs search_output_file_format 'py' (RETURNN refuses 'txt' too).")
    opts = model.specs[layers.decided].opts
    target = opts.get("target") or config.str("target")
    do_eval = config.bool("search_do_eval")
    scored = scored_loss_layers(model, layers.rec) if do_eval else []
    streams = sorted({model.loss_objects[name].target for name in scored})
    for name, stream in [(layers.decided, target)] + [(n, model.loss_objects[n].target) for n in scored]:
        if do_eval and stream not in dataset.data_keys:
            raise ConfigError(f"search_do_eval scores layer '{name}' against target {stream!r}, which the "
                              f"search data does not have (its keys: {dataset.data_keys}); set "
                              "search_do_eval = False.")
    extern = config.typed("extern_data") or {}
    entry = extern.get(target) if isinstance(extern, dict) else None
    text = HypothesisText.of(entry.get("vocab") if isinstance(entry, dict) else None,
                             dataset.labels.get(target, []), target, end_label(model, layers.rec))
    if output_file and text is None:
        raise ConfigError(f"search_output_file: the hypotheses are class ids of {target!r}, but neither its "
                          "extern_data entry has a 'vocab' nor the search data label names for it, so they "
                          "cannot be written as text (RETURNN refuses too).")
    if output_file:
        dataset.seq_ordering = parse_seq_ordering("sorted_reverse", owner=dataset.name)
    dataset.init_seq_order(max(epoch, 1))
    if output_file and dataset.num_seqs != dataset.corpus_num_seqs:
        raise ConfigError(f"search_output_file: epoch {max(epoch, 1)} of {dataset.name} holds "
                          f"{dataset.num_seqs} of its {dataset.corpus_num_seqs} sequences (partition_epoch), "
                          "but the file has one entry per sequence of the corpus; remove the partitioning "
                          "for searching.")
    batching = BatchOptions(config.int("batch_size", 1), config.int("max_seqs"), 0)
    data_spec, lengths_spec = model.input_signature
    target_specs = {k: tf.TensorSpec([None, None], tf.int32, name=k) for k in streams}
    target_lengths_specs = {k: tf.TensorSpec([None], tf.int32, name=f"{k}_len") for k in streams}

    def search_step(data, lengths, targets, target_lengths):
        found = model.search(data, lengths, layers.decided, scored, targets, target_lengths)
        found.setdefault("sums", tf.zeros([0, 3]))
        return {key: found[key] for key in STEP_OUTPUTS}

    step = CompiledStep(search_step, [data_spec, lengths_spec, target_specs, target_lengths_specs])
    step.trace()
    return SearchSetup(dataset, model, layers, target if do_eval else None, scored, streams, text, batching,
                       step, output_file, output_format)


@dataclass
class ShardResult:
    """What a rank's search found: corpus index -> its result; its batches; the scored loss layers' sums
    (``SearchSetup.scored``: loss, error and count of each)."""

    results: dict[int, SeqResult]
    steps: int
    sums: np.ndarray


def search_shard(setup: SearchSetup, rank: int, size: int) -> ShardResult:
    """This rank's batches, searched."""
    keys = ["data"] + sorted({*setup.streams, *([setup.target] if setup.target else [])} - {"data"})
    dtype = setup.model.input_signature[0].dtype.as_numpy_dtype
    report = EpochReport(f"search '{setup.layers.decided}'")
    results, sums = {}, np.zeros((len(setup.scored), 3))
    for batch in generate_batches(setup.dataset, setup.batching, shard_rank=rank, shard_size=size,
                                  shard_by="batches", keys=keys):
        targets = {k: np.asarray(batch.data[k], np.int32) for k in setup.streams}
        target_lengths = {k: np.asarray(batch.lengths[k], np.int32) for k in setup.streams}
        with report.computing():
            found = {key: t.numpy() for key, t in setup.step(
                np.asarray(batch.data["data"], dtype), np.asarray(batch.lengths["data"], np.int32), targets,
                target_lengths).items()}
        sums += found["sums"]
        for i, corpus_idx in enumerate(batch.corpus_seq_idx.tolist()):
            tag = batch.seq_tags[i]
            hyp = found["hyps"][i, :found["hyp_lengths"][i]]
            if np.isnan(found["scores"][i]):
                raise DataError(f"search: the best hypothesis of sequence '{tag}' has score NaN: its input "
                                "holds NaN or Inf values (or the model's outputs do); fix or drop it.")
            ref = None
            if setup.target:
                ref = np.asarray(batch.data[setup.target][i, :batch.lengths[setup.target][i]])
            result = score_sequence(tag, hyp, ref, setup.text)
            results[corpus_idx] = replace(result, output=_entry(setup, found, i, tag, result.output))
            if log.verbosity() >= log.DEBUG:  # RETURNN's lines at log_verbosity 4
                _log_sequence(setup, tag, hyp, found["scores"][i], ref)
        report.steps += 1
        report.scores.frames += float(batch.lengths["data"].sum())
    report.finish()
    return ShardResult(results, report.steps, sums)


def _entry(setup: SearchSetup, found: dict[str, np.ndarray], i: int, tag: str, decided: str | None) -> Any:
    """Sequence ``i``'s entry of the file: each output layer's value (the decided hypothesis' text, or the
    rec layer's beam as (score, text) pairs), alone or as a dict."""
    if setup.text is None:
        return None
    values = {name: decided for name in setup.layers.outputs}
    for name in setup.layers.beam_outputs():
        lengths = found["beam_lengths"][i]
        values[name] = [(BeamScore(found["beam_scores"][i, k]),
                         setup.text.text(found["beam"][i, k, :lengths[k]], tag)) for k in range(len(lengths))]
    return values if setup.layers.as_dict else values[setup.layers.outputs[0]]


def _log_sequence(setup: SearchSetup, tag: str, hyp: np.ndarray, score: float,
                  ref: np.ndarray | None) -> None:
    log.debug(f"seq_tag: {tag!r}, output {setup.layers.decided!r}: {hyp.tolist()!r}, score {score:f}")
    if setup.text is not None:
        if ref is not None:
            log.debug(f"  ref: {setup.text.text(ref, tag)}")
        log.debug(f"  hyp: {setup.text.text(hyp, tag)}")


def summary(setup: SearchSetup, results: list[SeqResult], steps: int, sums: np.ndarray) -> list[str]:
    """RETURNN's closing line of a search, then the word (or label) error rate of the hypotheses. The line
    has RETURNN's scores: each scored loss layer's loss and error divided by its count (``sums``, rows in
    the order of ``setup.scored``), and the decide layer's ``edit_distance`` error; an ``edit_distance``
    loss has an error only."""
    if setup.target is None:
        return [f"Search done. Num steps {steps}, Final: score None error None"]
    scores, errors = {}, {}
    for name, (loss, error, count) in zip(setup.scored, sums):
        if setup.model.loss_objects[name].loss != "edit_distance":
            scores[name] = loss / count if count else float("nan")
        errors[name] = error / count if count else float("nan")
    label_errors, ref_labels = sum(r.label_errors for r in results), sum(r.ref_labels for r in results)
    rate = label_errors / max(ref_labels, 1)
    # the decide layer's edit_distance loss: none where the layer drops its loss in a search
    # (loss_only_on_non_search)
    decide = setup.layers.decide
    opts = setup.model.specs[decide].opts if decide else {}
    if opts.get("loss") == "edit_distance" and not opts.get("loss_only_on_non_search"):
        errors[decide] = rate
    lines = [f"Search done. Num steps {steps}, Final: score {returnn_scores(scores)} error "
             f"{returnn_scores(errors)}"]
    if setup.text is not None and setup.text.has_words:
        errors, words = sum(r.word_errors for r in results), sum(r.ref_words for r in results)
        lines.append(f"search: WER {errors / max(words, 1):.6f} ({errors} word errors / {words} reference "
                     f"words, {len(results)} sequences)")
    else:
        lines.append(f"search: label error rate {rate:.6f} ({label_errors} label errors / {ref_labels} "
                     f"reference labels, {len(results)} sequences)")
    return lines


def returnn_scores(values: dict[str, float]) -> str:
    """Scores as RETURNN prints them (``Engine.format_score``): None, one value alone, or "<layer> <value>"
    pairs in order of the layers' names."""
    if not values:
        return "None"
    if len(values) == 1:
        return str(next(iter(values.values())))
    return " ".join(f"{name} {values[name]}" for name in sorted(values))


def run_search(config: Config) -> None:
    comm = start(config).comm
    tmp = None
    try:
        setup, error = None, None
        try:
            setup = _prepare(config, comm)
            if comm.rank == 0 and setup.output_file:  # an unwritable place fails now, not after the search
                tmp = _create_temp(setup.output_file)
        except EngineError as exc:
            error = exc
        agree_on_failure(comm, error)
        broadcast_initial(comm, list(setup.model.variables))
        log.info(f"search: {setup.dataset.num_seqs} sequences of {setup.dataset.name}, output layer(s) "
                 f"{', '.join(setup.layers.outputs)}, on {comm.size} rank(s)"
                 + (f", into {setup.output_file}" if tmp else ""))
        part = None
        try:
            part = search_shard(setup, comm.rank, comm.size)
        except EngineError as exc:
            error = exc
        agree_on_failure(comm, error)
        parts = comm.gather_object(part, root=0)
        lines = None
        if comm.rank == 0:
            try:
                lines = _write_and_score(setup, parts, tmp)
            except EngineError as exc:
                error = exc
        agree_on_failure(comm, error)
        for line in comm.broadcast_object(lines, root=0):
            log.info(line)
    finally:
        if tmp is not None:  # unfinished (once renamed, nothing is left under this name)
            discard(tmp)


def _create_temp(output_file: str) -> str:
    try:
        return create_temp_beside(output_file)
    except OSError as exc:
        raise DataError(f"Cannot create the search output file '{output_file}': {exc.strerror}.") from None


def _write_and_score(setup: SearchSetup, parts: list[ShardResult], tmp: str | None) -> list[str]:
    """On rank 0: every rank's results in corpus order into the file; the summary lines."""
    merged = {idx: result for part in parts for idx, result in part.results.items()}
    if len(merged) != setup.dataset.num_seqs or len(merged) != sum(len(part.results) for part in parts):
        raise EngineError(f"search: {len(merged)} hypotheses for {setup.dataset.num_seqs} sequences.")
    ordered = [merged[idx] for idx in sorted(merged)]
    if tmp is not None:
        try:
            write_hypotheses(tmp, setup.output_file, setup.output_format, ordered)
            commit(tmp, setup.output_file)
        except OSError as exc:
            raise DataError(f"Cannot write the search output file '{setup.output_file}': {exc}.") from None
    return summary(setup, ordered, sum(part.steps for part in parts), sum(part.sums for part in parts))
