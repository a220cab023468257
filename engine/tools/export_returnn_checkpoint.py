"""Write a checkpoint of this engine as a RETURNN TensorFlow checkpoint, for the same ``network`` config.

    export-returnn-checkpoint CONFIG CHECKPOINT OUT [--overwrite]

(or ``python tools/export_returnn_checkpoint.py ...``). CONFIG is the config the checkpoint was trained
with: its ``network`` (a dict or ``get_network``), and its stream dims from ``extern_data`` (or
``num_inputs``/``num_outputs``), else from its ``train``, ``dev`` or ``eval`` dataset. CHECKPOINT is
this engine's checkpoint file (``<model>.<NNN>``; a RETURNN one is read too). OUT is the prefix of the
RETURNN checkpoint: ``OUT.index``, ``OUT.data-00000-of-00001`` and ``OUT.meta``, as RETURNN's own saver
writes them, with RETURNN's variable names and layouts (``engine/training/checkpoints/returnn_format.py``)
and the checkpoint's global step as ``global_step``. RETURNN with the same network then takes it as
``load = "OUT"``, ``import_model_train_epoch1`` or a ``preload_from_files`` entry, and with
``OUT = <model>.<NNN>`` (next to this engine's file of that name) as epoch NNN of ``model``.

The files are written under temporary names and renamed; existing files of OUT are kept unless
``--overwrite``, which removes them once the new files are complete, just before renaming those into
place: a crash in between leaves an incomplete set that RETURNN does not load (rerun the export), never
the new data beside the old ``.index`` (``write_checkpoint``). The optimizer's state is not written:
RETURNN's own checkpoints hold none either (it saves the parameters and ``global_step``, and starts its
optimizer afresh when it loads one).
"""
from __future__ import annotations

import argparse
import os
import sys

from engine.config.loader import Config
from engine.runtime.errors import ConfigError, EngineError

NAME = "export-returnn-checkpoint"


def build(config: Config):
    """The config's model, with the stream dims it declares or its first dataset's."""
    from engine.datasets import data_dims, dataset_from_config
    from engine.model import build_model

    dataset = None
    if not (config.has("extern_data") or config.has("num_inputs") or config.has("num_outputs")):
        datasets = (dataset_from_config(config, key) for key in ("train", "dev", "eval"))
        dataset = next((d for d in datasets if d is not None), None)
    dims = data_dims(config, dataset)
    return build_model(config, input_dim=dims.input_dim, input_sparse=dims.input_sparse,
                       target_dims=dims.target_dims)


def global_step_of(path: str) -> int:
    from engine.training.checkpoints.reading import read_checkpoint
    from engine.training.checkpoints.returnn_files import returnn_prefix

    return 0 if returnn_prefix(path) is not None else read_checkpoint(path).global_step


def export(config_path: str, checkpoint: str, out: str, overwrite: bool = False) -> list[str]:
    """Read ``checkpoint`` into the config's network and write it under ``out``; returns the files."""
    # here, not at the top: TensorFlow's start-up lines are silenced in main() before it is imported
    from engine.training.checkpoints.initial_params import Loaded, Options, load_params
    from engine.training.checkpoints.returnn_files import files_of, write_checkpoint
    from engine.training.checkpoints.returnn_format import ReturnnView

    existing = files_of(out)
    if existing and not overwrite:
        raise ConfigError(f"{', '.join(existing)} exist(s) already; pass --overwrite to replace the RETURNN "
                          f"checkpoint '{out}'.")
    config = Config.from_sources([config_path], [])
    model = build(config)
    view = ReturnnView(model)
    load_params(checkpoint, model, Options("CHECKPOINT"), Loaded(model))  # every parameter, strictly
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    return write_checkpoint(out, view.values(), global_step_of(checkpoint))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=NAME, description=__doc__.split("\n\n")[0])
    parser.add_argument("config", metavar="CONFIG")
    parser.add_argument("checkpoint", metavar="CHECKPOINT")
    parser.add_argument("out", metavar="OUT", help="prefix of the RETURNN checkpoint's files")
    parser.add_argument("--overwrite", action="store_true", help="replace existing files of OUT")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # as rnn.py: no oneDNN / CPU feature lines
    try:
        written = export(args.config, args.checkpoint, args.out, args.overwrite)
    except EngineError as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"Wrote {args.out} (RETURNN's TensorFlow format): {', '.join(written)}. RETURNN loads it for the "
          "network of "
          f"{args.config} with load = {args.out!r}.")
    return 0
