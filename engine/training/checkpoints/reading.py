"""Reading a checkpoint whole, and telling why one cannot be used.

A checkpoint that cannot be used is one of three things, each handled its own way (docs/long-jobs.md,
"Damaged checkpoints"):

- damaged (``CheckpointDamaged``): not readable as HDF5 (truncated, overwritten with something else), or
  written by this engine but missing a group or attribute that continuing needs. A resume falls back to
  the previous checkpoint (``resume.py``).
- unreadable for now (``TransientIOError``, exit code 1): the read failed with EIO, ESTALE or ETIMEDOUT,
  which a flaky disk or network file system gives and a restart may not meet again; ``supervise``
  restarts on exit code 1. Falling back past such a file would throw away good training.
- not a checkpoint of this engine (a valid HDF5 file without its marks): a ConfigError naming the file;
  falling back past it would hide that something else writes files under the model prefix.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import h5py
import numpy as np

from engine.distributed.protocol import SCORE_NAMES
from engine.runtime.atomic_file import describe_io_error, io_errno
from engine.runtime.errors import TRANSIENT_ERRNOS, ConfigError, TransientIOError

MAIN_GROUPS = ("params", "optimizer")  # rank 0's parameters and optimizer state
RESUME_ARRAYS = ("steps", "batches_done", "scores", "fingerprints")  # a mid-epoch checkpoint's "resume"


class CheckpointDamaged(ConfigError):
    """A checkpoint that cannot be read or misses a part. A ConfigError where nothing older can take its
    place: a restart meets the same file."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"Checkpoint '{path}' cannot be used: {reason}.")
        self.path, self.reason = path, reason


@dataclass
class StoredCheckpoint:
    """A checkpoint file's attributes and every group's arrays (group path -> arrays by name)."""

    path: str
    attrs: dict[str, object]
    groups: dict[str, dict[str, np.ndarray]]

    @property
    def epoch(self) -> int:
        return int(self.attrs.get("epoch", 0))

    @property
    def global_step(self) -> int:
        return int(self.attrs.get("global_step", 0))

    @property
    def run_id(self) -> str | None:
        """The run that wrote it; None for checkpoints from before run ids existed."""
        return str(self.attrs["run_id"]) if self.attrs.get("run_id") else None

    def extras(self) -> tuple[dict[str, object], dict[str, dict[str, np.ndarray]]]:
        """The attributes and the groups besides the main ones that hold arrays (``resume``,
        ``ranks/<r>/...``): what ``resume.rank_parts`` takes."""
        return self.attrs, {name: arrays for name, arrays in self.groups.items()
                            if name not in MAIN_GROUPS and arrays}


def read_checkpoint(path: str) -> StoredCheckpoint:
    """The whole file, read once. Raises CheckpointDamaged (unreadable as HDF5), TransientIOError, or
    ConfigError (a valid HDF5 file that this engine did not write); parts a resume needs are checked by
    ``missing_part``."""
    groups: dict[str, dict[str, np.ndarray]] = {}
    try:
        with h5py.File(path, "r") as f:
            attrs = {key: _plain(value) for key, value in f.attrs.items()}

            def visit(name: str, obj: object) -> None:  # returning a value would end the visit
                if isinstance(obj, h5py.Group):
                    groups[name] = {key.replace("|", "/"): ds[()] for key, ds in obj.items()
                                    if isinstance(ds, h5py.Dataset)}

            f.visititems(visit)
            top_level = sorted(f)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:  # h5py's errors for broken files
        if io_errno(exc) in TRANSIENT_ERRNOS:
            raise TransientIOError(
                f"Checkpoint '{path}' could not be read: {describe_io_error(exc)}, an I/O error of the disk "
                "or network file system that may pass. Ending with exit code 1, on which `supervise` "
                "restarts the job; if it persists, check that file system.") from None
        raise CheckpointDamaged(path, _why_unreadable(exc)) from None
    if "engine_version" not in attrs and "params" not in groups:
        held = ", ".join(top_level[:8]) or "nothing"
        raise ConfigError(
            f"'{path}' is an HDF5 file but not a checkpoint of this engine (no 'engine_version' attribute, "
            f"no 'params' group; it holds: {held}). Something else writes under this model prefix: move "
            "that file away or choose another `model` path.")
    return StoredCheckpoint(path, attrs, groups)


def missing_part(stored: StoredCheckpoint, mid_epoch: bool) -> str | None:
    """What a checkpoint of this engine lacks for continuing training (None: nothing), e.g. ``it has no
    group 'resume'``: a group or attribute deleted, or a partial write by an old version."""
    attrs, groups = stored.attrs, stored.groups
    needed_attrs = ["epoch", "global_step"] + (["learning_rate"] if mid_epoch else [])
    needed_groups = list(MAIN_GROUPS) + (["resume"] if mid_epoch else [])
    ranks = int(attrs.get("ranks", 1))
    if any(name.startswith("ranks/") for name in groups):  # param mode: every rank's own state
        for rank in range(1, ranks):
            needed_groups += [f"ranks/{rank}/optimizer"] + ([f"ranks/{rank}/params"] if mid_epoch else [])
    for name in needed_attrs:
        if name not in attrs:
            return f"it has no attribute '{name}'"
    for name in needed_groups:
        if name not in groups:
            return f"it has no group '{name}'"
    if not groups["params"]:
        return "its group 'params' is empty"
    if mid_epoch:
        kind = attrs.get("kind", "mid-epoch")
        if kind != "mid-epoch":
            return f"its name says mid-epoch, its attribute 'kind' says {kind!r}"
        for name in RESUME_ARRAYS:
            if len(groups["resume"].get(name, ())) != ranks:
                return f"its group 'resume' has no {name!r} for each of its {ranks} ranks"
        shape = np.shape(groups["resume"]["scores"])
        if len(shape) != 2 or shape[1] not in (len(SCORE_NAMES) - 1, len(SCORE_NAMES)):  # older: 1 fewer
            return f"its group 'resume' has 'scores' of shape {shape}, not (ranks, {len(SCORE_NAMES)})"
    return None


def _why_unreadable(exc: BaseException) -> str:
    text = str(exc)
    if match := re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", text):
        return f"it is truncated ({match.group(1)} of {match.group(2)} bytes)"
    if "signature not found" in text:
        return "it is not an HDF5 file (no HDF5 signature: overwritten, or cut short before its header)"
    return f"it cannot be read as HDF5 ({describe_io_error(exc) if io_errno(exc) else text})"


def _plain(value: object) -> object:
    """HDF5 attribute values as Python values: numpy scalars as numbers, bytes as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value.item() if isinstance(value, np.generic) else value
