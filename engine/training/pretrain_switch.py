"""The trainer's side of RETURNN's pretraining (``engine/model/pretrain.py`` has the schedule).

Per epoch e (``PretrainRun``):
- the config of the epoch: the config with ``network`` = epoch e's network and its ``#config`` keys
  (``learning_rate`` aside, which goes to the learning-rate history);
- the learning rate, as RETURNN's ``init_train_epoch`` chooses it: with ``use_learning_rate_control_always``
  the control's (after ``#config``'s learning_rate is written into the history of epochs <= N); else in the
  pretraining epochs ``pretrain_learning_rate`` (default: ``learning_rate``), in epoch N + 1
  ``learning_rate``, each recorded where the history has no rate for the epoch; later the control's;
- whether the network must be built anew: when epoch e's dict differs from the one built (any difference,
  ``#`` entries included), as RETURNN compares them.

Building anew (``carry_parameters``): the new network gets its initial values (from ``random_seed``, so
every rank the same), then the old values as ``pretrain_copy.py`` says; the trainer makes a new updater
(RETURNN makes a new one with the new graph: optimizer slots and the update count start afresh) and
compiles the steps again. RETURNN's names of the parameters (``returnn_format.ReturnnView``) are what the
copy rule works on, so an LSTM's gate blocks and separate W/W_re are treated as in RETURNN.
"""
from __future__ import annotations

from typing import Any

from engine.config.loader import Config
from engine.model.pretrain import PretrainSchedule
from engine.runtime import log
from engine.training.checkpoints.returnn_format import LOW_MEM, LSTM_LAYOUTS, NATIVE, ReturnnView
from engine.training.pretrain_copy import Split, carry
from engine.training.update.lr_control import EpochData, LearningRateControl

_NO_BLOCKS_UNITS = ("vanillalstm",)  # a TF cell in RETURNN: its variables carry no split info


class PretrainRun:
    """The schedule as the trainer follows it: which network is built, per-epoch config and rate."""

    def __init__(self, config: Config, schedule: PretrainSchedule) -> None:
        self.config, self.schedule = config, schedule
        self.built: dict | None = None  # the dict of the network built now (RETURNN's layers_desc)
        self.always = config.bool("use_learning_rate_control_always")
        self.pretrain_rate = config.float("pretrain_learning_rate")
        if self.pretrain_rate is None:
            self.pretrain_rate = config.float("learning_rate")

    def epoch_config(self, epoch: int) -> Config:
        """The config with epoch ``epoch``'s network and its ``#config`` keys."""
        values = self.config.as_dict()
        values["network"] = self.schedule.layers(epoch)
        overrides = self.schedule.config_overrides(epoch)
        values.update({k: v for k, v in overrides.items() if k != "learning_rate"})
        epoch_config = Config(values)
        epoch_config.files = list(self.config.files)
        return epoch_config

    def needs_build(self, epoch: int) -> bool:
        return self.built is None or self.schedule.net_dict(epoch) != self.built

    def learning_rate(self, epoch: int, control: LearningRateControl) -> float:
        """Epoch ``epoch``'s rate, recorded in ``control``'s history as RETURNN records it."""
        overridden = self.schedule.config_overrides(epoch).get("learning_rate")
        if overridden is not None and self.schedule.is_pretrain_epoch(epoch):
            old = control.learning_rate_for_epoch(epoch)
            log.info(f"pretraining: learning rate of epoch {epoch} {old:g} -> {overridden:g} ('#config')")
            control.epoch_data[epoch].learning_rate = float(overridden)
        if self.always or epoch > self.schedule.num_epochs + 1:
            return control.learning_rate_for_epoch(epoch)
        pretraining = self.schedule.is_pretrain_epoch(epoch)
        rate = self.pretrain_rate if pretraining else self.config.float("learning_rate")
        data = control.epoch_data.get(epoch)
        if data is None:
            control.epoch_data[epoch] = EpochData(rate)
        elif not data.learning_rate:
            data.learning_rate = rate
        return rate


def output_layers(model: Any) -> list[str]:
    """RETURNN's output layers of a network: 'output', those with a loss and those marked so."""
    return [name for name, spec in model.specs.items()
            if name == "output" or spec.opts.get("loss") or spec.opts.get("is_output_layer")]


def _source_dims(model: Any, name: str) -> list[int]:
    """The dims of the sources a linear layer concatenates, 'copy' layers taken apart (RETURNN's
    ``_get_in_split_info``)."""
    dims, queue = [], list(model.specs[name].sources)
    while queue:
        src = queue.pop(0)
        if src != "data" and model.specs[src].cls == "copy":
            queue = list(model.specs[src].sources) + queue
            continue
        dims.append(model.input_dim if src == "data" else model.layers[src].n_out)
    return dims


def split_info(model: Any, layer: str, returnn_name: str) -> Split | None:
    """RETURNN's axes split info of a parameter of the new network (None: it sets none)."""
    spec, obj = model.specs[layer], model.layers[layer]
    key = returnn_name[len(layer) + 1:]
    if spec.cls in ("linear", "softmax") and key == "W":
        dims = _source_dims(model, layer)
        return [dims, [obj.n_out]] if sum(dims) == obj.in_dim else None
    if spec.cls == "self_attention" and key == "QKV":
        return [[obj.in_dim], [obj.key_dim * obj.heads] * 2 + [obj.n_out]]
    if spec.cls == "rec" and isinstance(spec.opts.get("unit"), dict):
        return obj.split_info(key[len("rec/"):])
    if spec.cls == "rec":
        unit = str(spec.opts.get("unit", "lstm")).lower()
        n, n_in = obj.n_out, obj.in_dim
        if unit in _NO_BLOCKS_UNITS:
            return None
        gates = [n] * 4
        layout = LSTM_LAYOUTS.get(unit)
        if layout is NATIVE:
            return {"rec/W": [[n_in], gates], "rec/W_re": [[n], gates], "rec/b": [gates]}.get(key)
        if layout is LOW_MEM:
            return {"rec/W": [[n_in, n], gates], "rec/b": [gates]}.get(key)
    return None


def carry_parameters(old_model: Any, new_model: Any, mode: str | None,
                     copy_output_layer: bool) -> tuple[list[str], list[str]]:
    """Assign to ``new_model`` what RETURNN carries over from ``old_model``: RETURNN's names of the
    parameters that took old values, and notes for the log."""
    old_view, new_view = ReturnnView(old_model), ReturnnView(new_model)
    layer_of = {name: m.layer for view in (old_view, new_view) for m in view.mappings for name in m.shapes()}
    new_values = new_view.values()
    splits = {name: split_info(new_model, layer_of[name], name) for name in new_values}
    skip = [] if copy_output_layer else output_layers(new_model)
    assigned, notes = carry(old_view.values(), new_values, splits, layer_of, new_model.specs, mode, skip)
    new_view.assign(assigned)
    return sorted(assigned), notes
