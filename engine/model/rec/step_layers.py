"""The layer classes of a rec unit. Each works on one step ((B, *axes, F)) and, where the plan moves it out
of the loop, on all steps at once ((B, L, *axes, F)): the same code, as it maps features or broadcasts by
axis label (``frames.py``). ``out_template`` says what a layer gives from its sources' templates (before
any parameter exists, as the loop's references to earlier steps need); the constructor makes the
parameters from the complete source templates.

Parameters have RETURNN's names under ``<rec layer>/rec/<unit layer>/``: ``W``/``b`` (linear, softmax),
``rec/lstm_cell/kernel`` and ``.../bias`` (``rnn_cell`` with an LSTMBlock-like unit, which RETURNN runs as
TensorFlow's LSTMCell on one step: gates i, j, f, o and a forget bias of 1).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from engine.config import returnn_tf_util
from engine.model.layers.base import positive_int
from engine.model.layers.dense import ACTIVATIONS, Linear, Softmax, activation_option
from engine.model.layers.elementwise import COMBINE_KINDS
from engine.model.layers.eval import LayerView, NetworkView, _Code
from engine.model.losses.cross_entropy import ProbabilityCrossEntropy, loss_scale
from engine.model.rec.frames import Axis, Template, Value, aligned, broadcast_axes, pair_static
from engine.runtime.errors import ConfigError


class UnitContext:
    """What the layers of one unit share: the rec layer's name, the target dims, the seed and config."""

    def __init__(self, rec_name: str, target_dims: dict[str, int], random_seed: int, config: Any) -> None:
        self.rec_name = rec_name
        self.target_dims = target_dims
        self.random_seed = random_seed
        self.config = config

    def where(self, name: str) -> str:
        return f"Network layer '{self.rec_name}', unit layer '{name}'"


def _union(sources: list[Template]) -> tuple[Axis, ...]:
    return broadcast_axes(sources)


def _dense_input(values: list[Value], looped: bool) -> tf.Tensor:
    """The sources broadcast to their common axes and concatenated along the features."""
    axes = broadcast_axes([v.template for v in values])
    parts = [aligned(v, axes, looped) for v in values]
    if len(parts) == 1:
        return parts[0]
    shape = tf.shape(parts[0])
    for part in parts[1:]:
        shape = tf.maximum(shape, tf.shape(part))
    return tf.concat([tf.broadcast_to(p, tf.concat([shape[:-1], tf.shape(p)[-1:]], 0)) for p in parts], -1)


class UnitLayer:
    """Base: ``template``, ``params`` (key -> variable; RETURNN's name is ``<rec>/rec/<layer>/<key>``)."""

    stateful = False

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext | None = None) -> None:
        self.name = name
        self.opts = opts
        self.sources = sources
        self.template = template
        self.params: dict[str, tf.Variable] = {}

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        raise NotImplementedError


class LinearUnit(UnitLayer):
    """``linear`` and ``softmax`` (the logits; the unit adds the probabilities)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        if opts.get("class") == "softmax" and "n_out" not in opts:
            target = opts.get("target")
            if target not in ctx.target_dims:
                raise ConfigError(f"{ctx.where(name)}: softmax needs 'n_out' or a known 'target' (known: "
                                  f"{sorted(ctx.target_dims)}), got {target!r}.")
            return Template(_union(sources), ctx.target_dims[target])
        return Template(_union(sources), positive_int(ctx.where(name), opts, "n_out"))

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        sparse = [s.sparse for s in sources]
        if any(sparse) and len(sources) > 1:
            raise ConfigError(f"{ctx.where(name)}: a sparse source (class ids) must be the only source of a "
                              "linear layer here.")
        in_dim = sum(s.dim for s in sources)
        prefix = f"{ctx.rec_name}/rec/{name}"
        if opts["class"] == "softmax":
            self.dense: Linear = Softmax(prefix, {**opts, "n_out": template.dim}, in_dim,
                                         sparse_input=any(sparse), random_seed=ctx.random_seed,
                                         target_dims=ctx.target_dims)
        else:
            self.dense = Linear(prefix, opts, in_dim, sparse_input=any(sparse), random_seed=ctx.random_seed)
        self.params = self.dense.params

    @property
    def criterion(self) -> Any:
        return getattr(self.dense, "criterion", None)

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        if self.dense.sparse_input:
            return self.dense(values[0].tensor, None, False)
        return self.dense(_dense_input(values, looped), None, False)


class Elementwise(UnitLayer):
    """``combine``, ``activation``, ``copy``, ``compare``: per element, broadcast by axis
    (``reinterpret_data`` with only ``enforce_batch_major``: a copy, the batch's place being a layout)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        kind = _kind(opts)
        if kind == "copy":
            return Template(_union(sources), sum(s.dim for s in sources), sources[0].sparse, sources[0].dtype)
        dims = {s.dim for s in sources}
        if kind == "combine" and len(dims - {1}) > 1:
            raise ConfigError(f"{ctx.where(name)}: combine needs sources of one dim, got {sorted(dims)}.")
        template = Template(_union(sources), max(dims), sources[0].sparse)
        if kind == "compare":
            return Template(template.axes, template.dim, template.sparse, tf.bool)
        return template

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        kind = _kind(opts)
        batch_major = opts.get("enforce_batch_major", False)
        if opts["class"] == "reinterpret_data" and not isinstance(batch_major, bool):
            raise ConfigError(f"{ctx.where(name)}: enforce_batch_major must be True or False.")
        if kind == "combine" and opts.get("kind") not in COMBINE_KINDS:
            raise ConfigError(f"{ctx.where(name)}: combine kind {opts.get('kind')!r} is not one of "
                              f"{', '.join(COMBINE_KINDS)}.")
        if kind == "combine" and opts.get("n_out", template.dim) != template.dim:
            raise ConfigError(f"{ctx.where(name)}: n_out {opts['n_out']} differs from the sources' dim "
                              f"{template.dim}.")
        if kind == "activation":
            self.activation = ACTIVATIONS[activation_option(ctx.where(name), opts)]
        if kind == "compare" and (opts.get("kind", "equal") != "equal" or len(sources) != 1):
            raise ConfigError(f"{ctx.where(name)}: compare is implemented here with one source and kind "
                              "'equal' against 'value'.")
        if kind == "copy" and len(sources) > 1 and any(s.sparse for s in sources):
            raise ConfigError(f"{ctx.where(name)}: copy of several sources concatenates features; sparse "
                              "sources (class ids) cannot be concatenated.")

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        kind = _kind(self.opts)
        if kind == "compare":
            value = self.opts.get("value")
            return tf.equal(values[0].tensor, tf.cast(value, values[0].tensor.dtype))
        if kind == "copy" and len(values) == 1:
            return aligned(values[0], self.template.axes, looped)
        if kind in ("copy", "activation"):
            x = _dense_input(values, looped)
            return x if kind == "copy" or self.activation is None else self.activation(x)
        op = COMBINE_KINDS[self.opts["kind"]]
        xs = [aligned(v, self.template.axes, looped) for v in values]
        y = xs[0]
        for x in xs[1:]:
            y = op(y, x)
        return y / float(len(xs)) if self.opts["kind"] == "average" else y


def _kind(opts: dict) -> str:
    return "copy" if opts["class"] == "reinterpret_data" else opts["class"]


class SoftmaxOverSpatial(UnitLayer):
    """``softmax_over_spatial``: softmax over the source's time axis (a base layer's frames), frames past a
    sequence's length excluded, the energies first times ``energy_factor`` where given."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        dynamic = [a for a in sources[0].axes if a.dynamic]
        if len(sources) != 1 or not dynamic:
            raise ConfigError(f"{ctx.where(name)}: softmax_over_spatial needs one source with a time axis "
                              f"(e.g. energies over an encoder's frames), got {sources[0].describe()}.")
        return sources[0]

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        self.axis = next(a for a in template.axes if a.dynamic)
        self.lengths: dict[str, tf.Tensor] = {}  # set per call by the unit: axis label -> (B,)
        self.factor = opts.get("energy_factor")
        if self.factor is not None and type(self.factor) not in (int, float):
            raise ConfigError(f"{ctx.where(name)}: energy_factor must be a number, got {self.factor!r}.")

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        value = values[0]
        x = value.tensor
        axis = value.axis_position(self.axis.label)
        mask = tf.sequence_mask(self.lengths[self.axis.label], tf.shape(x)[axis])  # (B, T)
        shape = [1] * len(x.shape)
        shape[0], shape[axis] = -1, tf.shape(x)[axis]
        mask = tf.reshape(mask, tf.stack([tf.shape(x)[0] if i == 0 else (s if i == axis else 1)
                                          for i, s in enumerate(shape)]))
        x = tf.where(mask, x, tf.fill(tf.shape(x), float("-inf")))
        return tf.nn.softmax(x * float(self.factor) if self.factor else x, axis=axis)


class GenericAttention(UnitLayer):
    """``generic_attention``: the base layer's frames weighted by ``weights`` and summed over its time axis;
    a weights' feature axis (heads) pairs with the base's static axis of that size, and a size of 1 with
    none (RETURNN's auto_squeeze); a static axis of the weights pairs with one of the base's (``pair_static``:
    the heads of a Transformer's keys and values, split apart)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        raise AssertionError("built from its options; see attention_template")

    @classmethod
    def attention_template(cls, name: str, weights: Template, base: Template, ctx: UnitContext) -> Template:
        times = [a for a in base.axes if a.dynamic]
        if len(times) != 1 or times[0] not in weights.axes:
            raise ConfigError(f"{ctx.where(name)}: generic_attention needs a base with one time axis that "
                              f"the weights have too; weights {weights.describe()}, base {base.describe()}.")
        pairs = pair_static(base.axes, weights.axes)
        rest = tuple(a for a in weights.axes if a != times[0] and a.label not in pairs and a not in base.axes)
        return Template(rest + tuple(a for a in base.axes if not a.dynamic), base.dim)

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext, weights: Template, base: Template) -> None:
        super().__init__(name, opts, sources, template)
        self.time = next(a for a in base.axes if a.dynamic)
        heads = [a for a in base.axes if not a.dynamic and a.size == weights.dim]
        if weights.dim != 1 and not heads:
            raise ConfigError(f"{ctx.where(name)}: the weights have {weights.dim} heads (features), but the "
                              f"base {base.describe()} has no static axis of that size.")
        self.head = heads[0] if heads else None
        self.weights_template = weights

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        weights, base = options["weights"], options["base"]
        pairs = pair_static(base.template.axes, weights.template.axes)
        w_axes = [Axis(pairs.get(a.label, a.label), a.size) for a in weights.template.axes]
        w = weights.tensor
        if self.head is None:
            w = w[..., 0]  # one weight per frame
        else:  # the weights' features are the base's head axis
            w_axes.append(self.head)
        b_axes = list(base.template.axes)
        letters = {a.label: chr(ord("c") + i) for i, a in enumerate(dict.fromkeys(w_axes + b_axes))}
        lead = "bl" if weights.looped else "b"
        w_spec = lead + "".join(letters[a.label] for a in w_axes)
        b_spec = "b" + "".join(letters[a.label] for a in b_axes) + "z"
        kept = [a for a in w_axes if a != self.time and a not in b_axes]
        kept += [a for a in b_axes if a != self.time]
        out_spec = lead + "".join(letters[a.label] for a in kept) + "z"
        return tf.einsum(f"{w_spec},{b_spec}->{out_spec}", w, base.tensor)


class MergeDims(UnitLayer):
    """``merge_dims`` of the static axes and the features into the features ('except_batch' or 'static'
    within a step; RETURNN's order, axis by axis)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        axes = opts.get("axes")
        source = sources[0]
        if axes not in ("except_batch", "static", "except_time") or any(a.dynamic for a in source.axes):
            raise ConfigError(f"{ctx.where(name)}: merge_dims inside a rec unit is implemented for axes "
                              f"'except_batch' / 'static' on a step without time axes, got {axes!r} on "
                              f"{source.describe()}.")
        dim = source.dim
        for axis in source.axes:
            dim *= axis.size
        return Template((), dim)

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        x = values[0].tensor
        lead = 2 if looped else 1
        return tf.reshape(x, tf.concat([tf.shape(x)[:lead], [self.template.dim]], 0))


class ReduceOutUnit(UnitLayer):
    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        pieces = positive_int(ctx.where(name), opts, "num_pieces")
        dim = sum(s.dim for s in sources)
        if dim % pieces or opts.get("mode") not in ("max", "sum", "mean", "avg"):
            raise ConfigError(f"{ctx.where(name)}: reduce_out needs mode max/sum/mean/avg and a dim ({dim}) "
                              f"divisible by num_pieces {pieces}.")
        return Template(_union(sources), dim // pieces)

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        x = _dense_input(values, looped)
        pieces = tf.reshape(x, tf.concat([tf.shape(x)[:-1], [self.template.dim, -1]], 0))
        reduce = {"max": tf.reduce_max, "sum": tf.reduce_sum}.get(self.opts["mode"], tf.reduce_mean)
        return reduce(pieces, axis=-1)


class EvalUnit(UnitLayer):
    """``eval``: the expression over the sources broadcast to their common axes (``source(i)``)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        out_type = opts.get("out_type") or {}
        unknown = set(out_type) - {"dim", "shape"}
        if unknown:
            raise ConfigError(f"{ctx.where(name)}: out_type keys {sorted(unknown)} are not implemented "
                              "inside "
                              "a rec unit (dim and shape are).")
        dim = out_type.get("dim", opts.get("n_out", sources[0].dim))
        return Template(_union(sources), dim)

    @classmethod
    def declared_template(cls, name: str, opts: dict, ctx: UnitContext, time_labels: set[str]) -> Template:
        """From ``out_type``'s ``shape`` (without batch): a None is a time axis of the base layers, the one
        of ``time_labels`` (those of the layer's base sources, else of all the unit reads), an int a static
        axis; the last entry is the features."""
        out_type = opts["out_type"]
        shape = tuple(out_type["shape"])
        dim = out_type.get("dim", shape[-1] if shape else None)
        if not shape or shape[-1] != dim or not isinstance(dim, int) or shape.count(None) > 1:
            raise ConfigError(f"{ctx.where(name)}: out_type {out_type!r} must end in its 'dim' and name at "
                              "most one time axis (None) here.")
        if None in shape and len(time_labels) != 1:
            raise ConfigError(f"{ctx.where(name)}: out_type {out_type!r} names a time axis (None), but the "
                              f"unit reads {len(time_labels)} ({sorted(time_labels)}); read one base layer "
                              "of that axis among the layer's sources.")
        axes = tuple(Axis(min(time_labels), None) if size is None else Axis(f"S{size}:{name}:{index}", size)
                     for index, size in enumerate(shape[:-1]))
        return Template(axes, dim)

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        if "eval" not in opts:
            raise ConfigError(f"{ctx.where(name)}: 'eval' (the expression) is required.")
        self.code = _Code(f"{ctx.rec_name}/{name}", opts["eval"], {})
        self.config = ctx.config
        self.where = ctx.where(name)
        self.training = False
        # RETURNN's CE on a layer that is no softmax: the output is taken as the probabilities
        self.loss, self.only_on_eval = opts.get("loss"), False
        self.target = opts.get("target", "classes" if self.loss else None)
        if self.target is not None and ctx.target_dims.get(self.target) != template.dim:
            raise ConfigError(f"{self.where}: target {self.target!r} (known: {sorted(ctx.target_dims)}) must "
                              f"be a sparse stream with as many classes as the layer's {template.dim} "
                              "features.")
        if self.loss:
            self.criterion = ProbabilityCrossEntropy(loss_scale(f"{ctx.rec_name}/{name}", opts, {}))

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        xs = [aligned(v, self.template.axes, looped) for v in values]

        def source(i: int, auto_convert: bool = True, enforce_batch_major: bool = False) -> tf.Tensor:
            return xs[i]

        names = {**returnn_tf_util.EVAL_NAMES, "tf": returnn_tf_util.TfWithV1Names(), "source": source,
                 "self": LayerView(self.name, NetworkView(self.config, self.training, None))}
        try:
            code = self.code.compiled
            y = code(**names) if callable(code) else eval(code, names)
        except Exception as exc:  # user code: name the layer and the expression
            raise ConfigError(f"{self.where}: eval {self.code.text!r} failed: {exc}") from None
        return tf.cast(y, tf.float32)


CLASSES: dict[str, type[UnitLayer]] = {
    "linear": LinearUnit, "softmax": LinearUnit, "combine": Elementwise, "activation": Elementwise,
    "copy": Elementwise, "compare": Elementwise, "reinterpret_data": Elementwise,
    "softmax_over_spatial": SoftmaxOverSpatial,
    "generic_attention": GenericAttention, "merge_dims": MergeDims, "reduce_out": ReduceOutUnit,
    "eval": EvalUnit,
}
