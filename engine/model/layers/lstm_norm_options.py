"""A ``rec`` layer's ``unit_opts``, checked without TensorFlow (``spec.parse_network`` calls
``check_unit_opts``, so ``rnn.py --check`` names a bad option before anything is built).

Unit ``layernormvariantslstm`` is RETURNN's LayerNormVariantsLSTMCell (``lstm_norm.py`` runs it); its
``unit_opts`` are the keyword arguments of that cell, with its defaults (``NormLstmOptions``). The plain
LSTM units (``spec.LSTM_UNITS``) that RETURNN runs as its NativeLstm2 take that cell's options
(``rec_weight_dropout``; ``recurrent.py`` applies them).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from engine.runtime.errors import ConfigError

NORM_LSTM_UNIT = "layernormvariantslstm"
# the plain units RETURNN (TF 2, no GPU) runs as its NativeLstm2 (layers/recurrent.py), and the options of
# that cell (its forget_bias only as 0, which it asserts)
NATIVE_LSTM2_UNITS = ("lstm", "lstmp", "nativelstm2", "lstmblock", "lstmblockfused", "cudnnlstm")
NATIVE_LSTM2_OPTIONS = ("rec_weight_dropout", "rec_weight_dropout_shape", "forget_bias")

# the cell's arguments this engine does not take, and why
_REFUSED = {
    "activation": "RETURNN calls the given Python function inside its cell; this engine runs tanh only "
                  "(the default)",
    "is_training": "RETURNN's cell then ignores the network's train flag for its dropout; this engine "
                   "applies the dropouts in training only",
    "dropout_seed": "this engine draws its dropout masks from its own random_seed (RETURNN's random "
                    "masks cannot be reproduced anyway)",
}


@dataclass(frozen=True)
class NormLstmOptions:
    """The options of RETURNN's LayerNormVariantsLSTMCell, with its defaults."""

    norm_gain: float = 1.0  # the gammas' initial value
    norm_shift: float = 0.0  # the betas' initial value
    forget_bias: float = 0.0  # if > 0: added to the initial values of the forget gate's bias or beta
    dropout: float = 0.0  # on the cell input tanh(j), in training
    dropout_h: float = 0.0  # on the previous output where it enters the recurrent weights, in training
    with_concat: bool = False  # one matrix W_ff_re over [input; previous output] instead of W_ff and W_re
    global_norm: bool = True  # norm of the input's and of the recurrent projection, each on its own
    global_norm_joined: bool = False  # norm of their sum
    per_gate_norm: bool = False  # norm of each gate's input on its own
    cell_norm: bool = True  # norm of the new cell state
    cell_norm_in_output: bool = True  # the output reads the normalised cell state (else the one before)
    hidden_norm: bool = False  # norm of the new output
    variance_epsilon: float = 1e-12


_TYPES = {f.name: type(f.default) for f in fields(NormLstmOptions)}


def _checked(where: str, key: str, value: Any) -> Any:
    option = f"{where}: unit_opts {key!r}"
    if _TYPES[key] is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{option} must be True or False, got {value!r}.")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{option} must be a number, got {value!r}.")
    if key in ("dropout", "dropout_h") and not 0.0 <= value < 1.0:
        # RETURNN scales the kept units by 1 / (1 - rate): a rate of 1 divides by zero
        raise ConfigError(f"{option} must be a rate in [0, 1), got {value!r}.")
    return float(value)


def norm_lstm_options(where: str, unit_opts: Any) -> NormLstmOptions:
    """The options ``unit_opts`` gives RETURNN's LayerNormVariantsLSTMCell; ConfigError, starting with
    ``where`` ("Network layer 'x'"), names an unknown or refused option, a wrong type, and each combination
    the cell asserts against."""
    if unit_opts is None:
        unit_opts = {}
    if not isinstance(unit_opts, dict):
        raise ConfigError(f"{where}: unit_opts must be a dict, got {unit_opts!r}.")
    for key in unit_opts:
        if key in _REFUSED:
            raise ConfigError(f"{where}: unit_opts {key!r} is not implemented: "
                              f"{_REFUSED[key]}.")
        if key not in _TYPES:
            raise ConfigError(f"{where}: unit_opts {key!r} is no option of RETURNN's "
                              f"LayerNormVariantsLSTMCell; it takes {', '.join(_TYPES)}.")
    options = NormLstmOptions(**{key: _checked(where, key, value) for key, value in unit_opts.items()})
    # the combinations RETURNN's cell asserts against (global_norm is on unless switched off)
    clashes = [("global_norm", "global_norm_joined"), ("per_gate_norm", "global_norm"),
               ("per_gate_norm", "global_norm_joined"), ("with_concat", "global_norm")]
    for first, second in clashes:
        if getattr(options, first) and getattr(options, second):
            raise ConfigError(f"{where}: unit_opts {first} and {second} are both on "
                              "(global_norm is on unless 'global_norm': False), a combination RETURNN's "
                              "LayerNormVariantsLSTMCell refuses; switch one of them off.")
    return options


def rec_weight_dropout(layer: str, unit: str, unit_opts: Any) -> tuple[float, tuple[int | None, ...] | None]:
    """The ``unit_opts`` of a plain LSTM unit: RETURNN's NativeLstm2 ``rec_weight_dropout`` (a rate in
    [0, 1)) and ``rec_weight_dropout_shape`` (None: a mask entry per entry of W_re; else two entries, each
    None for the full axis or 1 to share the mask along it). Other options are refused by name."""
    if not unit_opts:  # None or {} are no options
        return 0.0, None
    where = f"Network layer '{layer}': unit_opts {unit_opts!r} on unit {unit!r}"
    if not isinstance(unit_opts, dict):
        raise ConfigError(f"{where}: unit_opts must be a dict.")
    if unit not in NATIVE_LSTM2_UNITS:
        raise ConfigError(f"{where} is not implemented: RETURNN runs this unit as another cell than "
                          f"NativeLstm2, whose options ({', '.join(NATIVE_LSTM2_OPTIONS)}) are the ones this "
                          f"engine takes (on {', '.join(NATIVE_LSTM2_UNITS)}); unit {NORM_LSTM_UNIT!r} takes "
                          "its cell's options.")
    unknown = sorted(set(unit_opts) - set(NATIVE_LSTM2_OPTIONS))
    if unknown:
        raise ConfigError(f"{where}: {unknown} not implemented; RETURNN's NativeLstm2 options this engine "
                          f"takes: {', '.join(NATIVE_LSTM2_OPTIONS)}.")
    if unit_opts.get("forget_bias", 0) != 0:
        raise ConfigError(f"{where}: RETURNN's NativeLstm2 asserts forget_bias 0 (give the forget gate's "
                          "bias by bias_init instead).")
    rate = unit_opts.get("rec_weight_dropout", 0.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
        raise ConfigError(f"{where}: rec_weight_dropout must be a rate in [0, 1), got {rate!r}.")
    shape = unit_opts.get("rec_weight_dropout_shape")
    if shape is not None and (not isinstance(shape, (tuple, list)) or len(shape) != 2
                              or any(entry not in (None, 1) for entry in shape)):
        raise ConfigError(f"{where}: rec_weight_dropout_shape must be None or two entries, each None (a mask "
                          f"entry per row or column of W_re) or 1 (one shared along it), got {shape!r}.")
    return float(rate), None if shape is None else tuple(shape)


def check_unit_opts(layer: str, unit: str, unit_opts: Any) -> None:
    """A ``rec`` layer's ``unit_opts`` for its ``unit`` (a supported name, lower case)."""
    if unit == NORM_LSTM_UNIT:
        norm_lstm_options(f"Network layer '{layer}'", unit_opts)
    else:
        rec_weight_dropout(layer, unit, unit_opts)
