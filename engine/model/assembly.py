"""The layers of a parsed ``network`` dict, built in dependency order: each from its spec, its input's axes
(``axes.Layout``: the sources concatenated along the features) and the layers built before it.

What holds for every layer is checked here: dense input where RETURNN's layer needs it, static axes only
into layers that take them, ``trainable`` and ``reuse_params`` (the layer reads the named layer's
parameters, which stay that layer's: saved, updated and mapped to RETURNN's names once).
"""
from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from engine.config.loader import Config
from engine.model.axes import Layout
from engine.model.initializers import check_bias_init
from engine.model.layers.attention import PositionalEncoding, RelativePositionalEncoding, SelfAttention
from engine.model.layers.base import Layer
from engine.model.layers.batch_norm import BatchNorm
from engine.model.layers.conv import Conv, Pool, window_axes
from engine.model.layers.conv2d import Conv2D, Pool2D
from engine.model.layers.dense import Copy, Linear, Softmax
from engine.model.layers.dot import Dot
from engine.model.layers.elementwise import Activation, Combine
from engine.model.layers.eval import Eval
from engine.model.layers.features import FeatureSlice, Gating, ReduceOut
from engine.model.layers.lstm_norm import NormLstmRec
from engine.model.layers.lstm_norm_options import NORM_LSTM_UNIT
from engine.model.layers.norm import LayerNorm
from engine.model.layers.per_sequence import Length, SequenceCompare, SqueezeTime
from engine.model.layers.recurrent import Rec
from engine.model.layers.reduce import Reduce
from engine.model.layers.reinterpret import ReinterpretData
from engine.model.layers.reshape import MergeDims, SplitDims
from engine.model.layers.time_attention import AttentionPooling, SoftmaxOverTime
from engine.model.layers.time_chunking import TimeChunking, TimeUnchunking
from engine.model.layers.transposed_conv import TransposedConv
from engine.model.layers.window_pad import Pad, SwapAxes, Window
from engine.model.rec.decide import Decide
from engine.model.rec.frames import Axis, Template
from engine.model.rec.outside import UnitOutput
from engine.model.rec.subnet import RecSubnet
from engine.model.spec import UNIT_OUTPUT, LayerSpec, sparse_stream_dims, stream_sources
from engine.model.spec_readers import sequence_kinds
from engine.runtime.errors import ConfigError

# classes whose RETURNN layer needs dense input: on sparse data a one-hot would silently change their meaning
_DENSE_INPUT = ("conv", "pool", "layer_norm", "activation", "combine", "gating", "reduce_out", "slice",
                "split_dims", "merge_dims", "batch_norm", "transposed_conv", "window", "pad", "swap_axes",
                "reduce", "dot", "softmax_over_spatial", "generic_attention")

# classes built from their name, options and input dim alone
_BUILT_FROM_OPTIONS = {"time_chunking": TimeChunking, "pool": Pool, "layer_norm": LayerNorm,
                       "activation": Activation, "gating": Gating, "reduce_out": ReduceOut,
                       "slice": FeatureSlice, "length": Length, "compare": SequenceCompare}

# classes built from their name, options and input axes
_BUILT_FROM_LAYOUT = {"split_dims": SplitDims, "merge_dims": MergeDims, "window": Window, "pad": Pad,
                      "swap_axes": SwapAxes, "reduce": Reduce, "reinterpret_data": ReinterpretData,
                      "softmax_over_spatial": SoftmaxOverTime}


class BuildOptions(NamedTuple):
    """What the network's options say about every layer (``NetworkModel``'s arguments of those names)."""

    input_dim: int
    input_sparse: bool
    target_dims: dict[str, int]
    random_seed: int
    twice_differentiable: bool
    lstm_implementation: str | None
    compute_dtype: str
    config: Config | None


def input_layout(name: str, spec: LayerSpec, layouts: dict[str, Layout]) -> Layout:
    """The axes of the layer's input: its sources concatenated along the features, which needs the same
    static axes in each (a ``combine`` layer checks its own)."""
    spatial = {layouts[s].spatial for s in spec.sources}
    if len(spatial) > 1:
        listed = ", ".join(f"'{s}' {layouts[s].describe()}" for s in spec.sources)
        raise ConfigError(f"Network layer '{name}': its sources have different static axes besides the "
                          f"features ({listed}); they can be concatenated only along the features.")
    return Layout(spatial.pop(), sum(layouts[s].feature for s in spec.sources))


def _freeze(layer: Layer) -> None:
    """RETURNN's ``"trainable": False``: the layer's parameters keep their values (initial or loaded); no
    update, no accumulated gradient and no L2 decay touches them. A layer reads its parameters from
    ``params`` on every call, so swapping in non-trainable copies is all it takes."""
    layer.params = {key: tf.Variable(var, trainable=False, name=var.name.split(":")[0])
                    for key, var in layer.params.items()}


def _share(name: str, spec: LayerSpec, layer: Layer, owner: Layer) -> None:
    """``reuse_params``: the layer reads the owner's variables (RETURNN reuses the owner's variable scope)."""
    shapes = {key: tuple(var.shape) for key, var in layer.params.items()}
    owned = {key: tuple(var.shape) for key, var in owner.params.items()}
    if shapes != owned:
        raise ConfigError(f"Network layer '{name}': reuse_params '{spec.shares_params_of}' has the "
                          f"parameters {owned}, this layer needs {shapes}.")
    # RETURNN trains a shared parameter when any layer holding it is trainable: a reusing layer's False
    # changes nothing (the owner's True trains it, its False freezes it), its True where the owner's is False
    # would train the owner's frozen parameters
    if spec.opts.get("trainable", False) is True and owner.params and \
            not next(iter(owner.params.values())).trainable:
        raise ConfigError(f"Network layer '{name}': 'trainable' True on a layer with reuse_params of "
                          f"'{spec.shares_params_of}', whose parameters are frozen ('trainable': False): "
                          "RETURNN would train them through this layer; set it on the owner.")
    layer.params = owner.params
    layer.shares_params_of = spec.shares_params_of


def sparse_streams(options: BuildOptions) -> dict[str, int]:
    return sparse_stream_dims(options.input_dim, options.input_sparse, options.target_dims)


def _stream_layouts(specs: dict[str, LayerSpec], order: list[str],
                    options: BuildOptions) -> dict[str, Layout]:
    """``data`` and the other streams the layers read (each must be a sparse stream of the data)."""
    layouts = {"data": Layout((), options.input_dim)}
    for src, dim in stream_sources(specs, order, sparse_streams(options)).items():
        layouts[src] = Layout((), dim)
    return layouts


def build_layers(specs: dict[str, LayerSpec], order: list[str], options: BuildOptions,
                 time_axes: dict[str, tuple[str, ...]]) -> dict[str, Layer]:
    """Every layer of ``order``, built after the layers it reads; ``time_axes``: each layer's time axis
    (``time_chunking.check_time_axes``)."""
    layouts = _stream_layouts(specs, order, options)
    sparse = set(sparse_streams(options))
    kinds = sequence_kinds(specs)
    layers: dict[str, Layer] = {}
    for name in order:
        spec = specs[name]
        if spec.cls == UNIT_OUTPUT:  # a unit layer's output over the loop's steps (rec/outside.py)
            layers[name] = UnitOutput(name, layers[spec.sources[0]], spec.opts["unit_layer"])
            layouts[name] = Layout((), layers[name].n_out)
            continue
        _check_dense_input(name, spec, sparse)
        _check_sparse_sources(name, spec, layers)
        if spec.subnetwork:
            source = None
            if spec.sources:  # a loop over the sources' frames
                layout = input_layout(name, spec, layouts)
                if layout.spatial:
                    raise ConfigError(f"Network layer '{name}': its input {layout.describe()} has static "
                                      "axes besides the features; a rec unit takes frames of features.")
                source = Template((), layout.feature)
            bases = _base_templates(spec, layouts, layers, time_axes, kinds)
            layers[name] = RecSubnet(name, spec.opts, bases,
                                     target_dims=options.target_dims, random_seed=options.random_seed,
                                     config=options.config, source=source)
            layouts[name] = Layout((), layers[name].n_out)
            continue
        layout = input_layout(name, spec, layouts)
        if spec.cls == "decide":
            layer = Decide(name, spec.opts, layout.feature, options.target_dims)
        elif spec.cls == "combine":
            layer = Combine(name, spec.opts, {s: layouts[s].feature for s in spec.sources})
        elif spec.cls == "dot":
            layer = Dot(name, spec.opts, [layouts[s] for s in spec.sources])
        elif spec.cls == "eval":
            layer = Eval.for_network(name, specs, layouts, sparse, options.config)
        elif spec.cls == "generic_attention":
            layer = AttentionPooling(name, spec.opts, layouts[spec.sources[0]], layouts[spec.sources[1]])
        elif spec.cls == "squeeze":
            layer = SqueezeTime(name, spec.opts, layout.feature, spec.sources[0] in sparse)
        else:
            layer = _make_layer(name, spec, layout, layers, options, sparse, kinds.get(name) == "vector")
            check_bias_init(name, spec.opts, layer.params)
        if layout.spatial and not layer.takes_spatial:
            raise ConfigError(f"Network layer '{name}': its input {layout.describe()} has static axes "
                              f"besides the features, which a {spec.cls} layer here does not take; merge "
                              "them into the features first ('merge_dims' with axes 'static').")
        layer.compute_dtype = tf.as_dtype(options.compute_dtype)
        if spec.shares_params_of:
            _share(name, spec, layer, layers[spec.shares_params_of])
        elif spec.opts.get("trainable", True) is False:
            _freeze(layer)
        layers[name] = layer
        layouts[name] = Layout(layout.spatial if layer.spatial is None else layer.spatial, layer.n_out)
        if getattr(layer, "ids_output", False):  # an eval of class ids: read as a sparse stream is
            sparse.add(name)
    return layers


def _base_templates(spec: LayerSpec, layouts: dict[str, Layout], layers: dict[str, Layer],
                    time_axes: dict[str, tuple[str, ...]], kinds: dict[str, str]) -> dict[str, Template]:
    """The templates of the layers a unit reads as ``base:``: their time axis (layers on the same one share
    its label, ``T:<the layers that made its frames>``: an audio encoder's and a text encoder's differ; the
    unit checks at run time that the lengths of a label's layers agree) and their static axes; none for a
    vector per sequence (``kinds``: ``spec_readers.sequence_kinds``)."""
    templates = {}
    for name in spec.unit_bases:
        static = tuple(Axis(f"S{size}:{name}:{index}", size)
                       for index, size in enumerate(layouts[name].spatial))
        if isinstance(layers.get(name), SequenceCompare):  # a flag per sequence, (B,) in the unit
            templates[name] = Template((), 1, sparse=True, dtype=tf.bool)
            continue
        label = "T:" + ("/".join(time_axes.get(name, (name,))) or "data")
        time = () if kinds.get(name) == "vector" else (Axis(label, None),)
        templates[name] = Template(time + static, layouts[name].feature)
    return templates


def _check_sparse_sources(name: str, spec: LayerSpec, layers: dict[str, Layer]) -> None:
    """A subnetwork's output is class ids, which only a decide layer reads here."""
    for source in spec.sources:
        searched = isinstance(layers.get(source), RecSubnet) and layers[source].choice
        if searched and (spec.cls != "decide" or len(spec.sources) > 1):
            raise ConfigError(f"Network layer '{name}' reads '{source}', a rec layer whose unit's output is "
                              "class ids; here only a 'decide' layer (with that one source) reads it.")
    if spec.cls == "decide" and not all(isinstance(layers.get(s), RecSubnet) and layers[s].choice
                                        for s in spec.sources):
        raise ConfigError(f"Network layer '{name}': a decide layer reads a rec layer with a subnetwork unit "
                          f"(its search's hypotheses), got {list(spec.sources)}.")


def _on_vectors(spec: LayerSpec, vectors: bool) -> dict:
    """The options as they apply to the layer's input: on vectors per sequence (here one frame each,
    ``spec_readers.py``) RETURNN's ``except_batch`` names the axes this layout calls ``except_time``."""
    if vectors and spec.cls == "merge_dims" and spec.opts.get("axes") == "except_batch":
        return {**spec.opts, "axes": "except_time"}
    return spec.opts


def _make_layer(name: str, spec: LayerSpec, layout: Layout, built: dict[str, Layer],
                options: BuildOptions, sparse: set[str], vectors: bool) -> Layer:
    in_dim, seed = layout.feature, options.random_seed
    ids = _takes_ids(spec, sparse)
    if spec.cls == "batch_norm":
        return BatchNorm(name, spec.opts, in_dim, random_seed=seed)
    if spec.cls in ("conv", "pool") and window_axes(name, spec.opts, spec.cls) == 2:
        return Conv2D(name, spec.opts, layout, random_seed=seed) if spec.cls == "conv" else \
            Pool2D(name, spec.opts, layout)
    if spec.cls in _BUILT_FROM_LAYOUT:
        return _BUILT_FROM_LAYOUT[spec.cls](name, _on_vectors(spec, vectors), layout)
    if spec.cls == "linear":
        return Linear(name, spec.opts, in_dim, sparse_input=ids, random_seed=seed)
    if spec.cls == "softmax":
        return Softmax(name, spec.opts, in_dim, sparse_input=ids, random_seed=seed,
                       target_dims=options.target_dims)
    if spec.cls == "rec" and str(spec.opts.get("unit")).lower() == NORM_LSTM_UNIT:
        return NormLstmRec(name, spec.opts, in_dim, random_seed=seed)
    if spec.cls == "rec":
        return Rec(name, spec.opts, in_dim, random_seed=seed,
                   twice_differentiable=options.twice_differentiable,
                   implementation=options.lstm_implementation)
    if spec.cls in _BUILT_FROM_OPTIONS:
        return _BUILT_FROM_OPTIONS[spec.cls](name, spec.opts, in_dim)
    if spec.cls == "time_unchunking":
        return TimeUnchunking(name, spec.opts, in_dim, built.get(spec.opts.get("chunking_layer")))
    if spec.cls == "conv":
        return Conv(name, spec.opts, in_dim, random_seed=seed)
    if spec.cls == "transposed_conv":
        return TransposedConv(name, spec.opts, in_dim, random_seed=seed)
    if spec.cls == "positional_encoding":
        return PositionalEncoding(name, spec.opts, in_dim, spec.sources)
    if spec.cls == "self_attention":
        return SelfAttention(name, spec.opts, in_dim, random_seed=seed,
                             key_shift=built.get(spec.references.get("key_shift", "")))
    if spec.cls == "relative_positional_encoding":
        return RelativePositionalEncoding(name, spec.opts, in_dim, random_seed=seed)
    return Copy(name, spec.opts, in_dim, options.target_dims)


def _check_dense_input(name: str, spec: LayerSpec, sparse: set[str]) -> None:
    dense = spec.cls in _DENSE_INPUT or (spec.cls == "positional_encoding" and spec.opts.get("add_to_input"))
    ids = [s for s in spec.sources if s in sparse]
    if ids and dense:
        raise ConfigError(f"Network layer '{name}': RETURNN's {spec.cls} layer takes dense input, but "
                          f"'{ids[0]}' is sparse (class ids); put a linear layer (an embedding) in between.")


def _takes_ids(spec: LayerSpec, sparse: set[str]) -> bool:
    """One sparse stream straight into a weight matrix: a row lookup (embedding), not a one-hot matmul."""
    return (len(spec.sources) == 1 and spec.sources[0] in sparse and spec.cls in ("linear", "softmax")
            and not spec.opts.get("dropout"))
