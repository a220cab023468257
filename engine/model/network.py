"""The ``network`` layer dict (RETURNN style) -> a ``SeqModel``.

Only the layers that ``output``, a loss layer or an ``is_output_layer`` layer depend on are built (as in
RETURNN), in dependency order; every layer of the dict is still checked, so a typo in an unused layer is
reported too. Internally the network runs time-major (T, B, F): the fused LSTM kernel wants that, and
returned outputs are transposed back to (B, T, F) only where someone reads them (``tf.function`` prunes
the rest). Each layer's sequence lengths travel with it (``Layer.out_lengths``; conv and pool may change
them) and come back as ``"<layer>:lengths"`` (B,), int32, e.g. for a CTC loss on a downsampled output.
"""

from __future__ import annotations

from typing import Collection

import tensorflow as tf

from engine.config.key_check import enforce
from engine.model.base import LossResult, SeqModel, masked_ce_sums
from engine.model.layers.attention import PositionalEncoding, SelfAttention
from engine.model.layers.base import Layer
from engine.model.layers.conv import Conv, Pool, window_options
from engine.model.layers.dense import Copy, Linear, Softmax
from engine.model.layers.elementwise import Activation, Combine
from engine.model.layers.features import FeatureSlice, Gating, ReduceOut
from engine.model.layers.norm import LayerNorm
from engine.model.layers.recurrent import Rec
from engine.model.layers.time_chunking import TimeChunking, TimeUnchunking, check_time_axes
from engine.model.losses.regularization import darc1_factor, darc1_term, l2_factor, l2_term
from engine.model.spec import RECURRENT_CLASSES, LayerSpec, build_order, layer_findings, parse_network
from engine.runtime.errors import ConfigError, DataError

# classes whose RETURNN layer needs dense input: on sparse data a one-hot would silently change their meaning
_DENSE_INPUT = ("conv", "pool", "layer_norm", "activation", "combine", "gating", "reduce_out", "slice")

# classes built from their name, options and input dim alone
_BUILT_FROM_OPTIONS = {"time_chunking": TimeChunking, "pool": Pool, "layer_norm": LayerNorm,
                       "activation": Activation, "gating": Gating, "reduce_out": ReduceOut,
                       "slice": FeatureSlice}


def _freeze(layer: Layer) -> None:
    """RETURNN's ``"trainable": False``: the layer's parameters keep their values (initial or loaded); no
    update, no accumulated gradient and no L2 decay touches them. A layer reads its parameters from
    ``params`` on every call, so swapping in non-trainable copies is all it takes."""
    layer.params = {key: tf.Variable(var, trainable=False, name=var.name.split(":")[0])
                    for key, var in layer.params.items()}


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
        ignored: Collection[str] = (),
        lstm_implementation: str | None = None,
        compute_dtype: str = "float32",
    ) -> None:
        """``twice_differentiable``: use ops whose gradients can be differentiated again (slower LSTM);
        ``ignored``: the config's ignore_keys (``"layer:option"`` entries apply here);
        ``lstm_implementation``: the config key of that name (``layers/lstm_choice.py``); ``compute_dtype``:
        what the layers compute in (``tf_amp``, ``precision.py``; the parameters stay float32)."""
        super().__init__(
            input_dim=input_dim, input_sparse=input_sparse, target_dims=target_dims, name="network"
        )
        self.specs = parse_network(network)
        enforce(layer_findings(self.specs, ignored), "The network")
        self.order = build_order(self.specs)
        losses = [n for n in self.order
                  if self.specs[n].cls in ("softmax", "copy") and self.specs[n].opts.get("loss")]
        resampling = [n for n in self.order if self.specs[n].cls in ("conv", "pool")
                      and not window_options(n, self.specs[n].opts, self.specs[n].cls).keeps_time]
        check_time_axes(self.specs, self.order, losses, resampling=resampling,
                        frame_loss_layers=[n for n in losses if self.specs[n].opts.get("loss") == "ce"])
        self.random_seed = random_seed
        self.twice_differentiable = twice_differentiable
        self.lstm_implementation = lstm_implementation
        self.compute_dtype = compute_dtype
        dims = {"data": input_dim}
        self.layers: dict[str, Layer] = {}
        for name in self.order:
            spec = self.specs[name]
            self._check_dense_input(name, spec)
            if spec.cls == "combine":
                layer = Combine(name, spec.opts, {s: dims[s] for s in spec.sources})
            else:
                in_dim = sum(dims[s] for s in spec.sources)
                layer = self._make_layer(name, spec, in_dim, self._takes_ids(spec), random_seed)
            layer.compute_dtype = tf.as_dtype(compute_dtype)
            if spec.opts.get("trainable", True) is False:
                _freeze(layer)
            self.layers[name] = layer
            dims[name] = layer.n_out
        self.l2 = {name: l2_factor(name, self.specs[name].opts) for name in self.order}
        self.darc1 = {name: darc1_factor(name, self.specs[name].opts) for name in self.order}
        self.loss_layers = [n for n, l in self.layers.items() if isinstance(l, (Softmax, Copy)) and l.loss]
        if "output" in self.loss_layers:  # the main loss layer reports error and frame count
            self.loss_layers.remove("output")
            self.loss_layers.insert(0, "output")
        if self.loss_layers and all(self.layers[n].only_on_eval for n in self.loss_layers):
            raise ConfigError(f"Network layers {self.loss_layers}: every loss has only_on_eval, so training "
                              "has nothing to optimise.")

    def _make_layer(self, name: str, spec: LayerSpec, in_dim: int, ids: bool, seed: int) -> Layer:
        if spec.cls == "linear":
            return Linear(name, spec.opts, in_dim, sparse_input=ids, random_seed=seed)
        if spec.cls == "softmax":
            return Softmax(
                name, spec.opts, in_dim, sparse_input=ids, random_seed=seed, target_dims=self.target_dims
            )
        if spec.cls == "rec":
            return Rec(name, spec.opts, in_dim, random_seed=seed,
                       twice_differentiable=self.twice_differentiable,
                       implementation=self.lstm_implementation)
        if spec.cls in _BUILT_FROM_OPTIONS:
            return _BUILT_FROM_OPTIONS[spec.cls](name, spec.opts, in_dim)
        if spec.cls == "time_unchunking":
            return TimeUnchunking(name, spec.opts, in_dim, self.layers.get(spec.opts.get("chunking_layer")))
        if spec.cls == "conv":
            return Conv(name, spec.opts, in_dim, random_seed=seed)
        if spec.cls == "positional_encoding":
            return PositionalEncoding(name, spec.opts, in_dim, spec.sources)
        if spec.cls == "self_attention":
            return SelfAttention(name, spec.opts, in_dim, random_seed=seed)
        return Copy(name, spec.opts, in_dim, self.target_dims)

    def _check_dense_input(self, name: str, spec: LayerSpec) -> None:
        dense = spec.cls in _DENSE_INPUT or (spec.cls == "positional_encoding"
                                             and spec.opts.get("add_to_input"))
        if self.input_sparse and "data" in spec.sources and dense:
            raise ConfigError(f"Network layer '{name}': RETURNN's {spec.cls} layer takes dense input, but "
                              "'data' is sparse (class ids); put a linear layer (an embedding) in between.")

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
    def normalized_loss_layers(self) -> list[str]:
        """The loss layers whose ``loss_opts`` set ``use_normalized_loss``."""
        return [name for name in self.loss_layers
                if getattr(self.layers[name].criterion, "normalized", False)]

    @property
    def recurrent(self) -> bool:
        return any(self.specs[name].cls in RECURRENT_CLASSES for name in self.order)

    @property
    def ctc_output(self) -> bool:
        return isinstance(self.layers["output"], Softmax) and self.layers["output"].loss == "ctc"

    def output_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        seq_lengths = {"data": tf.cast(lengths, tf.int32)}
        for name, layer in self.layers.items():
            source = self.specs[name].sources[0]
            if isinstance(layer, TimeChunking):  # chunks are no sequences; check_time_axes keeps
                seq_lengths[name] = None  # "output" off their time axis
            elif isinstance(layer, TimeUnchunking):
                seq_lengths[name] = seq_lengths[self.specs[layer.chunking_layer].sources[0]]
            elif seq_lengths[source] is not None:
                seq_lengths[name] = layer.out_lengths(seq_lengths[source])
            else:
                seq_lengths[name] = None
        return seq_lengths["output"]

    def named_variables(self) -> dict[str, tf.Variable]:
        return {
            f"{name}/{key}": var for name, layer in self.layers.items() for key, var in layer.params.items()
        }

    def l2_factors(self) -> dict[str, float]:
        return {f"{name}/{key}": self.l2[name] for name, layer in self.layers.items() if self.l2[name]
                for key, var in layer.params.items() if var.trainable}

    def score_layers(self) -> list[str]:
        return list(self.loss_layers)

    def returnn_parts(self) -> dict[str, tuple[int, ...]]:
        return {f"{name}/{key}": rows for name, layer in self.layers.items()
                for key, rows in layer.returnn_parts.items() if layer.params[key].trainable}

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
            layer_seed = tf.random.experimental.stateless_fold_in(seed, index)
            x = self._layer_input(name, outs, training, layer_seed)
            layer_lengths = seq_lengths[self.specs[name].sources[0]]
            if isinstance(layer, TimeChunking):
                time_steps[name] = tf.shape(x)[0]
                y, layer_lengths = layer.chunk(x, layer_lengths)
            elif isinstance(layer, TimeUnchunking):
                y = layer.unchunk(x, layer_lengths, time_steps[layer.chunking_layer])
                layer_lengths = seq_lengths[self.specs[layer.chunking_layer].sources[0]]
            elif layer.needs_seed:
                y = layer(x, layer_lengths, training,
                          seed=tf.random.experimental.stateless_fold_in(layer_seed, 1))
                layer_lengths = layer.out_lengths(layer_lengths)
            else:
                y = layer(x, layer_lengths, training)
                layer_lengths = layer.out_lengths(layer_lengths)
            if isinstance(layer, Softmax):  # later layers see the probabilities, as in RETURNN
                y = tf.cast(y, tf.float32)  # tf_amp: softmax and losses in float32
                result[f"{name}:logits"] = _batch_major(y)
                y = tf.nn.softmax(y)
            outs[name], seq_lengths[name] = y, layer_lengths
            result[name] = _batch_major(tf.cast(y, tf.float32))
            result[f"{name}:lengths"] = layer_lengths
        return result

    def _layer_input(self, name: str, outs: dict[str, tf.Tensor], training: bool,
                     seed: tf.Tensor) -> tf.Tensor | list[tf.Tensor]:
        """The layer's sources concatenated (or as a list, for a layer with ``separate_sources``), with
        one-hot sparse data and input dropout."""
        spec = self.specs[name]
        if self.layers[name].sparse_input:
            return outs["data"]
        parts = []
        for src in spec.sources:
            part = outs[src]
            if src == "data" and self.input_sparse:
                part = tf.one_hot(part, self.input_dim, dtype=tf.float32)
            parts.append(tf.cast(part, self.layers[name].compute_dtype))  # tf_amp; no op in float32
        if self.layers[name].separate_sources:
            return parts  # such a layer takes no input dropout (``Combine`` refuses the option)
        x = parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)
        rate = float(spec.opts.get("dropout", 0.0))
        if training and rate > 0.0:
            # RETURNN's default mask (Data.get_bc_shape): one per feature, shared by the batch and time
            noise_shape = tf.concat([tf.ones([tf.rank(x) - 1], tf.int32), tf.shape(x)[-1:]], axis=0)
            x = tf.nn.experimental.stateless_dropout(x, rate=rate, seed=seed, noise_shape=noise_shape)
        return x

    def compute_losses(
        self,
        model_outputs: dict[str, tf.Tensor],
        targets: dict[str, tf.Tensor],
        target_lengths: dict[str, tf.Tensor],
        training: bool = False,
    ) -> LossResult:
        if not self.loss_layers:
            raise ConfigError(
                "The network has no layer with a loss (a 'softmax' layer with 'loss': 'ce' or 'ctc'), "
                "so it cannot be trained or scored."
            )
        loss = error = frames = None
        terms = []
        for name in self.loss_layers:
            layer = self.layers[name]
            if training and layer.only_on_eval:
                continue
            if layer.target not in targets or layer.target not in target_lengths:
                raise DataError(
                    f"Network layer '{name}' needs target {layer.target!r}, but the batch has only "
                    f"{sorted(targets)}."
                )
            if layer.loss == "edit_distance":
                value, err, n = layer.criterion.sums(
                    model_outputs[name], model_outputs[f"{name}:lengths"], targets[layer.target],
                    target_lengths[layer.target], layer=name, target=layer.target)
            elif layer.loss == "ctc":
                value, err, n = layer.criterion.sums(
                    model_outputs[f"{name}:logits"], model_outputs[f"{name}:lengths"], targets[layer.target],
                    target_lengths[layer.target], layer=name, target=layer.target, training=training)
            else:
                value, err, n = masked_ce_sums(
                    model_outputs[f"{name}:logits"],
                    targets[layer.target],
                    target_lengths[layer.target],
                    where=name,
                    criterion=layer.criterion,
                )
            if error is None:  # the main loss layer: its error and count are reported
                error, frames = err, n
            if layer.loss == "edit_distance":
                continue  # statistics only: no loss value (RETURNN's EditDistanceLoss has none)
            if loss is None:  # the first loss value is reported unscaled, as RETURNN's score_<layer>
                loss = value
            # RETURNN's objective: each loss summed over the batch, times its scale, and divided by its
            # count only with use_normalized_loss (LossHolder in returnn/tf/network.py)
            term = layer.criterion.scale * value
            terms.append(term / tf.maximum(n, 1.0) if layer.criterion.normalized else term)
        regularized = [l2_term(factor, self.layers[name].params.values())
                       for name, factor in self.l2.items() if factor and self.layers[name].params]
        darc1 = [darc1_term(factor, model_outputs[f"{name}:logits"], model_outputs[f"{name}:lengths"])
                 for name, factor in self.darc1.items() if factor]
        zero = tf.constant(0.0)
        return LossResult(loss=zero if loss is None else loss, error=error, num_frames=frames,
                          objective=tf.add_n(terms) if terms else zero,
                          regularizer=tf.add_n(regularized) if regularized else 0.0,
                          data_regularizer=tf.add_n(darc1) if darc1 else 0.0)


def _batch_major(x: tf.Tensor) -> tf.Tensor:
    return tf.transpose(x, [1, 0, 2])
