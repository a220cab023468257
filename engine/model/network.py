"""The ``network`` layer dict (RETURNN style) -> a ``SeqModel``.

Only the layers that ``output``, a loss layer or an ``is_output_layer`` layer depend on are built (as in
RETURNN), in dependency order; every layer of the dict is still checked, so a typo in an unused layer is
reported too. Internally the network runs time-major (T, B, F) (the fused LSTM kernel wants that),
chains of 2-D windows batch-major (``layouts.py``); returned outputs are transposed to (B, T, F) only
where someone reads them (``tf.function`` prunes the rest). Each layer's sequence lengths travel with it
(``Layer.out_lengths``; conv and pool may change them) and come back as ``"<layer>:lengths"`` (B,),
int32, e.g. for a CTC loss on a downsampled output.
"""

from __future__ import annotations

from typing import Collection, Sequence

import tensorflow as tf

from engine.config.key_check import enforce
from engine.config.loader import Config
from engine.datasets.streams import same_length_groups
from engine.model.assembly import BuildOptions, build_layers, sparse_streams
from engine.model.base import LossResult, SeqModel
from engine.model.layers.base import Layer, scope_name
from engine.model.layers.conv import window_options
from engine.model.layers.dense import Copy, Softmax
from engine.model.layers.eval import Eval
from engine.model.layouts import (call_batch_major, layer_input, runs_batch_major, time_major_ids,
                                  to_batch_major)
from engine.model.layers.reinterpret import ReinterpretData
from engine.model.layers.time_chunking import TimeChunking, TimeUnchunking, check_time_axes
from engine.model.layers.window_pad import changes_time
from engine.model.rec.decide import Decide
from engine.model.rec.outside import UnitOutput
from engine.model.rec.search import BEAM_KEYS
from engine.model.rec.subnet import RecSubnet
from engine.model.losses.network_sums import layer_loss_sums, network_losses
from engine.model.losses.regularization import darc1_factor, l2_factor
from engine.model.spec import RECURRENT_CLASSES, build_order, layer_findings, parse_network
from engine.model.spec_readers import sequence_kinds
from engine.model.spec_streams import REGISTER, registered_dims, registered_streams
from engine.runtime.errors import ConfigError


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
        config: Config | None = None,
    ) -> None:
        """``twice_differentiable``: use ops whose gradients can be differentiated again (slower LSTM);
        ``ignored``: the config's ignore_keys (``"layer:option"`` entries apply here);
        ``lstm_implementation``: the config key of that name (``layers/lstm_choice.py``); ``compute_dtype``:
        what the layers compute in (``tf_amp``, ``precision.py``; the parameters stay float32); ``config``:
        what ``eval`` layers read with ``get_config()`` (default: no keys)."""
        super().__init__(
            input_dim=input_dim, input_sparse=input_sparse, target_dims=target_dims, name="network"
        )
        # untracked: tf.Module would put wrappers in place of the nested dicts (loss_opts) in the config
        self.specs = self._no_dependency(parse_network(network))
        enforce(layer_findings(self.specs, ignored), "The network")
        self.order = build_order(self.specs)
        per_sequence = sequence_kinds(self.specs)  # a loss on vectors per sequence reads labels per sequence
        losses = [n for n in self.order if self.specs[n].cls in ("softmax", "copy")
                  and self.specs[n].opts.get("loss") and per_sequence.get(n) != "vector"]
        resampling = [n for n in self.order if self.specs[n].cls == "transposed_conv" or (
            self.specs[n].cls in ("conv", "pool")
            and not window_options(n, self.specs[n].opts, self.specs[n].cls)[0].keeps_time)]
        resampling += [n for n in self.order if changes_time(self.specs[n].cls, self.specs[n].opts)]
        time_axes = check_time_axes(self.specs, self.order, losses, resampling=resampling,
                                    frame_loss_layers=[n for n in losses
                                                       if self.specs[n].opts.get("loss") == "ce"],
                                    same_time=same_length_groups(config) if config is not None else ())
        self.random_seed = random_seed
        self.check_numerics = bool(config is not None and config.bool("debug_add_check_numerics_on_output"))
        self.compute_dtype = compute_dtype  # placement.py's summary line reads it
        if input_sparse:  # sparse input is a target too (an LM's 'data', read as 'data:delayed')
            target_dims = {"data": input_dim, **target_dims}
        # streams its layers compute (register_as_extern_data), in place of the batch's of that name
        self.registered = registered_streams(self.specs)
        target_dims = {**target_dims, **registered_dims(self.specs, target_dims)}
        options = BuildOptions(input_dim, input_sparse, target_dims, random_seed, twice_differentiable,
                               lstm_implementation, compute_dtype, config)
        self.layers: dict[str, Layer] = build_layers(self.specs, self.order, options, time_axes)
        self.sparse_dims = sparse_streams(options)  # source name -> number of classes
        self.sparse_dims.update({name: layer.n_out for name, layer in self.layers.items()
                                 if getattr(layer, "ids_output", False)})
        self.l2 = {name: l2_factor(name, self.specs[name].opts) for name in self.order}
        self.darc1 = {name: darc1_factor(name, self.specs[name].opts) for name in self.order}
        # name -> the object with the loss (``loss``, ``target``, ``criterion``, ``only_on_eval``); a rec
        # unit's loss layers as "<rec>/<unit layer>"
        self.loss_objects: dict[str, Layer] = {}
        for name, layer in self.layers.items():
            if isinstance(layer, (Softmax, Copy, Decide)) and layer.loss:
                self.loss_objects[name] = layer
            elif isinstance(layer, RecSubnet):
                self.loss_objects.update({f"{name}/{unit}": obj for unit, obj in layer.loss_units.items()})
        self.loss_layers = list(self.loss_objects)
        if "output" in self.loss_layers:  # the main loss layer reports error and frame count
            self.loss_layers.remove("output")
            self.loss_layers.insert(0, "output")
        if self.loss_layers and all(self.loss_objects[n].only_on_eval for n in self.loss_layers):
            raise ConfigError(f"Network layers {self.loss_layers}: every loss has only_on_eval, so training "
                              "has nothing to optimise.")

    @property
    def loss_targets(self) -> set[str]:
        loops = {layer.target for layer in self.layers.values()
                 if isinstance(layer, RecSubnet) and layer.choice}
        return {self.loss_objects[name].target for name in self.loss_layers} | loops

    @property
    def computed_targets(self) -> set[str]:
        return set(self.registered)

    @property
    def input_streams(self) -> set[str]:
        return {src[len("data:"):] for name in self.order for src in self.specs[name].sources
                if src.startswith("data:")}

    @property
    def reads_streams(self) -> bool:
        """Whether a call needs the target streams (``streams``): a decoder loop runs over them, or layers
        read them as input."""
        return bool(self.input_streams) or any(isinstance(layer, RecSubnet) and layer.choice
                                               for layer in self.layers.values())

    def _refuse_without_streams(self) -> None:
        raise ConfigError(f"The network's layers read the data stream(s) {sorted(self.input_streams)} "
                          "('data:<stream>'), but this task feeds the network 'data' only (forward and "
                          "search read no other stream); give those layers 'data' as their input.")

    @property
    def normalized_loss_layers(self) -> list[str]:
        """The loss layers whose ``loss_opts`` set ``use_normalized_loss``."""
        return [name for name in self.loss_layers
                if getattr(self.loss_objects[name].criterion, "normalized", False)]

    @property
    def recurrent(self) -> bool:
        return any(self.specs[name].cls in RECURRENT_CLASSES for name in self.order)

    @property
    def ctc_output(self) -> bool:
        return isinstance(self.layers.get("output"), Softmax) and self.layers["output"].loss == "ctc"

    def output_lengths(self, lengths: tf.Tensor) -> tf.Tensor:
        if "output" not in self.layers:
            raise ConfigError("The network has no layer called 'output', whose values a forward pass "
                              "writes (RETURNN's default output layer); its layers: "
                              f"{', '.join(self.specs)}.")
        if self.input_streams:
            self._refuse_without_streams()
        seq_lengths = {"data": tf.cast(lengths, tf.int32)}
        for name, layer in self.layers.items():
            if isinstance(layer, (RecSubnet, Decide)):  # the target's labels, or the search's, or the input's
                looped = isinstance(layer, RecSubnet) and not layer.choice
                seq_lengths[name] = seq_lengths[self.specs[name].sources[0]] if looped else None
                continue
            source = self.specs[name].sources[0]
            if isinstance(layer, TimeChunking):  # chunks are no sequences; check_time_axes keeps
                seq_lengths[name] = None  # "output" off their time axis
            elif isinstance(layer, TimeUnchunking):
                seq_lengths[name] = seq_lengths[self.specs[layer.chunking_layer].sources[0]]
            elif isinstance(layer, ReinterpretData) and layer.base:
                seq_lengths[name] = self._size_base_lengths(layer, seq_lengths, {})
            elif seq_lengths[source] is not None:
                seq_lengths[name] = layer.out_lengths(seq_lengths[source])
            else:
                seq_lengths[name] = None
        return seq_lengths["output"]

    def owners(self) -> dict[str, Layer]:
        """The layers whose parameters are their own (not another's, by reuse_params)."""
        return {name: layer for name, layer in self.layers.items() if not layer.shares_params_of}

    def named_variables(self) -> dict[str, tf.Variable]:
        return {f"{name}/{key}": var for name, layer in self.owners().items()
                for key, var in layer.params.items()}

    def load_on_init(self) -> list[tuple[str, str, str]]:
        """(rec layer, subnetwork layer of its unit, checkpoint) of each ``load_on_init``."""
        return [(name, subnetwork, path) for name, layer in self.layers.items()
                if isinstance(layer, RecSubnet) for subnetwork, path in layer.load_on_init.items()]

    def running_state(self) -> dict[str, tf.Variable]:
        return {f"{name}/{key}": layer.params[key] for name, layer in self.owners().items()
                for key in layer.running_keys}

    def l2_factors(self) -> dict[str, float]:
        """With decouple_constraints, per variable (RETURNN marks a shared one with the owner's L2); a rec
        unit's layer's L2 adds to its rec layer's."""
        factors = {f"{name}/{key}": self.l2[name] + layer.inner_l2.get(key, 0.0)
                   for name, layer in self.owners().items() for key, var in layer.params.items()
                   if var.trainable}
        return {name: factor for name, factor in factors.items() if factor}

    def score_layers(self) -> list[str]:
        return list(self.loss_layers)

    def returnn_parts(self) -> dict[str, tuple[int, ...]]:
        return {f"{name}/{key}": rows for name, layer in self.owners().items()
                for key, rows in layer.returnn_parts.items() if layer.params[key].trainable}

    def _size_base_lengths(self, layer: ReinterpretData, seq_lengths: dict[str, tf.Tensor],
                           stream_lengths: dict[str, tf.Tensor]) -> tf.Tensor:
        if not layer.base.startswith("data:"):
            return seq_lengths[layer.base]
        stream = layer.base[len("data:"):]
        if stream == "data":
            return seq_lengths["data"]
        if stream not in stream_lengths:
            raise ConfigError(f"Network layer '{layer.layer_name}': size_base {layer.base!r} needs the "
                              f"lengths of data stream {stream!r}, which this run does not read (forward and "
                              "search read no targets).")
        return tf.cast(stream_lengths[stream], tf.int32)

    def __call__(self, data: tf.Tensor, lengths: tf.Tensor, training: bool = False,
                 seed: tf.Tensor | None = None, train_step: tf.Tensor | None = None,
                 update_running: bool = False,
                 stream_lengths: dict[str, tf.Tensor] | None = None,
                 streams: dict[str, tf.Tensor] | None = None, search: bool = False) -> dict[str, tf.Tensor]:
        """``update_running``: an eval call (``training`` False) stores the running statistics its
        ``batch_norm`` layers move, as RETURNN's eval and forward steps do (``Steps``); a training call always
        does. ``stream_lengths``: the lengths of the other data streams (the targets), which
        ``reinterpret_data`` layers with a ``size_base`` of a stream read. ``streams``: the other data
        streams themselves (B, L) (the targets), which a rec layer's decoder loop runs over. ``search``:
        rec layers with a subnetwork search with their choice's beam (``engine/model/rec/search.py``)."""
        if self.input_sparse:
            x, lengths = time_major_ids(data, lengths)
        else:
            lengths = tf.cast(lengths, tf.int32)
            mask = tf.transpose(tf.sequence_mask(lengths, tf.shape(data)[1]))  # (T, B)
            x = tf.transpose(tf.cast(data, tf.float32), [1, 0, 2])
            x = tf.where(mask[:, :, None], x, tf.zeros_like(x))  # keep garbage (inf/nan) out of the math
        if seed is None:
            seed = tf.constant([self.random_seed, 0], tf.int64)
        outs = {"data": x}
        seq_lengths = {"data": lengths}  # per layer: chunking layers change the time axis and the batch
        streams, stream_lengths = dict(streams or {}), dict(stream_lengths or {})  # + registered ones
        for stream in sorted(self.input_streams):
            if stream not in streams:
                self._refuse_without_streams()
            ids, seq_lengths[f"data:{stream}"] = time_major_ids(streams[stream], stream_lengths[stream])
            outs[f"data:{stream}"] = ids
        time_steps = {}  # time_chunking layer -> the number of frames it cut into chunks
        batch_major = {}  # a chain of 2-D windows and activations: their (B, T, S, C) outputs
        result = {}
        for index, (name, layer) in enumerate(self.layers.items()):
            with tf.name_scope(scope_name(name)):  # profiles and graphs name ops by their layer
                layer_seed = tf.random.experimental.stateless_fold_in(seed, index)
                if isinstance(layer, RecSubnet):
                    base = {b: (outs[b], seq_lengths[b]) for b in layer.base_layers}
                    source = None
                    if self.specs[name].sources:  # a loop over its sources' frames
                        source = (self._input(name, outs, training, layer_seed),
                                  seq_lengths[self.specs[name].sources[0]])
                    deciders = [self.layers[n] for n in self.layers if self.specs[n].sources == (name,)
                                and isinstance(self.layers[n], Decide)]
                    y, seq_lengths[name], unit_outputs = layer.run(
                        base, streams, stream_lengths, training, layer_seed, search=search,
                        decide_by_length=any(d.length_normalization for d in deciders), source=source)
                    outs[name] = y
                    result.update(unit_outputs)
                    result[name], result[f"{name}:lengths"] = to_batch_major(y), seq_lengths[name]
                    continue
                if isinstance(layer, UnitOutput):  # "<rec>/<unit layer>": its steps, (L, B, F)
                    if search and self.layers[layer.rec_name].choice:
                        raise ConfigError(f"Network layer '{name}' reads a unit layer of '{layer.rec_name}', "
                                          "whose loop is searched here: reading its steps outside is "
                                          "implemented in training and eval (on the target's labels), not in "
                                          "a search.")
                    outs[name] = tf.transpose(result[name], [1, 0, 2])
                    seq_lengths[name] = result[f"{name}:lengths"] = seq_lengths[layer.rec_name]
                    continue
                if isinstance(layer, Decide):  # without search: the rec layer's one sequence per batch entry
                    source = self.specs[name].sources[0]
                    outs[name], seq_lengths[name] = outs[source], seq_lengths[source]
                    result[name], result[f"{name}:lengths"] = result[source], seq_lengths[source]
                    continue
                if getattr(layer, "ids_output", False):  # class ids (T, B): an eval of ids, a squeeze
                    ids = [outs[s] for s in self.specs[name].sources]
                    lengths_in = seq_lengths[self.specs[name].sources[0]]
                    y = layer(ids, lengths_in, training, train_step=train_step) if isinstance(layer, Eval) \
                        else layer(ids[0], lengths_in, training)
                    outs[name], seq_lengths[name] = y, layer.out_lengths(lengths_in)
                    result[name], result[f"{name}:lengths"] = tf.transpose(y), seq_lengths[name]
                    if self.specs[name].opts.get(REGISTER):  # a target of the losses and rec units
                        streams[self.specs[name].opts[REGISTER]] = result[name]
                        stream_lengths[self.specs[name].opts[REGISTER]] = seq_lengths[name]
                    continue
                if runs_batch_major(layer, self.specs[name].sources, batch_major):
                    layer_lengths = seq_lengths[self.specs[name].sources[0]]
                    from_chain = all(src in batch_major for src in self.specs[name].sources)
                    # (input dropout draws one mask per feature: the same on either layout)
                    x = self._input(name, {**outs, **batch_major} if from_chain else outs, training,
                                    layer_seed)
                    y = self._checked(name, call_batch_major(layer, x, from_chain, layer_lengths,
                                                             training))
                    batch_major[name] = y
                    outs[name] = to_batch_major(y)  # computed only where a time-major reader needs it
                    seq_lengths[name] = result[f"{name}:lengths"] = layer.out_lengths(layer_lengths)
                    result[name] = tf.cast(y, tf.float32)
                    continue
                x = self._input(name, outs, training, layer_seed)
                layer_lengths = seq_lengths[self.specs[name].sources[0]]
                refs = {key: outs[ref] for key, ref in self.specs[name].references.items()}  # e.g. key_shift
                if layer.running_keys:
                    refs["update_running"] = update_running
                if isinstance(layer, TimeChunking):
                    time_steps[name] = tf.shape(x)[0]
                    y, layer_lengths = layer.chunk(x, layer_lengths)
                elif isinstance(layer, TimeUnchunking):
                    y = layer.unchunk(x, layer_lengths, time_steps[layer.chunking_layer])
                    layer_lengths = seq_lengths[self.specs[layer.chunking_layer].sources[0]]
                elif isinstance(layer, ReinterpretData) and layer.base:
                    new_lengths = self._size_base_lengths(layer, seq_lengths, stream_lengths or {})
                    y, layer_lengths = layer.resize(x, layer_lengths, new_lengths), new_lengths
                elif isinstance(layer, Softmax):
                    if layer.loss == "ce":  # the ce loss projects only the frames it scores (packed_ce_sums)
                        result[f"{name}:logits_input"] = x
                    # batch-major logits from a batch-major input: over thousands of classes, transposing the
                    # (T, B, classes) logits for the losses would cost more than the matmul's input transpose
                    x = to_batch_major(x)
                    logits = tf.cast(layer(x, layer_lengths, training), tf.float32)  # tf_amp
                    seq_lengths[name] = result[f"{name}:lengths"] = layer.out_lengths(layer_lengths)
                    result[f"{name}:logits"] = logits
                    result[name] = self._checked(name, tf.nn.softmax(logits))
                    outs[name] = to_batch_major(result[name])  # later layers see the probabilities (RETURNN)
                    continue
                elif isinstance(layer, Eval):  # RETURNN's global_train_step for config code
                    y = layer(x, layer_lengths, training, train_step=train_step)
                elif layer.needs_seed:
                    y = layer(x, layer_lengths, training,
                              seed=tf.random.experimental.stateless_fold_in(layer_seed, 1), **refs)
                    layer_lengths = layer.out_lengths(layer_lengths)
                else:
                    y = layer(x, layer_lengths, training, **refs)
                    layer_lengths = layer.out_lengths(layer_lengths)
                y = self._checked(name, y)
                outs[name], seq_lengths[name] = y, layer_lengths
                y = tf.cast(y, tf.float32)
                # RETURNN's copy_as_batch_major
                result[name] = to_batch_major(y) if layer.has_batch_axis else y
                result[f"{name}:lengths"] = layer_lengths
        return result

    def _checked(self, name: str, y: tf.Tensor) -> tf.Tensor:
        """RETURNN's ``debug_add_check_numerics_on_output``: a NaN or Inf in the output stops the step."""
        if not self.check_numerics or not y.dtype.is_floating:
            return y
        return tf.debugging.check_numerics(y, f"Network layer '{name}': its output has a NaN or Inf "
                                              "(debug_add_check_numerics_on_output)")

    def search(self, data: tf.Tensor, lengths: tf.Tensor, layer: str, scored: Sequence[str] = (),
               targets: dict[str, tf.Tensor] | None = None,
               target_lengths: dict[str, tf.Tensor] | None = None) -> dict[str, tf.Tensor]:
        """RETURNN's search: the hypotheses of ``layer`` (a decide layer or a rec layer with a subnetwork
        unit): "hyps" (B, L) class ids, "hyp_lengths" (B,), "scores" (B,) (the decided hypothesis' score as
        RETURNN gives it: its log probability, end label included, divided by its length + 1 with the
        choice's ``length_normalization``); the searched rec layer's final beam, best first: "beam" (B, K, L),
        "beam_lengths" and "beam_scores" (B, K). With ``scored`` loss layers (outside the searched loop),
        also "sums" (len(scored), 3): each one's loss sum, error sum and count on ``targets``."""
        source = self.specs[layer].sources[0] if isinstance(self.layers.get(layer), Decide) else layer
        if not (isinstance(self.layers.get(source), RecSubnet) and self.layers[source].choice):
            raise ConfigError(f"search_output_layer {layer!r} must be a decide layer or a rec layer with a "
                              f"subnetwork unit; the network's are {self._searchable()}.")
        result = self(data, lengths, training=False, search=True)
        found = {"hyps": result[layer], "hyp_lengths": result[f"{layer}:lengths"],
                 "scores": result[f"{source}:scores"]}
        found.update({key: result[f"{source}:{key}"] for key in BEAM_KEYS})
        if scored:
            sums = self.layer_loss_sums(result, targets or {}, target_lengths or {}, layers=scored)
            found["sums"] = tf.stack([tf.stack(sums[name]) for name in scored])
        return found

    def _searchable(self) -> list[str]:
        return [n for n, layer in self.layers.items()
                if isinstance(layer, Decide) or (isinstance(layer, RecSubnet) and layer.choice)]

    def _input(self, name: str, outs: dict[str, tf.Tensor], training: bool,
               seed: tf.Tensor) -> tf.Tensor | list[tf.Tensor]:
        return layer_input(self.specs[name], self.layers[name], outs, self.sparse_dims, training, seed)

    def layer_loss_sums(self, model_outputs: dict[str, tf.Tensor], targets: dict[str, tf.Tensor],
                        target_lengths: dict[str, tf.Tensor], training: bool = False,
                        layers: Sequence[str] | None = None
                        ) -> dict[str, tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
        """Per loss layer (or those of ``layers``): its loss sum, error sum and count
        (``losses/network_sums.py``)."""
        return layer_loss_sums(self, model_outputs, targets, target_lengths, training, layers)

    def compute_losses(self, model_outputs: dict[str, tf.Tensor], targets: dict[str, tf.Tensor],
                       target_lengths: dict[str, tf.Tensor], training: bool = False) -> LossResult:
        return network_losses(self, model_outputs, targets, target_lengths, training)
