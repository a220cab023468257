"""The model's running state across data-parallel ranks: ``batch_norm``'s running statistics.

The train step updates them from the rank's own batch (``SeqModel.running_state``); they get no gradient,
so no reduction makes them equal on every rank, as with RETURNN + Horovod, whose ranks keep their own and
whose rank 0 saves its own. This engine averages them over the ranks wherever the ranks must hold one
model: at the end of each train epoch (before dev scoring and the epoch's checkpoint) and before each
mid-epoch checkpoint. Every checkpoint then holds what every rank continues with, so a resumed run goes on
exactly as one that did not stop. Training itself never reads them with RETURNN's default ``use_sample``
0 (the batch's own statistics normalise in training), so the averages change no update.
"""
from __future__ import annotations

from engine.distributed.backend import Communicator
from engine.model.base import SeqModel


def average_running_state(comm: Communicator, model: SeqModel) -> None:
    """Every rank's running state replaced by the ranks' mean. Every rank calls it at the same point (the
    ranks build the same model, so all of them or none have a running state)."""
    variables = list(model.running_state().values())
    if comm.size == 1 or not variables:
        return
    with comm.stall_guard("running statistics average"):
        averaged = comm.allreduce([v.numpy() for v in variables], "average")
    for var, value in zip(variables, averaged):
        var.assign(value)
