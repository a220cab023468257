"""The engine's side of the RETURNN parity fixtures (tests/fixtures/returnn_parity, made by
benchmarks/bench_returnn_parity.py): one update from RETURNN's checkpoint on RETURNN's batch.

    mpirun -np N python returnn_parity_step.py FIXTURE_DIR OUT_DIR CASE...

As the train task builds it: the fixture's engine config (``cases.json``) with ``load`` = the fixture's
RETURNN checkpoint, the model, the updater and the steps from that config, rank 0 loading the checkpoint
(``init_for_training``) and broadcasting it. Each rank then trains one step on its sequences of the
fixture's train batch (``rank_sequences``; padded to its own longest, as its own batch would be), and
rank 0 scores the dev batch before and after. Rank 0 writes ``OUT_DIR/<case>.npz``: the parameters after
the update by RETURNN's names (``param:<name>``) and the dev scores. ``one_update`` does the same in this
process with one rank (the tests and the benchmark call it).
"""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import numpy as np

from engine.config.loader import Config
from engine.distributed import DataParallelSettings, Strategy, broadcast_initial, build_strategy, fail, start
from engine.distributed.local_backend import LocalCommunicator
from engine.model import build_model
from engine.runtime import log
from engine.runtime.errors import EngineError
from engine.training.checkpoints.initial_params import init_for_training
from engine.training.checkpoints.returnn_format import ReturnnView
from engine.training.step import Steps
from engine.training.update.updater import Updater


def fixture_case(fixture_dir: str, name: str) -> dict:
    with open(os.path.join(fixture_dir, "cases.json")) as f:
        return json.load(f)["cases"][name]


def batch(arrays, loss: str, part: str, sequences: list[int] | None = None) -> SimpleNamespace:
    """The fixture's ``part`` batch of ``loss`` (its ``sequences``), padded to its own longest sequence."""
    keys = {key: arrays[f"{loss}/{part}/{key}"] for key in ("data", "classes")}
    lengths = {key: arrays[f"{loss}/{part}/{key}_lengths"] for key in ("data", "classes")}
    if sequences is not None:
        keys = {k: v[sequences] for k, v in keys.items()}
        lengths = {k: v[sequences] for k, v in lengths.items()}
    return SimpleNamespace(data={k: v[:, :int(lengths[k].max())] for k, v in keys.items()}, lengths=lengths)


def dev_score(steps: Steps, dev) -> float:
    """Score of the dev batch as the engine reports it: loss sum / count (RETURNN's dev_score)."""
    loss, _, count, _ = steps.eval(dev)
    return float(loss / count)


def one_update(fixture_dir: str, name: str, strategy: Strategy | None = None) -> dict:
    """The engine's update of case ``name``: {"params": by RETURNN's names, "dev_score_before": ...,
    "dev_score_after": ..., "train_loss_sum": this rank's}. ``strategy``: the data-parallel one (default:
    a single process)."""
    case = fixture_case(fixture_dir, name)
    config = Config({**case["engine"], "load": os.path.join(fixture_dir, name)})
    strategy = strategy or Strategy(LocalCommunicator())
    streams = config.typed("extern_data")
    model = build_model(config, input_dim=streams["data"]["dim"], input_sparse=False,
                        target_dims={"classes": streams["classes"]["dim"]})
    updater = Updater.from_config(config, model.named_trainable_variables(), l2=model.l2_factors(),
                                  parts=model.returnn_parts())
    updater.set_learning_rate(config.float("learning_rate") * strategy.lr_scale)  # as the train task
    steps = Steps(model, updater, strategy)
    if strategy.comm.rank == 0:
        init_for_training(config, model)
    broadcast_initial(strategy.comm, list(model.variables) + updater.variables)
    arrays = np.load(os.path.join(fixture_dir, "batches.npz"))
    dev = batch(arrays, case["loss"], "dev")
    train = batch(arrays, case["loss"], "train", case["rank_sequences"][strategy.comm.rank])
    before = dev_score(steps, dev)
    plan = strategy.before_step(0, train, None)
    scores = steps.train(train)
    strategy.after_step(plan, list(model.trainable_variables))
    return {"params": ReturnnView(model).values(), "dev_score_before": before,
            "dev_score_after": dev_score(steps, dev), "train_loss_sum": float(scores[0])}


def read_results(out_dir: str, name: str) -> dict:
    """What ``main`` wrote for case ``name``, as ``one_update`` returns it."""
    saved = np.load(os.path.join(out_dir, f"{name}.npz"))
    return {"params": {k[len("param:"):]: saved[k] for k in saved.files if k.startswith("param:")},
            **{k: float(saved[k]) for k in ("dev_score_before", "dev_score_after", "train_loss_sum")}}


def main() -> None:
    fixture_dir, out_dir, *names = sys.argv[1:]
    log.init(verbosity=1)
    comm = None
    for name in names:
        config = Config(fixture_case(fixture_dir, name)["engine"])
        if comm is None:  # once per process: it starts MPI
            strategy = start(config)
            comm = strategy.comm
        else:
            strategy = build_strategy(DataParallelSettings.from_config(config), comm)
        result = one_update(fixture_dir, name, strategy)
        if strategy.comm.rank == 0:
            np.savez(os.path.join(out_dir, f"{name}.npz"),
                     **{f"param:{k}": v for k, v in result.pop("params").items()}, **result)


if __name__ == "__main__":
    try:
        main()
    except EngineError as exc:  # as rnn.py ends: one message, the error's exit code
        fail(exc)
