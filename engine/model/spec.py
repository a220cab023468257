"""The ``network`` layer dict as data: its layers' classes, sources and options, checked without building
anything (so ``rnn.py --check`` needs no TensorFlow).

``parse_network`` checks the dict's shape, the layer classes, ``from`` references and cycles;
``layer_findings`` classifies every layer option (``engine/config/key_check.py``): implemented, without effect
here, ignored on request, or refused; ``build_order`` lists the layers an output or loss depends on.
"""
from __future__ import annotations

import difflib
from typing import Any, Collection, NamedTuple

from engine.config import returnn_names_table as returnn_keys
from engine.config.key_check import Finding, Scope, classify
from engine.config.no_effect import LAYER_OPTIONS as NO_EFFECT_OPTIONS
from engine.model.axes import reduces_time_away
from engine.model.layers.lstm_norm_options import NORM_LSTM_UNIT, check_unit_opts
from engine.model.losses import check_loss_name, check_loss_only_on_non_search, check_loss_opts
from engine.model.rec.unit import max_len_layers, parse_unit
from engine.model.spec_options import CLASS_OPTIONS
from engine.model.spec_readers import check_per_sequence_readers
from engine.model.spec_streams import registered_streams, with_registered_streams
from engine.model.rec.unit_subnetwork import flatten_subnetworks
from engine.runtime import log
from engine.runtime.errors import ConfigError

# the class of a "<rec>/<unit layer>" source (a unit layer's output over the loop's steps, read outside the
# rec layer): an entry of the parsed network, never a class a config names
UNIT_OUTPUT = "(a rec unit's layer)"
IMPLEMENTED_CLASSES = frozenset(CLASS_OPTIONS)
# options of a rec layer with a dict unit (engine/model/rec/)
_SUBNETWORK_OPTIONS = {"target", "max_seq_len", "cheating", "optimize_move_layers_out"}
_COMMON_OPTIONS = {"class", "from", "dropout", "is_output_layer", "L2", "trainable", "reuse_params",
                   "register_as_extern_data"}  # spec_streams.py checks which layers may register
# layers for which the order of frames matters (a network without one is not chunked, as in RETURNN)
RECURRENT_CLASSES = {"rec", "time_chunking", "time_unchunking", "conv", "pool", "self_attention",
                     "positional_encoding", "relative_positional_encoding", "window",
                     "softmax_over_spatial", "generic_attention",
                     "eval"}  # RETURNN cannot tell what an expression does with the frames: recurrent
# options that name a layer whose output the layer reads besides its 'from' sources (on their time axis):
# that layer is built first, counts for cycles, and the network hands its output over by the option's name
REFERENCE_OPTIONS: dict[str, tuple[str, ...]] = {"self_attention": ("key_shift",)}
# classes whose output has no batch axis (T, T, n_out): read only through a reference option, never 'from'
UNBATCHED_CLASSES = {"relative_positional_encoding": "a self_attention's key_shift"}
# RETURNN's unit names of a plain LSTM (no peepholes, no projection), lower case. In RETURNN (TF) "lstm"
# and "lstmp" both mean its default NativeLSTM2, and "CudnnLSTM" without a GPU means LSTMBlockFused.
LSTM_UNITS = ("lstm", "lstmp", "basiclstm", "standardlstm", "lstmblock", "lstmblockfused", "nativelstm",
              "nativelstm2", "nativelstmlowmem", "cudnnlstm", "vanillalstm")
_UNIT_NAMES = ("LSTM, lstmp, BasicLSTM, StandardLSTM, LSTMBlock, LSTMBlockFused, NativeLstm, NativeLstm2, "
               "NativeLstmLowMem, CudnnLSTM, VanillaLSTM")


def is_stream(name: str) -> bool:
    """``data`` (the input) or ``data:<stream>`` (another stream of the data, e.g. an LM's ``delayed``): no
    layer of the network."""
    return name == "data" or name.startswith("data:")


class LayerSpec(NamedTuple):
    cls: str
    sources: tuple[str, ...]
    opts: dict[str, Any]
    # layers built before this one besides those it reads: those that compute its target stream
    # (``register_as_extern_data``: spec_streams.py)
    after: tuple[str, ...] = ()

    @property
    def references(self) -> dict[str, str]:
        """Option -> the layer it names (REFERENCE_OPTIONS; RETURNN reads an empty value as none)."""
        return {key: self.opts[key] for key in REFERENCE_OPTIONS.get(self.cls, ()) if self.opts.get(key)}

    @property
    def shares_params_of(self) -> str | None:
        """The layer named by ``reuse_params`` (its parameters are this layer's too)."""
        return self.opts.get("reuse_params") or None

    @property
    def size_base(self) -> str | None:
        """The layer named by a reinterpret_data's ``size_base`` (None: a data stream or no such option)."""
        base = self.opts.get("size_base") if self.cls == "reinterpret_data" else None
        return base if isinstance(base, str) and not is_stream(base) else None

    @property
    def reads(self) -> tuple[str, ...]:
        """Every layer this one depends on: its sources, the layers its options name, the layer whose
        parameters it shares, the one whose lengths it takes, and those a subnetwork unit reads."""
        extra = tuple(n for n in (self.shares_params_of, self.size_base) if n)
        return self.sources + tuple(self.references.values()) + extra + self.unit_bases + self.after

    @property
    def subnetwork(self) -> bool:
        """A ``rec`` layer whose ``unit`` is a dict of layers (``engine/model/rec/``)."""
        return self.cls == "rec" and isinstance(self.opts.get("unit"), dict)

    @property
    def unit_bases(self) -> tuple[str, ...]:
        """The network's layers a subnetwork unit reads as ``base:<layer>``."""
        if not self.subnetwork:
            return ()
        return tuple(sorted({ref.name for layer in parse_unit("?", self.opts["unit"]).values()
                             for ref in layer.sources + list(layer.options.values()) if ref.kind == "base"}
                            | set(max_len_layers(self.opts.get("max_seq_len")))))


def parse_network(network: Any) -> dict[str, LayerSpec]:
    """Check the dict's shape, layer classes, ``from`` references and cycles; ConfigError names the layer."""
    if not isinstance(network, dict) or not network:
        raise ConfigError(
            f"Config key 'network' must be a non-empty dict of layers, got {type(network).__name__}."
        )
    specs: dict[str, LayerSpec] = {}
    for name, opts in network.items():
        if isinstance(name, str) and name.startswith("#"):
            _check_network_entry(name)
            continue
        if not isinstance(name, str) or is_stream(name):
            raise ConfigError(f"Network layer name {name!r} is not allowed ('data' is the input stream).")
        if not isinstance(opts, dict):
            raise ConfigError(
                f"Network layer '{name}' must be a dict like {{'class': 'linear', ...}}, got {opts!r}."
            )
        cls = opts.get("class")
        if cls not in IMPLEMENTED_CLASSES:
            raise ConfigError(f"Network layer '{name}': {_class_problem(cls)}; this engine implements the "
                              f"classes {', '.join(CLASS_OPTIONS)}.")
        unit = opts.get("unit", "lstm")
        if cls == "rec" and isinstance(unit, dict):  # a loop over its sources' frames, or over labels
            parse_unit(name, unit)
            sources = opts.get("from", "data")  # RETURNN's default source, as for every layer
            specs[name] = LayerSpec(cls, _sources(name, sources) if sources not in ([], ()) else (), opts)
            continue
        if cls == "rec" and (not isinstance(unit, str) or unit.lower() not in LSTM_UNITS + (NORM_LSTM_UNIT,)):
            raise ConfigError(f"Network layer '{name}': unit {unit!r} is not supported; supported: "
                              f"{_UNIT_NAMES} (each a plain LSTM), and LayerNormVariantsLSTM.")
        if cls == "rec" and not isinstance(unit, dict):
            check_unit_opts(name, unit.lower(), opts.get("unit_opts"))
        if cls == "reduce" and reduces_time_away(opts):
            raise ConfigError(f"Network layer '{name}': reduce over the time axis is implemented alone (with "
                              "keep_dims True one frame per sequence, without it one vector per sequence), "
                              f"not with other axes (axes {opts.get('axes', opts.get('axis'))!r}, keep_dims "
                              f"{opts.get('keep_dims', False)!r}).")
        if not isinstance(opts.get("trainable", True), bool):
            raise ConfigError(f"Network layer '{name}': 'trainable' must be True or False, got "
                              f"{opts['trainable']!r}.")
        rate = opts.get("dropout", 0.0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
            raise ConfigError(f"Network layer '{name}': dropout must be a float in [0, 1), got {rate!r}.")
        if "loss" in CLASS_OPTIONS[cls]:
            check_loss_name(f"Network layer '{name}'", cls, opts.get("loss"))
            check_loss_opts(f"Network layer '{name}'", opts.get("loss"), opts.get("loss_opts"))
            check_loss_only_on_non_search(f"Network layer '{name}'", opts)
        if cls == "generic_attention":  # RETURNN's reads no 'from': its weights and base are its sources
            if opts.get("from") not in (None, [], ()):
                raise ConfigError(f"Network layer '{name}': generic_attention reads 'weights' and 'base', no "
                                  f"'from' (RETURNN asserts none), got {opts['from']!r}.")
            if not all(isinstance(opts.get(key), str) for key in ("weights", "base")):
                raise ConfigError(f"Network layer '{name}': generic_attention needs 'weights' and 'base', "
                                  f"each a layer name, got {opts.get('weights')!r} and {opts.get('base')!r}.")
            specs[name] = LayerSpec(cls, (opts["weights"], opts["base"]), opts)
            continue
        specs[name] = LayerSpec(cls, _sources(name, opts.get("from", "data")), opts)
    specs.update(_unit_outputs(specs))
    specs = with_registered_streams(specs)
    for name, spec in specs.items():
        for src in spec.sources:
            if src == "data:" or (not is_stream(src) and src not in specs):
                raise ConfigError(
                    f"Network layer '{name}': 'from' names {src!r}, which is not a layer of the "
                    f"network; layers: {', '.join(specs)} (and 'data', or 'data:<stream>')."
                )
            if src in specs and specs[src].cls in UNBATCHED_CLASSES:
                raise ConfigError(f"Network layer '{name}': 'from' names {src!r}, a {specs[src].cls} layer, "
                                  f"whose output has no batch axis; it is read only as "
                                  f"{UNBATCHED_CLASSES[specs[src].cls]}.")
        for key, ref in spec.references.items():
            if not isinstance(ref, str):
                raise ConfigError(f"Network layer '{name}': {key!r} must be a layer name, got {ref!r}.")
            if ref != "data" and ref not in specs:
                raise ConfigError(f"Network layer '{name}': {key!r} names {ref!r}, which is not a layer of "
                                  f"the network; layers: {', '.join(specs)}.")
        _check_named_layers(name, spec, specs)
        if spec.cls == "decide" and not all(s in specs and specs[s].subnetwork for s in spec.sources):
            raise ConfigError(f"Network layer '{name}': a decide layer reads a rec layer with a subnetwork "
                              f"unit (its search's hypotheses), got {list(spec.sources)}.")
        missing = [b for b in spec.unit_bases if b not in specs]
        if missing:
            raise ConfigError(f"Network layer '{name}': its unit reads {['base:' + b for b in missing]}, "
                              "which "
                              f"are no layers of the network; layers: {', '.join(specs)}.")
    if not _roots(specs):  # RETURNN trains a network without 'output' on its loss layers
        raise ConfigError(f"The network has no layer called 'output' and no layer with a loss or "
                          f"is_output_layer, so nothing would be computed (layers: {', '.join(specs)}).")
    check_per_sequence_readers(specs, registered_streams(specs))
    if "output" in specs and specs["output"].cls in UNBATCHED_CLASSES:
        raise ConfigError(f"Network layer 'output': a {specs['output'].cls} layer's output has no batch "
                          f"axis; it is read only as {UNBATCHED_CLASSES[specs['output'].cls]}.")
    _check_cycles(specs)
    return specs


def _check_named_layers(name: str, spec: LayerSpec, specs: dict[str, LayerSpec]) -> None:
    """``reuse_params`` names a layer of the same class (RETURNN's dict form, which maps single parameters,
    is refused); a reinterpret_data's ``size_base`` names a layer or a data stream."""
    shared = spec.opts.get("reuse_params")
    if shared is not None:
        if not isinstance(shared, str) or shared not in specs or shared == name:
            raise ConfigError(f"Network layer '{name}': 'reuse_params' must name another layer of the "
                              "network (RETURNN's dict form with a 'map' of parameters is not implemented), "
                              f"got {shared!r}.")
        if specs[shared].cls != spec.cls or specs[shared].shares_params_of:
            raise ConfigError(f"Network layer '{name}': 'reuse_params' names '{shared}', which must be a "
                              f"{spec.cls} layer with parameters of its own.")
    if spec.cls == "reinterpret_data" and "size_base" in spec.opts:
        base = spec.opts.get("size_base")
        if not isinstance(base, str) or (spec.size_base and base not in specs):
            raise ConfigError(f"Network layer '{name}': 'size_base' must name a layer of the network or a "
                              f"data stream as 'data:<stream>', got {base!r}.")


# RETURNN's network entries whose name starts with '#' are not layers; other parts of RETURNN read them
_NETWORK_ENTRIES = {
    "#config": "config keys that hold while this network trains (RETURNN's pretraining sets them)",
    "#copy_param_mode": "how RETURNN's pretraining copies parameters into a grown network",
    "#repetition": "how many epochs RETURNN's pretraining keeps this network",
    "#finish_all_data": "RETURNN's flag to finish every dataset of a step",
    "#trainable": "RETURNN's switch that freezes the whole network",
}


def _check_network_entry(name: str) -> None:
    """RETURNN builds no layer of a '#' entry. Those that other parts of RETURNN read are refused until this
    engine does what they do; the rest (``#info``, a note to the reader) are skipped, as in RETURNN."""
    what = _NETWORK_ENTRIES.get(name)
    if what is None:
        log.info(f"Network entry {name!r} is skipped: RETURNN builds no layer of a name that starts with "
                 "'#'.")
        return
    raise ConfigError(f"Network entry {name!r} ({what}) is not implemented in this engine; remove it from "
                      "the network dict.")


def _class_problem(cls: Any) -> str:
    if cls in returnn_keys.LAYER_OPTIONS:
        return f"class {cls!r} is a RETURNN layer class this engine does not implement"
    close = difflib.get_close_matches(str(cls), list(CLASS_OPTIONS), n=1, cutoff=0.75)
    return f"unknown class {cls!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def layer_findings(specs: dict[str, LayerSpec], ignored: Collection[str]) -> list[Finding]:
    """A verdict for every option of every layer; RETURNN refuses options its layers do not take, so an
    unknown option is an error here too."""
    findings = []
    for name, spec in specs.items():
        if spec.cls == UNIT_OUTPUT:  # no layer of the config: its unit layer's options are checked there
            continue
        implemented = _COMMON_OPTIONS | CLASS_OPTIONS[spec.cls]
        implemented |= _SUBNETWORK_OPTIONS if spec.subnetwork else set()
        scope = Scope("layer", name, spec.cls, implemented,
                      returnn_keys.LAYER_COMMON_OPTIONS | returnn_keys.LAYER_OPTIONS.get(spec.cls, set()),
                      NO_EFFECT_OPTIONS, unknown_fatal=True)
        findings += classify(scope, spec.opts, ignored)
    return findings


def sparse_stream_dims(input_dim: int, input_sparse: bool, target_dims: dict[str, int]) -> dict[str, int]:
    """The data streams a layer may read that hold class ids, by source name (``data:<stream>``) -> dim: the
    sparse streams besides ``data`` (``target_dims``), and ``data`` where it is sparse."""
    dims = {f"data:{key}": dim for key, dim in target_dims.items() if key != "data"}
    return {"data": input_dim, **dims} if input_sparse else dims


def stream_sources(specs: dict[str, LayerSpec], names: Collection[str],
                   sparse: dict[str, int]) -> dict[str, int]:
    """The ``data:<stream>`` sources the layers ``names`` read -> their dims; each must be one of the
    ``sparse`` streams (source name -> dim), else a ConfigError names the layer (build and ``--check``)."""
    found = {}
    for name in names:
        for src in specs[name].sources:
            if not src.startswith("data:"):
                continue
            if src not in sparse:
                known = ", ".join(sorted(sparse)) or "none"
                raise ConfigError(f"Network layer '{name}': 'from' names {src!r}, but the data has no sparse "
                                  f"stream {src[5:]!r} (its sparse streams: {known}); of the streams besides "
                                  "'data', layers read only those with class ids here.")
            found[src] = sparse[src]
    return found


def _sources(name: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(s, str) for s in items):
        raise ConfigError(
            f"Network layer '{name}': 'from' must be a layer name or a non-empty list of names, "
            f"got {value!r}."
        )
    return tuple("data" if s == "data:data" else s for s in items)


def _check_cycles(specs: dict[str, LayerSpec]) -> None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2 or is_stream(name):
            return
        if state.get(name) == 1:
            cycle = path[path.index(name) :] + [name]
            raise ConfigError(
                f"The network has a cycle: {' -> '.join(cycle)} (each layer reads the next, by 'from' or "
                f"an option such as key_shift)."
            )
        state[name] = 1
        for src in specs[name].reads:
            visit(src, path + [name])
        state[name] = 2

    for name in specs:
        visit(name, [])


def build_order(specs: dict[str, LayerSpec]) -> list[str]:
    """Layers needed by ``output``, loss and ``is_output_layer`` layers, each after its sources."""
    roots = _roots(specs)
    order: list[str] = []

    def visit(name: str) -> None:
        if is_stream(name) or name in order:
            return
        for src in specs[name].reads:
            visit(src)
        order.append(name)

    for name in roots:
        visit(name)
    unused = [n for n in specs if n not in order]
    if unused:
        log.info(f"Network layers {unused} feed no output or loss layer and are not built.")
    return order


def _roots(specs: dict[str, LayerSpec]) -> list[str]:
    """RETURNN's output layers: ``output``, those with a loss and those marked ``is_output_layer``."""
    return [n for n, s in specs.items()
            if n == "output" or s.opts.get("is_output_layer")
            or (s.cls in ("softmax", "copy", "decide") and s.opts.get("loss"))
            or (s.subnetwork and any(isinstance(layer, dict) and layer.get("loss")
                                     for layer in s.opts["unit"].values()))]


def _unit_outputs(specs: dict[str, LayerSpec]) -> dict[str, LayerSpec]:
    """The ``"<rec>/<unit layer>"`` sources (2019-e2e-speech-to-text-comparison's triangle models read the
    first decoder's ``output2/readout`` as the second's encoder): entries of class ``UNIT_OUTPUT``. In
    training the unit layer's output on every step of the loop over the target's labels; the unit layer
    must be one the loop gives (``is_output_layer``, a loss layer or ``output``)."""
    found = {}
    for name, spec in list(specs.items()):
        for src in spec.sources:
            rec, _, unit_layer = src.partition("/")
            if src in specs or not unit_layer or rec not in specs or not specs[rec].subnetwork:
                continue
            unit = specs[rec].opts["unit"]
            layer = flatten_subnetworks(rec, unit).get(unit_layer)
            if not isinstance(layer, dict):
                raise ConfigError(f"Network layer '{name}': 'from' names {src!r}, but the unit of rec layer "
                                  f"'{rec}' has no layer '{unit_layer}'.")
            if not (layer.get("is_output_layer") or layer.get("loss") or unit_layer == "output"):
                raise ConfigError(f"Network layer '{name}' reads {src!r}, which the loop of '{rec}' does not "
                                  f"give: set 'is_output_layer': True on unit layer '{unit_layer}'.")
            found[src] = LayerSpec(UNIT_OUTPUT, (rec,), {"unit_layer": unit_layer})
    return found
