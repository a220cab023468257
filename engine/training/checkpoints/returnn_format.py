"""RETURNN's names and layouts of a ``network`` dict's parameters, and how they map to this engine's.

RETURNN (TensorFlow 2, commit b46ff5f0f, ``returnn/tf/layers``) names a parameter ``<layer>/<name>``. For
``linear``, ``softmax``, ``conv``, ``layer_norm``, ``self_attention``, ``combine`` and
``relative_positional_encoding`` the engine's parameters have RETURNN's names, shapes and layouts (``W``,
``b``, ``bias``, ``scale``, ``QKV``, ``encoding_matrix``). A
``rec`` layer's LSTM differs: this engine keeps one ``W`` (in + n, 4n), rows [input; recurrent], gate
columns (input, cell input, forget, output) and one ``b`` (4n), while RETURNN's unit decides names,
split and gate order (``LSTM_LAYOUTS``), and some of its units add a constant forget bias at run time:

=====================================================  ===========================================  ====
RETURNN unit (lower case) -> what RETURNN runs on TF 2  its variables under ``<layer>/rec/``          fb
=====================================================  ===========================================  ====
lstm, lstmp, nativelstm2; lstmblock, lstmblockfused     ``W`` (in, 4n), ``W_re`` (n, 4n), ``b`` (4n);  0
and cudnnlstm without GPU (``get_rnn_cell_class``        gates (cell input, input, forget, output)
maps them to NativeLSTM2 on TF 2) -> NativeLstm2
nativelstm -> NativeLstmCell; vanillalstm ->            the same                                     0
VanillaLSTMCell
nativelstmlowmem -> NativeLstmLowMemCell                ``W`` (in + n, 4n) rows [input; recurrent],   0
                                                        ``b``; gates as NativeLstm2
standardlstm -> TF's LSTMCell                           ``lstm_cell/kernel`` (in + n, 4n),            1
                                                        ``lstm_cell/bias``; the engine's gate order
basiclstm -> TF's BasicLSTMCell                         ``basic_lstm_cell/kernel``, ``.../bias``;     1
                                                        the engine's gate order
layernormvariantslstm -> LayerNormVariantsLSTMCell      the engine's parameters, named as they are    0
                                                        (``W_ff``, ``W_re``, ``gamma_new_c``, ...)
=====================================================  ===========================================  ====

fb: the forget bias RETURNN adds to the forget gate's input at every step (NativeLstm2 & co. assert
``forget_bias == 0``; TF's LSTMCell and BasicLSTMCell default to 1.0). The engine's ``Rec`` adds its own
``forget_bias`` (0.0 where the layer has none), so a conversion moves the difference into ``b``:
engine b_forget = RETURNN b_forget + RETURNN fb - engine fb, which is RETURNN's bias value unchanged
when both add the same. The outputs are then RETURNN's for every unit.

A mapping (``SameNames``, ``Renamed`` for batch_norm, ``LstmParams``) converts one layer's values both
ways; ``ReturnnView`` applies them to a whole model: RETURNN's names and shapes, the current values under
those names, and assigning some or all of them (what a partial load such as ``preload_from_files`` with
``ignore_params`` needs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

import numpy as np

from engine.model.layers.lstm_norm_options import NORM_LSTM_UNIT
from engine.runtime.errors import ConfigError

ENGINE_GATES = ("input", "cell_in", "forget", "output")  # lstm.py's column blocks of W and b
# layer classes whose parameters RETURNN names, shapes and lays out as the engine does
SAME_NAMES_CLASSES = ("linear", "softmax", "conv", "layer_norm", "self_attention", "combine",
                      "relative_positional_encoding", "transposed_conv")


@dataclass(frozen=True)
class LstmLayout:
    """How one family of RETURNN's LSTM implementations stores its parameters under ``<layer>/rec/``."""

    cells: str  # RETURNN's classes that store it this way, for messages
    kernel: str  # input weights (in, 4n), or with ``recurrent`` None [input; recurrent] weights (in + n, 4n)
    recurrent: str | None  # recurrent weights (n, 4n), or None: rows of ``kernel``
    bias: str
    gates: tuple[str, ...]  # RETURNN's order of the four column blocks, in ENGINE_GATES' names
    forget_bias: float  # added to the forget gate's input at run time

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.kernel, self.recurrent, self.bias) if n)


NATIVE = LstmLayout("NativeLstm2, NativeLstmCell, VanillaLSTMCell", "W", "W_re", "b",
                    ("cell_in", "input", "forget", "output"), 0.0)
LOW_MEM = LstmLayout("NativeLstmLowMemCell", "W", None, "b", ("cell_in", "input", "forget", "output"), 0.0)
STANDARD = LstmLayout("TensorFlow's LSTMCell (StandardLSTM)", "lstm_cell/kernel", None, "lstm_cell/bias",
                      ENGINE_GATES, 1.0)
BASIC = LstmLayout("TensorFlow's BasicLSTMCell", "basic_lstm_cell/kernel", None, "basic_lstm_cell/bias",
                   ENGINE_GATES, 1.0)
LSTM_LAYOUTS: dict[str, LstmLayout] = {
    "lstm": NATIVE, "lstmp": NATIVE, "nativelstm2": NATIVE, "lstmblock": NATIVE, "lstmblockfused": NATIVE,
    "cudnnlstm": NATIVE, "nativelstm": NATIVE, "vanillalstm": NATIVE,
    "nativelstmlowmem": LOW_MEM, "standardlstm": STANDARD, "basiclstm": BASIC,
}


class ParamMapping(Protocol):
    """One layer's parameters under RETURNN's names, both ways."""

    layer: str

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """RETURNN's full names -> shapes."""

    def to_returnn(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The engine's values (by parameter key, ``W``) -> RETURNN's (by full name)."""

    def from_returnn(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """RETURNN's values (every name of ``shapes``) -> the engine's, by parameter key."""

    def sources(self) -> dict[str, tuple[str, ...]]:
        """Engine parameter key -> the RETURNN names its value is made of."""


@dataclass
class SameNames:
    """``<layer>/<key>`` in both, same shape and layout."""

    layer: str
    params: dict[str, tuple[int, ...]]  # engine key -> shape

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {f"{self.layer}/{key}": shape for key, shape in self.params.items()}

    def to_returnn(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {f"{self.layer}/{key}": params[key] for key in self.params}

    def from_returnn(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {key: values[f"{self.layer}/{key}"] for key in self.params}

    def sources(self) -> dict[str, tuple[str, ...]]:
        return {key: (f"{self.layer}/{key}",) for key in self.params}


@dataclass
class Renamed:
    """Same shapes and layouts, other names: ``batch_norm``'s ``<layer>/batch_norm/<prefix>mean`` & co.
    (the layer's ``returnn_names``; the prefix depends on its ``param_version``), and unit
    ``layernormvariantslstm``'s ``<layer>/rec/<key>`` (``W_ff``, ``gamma_new_c``, ...)."""

    layer: str
    params: dict[str, tuple[int, ...]]  # engine key -> shape
    names: dict[str, str]  # engine key -> RETURNN's full name

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.names[key]: shape for key, shape in self.params.items()}

    def to_returnn(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {self.names[key]: params[key] for key in self.params}

    def from_returnn(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {key: values[self.names[key]] for key in self.params}

    def sources(self) -> dict[str, tuple[str, ...]]:
        return {key: (self.names[key],) for key in self.params}


@dataclass
class LstmParams:
    """A ``rec`` layer: the engine's ``W``/``b`` <-> RETURNN's variables of ``layout``."""

    layer: str
    in_dim: int
    n: int
    layout: LstmLayout
    engine_forget_bias: float

    def _name(self, key: str) -> str:
        return f"{self.layer}/rec/{key}"

    def shapes(self) -> dict[str, tuple[int, ...]]:
        n, layout = self.n, self.layout
        kernel_rows = self.in_dim if layout.recurrent else self.in_dim + n
        shapes = {self._name(layout.kernel): (kernel_rows, 4 * n)}
        if layout.recurrent:
            shapes[self._name(layout.recurrent)] = (n, 4 * n)
        shapes[self._name(layout.bias)] = (4 * n,)
        return shapes

    def _reorder(self, x: np.ndarray, source: tuple[str, ...], target: tuple[str, ...]) -> np.ndarray:
        """The four column blocks of ``x`` (last axis), from gate order ``source`` to ``target``."""
        blocks = np.split(x, 4, axis=-1)
        return np.concatenate([blocks[source.index(gate)] for gate in target], axis=-1)

    def _forget_shift(self) -> np.ndarray:
        """What moves into b: RETURNN adds ``layout.forget_bias`` at run time, the engine its own."""
        shift = np.zeros(4 * self.n, np.float32)
        k = ENGINE_GATES.index("forget")
        shift[k * self.n:(k + 1) * self.n] = self.layout.forget_bias - self.engine_forget_bias
        return shift

    def to_returnn(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        layout = self.layout
        weights = self._reorder(np.asarray(params["W"]), ENGINE_GATES, layout.gates)
        bias = np.asarray(params["b"])
        if self.layout.forget_bias != self.engine_forget_bias:
            bias = bias - self._forget_shift()
        values = {self._name(layout.bias): self._reorder(bias, ENGINE_GATES, layout.gates)}
        if layout.recurrent:
            values[self._name(layout.kernel)] = weights[:self.in_dim]
            values[self._name(layout.recurrent)] = weights[self.in_dim:]
        else:
            values[self._name(layout.kernel)] = weights
        return values

    def from_returnn(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        layout = self.layout
        weights = np.asarray(values[self._name(layout.kernel)])
        if layout.recurrent:
            weights = np.concatenate([weights, np.asarray(values[self._name(layout.recurrent)])], axis=0)
        bias = self._reorder(np.asarray(values[self._name(layout.bias)]), layout.gates, ENGINE_GATES)
        if self.layout.forget_bias != self.engine_forget_bias:
            bias = bias + self._forget_shift()
        return {"W": self._reorder(weights, layout.gates, ENGINE_GATES), "b": bias}

    def sources(self) -> dict[str, tuple[str, ...]]:
        layout = self.layout
        return {"W": tuple(self._name(n) for n in (layout.kernel, layout.recurrent) if n),
                "b": (self._name(layout.bias),)}


def layer_mapping(name: str, cls: str, opts: Mapping, layer) -> ParamMapping | None:
    """The mapping of one built layer (None: it has no parameters). ``layer`` is the engine's layer
    object: its ``params``, ``in_dim``, ``n_out`` and (``Rec``) ``forget_bias``. A layer that reads another's
    parameters (``reuse_params``) has none of its own: RETURNN saves them once, under the owner's name."""
    if not layer.params or layer.shares_params_of:
        return None
    if cls == "rec" and isinstance(opts.get("unit"), dict):  # a subnetwork: its layers under <layer>/rec/
        shapes = {key: tuple(var.shape) for key, var in layer.params.items()}
        return Renamed(name, shapes, {key: f"{name}/rec/{key}" for key in shapes})
    if cls == "rec" and str(opts.get("unit")).lower() == NORM_LSTM_UNIT:  # RETURNN's variables as they are
        shapes = {key: tuple(var.shape) for key, var in layer.params.items()}
        return Renamed(name, shapes, {key: f"{name}/rec/{key}" for key in shapes})
    if cls == "rec":
        unit = str(opts.get("unit", "lstm")).lower()
        # lstm.py's kernel adds no forget bias of its own where the layer does not say otherwise
        return LstmParams(name, layer.in_dim, layer.n_out, LSTM_LAYOUTS[unit],
                          float(getattr(layer, "forget_bias", 0.0)))
    if cls in SAME_NAMES_CLASSES:
        return SameNames(name, {key: tuple(var.shape) for key, var in layer.params.items()})
    if cls == "batch_norm":
        shapes = {key: tuple(var.shape) for key, var in layer.params.items()}
        return Renamed(name, shapes, layer.returnn_names)
    raise ConfigError(f"Network layer '{name}' (class {cls}) has parameters, but no mapping to RETURNN's "
                      "checkpoint names is known for its class "
                      "(engine/training/checkpoints/returnn_format.py).")


class ReturnnView:
    """A ``network`` dict model's parameters under RETURNN's names."""

    def __init__(self, model) -> None:
        if not hasattr(model, "specs") or not hasattr(model, "layers"):
            raise ConfigError("RETURNN checkpoints map to models built from a 'network' dict; this model "
                              "comes from get_model, whose variables have no RETURNN names.")
        self.model = model
        self.mappings = [m for name, layer in model.layers.items()
                         if (m := layer_mapping(name, model.specs[name].cls, model.specs[name].opts, layer))]
        self._owner = {name: m for m in self.mappings for name in m.shapes()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: shape for m in self.mappings for name, shape in m.shapes().items()}

    def describe(self, name: str) -> str:
        """``lstm/rec/W_re`` -> ``lstm/rec/W_re (rec layer 'lstm', unit LSTM: NativeLstm2, ...)``."""
        mapping = self._owner.get(name)
        if isinstance(mapping, LstmParams):
            unit = self.model.specs[mapping.layer].opts.get("unit", "lstm")
            return f"{name} (rec layer '{mapping.layer}', unit {unit}: {mapping.layout.cells})"
        return name

    def _engine_values(self, mapping: ParamMapping) -> dict[str, np.ndarray]:
        return {key: var.numpy() for key, var in self.model.layers[mapping.layer].params.items()}

    def values(self) -> dict[str, np.ndarray]:
        """The current values, by RETURNN's names."""
        return {name: value for m in self.mappings
                for name, value in m.to_returnn(self._engine_values(m)).items()}

    def assign(self, values: Mapping[str, np.ndarray]) -> None:
        """Set the parameters given by RETURNN's names; the others keep their values. An engine parameter
        made of several RETURNN ones (an LSTM's W from W and W_re) takes the given ones and keeps the rest."""
        for mapping in self.mappings:
            given = set(mapping.shapes()) & set(values)
            if not given:
                continue
            current = mapping.to_returnn(self._engine_values(mapping))
            current.update({name: values[name] for name in given})
            converted = mapping.from_returnn(current)
            params = self.model.layers[mapping.layer].params
            for key, names in mapping.sources().items():
                if given & set(names):  # untouched ones keep their exact values
                    params[key].assign(np.asarray(converted[key], params[key].dtype.as_numpy_dtype))

    def hint(self, missing: list[str], unused: list[str]) -> str:
        """For an LSTM whose variables are missing while the file holds another unit's: which units read
        those."""
        notes = []
        for mapping in self.mappings:
            if not isinstance(mapping, LstmParams) or not set(mapping.shapes()) & set(missing):
                continue
            for layout in dict.fromkeys(LSTM_LAYOUTS.values()):
                names = [mapping._name(n) for n in layout.names()]
                if layout != mapping.layout and all(n in unused for n in names):
                    units = ", ".join(u for u, other in LSTM_LAYOUTS.items() if other == layout)
                    notes.append(f"Layer '{mapping.layer}': the checkpoint holds {', '.join(names)}, the "
                                 f"variables of RETURNN's {layout.cells}; this engine reads them for unit "
                                 f"{units}.")
        return " ".join(notes)
