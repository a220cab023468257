"""TensorBoard curves of a training run, written by rank 0 with ``tf.summary``.

Tags (the x axis is the global step for ``train/*``, the epoch for ``epoch/*``):

- every ``step_interval`` steps: ``train/score``, ``train/error``, ``train/learning_rate``,
  ``train/frames_per_sec`` (the step's values, as the step loop passes them);
- every epoch: ``epoch/<name>`` for each score of the learning-rate file (``epoch/train_score``,
  ``epoch/dev_score``, ``epoch/dev_error``, ``epoch/eval_score``, ...), and ``epoch/learning_rate``,
  ``epoch/frames_per_sec``, ``epoch/computing_percent``, ``epoch/collective_percent``,
  ``epoch/data_wait_percent`` (shares of the epoch's wall time, in percent).

Resume: a run that continues from global step S and epoch E first cuts the event files already in the
directory back to steps <= S (``train/*`` and any other tag) and epochs <= E (``epoch/*``): each file
holding later events (an interrupted run writes past its last checkpoint) is rewritten without them,
atomically; a file left without summaries is removed. The curves then continue without a duplicate
step, whatever reader looks at them (TensorBoard's own purging of orphaned steps applies only to its
legacy loader). A fresh run (S = E = 0) starts with an empty directory of curves. The directory
belongs to the run: other event files in it are cut back as well.

The rewrite's temp file is named ``.tb-rewrite.<random>.tmp``, without "tfevents": TensorBoard reads
every file whose name contains that, and would show a temp file left by a killed rewrite as a second
copy of the steps. Such leftovers (also those of earlier versions, named after the event file) are
removed before the cut.

Config keys (read by ``TensorBoardWriter.from_config``): ``tensorboard`` [True] switches the curves
on or off; ``tensorboard_dir`` [``<model dir>/tensorboard``, i.e. beside the ``model`` prefix; without
``model`` and without this key there are no curves]; ``tensorboard_step_interval`` [100].
"""
from __future__ import annotations

import os
import re
import time
from typing import Mapping

import tensorflow as tf
from tensorflow.core.util import event_pb2

from engine.runtime.atomic_file import atomic_path
from engine.runtime.errors import ConfigError

EPOCH_PREFIX = "epoch/"
STEP_PREFIX = "train/"
_EVENT_FILE = re.compile(r"events\.out\.tfevents\.")
_EVENT_FILE_STAMP = re.compile(r"events\.out\.tfevents\.(\d+)\.")
_REWRITE_PREFIX = ".tb-rewrite."  # temp files of rewrites: no "tfevents" in the name (module docstring)
# Left by killed rewrites: ours, and earlier versions' (atomic_file's default name, and "<file>.tmp-N").
_STALE_TEMP = re.compile(r"(\.tb-rewrite\..*|\.events\.out\.tfevents\..*)\.tmp$"
                         r"|events\.out\.tfevents\..*\.tmp-\d+$")


def _read_events(path: str) -> list[event_pb2.Event]:
    """The events of one file; a torn record at the end (a crash mid-write) ends the list."""
    events = []
    try:
        for record in tf.data.TFRecordDataset(path):
            events.append(event_pb2.Event.FromString(record.numpy()))
    except tf.errors.DataLossError:
        pass
    return events


def _keep(event: event_pb2.Event, max_step: int, max_epoch: int) -> event_pb2.Event | None:
    """``event`` without the summary values past the resume point; None if nothing is left of it."""
    if not event.HasField("summary"):
        return event  # file version, graph and such: no step of ours
    values = [v for v in event.summary.value
              if event.step <= (max_epoch if v.tag.startswith(EPOCH_PREFIX) else max_step)]
    if len(values) == len(event.summary.value):
        return event
    if not values:
        return None
    kept = event_pb2.Event()
    kept.CopyFrom(event)
    del kept.summary.value[:]
    kept.summary.value.extend(values)
    return kept


def cut_event_files(log_dir: str, max_step: int, max_epoch: int) -> int:
    """Cut the event files in ``log_dir`` back to the resume point (see the module docstring);
    returns how many summary events were dropped."""
    if not os.path.isdir(log_dir):
        return 0
    dropped = 0
    for name in sorted(os.listdir(log_dir)):
        path = os.path.join(log_dir, name)
        if _STALE_TEMP.match(name) and os.path.isfile(path):  # left by a rewrite that was killed
            os.remove(path)
            continue
        if not _EVENT_FILE.match(name) or not os.path.isfile(path):
            continue
        events = _read_events(path)
        kept = [k for k in (_keep(e, max_step, max_epoch) for e in events) if k is not None]
        if kept == events and os.path.getsize(path) == sum(_record_size(e) for e in events):
            continue
        dropped += sum(e.HasField("summary") for e in events) - sum(k.HasField("summary") for k in kept)
        if not any(k.HasField("summary") for k in kept):
            os.remove(path)
            continue
        with atomic_path(path, prefix=_REWRITE_PREFIX) as tmp:
            with tf.io.TFRecordWriter(tmp) as writer:
                for event in kept:
                    writer.write(event.SerializeToString())
    return dropped


def _record_size(event: event_pb2.Event) -> int:
    """Bytes of one TFRecord: length (8), its CRC (4), the data, the data's CRC (4)."""
    return 16 + event.ByteSize()


def _wait_for_a_later_file_name(log_dir: str) -> None:
    """Readers take a directory's event files in name order, and the name starts with the writer's
    start time in whole seconds: a file begun in this same second (a run that died at once) could
    sort after ours, its old steps after our new ones. Wait for the next second then."""
    stamps = [int(m.group(1)) for name in (os.listdir(log_dir) if os.path.isdir(log_dir) else [])
              if (m := _EVENT_FILE_STAMP.match(name))]
    if stamps:
        wait = max(stamps) + 1 - time.time()
        if 0 < wait <= 1:  # a clock far behind another host's files cannot be helped
            time.sleep(wait)


def settings_from_config(config) -> tuple[str, int] | None:
    """(directory, step interval) as the config asks (keys in the module docstring), None when off.
    Checks the keys without touching the directory, so that every rank can check them."""
    if not config.bool("tensorboard"):
        return None
    log_dir = config.str("tensorboard_dir")
    if log_dir is None:
        model = config.str("model")
        if not model:
            return None
        log_dir = os.path.join(os.path.dirname(model), "tensorboard")
    interval = config.int("tensorboard_step_interval")
    if interval < 1:
        raise ConfigError(f"Config key 'tensorboard_step_interval' must be at least 1, got {interval}.")
    return log_dir, interval


class TensorBoardWriter:
    """Rank 0's summary writer: ``step`` every step (it writes every ``step_interval``), ``epoch``
    once an epoch's scores are known, ``close`` at the end."""

    def __init__(self, log_dir: str, *, step_interval: int = 100, resume_step: int = 0,
                 resume_epoch: int = 0) -> None:
        if step_interval < 1:
            raise ValueError(f"step_interval must be >= 1, got {step_interval}")
        self.log_dir = log_dir
        self.step_interval = step_interval
        cut_event_files(log_dir, resume_step, resume_epoch)
        _wait_for_a_later_file_name(log_dir)
        os.makedirs(log_dir, exist_ok=True)
        self._writer = tf.summary.create_file_writer(log_dir)

    @classmethod
    def from_config(cls, config, *, resume_step: int = 0,
                    resume_epoch: int = 0) -> "TensorBoardWriter | None":
        """The writer the config asks for (keys in the module docstring), or None when off."""
        settings = settings_from_config(config)
        if settings is None:
            return None
        log_dir, interval = settings
        return cls(log_dir, step_interval=interval, resume_step=resume_step, resume_epoch=resume_epoch)

    def wants_step(self, global_step: int) -> bool:
        """Whether ``step(global_step, ...)`` writes: lets the caller skip computing the values."""
        return global_step % self.step_interval == 0

    def step(self, global_step: int, *, score: float | None = None, error: float | None = None,
             learning_rate: float | None = None, frames_per_sec: float | None = None) -> bool:
        """Write the ``train/*`` scalars (those not None) if ``global_step`` is a multiple of the
        interval; returns whether it wrote."""
        if not self.wants_step(global_step):
            return False
        self._scalars(global_step, {STEP_PREFIX + "score": score, STEP_PREFIX + "error": error,
                                    STEP_PREFIX + "learning_rate": learning_rate,
                                    STEP_PREFIX + "frames_per_sec": frames_per_sec})
        return True

    def epoch(self, epoch: int, scores: Mapping[str, float], *, learning_rate: float | None = None,
              frames_per_sec: float | None = None, computing_percent: float | None = None,
              collective_percent: float | None = None, data_wait_percent: float | None = None) -> None:
        """Write the ``epoch/*`` scalars of ``epoch`` (scores named as in the learning-rate file) and
        flush, so that the curves are on disk once the epoch is."""
        values: dict[str, float | None] = {EPOCH_PREFIX + name: value for name, value in scores.items()}
        values.update({
            EPOCH_PREFIX + "learning_rate": learning_rate,
            EPOCH_PREFIX + "frames_per_sec": frames_per_sec,
            EPOCH_PREFIX + "computing_percent": computing_percent,
            EPOCH_PREFIX + "collective_percent": collective_percent,
            EPOCH_PREFIX + "data_wait_percent": data_wait_percent,
        })
        self._scalars(epoch, values)
        self.flush()

    def _scalars(self, step: int, values: Mapping[str, float | None]) -> None:
        with self._writer.as_default(step=step):
            for tag, value in values.items():
                if value is not None:
                    tf.summary.scalar(tag, float(value))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
