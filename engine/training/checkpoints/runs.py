"""Runs under one model prefix: the run id every checkpoint stores, and what a start that does not
continue from the files already there does about them.

Every checkpoint holds the id of the run that wrote it (attribute "run_id"). A start that loads no
checkpoint begins a new run with a new id; a resume keeps the id of the checkpoint it continues from
(one written before run ids existed has none, and the run gets a new one).

A start that does not continue from the newest files -- a fresh start (``start_epoch = 1``, or "auto"
that found nothing to continue), or an explicit ``start_epoch`` N -- may find files of an earlier run
that reach epoch N or beyond: checkpoints ``<model>.<NNN>`` and mid-epoch ones of those epochs, and
those epochs, with scores, in the learning-rate file. Left there, they would take over: a later "auto"
resume continues from the highest numbers, which are the earlier run's, and the learning-rate control
and the summary read its scores as this run's. So such a start is refused with one message naming the
files, unless ``move_old_checkpoints`` is set: then they move into a new folder
``<model>.old-<date>-<time>/`` (the learning-rate file is copied there, and the epochs from N on are
dropped from it in place, since a restart at N > 1 continues the history before N).

Refusing is the default because those files are usually the result of days of training and a fresh
start over them is usually a slip (a reused config, a ``++model`` that missed the learning-rate file,
``start_epoch = 1`` left in a config under ``supervise``); moving them silently would hide the slip and
keep gigabytes of checkpoints around unasked.
"""
from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass, field

from engine.runtime import log
from engine.runtime.atomic_file import describe_io_error, write_text_atomically
from engine.runtime.errors import ConfigError
from engine.training.checkpoints.file_format import checkpoint_path, find_epochs, find_mid_epoch_checkpoints
from engine.training.update.lr_history import format_history, read_history_file, trained_epochs

MOVE_KEY = "move_old_checkpoints"


def new_run_id() -> str:
    """Readable and unique: the start time and 6 random hex digits, e.g. ``20250302-041109-3fa2c1``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@dataclass
class LaterFiles:
    """Files of epochs ``start_epoch`` and later that a start at ``start_epoch`` did not write."""

    start_epoch: int
    checkpoints: list[str] = field(default_factory=list)
    lr_file: str | None = None  # set when it holds trained epochs >= start_epoch
    lr_epochs: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.checkpoints or self.lr_epochs)

    def describe(self) -> str:
        parts = [_first(self.checkpoints)] if self.checkpoints else []
        if self.lr_epochs:
            plural = "s" * (len(self.lr_epochs) > 1)
            parts.append(f"the learning-rate file '{self.lr_file}' with epoch{plural} "
                         f"{epoch_ranges(self.lr_epochs)}")
        return " and ".join(parts)


def later_files(prefix: str | None, lr_file: str | None, start_epoch: int) -> LaterFiles:
    """Rank 0: the checkpoints of ``prefix`` and the learning-rate file's trained epochs from
    ``start_epoch`` on."""
    found = LaterFiles(start_epoch)
    if prefix:
        found.checkpoints = [checkpoint_path(prefix, e) for e in find_epochs(prefix) if e >= start_epoch]
        found.checkpoints += [path for e, _, path in find_mid_epoch_checkpoints(prefix) if e >= start_epoch]
    if lr_file and os.path.exists(lr_file):
        found.lr_epochs = [e for e in trained_epochs(read_history_file(lr_file)) if e >= start_epoch]
        found.lr_file = lr_file
    return found


def refuse_or_move(found: LaterFiles, prefix: str | None, move: bool, continued_from: str | None) -> None:
    """Rank 0, for a start that does not continue from the newest files (module docstring): nothing when
    ``found`` is empty; else move them aside (``move``) or raise a ConfigError naming them."""
    if not found:
        return
    start = found.start_epoch
    base = prefix or found.lr_file
    if not move:
        if continued_from:
            what = f"Training would continue from '{continued_from}' (start_epoch = {start})"
        else:
            what = f"Training would start afresh under the model prefix '{prefix}'" if prefix else \
                "Training would start afresh"
        raise ConfigError(
            f"{what}, but an earlier run left files of epoch {start} and later: {found.describe()}. Left "
            "there, a later resume would continue that run instead of this one, and its scores would count "
            "as this run's. To continue the newest checkpoint, set start_epoch = \"auto\" (the default); to "
            f"start here, delete or move those files, or set {MOVE_KEY} = True to have them moved into a "
            f"new folder '{base}.old-<date>-<time>/'.")
    folder = f"{base}.old-{time.strftime('%Y%m%d-%H%M%S')}"
    kept = {}
    try:
        folder = _new_folder(folder)
        for path in found.checkpoints:
            os.replace(path, os.path.join(folder, os.path.basename(path)))
        if found.lr_epochs:
            shutil.copy2(found.lr_file, os.path.join(folder, os.path.basename(found.lr_file)))
            kept = {e: d for e, d in read_history_file(found.lr_file).items() if e < start}
            if kept:  # a restart at start > 1 continues the history before it
                write_text_atomically(found.lr_file, format_history(kept))
            else:
                os.remove(found.lr_file)
    except OSError as exc:
        raise ConfigError(f"{MOVE_KEY}: cannot move the files of an earlier run ({found.describe()}) into "
                          f"'{folder}/': {describe_io_error(exc)} ({exc.filename or folder}). Move them by "
                          "hand.") from None
    lr_note = f"; the learning-rate file kept its epochs before {start}" if kept else ""
    log.info(f"{MOVE_KEY}: moved {found.describe()} of an earlier run into '{folder}/' (this run starts at "
             f"epoch {start}{lr_note}).")


def epoch_ranges(epochs: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``1-3, 7``."""
    ranges: list[list[int]] = []
    for epoch in sorted(epochs):
        if ranges and epoch == ranges[-1][1] + 1:
            ranges[-1][1] = epoch
        else:
            ranges.append([epoch, epoch])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _first(paths: list[str], shown: int = 6) -> str:
    names = ", ".join(paths[:shown])
    return names + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def _new_folder(base: str) -> str:
    """``base``, or ``base-2``, ``base-3``, ... when a start in the same second made it already."""
    n = 1
    while True:
        folder = base if n == 1 else f"{base}-{n}"
        try:
            os.makedirs(folder)
            return folder
        except FileExistsError:
            n += 1
