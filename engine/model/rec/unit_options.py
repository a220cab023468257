"""The option values of the unit layer classes of ``step_state.py`` and ``step_cells.py``, checked without
TensorFlow, so that ``rnn.py --check`` refuses what the build would refuse (``parse_unit`` calls
``check_options``)."""
from __future__ import annotations

from typing import Any

from engine.model.layers.lstm_norm_options import NORM_LSTM_UNIT, norm_lstm_options
from engine.runtime.errors import ConfigError

REDUCE_MODES = ("sum", "max", "min", "mean", "avg", "logsumexp")
TIME_MODES = ("sum", "max", "min", "mean", "avg")  # over the valid frames (layers/reduce.py's MASKED)
TIME_AXES = ("t", "T", "time")
FEATURE_AXES = ("f", "F", "feature", "dim")
# RETURNN's rnn_cell units that run TensorFlow's LSTMCell one step at a time (its get_rnn_cell_class with
# cell_only on TF 2: LSTMBlock and LSTMBlockFused are mapped to StandardLSTM there), and its ZoneoutLSTMCell
# (that LSTMCell, then zoneout on c and h)
LSTM_CELL_UNITS = ("lstmblock", "lstmblockfused", "standardlstm", "basiclstm")
ZONEOUT_UNIT = "zoneoutlstm"
ZONEOUT_OPTIONS = ("zoneout_factor_cell", "zoneout_factor_output", "use_zoneout_output")
# the units RETURNN runs as NativeLstm2 on one step (NativeLstm raises there: its initial state is broken)
NATIVE_STEP_UNITS = ("lstm", "lstmp", "nativelstm2", "lstmblock", "lstmblockfused")
SWITCH_OPTIONS = ("condition", "true_from", "false_from")
# the unit classes that may read the step index ':i' (engine/model/rec/step_select.py)
STEP_READERS = ("compare",)
# RETURNN's state keys of an LSTM's (c, h): by name, by position, or both concatenated
LSTM_STATE_KEYS = ("*", "flat", "c", "h", 0, 1)


def feature_axes(opts: dict) -> Any:
    axes = opts.get("axes", opts.get("axis"))
    return axes[0] if isinstance(axes, (list, tuple)) and len(axes) == 1 else axes


def zoneout_options(where: str, unit_opts: Any) -> tuple[float, float, bool]:
    """RETURNN's ZoneoutLSTMCell options: the zoneout factors of c and h (each in [0, 1): a factor of 1
    makes RETURNN's dropout divide by 0), and whether the output is the zoned h (RETURNN's default for a
    config without behavior_version: False, the LSTM's own output; configs here have none)."""
    unit_opts = unit_opts or {}
    unknown = sorted(set(unit_opts) - set(ZONEOUT_OPTIONS)) if isinstance(unit_opts, dict) else unit_opts
    if unknown:
        raise ConfigError(f"{where}: unit_opts {unknown!r} of rnn_cell unit ZoneoutLSTM: it takes "
                          f"{', '.join(ZONEOUT_OPTIONS)}.")
    factors = []
    for key in ZONEOUT_OPTIONS[:2]:
        value = unit_opts.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ConfigError(f"{where}: unit_opts {key} must be in [0, 1), got {value!r}.")
        factors.append(float(value))
    use_output = unit_opts.get("use_zoneout_output", False)
    if not isinstance(use_output, bool):
        raise ConfigError(f"{where}: unit_opts use_zoneout_output must be True or False, got {use_output!r}.")
    return factors[0], factors[1], use_output


def lstm_cell_forget_bias(where: str, unit_opts: Any) -> float:
    """The ``unit_opts`` of an rnn_cell unit RETURNN runs as TensorFlow's LSTMCell: ``forget_bias`` only,
    added to the forget gate before its sigmoid (TensorFlow's default 1.0)."""
    unit_opts = unit_opts or {}
    if not isinstance(unit_opts, dict) or set(unit_opts) - {"forget_bias"}:
        raise ConfigError(f"{where}: unit_opts {unit_opts!r} of an LSTMCell unit (LSTMBlock, LSTMBlockFused, "
                          "StandardLSTM, BasicLSTM): only 'forget_bias' is implemented.")
    value = unit_opts.get("forget_bias", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: unit_opts forget_bias must be a number, got {value!r}.")
    return float(value)


def reduces_time(opts: dict) -> bool:
    """A unit ``reduce`` over the time axis of its source (``step_state.ReduceTime``)."""
    return feature_axes(opts) in TIME_AXES


def explicit_search_sources(where: str, opts: dict) -> list[str]:
    """A choice's ``explicit_search_sources`` (a list, or a dict by key) or ``explicit_search_source`` (one
    name): the names of the unit's layers, ``x`` or ``prev:x``, in the config's order (RETURNN builds them
    so, before the choice's 'from'), which its ``custom_score_combine`` reads at each step of a search."""
    if opts.get("explicit_search_source") and opts.get("explicit_search_sources"):
        raise ConfigError(f"{where}: choice takes explicit_search_source or explicit_search_sources, not "
                          "both.")
    sources = opts.get("explicit_search_sources") or opts.get("explicit_search_source") or []
    if isinstance(sources, str):
        sources = [sources] if opts.get("explicit_search_source") else sources
    names = list(sources.values()) if isinstance(sources, dict) else sources
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{where}: explicit_search_sources must be a list of layer names (or a dict of "
                          f"them), got {sources!r}.")
    for name in names:
        if name.startswith(("base:", "data:")) or name == ":i":
            raise ConfigError(f"{where}: explicit_search_sources names {name!r}; here they are layers of the "
                              "unit, 'x' or 'prev:x' (values per hypothesis that custom_score_combine "
                              "reads).")
    return list(names)


def check_choice(where: str, opts: dict) -> None:
    if opts.get("cheating"):
        raise ConfigError(f"{where}: choice 'cheating' {opts['cheating']!r} (the target kept in the beam) is "
                          "not implemented; False, RETURNN's default, is accepted.")
    combine = opts.get("custom_score_combine")
    if combine is not None and not callable(combine):
        raise ConfigError(f"{where}: custom_score_combine must be a function of the config (RETURNN calls it "
                          f"with layer, scores_in, scores_base, ...), got {combine!r}.")
    explicit_search_sources(where, opts)


def check_options(where: str, cls: str, opts: dict) -> None:
    if cls == "choice":
        check_choice(where, opts)
    elif cls == "switch":
        if opts.get("from") not in (None, [], ()):
            raise ConfigError(f"{where}: switch reads no 'from' here (its layers are condition, true_from "
                              f"and false_from), got {opts['from']!r}.")
        for key in SWITCH_OPTIONS:
            if not isinstance(opts.get(key), str):
                raise ConfigError(f"{where}: switch needs '{key}', the name of a layer; got "
                                  f"{opts.get(key)!r} (RETURNN's constants in place of a layer are not "
                                  "implemented).")
    elif cls == "rnn_cell":
        unit = str(opts.get("unit", "")).lower()
        if unit == ZONEOUT_UNIT:
            zoneout_options(where, opts.get("unit_opts"))
        elif unit == NORM_LSTM_UNIT:
            norm_lstm_options(where, opts.get("unit_opts"))
        elif unit in LSTM_CELL_UNITS:
            lstm_cell_forget_bias(where, opts.get("unit_opts"))
        else:
            raise ConfigError(f"{where}: rnn_cell unit {opts.get('unit')!r} is not implemented here; "
                              "implemented: LSTMBlock, LSTMBlockFused, StandardLSTM, BasicLSTM (TensorFlow's "
                              "LSTMCell, as RETURNN runs them on one step), ZoneoutLSTM and "
                              "LayerNormVariantsLSTM.")
    elif cls == "reduce" and reduces_time(opts):
        if opts.get("keep_dims", False) is not False or str(opts.get("mode", "")).lower() not in TIME_MODES:
            raise ConfigError(f"{where}: reduce over time inside a rec unit is implemented without keep_dims "
                              f"and with mode {', '.join(TIME_MODES)}; got mode {opts.get('mode')!r}, "
                              f"keep_dims {opts.get('keep_dims')!r}.")
    elif cls == "reduce":
        if feature_axes(opts) not in FEATURE_AXES or opts.get("keep_dims") is not True:
            raise ConfigError(f"{where}: reduce inside a rec unit is implemented over the feature axis with "
                              f"keep_dims True (axes 'f'); got axes {feature_axes(opts)!r}, keep_dims "
                              f"{opts.get('keep_dims')!r}: without keep_dims RETURNN makes another axis the "
                              "feature, which the unit's templates do not follow.")
        if str(opts.get("mode", "")).lower() not in REDUCE_MODES or opts.get("n_out", 1) != 1:
            raise ConfigError(f"{where}: reduce mode {opts.get('mode')!r} (n_out {opts.get('n_out', 1)!r}): "
                              f"implemented {', '.join(REDUCE_MODES)}, giving dim 1.")
    elif cls == "variable":
        shape = opts.get("shape")
        if (not isinstance(shape, (list, tuple)) or len(shape) != 1 or isinstance(shape[0], bool)
                or not isinstance(shape[0], int) or shape[0] < 1):
            raise ConfigError(f"{where}: variable 'shape' {shape!r} is not implemented inside a rec unit "
                              "here: one positive feature size, such as [1] or [512], is (the shapes of "
                              "RETURNN's published setups).")
        if opts.get("add_time_axis") or opts.get("dtype", "float32") != "float32":
            raise ConfigError(f"{where}: variable with add_time_axis or a dtype other than float32 is not "
                              "implemented inside a rec unit here.")
        if not isinstance(opts.get("add_batch_axis", False), bool):
            raise ConfigError(f"{where}: add_batch_axis must be True or False.")
    elif cls == "get_last_hidden_state":
        if opts.get("key", "*") not in LSTM_STATE_KEYS:
            raise ConfigError(f"{where}: key {opts['key']!r} is not a state of an LSTM cell (c, h): RETURNN "
                              "takes '*' or 'flat' (both concatenated), 'c', 'h', 0 or 1.")
        if opts.get("combine", "concat") not in ("concat", "add"):
            raise ConfigError(f"{where}: combine {opts['combine']!r}: RETURNN takes 'concat' or 'add'.")
        if opts.get("dropout"):
            raise ConfigError(f"{where}: 'dropout' would apply to its sources' outputs, which this layer "
                              "does not read (it reads their state): RETURNN drops nothing here, so it is "
                              "refused.")
    elif cls == "rec":
        unit = opts.get("unit")
        if not isinstance(unit, str) or unit.lower() not in NATIVE_STEP_UNITS or opts.get("unit_opts"):
            raise ConfigError(f"{where}: a rec layer inside a rec unit is implemented with the units "
                              "RETURNN runs as NativeLstm2 on one step (LSTM, lstmp, NativeLstm2, LSTMBlock, "
                              f"LSTMBlockFused) without unit_opts; got unit {unit!r}, unit_opts "
                              f"{opts.get('unit_opts')!r}.")
        if opts.get("direction", 1) not in (1, -1):
            raise ConfigError(f"{where}: direction must be 1 or -1 (on one step both are the same).")
