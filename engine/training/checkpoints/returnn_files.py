"""RETURNN's TensorFlow checkpoint files: telling them from this engine's, reading and writing them.

RETURNN saves epoch N of ``model = "out/net"`` with TensorFlow's ``Saver`` as ``out/net.00N.index``,
``out/net.00N.data-00000-of-00001`` and ``out/net.00N.meta``, and names it by the common prefix
``out/net.00N`` (``load`` may also name the ``.index`` or ``.meta`` file). This engine's checkpoint is one
HDF5 file at exactly its name (``file_format.py``). So a name that is a file is this engine's, as it
always was, and a name whose ``.index`` exists is RETURNN's. Reading needs TensorFlow only
(``tf.train.load_checkpoint``), not RETURNN.

Writing (``write_checkpoint``) makes what RETURNN's ``Saver`` makes, ``.meta`` included: RETURNN looks for
``<prefix>.meta`` to tell whether a checkpoint exists (``load``, ``import_model_train_epoch1``, the epochs
under ``model``), though it never reads the graph in it. The files are written under a temporary prefix
beside the target and renamed into place, the data first, then the ``.index``, the ``.meta`` last. Files
of an older checkpoint under the same prefix are removed before the first rename (its ``.meta`` first,
then its ``.index``, then its data): renames replace one file at a time, so a crash between them would
otherwise leave the new data beside the old ``.index`` (read as a checkpoint, with wrong values). A crash
now leaves an incomplete set, which RETURNN and TensorFlow refuse (no ``.meta``, or no ``.index``), never
a mix of old and new files.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import tensorflow as tf

from engine.runtime.atomic_file import describe_io_error
from engine.runtime.errors import ConfigError, EngineError

FORMAT = "RETURNN's TensorFlow format"
SUFFIXES = (".index", ".meta")  # the names RETURNN's `load` takes besides the prefix
GLOBAL_STEP = "global_step"  # RETURNN's variable with the update count


def returnn_prefix(path: str) -> str | None:
    """The checkpoint prefix if ``path`` names a RETURNN TensorFlow checkpoint (its prefix, ``.index`` or
    ``.meta`` file), else None: this engine's own file, or nothing there."""
    for suffix in SUFFIXES:
        if path.endswith(suffix) and os.path.isfile(path[: -len(suffix)] + ".index"):
            return path[: -len(suffix)]
    if os.path.isfile(path):
        return None  # this engine's HDF5 file, even if RETURNN files share its name as their prefix
    return path if os.path.isfile(path + ".index") else None


def files_of(prefix: str) -> list[str]:
    """The files of the checkpoint ``prefix`` that exist."""
    candidates = [prefix + ".index", prefix + ".meta", *glob.glob(glob.escape(prefix) + ".data-*")]
    return sorted(p for p in candidates if os.path.isfile(p))


@dataclass
class TfCheckpoint:
    """A TensorFlow checkpoint opened for reading: its variables' shapes, and their values on demand."""

    path: str  # the prefix
    shapes: dict[str, tuple[int, ...]]
    _reader: object

    def read(self, name: str) -> np.ndarray:
        try:
            return self._reader.get_tensor(name)
        except tf.errors.OpError as exc:
            raise ConfigError(f"Checkpoint '{self.path}' ({FORMAT}): variable {name!r} cannot be read: "
                              f"{exc.message}.") from None

    def global_step(self) -> int | None:
        return int(self.read(GLOBAL_STEP)) if GLOBAL_STEP in self.shapes else None


def open_checkpoint(prefix: str) -> TfCheckpoint:
    """Open the checkpoint ``prefix``; an unreadable one is a ConfigError naming it."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = {name: tuple(shape) for name, shape in reader.get_variable_to_shape_map().items()}
    except (tf.errors.OpError, ValueError) as exc:
        detail = getattr(exc, "message", None) or str(exc)
        raise ConfigError(f"Checkpoint '{prefix}' ({FORMAT}: {', '.join(files_of(prefix)) or 'no files'}) "
                          f"cannot be read: {detail.strip()}.") from None
    return TfCheckpoint(prefix, shapes, reader)


def write_checkpoint(prefix: str, values: Mapping[str, np.ndarray], global_step: int = 0) -> list[str]:
    """Write ``values`` (RETURNN's names -> arrays) and ``global_step`` as the TensorFlow checkpoint
    ``prefix``, as RETURNN's Saver does; returns the files written. A failed write is an EngineError
    naming the prefix; the files of an earlier checkpoint under that prefix are removed only once the new
    ones are complete under their temporary names, and before the first of them is renamed into place."""
    folder = os.path.dirname(os.path.abspath(prefix))
    tmp = os.path.join(folder, f".{os.path.basename(prefix)}.{os.getpid()}.tmp")
    try:
        _save(tmp, values, global_step)
        old = files_of(prefix)
        for path in sorted(old, key=lambda p: (not p.endswith(".meta"), not p.endswith(".index"))):
            os.remove(path)  # the .meta, the .index, then the data: never new data beside an old index
        written = []
        data = sorted(glob.glob(glob.escape(tmp) + ".data-*"))
        for source in data + [tmp + ".index", tmp + ".meta"]:
            target = prefix + source[len(tmp):]
            os.replace(source, target)
            written.append(target)
        return written
    except (OSError, tf.errors.OpError) as exc:
        detail = describe_io_error(exc) if isinstance(exc, OSError) else exc.message
        raise EngineError(f"Cannot write the RETURNN checkpoint '{prefix}': {detail}.") from None
    finally:
        for leftover in glob.glob(glob.escape(tmp) + ".*"):
            os.remove(leftover)


def _save(prefix: str, values: Mapping[str, np.ndarray], global_step: int) -> None:
    """TensorFlow 1's Saver in a graph of its own, the values fed in (not stored as constants in .meta)."""
    with tf.Graph().as_default():
        feeds, variables = {}, {}
        for name, value in {**values, GLOBAL_STEP: np.array(global_step, np.int64)}.items():
            value = np.asarray(value)
            placeholder = tf.compat.v1.placeholder(value.dtype, value.shape)
            variables[name] = tf.compat.v1.Variable(placeholder, name=name, trainable=name != GLOBAL_STEP)
            feeds[placeholder] = value
        saver = tf.compat.v1.train.Saver(var_list=variables)
        with tf.compat.v1.Session() as session:
            session.run([v.initializer for v in variables.values()], feeds)
            saver.save(session, prefix, write_meta_graph=True, write_state=False)
