"""Checkpoints: one HDF5 file ``<model>.<NNN>`` per saved epoch, written atomically, and mid-epoch ones
``<model>.<NNN>.step<S>`` (epoch NNN in progress, at global step S; ``resume.py`` says what they hold).

A checkpoint holds the model's variables and the optimizer's state by name, plus the epoch and the
global step, and whatever attributes and extra groups of arrays its writer adds. It is written through
``atomic_file``, so a crash, kill or full disk during a save leaves the previous checkpoint intact and
never a partial file under a checkpoint's name. One file (rather than TensorFlow's index + data shards)
keeps the rename atomic. Reading, and telling a damaged file from a foreign one or a passing I/O error:
``reading.py``.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import h5py
import numpy as np
import tensorflow as tf

import engine
from engine.config.loader import Config
from engine.distributed.backend import Communicator
from engine.report import phases
from engine.report.timeline import CHECKPOINT
from engine.runtime.atomic_file import atomic_path, describe_io_error
from engine.runtime.errors import ConfigError, EngineError
from engine.training.checkpoints.reading import MAIN_GROUPS, StoredCheckpoint, read_checkpoint
from engine.training.update.loss_scale import PREFIX as LOSS_SCALE_PREFIX


def checkpoint_path(model_prefix: str, epoch: int) -> str:
    return f"{model_prefix}.{epoch:03d}"


def mid_epoch_path(model_prefix: str, epoch: int, global_step: int) -> str:
    return f"{model_prefix}.{epoch:03d}.step{global_step}"


def _mid_epoch_pattern(model_prefix: str) -> re.Pattern:
    return re.compile(re.escape(os.path.basename(model_prefix)) + r"\.(\d{3,})\.step(\d+)$")


def find_mid_epoch_checkpoints(model_prefix: str) -> list[tuple[int, int, str]]:
    """(epoch, global step, path) of every mid-epoch checkpoint of ``model_prefix``, oldest first."""
    pattern = _mid_epoch_pattern(model_prefix)
    found = [(int(m.group(1)), int(m.group(2)), path) for path in glob.glob(glob.escape(model_prefix) + ".*")
             if (m := pattern.match(os.path.basename(path)))]
    return sorted(found, key=lambda item: (item[1], item[0]))


def remove_superseded(model_prefix: str, keep: str) -> list[str]:
    """After ``keep`` was saved: remove every other mid-epoch checkpoint of ``model_prefix`` and the temp
    files that killed saves of checkpoints left behind. Returns the removed paths."""
    base = re.escape(os.path.basename(model_prefix))
    temp = re.compile(rf"\.{base}\.\d{{3,}}(\.step\d+)?\..+\.tmp$")  # atomic_file's temp names
    folder = os.path.dirname(os.path.abspath(model_prefix))
    doomed = [path for _, _, path in find_mid_epoch_checkpoints(model_prefix)
              if os.path.abspath(path) != os.path.abspath(keep)]
    doomed += [os.path.join(folder, name) for name in os.listdir(folder) if temp.match(name)]
    removed = []
    for path in doomed:
        try:
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def find_epochs(model_prefix: str) -> list[int]:
    """The epochs N with a file ``<model>.<NNN>``, in order, ignoring temp files of interrupted saves."""
    pattern = re.compile(re.escape(os.path.basename(model_prefix)) + r"\.(\d{3,})$")
    return sorted(int(m.group(1)) for path in glob.glob(glob.escape(model_prefix) + ".*")
                  if (m := pattern.match(os.path.basename(path))))


def find_newest_epoch(model_prefix: str) -> int | None:
    """The highest epoch N with a file ``<model>.<NNN>``."""
    epochs = find_epochs(model_prefix)
    return epochs[-1] if epochs else None


def checkpoint_to_load(config: Config, comm: Communicator) -> tuple[str, int]:
    """For eval/forward: ``load`` (a checkpoint file), else ``<model>.<load_epoch>``, else the newest
    ``<model>.<NNN>``. Rank 0 decides; every rank gets (path, epoch)."""
    found: tuple[str, int] | None = None
    if comm.rank == 0:
        prefix = config.str("model")
        if config.str("load"):
            found = (config.str("load"), 0)
        elif prefix and config.has("load_epoch"):
            found = (checkpoint_path(prefix, config.int("load_epoch")), config.int("load_epoch"))
        elif prefix and (newest := find_newest_epoch(prefix)) is not None:
            found = (checkpoint_path(prefix, newest), newest)
    found = comm.broadcast_object(found, root=0)
    if found is None:
        raise ConfigError("No model to load: set 'load' to a checkpoint file, or 'model' to the prefix of "
                          "trained checkpoints (<model>.<NNN>), optionally with 'load_epoch'.")
    return found


Variables = Union[Mapping[str, tf.Variable], Sequence[tf.Variable]]


def named(variables: Variables) -> dict[str, tf.Variable]:
    """Variables by stable name: a mapping as given; a list by the variables' own names (``adam/m:0``
    -> ``adam/m``), a repeated name getting ``#2``, ``#3``... in order."""
    if isinstance(variables, Mapping):
        return dict(variables)
    result: dict[str, tf.Variable] = {}
    for var in variables:
        base = (getattr(var, "path", None) or var.name).split(":")[0]
        name, n = base, 1
        while name in result:
            n += 1
            name = f"{base}#{n}"
        result[name] = var
    return result


def current_values(variables: Variables) -> dict[str, np.ndarray]:
    """Each variable's value by name as a read-only array over TensorFlow's own buffer: ``Variable.numpy``
    copies, and fresh memory is slow to fault in on some virtual machines (a 134 MB model with its optimizer
    state took 0.3-0.7 s to copy, against 20 ms for these views). Use them before the variables change."""
    return {name: np.asarray(var.value()) for name, var in named(variables).items()}


@dataclass
class CheckpointInfo:
    epoch: int
    global_step: int


def save_checkpoint(path: str, params: Variables, optimizer_vars: Variables, epoch: int, global_step: int, *,
                    attrs: Mapping[str, object] | None = None,
                    groups: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> None:
    """Write the checkpoint, with extra ``attrs`` (numbers, strings, arrays) and ``groups`` (group path ->
    arrays by name); a failed write (full disk, file size limit, permissions) is an EngineError naming the
    path and the cause, and leaves an existing file of that name as it was."""
    arrays = {group: current_values(variables)
              for group, variables in zip(MAIN_GROUPS, (params, optimizer_vars))}
    arrays.update(groups or {})
    try:
        with phases.span("checkpoint", CHECKPOINT, path=path, epoch=epoch, global_step=global_step), \
                atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            f.attrs["epoch"] = epoch
            f.attrs["global_step"] = global_step
            f.attrs["engine_version"] = engine.__version__
            for key, value in (attrs or {}).items():
                f.attrs[key] = value
            for group_name, values in arrays.items():
                group = f.create_group(group_name)
                for name, value in values.items():
                    group.create_dataset(name.replace("/", "|"), data=value)
    except (OSError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and "errno =" not in str(exc):
            raise  # not a failed write (h5py reports those found while closing as RuntimeError)
        raise EngineError(f"Cannot write checkpoint '{path}': {describe_io_error(exc)}. Earlier checkpoints "
                          "are unchanged; free disk space or fix the permissions of that directory (or "
                          "choose another `model` path), then run again to resume.") from None


def _assign(path: str, what: str, variables: Variables, stored: dict[str, np.ndarray],
            optional: str | None = None) -> None:
    """``optional``: a name prefix whose entries may be missing on either side (then a variable keeps its
    value, a stored value is left unused)."""
    by_name = named(variables)
    if optional:
        by_name = {n: v for n, v in by_name.items() if n in stored or not n.startswith(optional)}
        stored = {n: v for n, v in stored.items() if n in by_name or not n.startswith(optional)}
    names, variables = list(by_name), list(by_name.values())
    missing = [n for n in names if n not in stored]
    unexpected = sorted(set(stored) - set(names))
    wrong_shape = [f"{n}: checkpoint {stored[n].shape} vs network {tuple(v.shape)}"
                   for n, v in zip(names, variables) if n in stored and stored[n].shape != tuple(v.shape)]
    if missing or unexpected or wrong_shape:
        details = []
        if missing:
            details.append(f"missing in the checkpoint: {', '.join(missing[:10])}")
        if unexpected:
            details.append(f"not in the network: {', '.join(unexpected[:10])}")
        if wrong_shape:
            details.append("different shapes: " + "; ".join(wrong_shape[:10]))
        raise ConfigError(f"Checkpoint '{path}' does not match the network ({what}): " + "; ".join(details)
                          + ". Was it saved with another network config? Use another `model` prefix, "
                            "or `start_epoch = 1` to train from scratch.")
    for name, var in zip(names, variables):
        var.assign(stored[name])


def assign_checkpoint(stored: StoredCheckpoint, params: Variables,
                      optimizer_vars: Variables | None = None) -> CheckpointInfo:
    """Assign the stored values; optimizer state only when ``optimizer_vars`` is given (resume). A network
    that does not match is a ConfigError naming the file."""
    _assign(stored.path, "parameters", params, stored.groups.get("params", {}))
    if optimizer_vars is not None and stored.groups.get("optimizer"):
        # the loss scale of tf_amp = "float16" starts afresh when a run switches tf_amp on, and is dropped
        # when it switches it off: the rest of the optimizer state does not depend on it
        _assign(stored.path, "optimizer state", optimizer_vars, stored.groups["optimizer"],
                optional=LOSS_SCALE_PREFIX)
    return CheckpointInfo(stored.epoch, stored.global_step)


def load_checkpoint(path: str, params: Variables, optimizer_vars: Variables | None = None) -> CheckpointInfo:
    """Read ``path`` (``read_checkpoint``: damaged, transient and foreign files each get their error) and
    assign it."""
    if not os.path.isfile(path):
        raise ConfigError(f"Checkpoint '{path}' does not exist.")
    return assign_checkpoint(read_checkpoint(path), params, optimizer_vars)
