"""The ``network`` layer dict (RETURNN style) -> a ``SeqModel``.

Only the layers that ``output``, a loss layer or an ``is_output_layer`` layer depend on are built (as in
RETURNN), in dependency order; every layer of the dict is still checked, so a typo in an unused layer is
reported too. Internally the network runs time-major (T, B, F): the fused LSTM kernel wants that, and
returned outputs are transposed back to (B, T, F) only where someone reads them (``tf.function`` prunes
the rest).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from engine import log
from engine.errors import ConfigError, DataError
from engine.model.base import LossResult, SeqModel, masked_ce_sums
from engine.model.layers import Copy, Layer, Linear, Rec, Softmax
from engine.model.losses import l2_factor, l2_term
from engine.model.time_chunking import TimeChunking, TimeUnchunking, check_time_axes

_CLASS_OPTIONS = {
    "linear": {"n_out", "activation", "with_bias"},
    "softmax": {"n_out", "loss", "target", "loss_scale", "loss_opts", "with_bias"},
    "rec": {"n_out", "unit", "direction"},
    "copy": set(),
    "dropout": set(),
    "time_chunking": {"chunk_size", "chunk_step"},
    "time_unchunking": {"chunking_layer"},
}
_COMMON_OPTIONS = {"class", "from", "dropout", "is_output_layer", "L2"}
# layers for which the order of frames matters
RECURRENT_CLASSES = {"rec", "time_chunking", "time_unchunking"}


class LayerSpec(NamedTuple):
    cls: str
    sources: tuple[str, ...]
    opts: dict[str, Any]


def parse_network(network: Any) -> dict[str, LayerSpec]:
    """Check the dict's shape, layer classes, ``from`` references and cycles; ConfigError names the layer."""
    if not isinstance(network, dict) or not network:
        raise ConfigError(
            f"Config key 'network' must be a non-empty dict of layers, got {type(network).__name__}."
        )
    specs: dict[str, LayerSpec] = {}
    for name, opts in network.items():
        if not isinstance(name, str) or name == "data" or name.startswith("data:"):
            raise ConfigError(f"Network layer name {name!r} is not allowed ('data' is the input stream).")
        if not isinstance(opts, dict):
            raise ConfigError(
                f"Network layer '{name}' must be a dict like {{'class': 'linear', ...}}, got {opts!r}."
            )
        cls = opts.get("class")
        if cls not in _CLASS_OPTIONS:
            raise ConfigError(
                f"Network layer '{name}': unknown class {cls!r}; supported: {', '.join(_CLASS_OPTIONS)}."
            )
        unknown = sorted(set(opts) - _COMMON_OPTIONS - _CLASS_OPTIONS[cls])
        if unknown:
            log.warning(f"Network layer '{name}' ({cls}): option(s) {unknown} are not supported and ignored.")
        rate = opts.get("dropout", 0.0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
            raise ConfigError(f"Network layer '{name}': dropout must be a float in [0, 1), got {rate!r}.")
        specs[name] = LayerSpec(cls, _sources(name, opts.get("from", "data")), opts)
    for name, spec in specs.items():
        for src in spec.sources:
            if src != "data" and src not in specs:
                raise ConfigError(
                    f"Network layer '{name}': 'from' names {src!r}, which is not a layer of the "
                    f"network; layers: {', '.join(specs)} (and 'data')."
                )
    if "output" not in specs:
        raise ConfigError(f"The network has no layer called 'output' (layers: {', '.join(specs)}).")
    _check_cycles(specs)
    return specs


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
        if state.get(name) == 2 or name == "data":
            return
        if state.get(name) == 1:
            cycle = path[path.index(name) :] + [name]
            raise ConfigError(
                f"The network has a cycle: {' -> '.join(cycle)} (each layer takes 'from' the next)."
            )
        state[name] = 1
        for src in specs[name].sources:
            visit(src, path + [name])
        state[name] = 2

    for name in specs:
        visit(name, [])


def build_order(specs: dict[str, LayerSpec]) -> list[str]:
    """Layers needed by ``output``, loss and ``is_output_layer`` layers, each after its sources."""
    roots = [
        n
        for n, s in specs.items()
        if n == "output" or s.opts.get("is_output_layer") or (s.cls == "softmax" and s.opts.get("loss"))
    ]
    order: list[str] = []

    def visit(name: str) -> None:
        if name == "data" or name in order:
            return
        for src in specs[name].sources:
            visit(src)
        order.append(name)

    for name in roots:
        visit(name)
    unused = [n for n in specs if n not in order]
    if unused:
        log.info(f"Network layers {unused} feed no output or loss layer and are not built.")
    return order


class NetworkModel(SeqModel):
    """A ``SeqModel`` built from a ``network`` dict."""

    def __init__(
        self,
        network: dict,
        *,
        input_dim: int,
        input_sparse: bool,
        target_dims: dict[str, int],
        random_seed: int,
        twice_differentiable: bool = False,
    ) -> None:
        """``twice_differentiable``: use ops whose gradients can be differentiated again (slower LSTM)."""
        super().__init__(
            input_dim=input_dim, input_sparse=input_sparse, target_dims=target_dims, name="network"
        )
        self.specs = parse_network(network)
        self.order = build_order(self.specs)
        check_time_axes(self.specs, self.order,
                        [n for n in self.order
                         if self.specs[n].cls == "softmax" and self.specs[n].opts.get("loss")])
        self.random_seed = random_seed
        self.twice_differentiable = twice_differentiable
        dims = {"data": input_dim}
        self.layers: dict[str, Layer] = {}
        for name in self.order:
            spec = self.specs[name]
            in_dim = sum(dims[s] for s in spec.sources)
            layer = self._make_layer(name, spec, in_dim, self._takes_ids(spec), random_seed)
            self.layers[name] = layer
            dims[name] = layer.n_out
        self.l2 = {name: l2_factor(name, self.specs[name].opts) for name in self.order}
        self.loss_layers = [n for n, l in self.layers.items() if isinstance(l, Softmax) and l.loss]
        if "output" in self.loss_layers:  # the main loss layer reports error and frame count
            self.loss_layers.remove("output")
            self.loss_layers.insert(0, "output")

    def _make_layer(self, name: str, spec: LayerSpec, in_dim: int, ids: bool, seed: int) -> Layer:
        if spec.cls == "linear":
            return Linear(name, spec.opts, in_dim, sparse_input=ids, random_seed=seed)
        if spec.cls == "softmax":
            return Softmax(
                name, spec.opts, in_dim, sparse_input=ids, random_seed=seed, target_dims=self.target_dims
            )
        if spec.cls == "rec":
            return Rec(name, spec.opts, in_dim, random_seed=seed,
                       twice_differentiable=self.twice_differentiable)
        if spec.cls == "time_chunking":
            return TimeChunking(name, spec.opts, in_dim)
        if spec.cls == "time_unchunking":
            return TimeUnchunking(name, spec.opts, in_dim, self.layers.get(spec.opts.get("chunking_layer")))
        return Copy(in_dim)

    def _takes_ids(self, spec: LayerSpec) -> bool:
        """Sparse ``data`` straight into a weight matrix: a row lookup (embedding), not a one-hot matmul."""
        return (
            self.input_sparse
            and spec.sources == ("data",)
            and spec.cls in ("linear", "softmax")
            and not spec.opts.get("dropout")
        )

    @property
    def loss_targets(self) -> set[str]:
        return {self.layers[name].target for name in self.loss_layers}

    @property
    def recurrent(self) -> bool:
        return any(self.specs[name].cls in RECURRENT_CLASSES for name in self.order)

    def named_variables(self) -> dict[str, tf.Variable]:
        return {
            f"{name}/{key}": var for name, layer in self.layers.items() for key, var in layer.params.items()
        }

    def __call__(self, data: tf.Tensor, lengths: tf.Tensor, training: bool = False,
                 seed: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
        lengths = tf.cast(lengths, tf.int32)
        mask = tf.transpose(tf.sequence_mask(lengths, tf.shape(data)[1]))  # (T, B)
        if self.input_sparse:
            x = tf.transpose(tf.cast(data, tf.int32))
            x = tf.where(mask, x, tf.zeros_like(x))  # padded ids may be out of range
        else:
            x = tf.transpose(tf.cast(data, tf.float32), [1, 0, 2])
            x = tf.where(mask[:, :, None], x, tf.zeros_like(x))  # keep garbage (inf/nan) out of the math
        if seed is None:
            seed = tf.constant([self.random_seed, 0], tf.int64)
        outs = {"data": x}
        seq_lengths = {"data": lengths}  # per layer: chunking layers change the time axis and the batch
        time_steps = {}  # time_chunking layer -> the number of frames it cut into chunks
        result = {}
        for index, (name, layer) in enumerate(self.layers.items()):
            x = self._layer_input(name, outs, training, tf.random.experimental.stateless_fold_in(seed, index))
            layer_lengths = seq_lengths[self.specs[name].sources[0]]
            if isinstance(layer, TimeChunking):
                time_steps[name] = tf.shape(x)[0]
                y, layer_lengths = layer.chunk(x, layer_lengths)
            elif isinstance(layer, TimeUnchunking):
                y = layer.unchunk(x, layer_lengths, time_steps[layer.chunking_layer])
                layer_lengths = seq_lengths[self.specs[layer.chunking_layer].sources[0]]
            else:
                y = layer(x, layer_lengths, training)
            outs[name], seq_lengths[name] = y, layer_lengths
            if isinstance(layer, Softmax):
                result[f"{name}:logits"] = _batch_major(y)
                y = tf.nn.softmax(y)
            result[name] = _batch_major(y)
        return result

    def _layer_input(self, name: str, outs: dict[str, tf.Tensor], training: bool,
                     seed: tf.Tensor) -> tf.Tensor:
        spec = self.specs[name]
        if self.layers[name].sparse_input:
            return outs["data"]
        parts = []
        for src in spec.sources:
            part = outs[src]
            if src == "data" and self.input_sparse:
                part = tf.one_hot(part, self.input_dim, dtype=tf.float32)
            parts.append(part)
        x = parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)
        rate = float(spec.opts.get("dropout", 0.0))
        if training and rate > 0.0:
            x = tf.nn.experimental.stateless_dropout(x, rate=rate, seed=seed)
        return x

    def compute_losses(
        self,
        model_outputs: dict[str, tf.Tensor],
        targets: dict[str, tf.Tensor],
        target_lengths: dict[str, tf.Tensor],
    ) -> LossResult:
        if not self.loss_layers:
            raise ConfigError(
                "The network has no layer with a loss (a 'softmax' layer with 'loss': 'ce'), "
                "so it cannot be trained or scored."
            )
        loss = objective = error = frames = None
        for name in self.loss_layers:
            layer = self.layers[name]
            if layer.target not in targets or layer.target not in target_lengths:
                raise DataError(
                    f"Network layer '{name}' needs target {layer.target!r}, but the batch has only "
                    f"{sorted(targets)}."
                )
            ce, err, n = masked_ce_sums(
                model_outputs[f"{name}:logits"],
                targets[layer.target],
                target_lengths[layer.target],
                where=name,
                criterion=layer.criterion,
            )
            scaled = layer.criterion.scale * ce
            per_frame = scaled / tf.maximum(n, 1.0)
            if loss is None:
                loss, objective, error, frames = scaled, per_frame, err, n
            else:
                loss, objective = loss + scaled, objective + per_frame
        regularized = [l2_term(factor, self.layers[name].params.values())
                       for name, factor in self.l2.items() if factor and self.layers[name].params]
        return LossResult(loss=loss, error=error, num_frames=frames, objective=objective,
                          regularizer=tf.add_n(regularized) if regularized else 0.0)


def _batch_major(x: tf.Tensor) -> tf.Tensor:
    return tf.transpose(x, [1, 0, 2])
