"""RETURNN's ``pretrain``: the network of each epoch, growing towards the config's ``network``.

The schedule (pure Python, no TensorFlow): the networks of ``pretrain_construct.py``, each kept for its
``repetitions`` epochs, give epochs 1..N (N = ``num_epochs``; the last of them is the full network); every
later epoch trains the full network (as resolved for epoch N). Entries of a network that are no layers:

- ``#config``: config keys that hold while the network trains (``config_overrides``; the full network's
  from epoch N on). This engine applies ``learning_rate``, ``batch_size``, ``max_seqs``, ``max_seq_length``
  and ``accum_grad_multiple_step``; any other key is refused by name;
- ``#copy_param_mode``: how parameters are carried into this network (default: the ``copy_param_mode``
  option); ``#repetition``: this network's number of epochs (wins over ``repetitions``).

``WrapEpochValue(func)`` anywhere in the network (in a dict, or directly in a list or tuple) becomes
``func(epoch=e)`` in epoch e's copy, as RETURNN resolves it. Where the network changes from one epoch to
the next (any difference, ``#config`` included), the trainer builds the new one and carries the
parameters over (``engine/training/pretrain_switch.py``).
"""
from __future__ import annotations

import copy
from typing import Any

from engine.config.epoch_value import WrapEpochValue
from engine.config.loader import Config
from engine.model import pretrain_construct as construct
from engine.runtime.errors import ConfigError

OVERRIDABLE = ("learning_rate", "batch_size", "max_seqs", "max_seq_length", "accum_grad_multiple_step")
COPY_MODES = (None, "ifpossible", "subset", "reset")
ALGOS = ("from_output", "from_input", "no_network_modifications")
OWN_ENTRIES = ("#config", "#copy_param_mode")  # read here; '#repetition' is taken out at construction
__all__ = ["PretrainSchedule", "WrapEpochValue", "pretrain_from_config"]
_OPTIONS = ("copy_param_mode", "copy_output_layer", "greedy", "repetitions", "construction_algo",
            "output_layers", "input_layers", "network_init_args")


def _resolved(value: Any, epoch: int) -> Any:
    if isinstance(value, WrapEpochValue):
        return value.get_value(epoch=epoch)
    if isinstance(value, (list, tuple)):  # RETURNN looks into a list only for a wrapped value directly in it
        if not any(isinstance(x, WrapEpochValue) for x in value):
            return value
        return type(value)([_resolved(x, epoch) for x in value])
    if isinstance(value, dict):
        _resolve_dict(value, epoch)
    return value


def _resolve_dict(values: dict, epoch: int) -> None:
    try:
        keys = [k for k, _ in sorted(values.items())]  # RETURNN's order (a function's calls may count on it)
    except TypeError:
        raise ConfigError(f"Config key 'pretrain': the network holds a dict with keys of mixed types "
                          f"({list(values)}), which RETURNN cannot sort to resolve WrapEpochValue.") from None
    for key in keys:
        values[key] = _resolved(values[key], epoch)


def _repetitions(value: Any, count: int) -> list[int]:
    """Epochs per network: an int, a list (its last entry repeats), or a dict of index ('final': the last)
    -> count with a 'default'."""
    if not value:
        value = 1
    if isinstance(value, dict):
        reps = dict(value)
        result = [reps.pop("default", 1)] * count
        try:
            for index, n in sorted(reps.items()):
                result[count - 1 if index == "final" else index] = n
        except (TypeError, IndexError):
            raise ConfigError(f"Config key 'pretrain': repetitions {value!r} must map network indices "
                              f"0..{count - 1} (or 'final', but not both kinds) to counts.") from None
    elif isinstance(value, int):
        result = [value] * count
    elif isinstance(value, list) and 0 < len(value) <= count:
        result = value + [value[-1]] * (count - len(value))
    else:
        raise ConfigError(f"Config key 'pretrain': repetitions must be an int, a list of 1..{count} ints "
                          f"(one per pretraining network) or a dict, got {value!r}.")
    return result


class PretrainSchedule:
    """Epoch -> network dict (and what its ``#`` entries say), as RETURNN's ``Pretrain`` gives them."""

    def __init__(self, network: dict, *, copy_param_mode: str | None = None, copy_output_layer: Any = None,
                 greedy: bool | None = None, repetitions: Any = None, construction_algo: Any = "from_output",
                 output_layers: Any = ("output",), input_layers: Any = ("data",),
                 network_init_args: Any = None) -> None:
        if copy_param_mode not in COPY_MODES:
            raise ConfigError(f"Config key 'pretrain': copy_param_mode must be one of {COPY_MODES}, got "
                              f"{copy_param_mode!r}.")
        if copy_output_layer is None:
            copy_output_layer = copy_param_mode or "ifpossible"
        if copy_output_layer == "reset":
            copy_output_layer = False
        if copy_output_layer not in (True, False, "ifpossible", "subset"):
            raise ConfigError(f"Config key 'pretrain': copy_output_layer must be True, False, 'ifpossible', "
                              f"'subset' or 'reset', got {copy_output_layer!r}.")
        self.copy_param_mode, self.copy_output_layer = copy_param_mode, bool(copy_output_layer)
        if greedy:
            raise ConfigError("Config key 'pretrain': greedy (train only the newest layers) is not "
                              "available: RETURNN's TensorFlow engine removed it too and stops at epoch 2.")
        if network_init_args is not None:
            raise ConfigError("Config key 'pretrain': network_init_args is for RETURNN's Theano networks "
                              "only.")
        outputs, inputs = list(output_layers), list(input_layers)
        self.algo = construction_algo
        original = copy.deepcopy(network)  # RETURNN edits the config's network in place; here it stays
        if construction_algo == "from_output":
            nets = construct.from_output(original, outputs, inputs)
        elif construction_algo == "from_input":
            nets = construct.from_input(original, outputs)
        elif callable(construction_algo):
            nets = construct.custom(original, construction_algo)
        elif construction_algo == "no_network_modifications":
            nets = [original]
        else:
            raise ConfigError(f"Config key 'pretrain': construction_algo must be a function (idx, net_dict) "
                              f"-> net_dict | None or one of {ALGOS}, got {construction_algo!r}.")
        if not callable(construction_algo):
            nets = construct.drop_untrainable_steps(nets, outputs)
        reps = _repetitions(repetitions, len(nets))
        for i, net in enumerate(nets):
            if "#repetition" in net:
                reps[i] = net.pop("#repetition")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in reps):
            raise ConfigError(f"Config key 'pretrain': repetitions must be counts >= 0, got {reps}.")
        self.repetitions = reps
        self.nets = [copy.deepcopy(net) for n, net in zip(reps, nets) for _ in range(n)]
        if not self.nets:
            raise ConfigError(f"Config key 'pretrain': repetitions {reps} leave no epoch to train.")
        for i, net in enumerate(self.nets):
            _resolve_dict(net, i + 1)
        for i, net in enumerate(self.nets):
            self._check_entries(i + 1, net)

    @property
    def num_epochs(self) -> int:
        """N: the epochs RETURNN counts as pretraining (the full network's repetitions included)."""
        return len(self.nets)

    def is_pretrain_epoch(self, epoch: int) -> bool:
        return epoch <= self.num_epochs

    def net_dict(self, epoch: int) -> dict:
        """Epoch ``epoch``'s network as RETURNN has it, ``#`` entries included (epochs count from 1)."""
        if epoch < 1:
            raise ValueError(f"epochs count from 1, got {epoch}")
        return self.nets[min(epoch, self.num_epochs) - 1]

    def layers(self, epoch: int) -> dict:
        """The network to build: without the entries this schedule reads."""
        return {k: v for k, v in self.net_dict(epoch).items() if k not in OWN_ENTRIES}

    def config_overrides(self, epoch: int) -> dict:
        return dict(self.net_dict(epoch).get("#config") or {})

    def copy_mode(self, epoch: int) -> str | None:
        """How the parameters go into epoch ``epoch``'s network when it is built anew."""
        return self.net_dict(epoch).get("#copy_param_mode", self.copy_param_mode)

    def describe(self) -> str:
        algo = self.algo if isinstance(self.algo, str) else getattr(self.algo, "__name__", repr(self.algo))
        reps = set(self.repetitions)
        shown = self.repetitions[0] if len(reps) == 1 else self.repetitions
        shown = "" if reps == {1} else f" (repetitions: {shown})"
        return (f"pretraining: construction algo {algo!r}, {len(self.repetitions)} network(s) over "
                f"{self.num_epochs} epoch(s){shown}, copy_param_mode {self.copy_param_mode!r}")

    def _check_entries(self, epoch: int, net: dict) -> None:
        mode = net.get("#copy_param_mode", self.copy_param_mode)
        if mode not in COPY_MODES:
            raise ConfigError(f"Pretraining network of epoch {epoch}: '#copy_param_mode' must be one of "
                              f"{COPY_MODES}, got {mode!r}.")
        overrides = net.get("#config") or {}
        if not isinstance(overrides, dict):
            raise ConfigError(f"Pretraining network of epoch {epoch}: '#config' must be a dict of config "
                              f"keys, got {overrides!r}.")
        unknown = sorted(set(overrides) - set(OVERRIDABLE))
        if unknown:
            raise ConfigError(f"Pretraining network of epoch {epoch}: '#config' sets {unknown}; this engine "
                              f"applies {', '.join(OVERRIDABLE)} per epoch (others are read once at the "
                              "start).")
        for name, layer in net.items():  # the step count restarts with each new network here (a new updater)
            if isinstance(layer, dict) and layer.get("class") == "eval" and "global_train_step" in str(
                    layer.get("eval")):
                raise ConfigError(f"Pretraining network of epoch {epoch}: eval layer {name!r} reads "
                                  "global_train_step, which RETURNN carries into each new network, while "
                                  "this engine's step count starts anew with the new network's optimizer.")


def pretrain_from_config(config: Config) -> PretrainSchedule | None:
    """The schedule of ``pretrain`` (True, "default" or a dict of options; off when empty or False) and the
    ``pretrain_*`` keys (defaults of the options the dict does not set)."""
    value = config.value("pretrain")
    if not value:
        return None
    if value is not True and value != "default" and not isinstance(value, dict):
        raise ConfigError(f"Config key 'pretrain' must be True, 'default' or a dict of options, got "
                          f"{value!r}.")
    opts = dict(value) if isinstance(value, dict) else {}
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise ConfigError(f"Config key 'pretrain': unknown option(s) {unknown}; RETURNN's are "
                          f"{', '.join(_OPTIONS)}.")
    for key, option in (("pretrain_copy_output_layer", "copy_output_layer"), ("pretrain_greedy", "greedy"),
                        ("pretrain_repetitions", "repetitions"), ("pretrain_construction_algo",
                                                                  "construction_algo")):
        if config.has(key):
            given = config.value(key)
            if isinstance(given, str) and key == "pretrain_repetitions":
                given = [int(n) for n in config.list(key)] if "," in given else config.int(key)
            elif isinstance(given, str) and key in ("pretrain_copy_output_layer", "pretrain_greedy"):
                given = {"true": True, "false": False}.get(given.lower(), given)
            opts.setdefault(option, given)
    network = config.value("network")
    if not isinstance(network, dict) or not network:
        raise ConfigError("Config key 'pretrain' builds its networks from 'network', which must be a "
                          "non-empty layer dict (not get_network or get_model).")
    for other in ("get_network", "get_model"):
        if callable(config.value(other)):
            raise ConfigError(f"Config key 'pretrain' together with '{other}': RETURNN takes the pretraining "
                              f"networks from 'network' and {other} afterwards; set one of them.")
    schedule = PretrainSchedule(network, **opts)
    always = config.bool("use_learning_rate_control_always")
    for epoch in range(1, schedule.num_epochs + 1):
        for key in schedule.config_overrides(epoch):
            if key == "learning_rate" and not always:
                raise ConfigError(f"Pretraining network of epoch {epoch}: '#config' sets learning_rate, "
                                  "which RETURNN accepts only with use_learning_rate_control_always = True.")
            if key != "learning_rate" and not config.has(key):
                raise ConfigError(f"Pretraining network of epoch {epoch}: '#config' sets {key!r}, which the "
                                  "config does not set; RETURNN changes only keys the config has.")
    return schedule
