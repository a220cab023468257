"""The Transformer decoder's layer classes inside a rec unit (``step_layers.py`` says how a unit layer works
on one step or on all steps): ``self_attention``, ``layer_norm``, ``dropout``, ``split_dims``, ``dot``,
``positional_encoding``.

``self_attention`` (``attention_left_only`` True, as RETURNN requires inside a loop) keeps, in the loop,
the keys and values of the steps so far as its state, (B, heads, steps, dims per head) each, growing by
one step per step (RETURNN's ``k_left``/``v_left``); every earlier step is attended to. Moved out of the
loop (in training, RETURNN's plan moves it: its template reads no earlier step of its own) it attends on
all steps at once with the causal mask, key step <= query step (RETURNN masks nothing else there: steps
past a sequence's end are never read by its own steps). Its parameter is RETURNN's ``QKV`` (columns per
head [q | k | v]); queries are scaled by (key dims per head) ** -0.5.

``dot`` is RETURNN's DotLayer as the Transformer's encoder-decoder attention uses it: the product of its
two sources summed over their features (``red1``/``red2`` -1 or "F"), the first source's time axis kept
(``var1`` "T"), the second's none (``var2`` "T?" or None: inside a step it has no time axis; moved out of
the loop the loop's steps stay an axis of their own), its result's features of size 1 (``add_var2_if_empty``
True). Static axes of the two pair up by size (the heads of a key and a query split by two ``split_dims``),
as RETURNN pairs such axes.
"""
from __future__ import annotations

import tensorflow as tf

from engine.model.dropout import stateless_dropout
from engine.model.initializers import option_variable
from engine.model.layers.attention import sinusoid_signal
from engine.model.layers.base import positive_int
from engine.model.rec.frames import Axis, Template, Value, aligned, broadcast_axes, pair_static
from engine.model.rec.step_layers import UnitContext, UnitLayer, _dense_input
from engine.runtime.errors import ConfigError


def _dense_source(name: str, sources: list[Template], ctx: UnitContext, cls: str) -> int:
    if any(s.sparse for s in sources):
        raise ConfigError(f"{ctx.where(name)}: {cls} takes dense sources here, got class ids.")
    return sum(s.dim for s in sources)


class LayerNormUnit(UnitLayer):
    """``layer_norm``: each vector normalised over its features, times ``scale`` plus ``bias``."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        return Template(broadcast_axes(sources), _dense_source(name, sources, ctx, "layer_norm"))

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        self.epsilon = opts.get("epsilon", 1e-6)  # RETURNN's default
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) or self.epsilon < 0:
            raise ConfigError(f"{ctx.where(name)}: 'epsilon' must be a number >= 0, got {self.epsilon!r}.")
        prefix = f"{ctx.rec_name}/rec/{name}"
        self.params["scale"] = tf.Variable(tf.ones([template.dim]), name=f"{prefix}/scale")
        self.params["bias"] = tf.Variable(tf.zeros([template.dim]), name=f"{prefix}/bias")

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        x = _dense_input(values, looped)
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
        normed = (x - mean) * tf.math.rsqrt(variance + float(self.epsilon))
        return normed * self.params["scale"] + self.params["bias"]


class DropoutUnit(UnitLayer):
    """``dropout``: its source as it is; the unit drops its input with the layer's ``dropout`` in training,
    over the features only (RETURNN's default noise shape) or, with ``dropout_noise_shape`` {"*": None},
    every element on its own (``full_noise``)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        if len(sources) != 1:
            raise ConfigError(f"{ctx.where(name)}: dropout takes one source here, got {len(sources)}.")
        return sources[0]

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        noise = opts.get("dropout_noise_shape")
        if noise not in (None, {}, {"*": None}):
            raise ConfigError(f"{ctx.where(name)}: dropout_noise_shape {noise!r} is not implemented inside a "
                              "rec unit; None (noise per feature, broadcast over the other axes) and "
                              "{'*': None} (noise per element) are.")
        self.full_noise = noise == {"*": None}

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        return aligned(values[0], self.template.axes, looped)


class SplitDimsUnit(UnitLayer):
    """``split_dims`` of the features (``axis`` "F") into ``dims``: the last the new features, the others
    static axes (heads)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        dims = opts.get("dims")
        source = sources[0]
        valid = isinstance(dims, (list, tuple)) and len(dims) >= 2 and all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)
        if opts.get("axis") not in ("F", "f") or len(sources) != 1 or source.sparse or not valid:
            raise ConfigError(f"{ctx.where(name)}: split_dims inside a rec unit is implemented for one dense "
                              f"source, axis 'F' and dims of positive ints, got axis {opts.get('axis')!r}, "
                              f"dims {dims!r}.")
        size = 1
        for d in dims:
            size *= d
        if size != source.dim:
            raise ConfigError(f"{ctx.where(name)}: dims {tuple(dims)} do not multiply to the source's dim "
                              f"{source.dim}.")
        axes = tuple(Axis(f"S{d}:{name}:{i}", d) for i, d in enumerate(dims[:-1]))
        return Template(source.axes + axes, dims[-1])

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        x = values[0].tensor
        sizes = [a.size for a in self.template.axes[len(self.sources[0].axes):]] + [self.template.dim]
        return tf.reshape(x, tf.concat([tf.shape(x)[:-1], sizes], 0))


class DotUnit(UnitLayer):
    """``dot`` (see the module docstring): energies of (B, [steps], *axes, 1)."""

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        where = ctx.where(name)
        if len(sources) != 2 or any(s.sparse for s in sources):
            raise ConfigError(f"{where}: dot takes two dense sources.")
        for key in ("red1", "red2"):
            if opts.get(key) not in (-1, "F", "f"):
                raise ConfigError(f"{where}: {key} {opts.get(key)!r} is not implemented inside a rec unit; "
                                  "the features (-1 or 'F') are.")
        if opts.get("var2") not in ("T?", None) or not opts.get("add_var2_if_empty", True):
            raise ConfigError(f"{where}: var2 {opts.get('var2')!r} (add_var2_if_empty "
                              f"{opts.get('add_var2_if_empty', True)!r}) is not implemented inside a rec "
                              "unit; var2 'T?' or None with add_var2_if_empty True (a step has no time "
                              "axis of its own) are.")
        first, second = sources
        if first.dim != second.dim:
            raise ConfigError(f"{where}: the reduced features differ: {first.dim} and {second.dim}.")
        times = [a for a in first.axes if a.dynamic]
        if opts.get("var1") not in ("T", "t", None) or (opts.get("var1") and len(times) != 1):
            raise ConfigError(f"{where}: var1 {opts.get('var1')!r} is not implemented inside a rec unit on "
                              f"{first.describe()}; 'T' (the first source's one time axis) or None are.")
        kept = {a.label for a in first.axes if a.dynamic} if opts.get("var1") else set()
        pairs = pair_static(first.axes, second.axes)
        rest_first = [a.label for a in first.axes if a.label not in kept]
        rest_second = [pairs.get(a.label, a.label) for a in second.axes]
        if sorted(rest_first) != sorted(rest_second):
            raise ConfigError(f"{where}: the axes of the sources other than var1 and the features must pair "
                              f"up (RETURNN's common axes); got {first.describe()} and {second.describe()}.")
        return Template(first.axes, 1)

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        first, second = values
        pairs = pair_static(first.template.axes, second.template.axes)
        labels = [a.label for a in first.template.axes]
        letters = {label: chr(ord("c") + i) for i, label in enumerate(labels)}
        lead_first, lead_second = ("bl" if first.looped else "b"), ("bl" if second.looped else "b")
        spec_first = lead_first + "".join(letters[x] for x in labels) + "z"
        spec_second = lead_second + "".join(letters[pairs.get(a.label, a.label)]
                                            for a in second.template.axes) + "z"
        lead = "bl" if first.looped or second.looped else "b"
        out = tf.einsum(f"{spec_first},{spec_second}->{lead}{''.join(letters[x] for x in labels)}",
                        first.tensor, second.tensor)
        if looped and lead == "b":
            out = tf.expand_dims(out, 1)
        return out[..., None]


class SelfAttentionUnit(UnitLayer):
    """``self_attention`` with ``attention_left_only`` (see the module docstring). ``training`` and
    ``seed`` are set by the unit before each call (``attention_dropout`` on the weights in training)."""

    stateful = True

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        if any(s.axes for s in sources):
            raise ConfigError(f"{ctx.where(name)}: self_attention inside a rec unit attends over the steps; "
                              f"its sources must have no other axes, got {[s.describe() for s in sources]}.")
        return Template((), positive_int(ctx.where(name), opts, "n_out"))

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        where = ctx.where(name)
        in_dim = _dense_source(name, sources, ctx, "self_attention")
        self.heads = positive_int(where, opts, "num_heads")
        key_total = positive_int(where, opts, "total_key_dim")
        for key, value in (("total_key_dim", key_total), ("n_out", template.dim)):
            if value % self.heads:
                raise ConfigError(f"{where}: {key} {value} is not divisible by num_heads {self.heads}.")
        if opts.get("attention_left_only") is not True:
            raise ConfigError(f"{where}: self_attention inside a rec unit needs attention_left_only True (a "
                              "step sees only the steps so far; RETURNN requires it there too).")
        self.dropout = opts.get("attention_dropout", 0.0)
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or \
                not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"{where}: attention_dropout must be a float in [0, 1), got {self.dropout!r}.")
        self.key_dim, self.value_dim = key_total // self.heads, template.dim // self.heads
        self.params["QKV"] = option_variable(where, opts, "forward_weights_init",
                                             f"{ctx.rec_name}/rec/{name}/QKV",
                                             (in_dim, 2 * key_total + template.dim), ctx.random_seed)
        self.training = False
        self.seed = tf.constant([0, 0], tf.int64)

    def _qkv(self, values: list[Value], looped: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """q (scaled), k, v as (B, heads, steps, dims per head); one step where not ``looped``."""
        x = _dense_input(values, looped)
        if not looped:
            x = x[:, None]
        qkv = tf.matmul(x, self.params["QKV"])
        shape = tf.shape(qkv)
        qkv = tf.reshape(qkv, tf.stack([shape[0], shape[1], self.heads, 2 * self.key_dim + self.value_dim]))
        q, k, v = tf.split(tf.transpose(qkv, [0, 2, 1, 3]), [self.key_dim, self.key_dim, self.value_dim], -1)
        return q * self.key_dim ** -0.5, k, v

    def _attend(self, q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor | None) -> tf.Tensor:
        energy = tf.matmul(q, k, transpose_b=True)  # (B, heads, queries, keys)
        if mask is not None:
            energy = tf.where(mask, energy, tf.fill(tf.shape(energy), float("-inf")))
        weights = tf.nn.softmax(energy)
        if self.training and self.dropout > 0.0:
            weights = stateless_dropout(weights, float(self.dropout), self.seed)
        out = tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3])  # (B, queries, heads, value dims)
        shape = tf.shape(out)
        return tf.reshape(out, tf.stack([shape[0], shape[1], self.template.dim]))

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        """All steps at once (moved out of the loop): the causal mask."""
        q, k, v = self._qkv(values, looped)
        steps = tf.shape(q)[2]
        causal = tf.linalg.band_part(tf.ones(tf.stack([steps, steps]), tf.bool), -1, 0)[None, None]
        out = self._attend(q, k, v, causal)
        return out if looped else out[:, 0]

    def initial_state(self, batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """No keys and values yet; their steps axis grows in the loop (so unknown to the graph)."""
        def empty(dim: int) -> tf.Tensor:
            zeros = tf.zeros(tf.stack([batch, self.heads, 0, dim]))
            return tf.raw_ops.PlaceholderWithDefault(input=zeros, shape=[None, self.heads, None, dim])

        return empty(self.key_dim), empty(self.value_dim)

    def step(self, values: list[Value], state: tuple[tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, tuple]:
        q, k, v = self._qkv(values, looped=False)
        keys, vals = tf.concat([state[0], k], axis=2), tf.concat([state[1], v], axis=2)
        return self._attend(q, keys, vals, None)[:, 0], (keys, vals)


class PositionalEncodingUnit(UnitLayer):
    """``positional_encoding`` of the step's position (0, 1, ...): ``positional_encoding``'s sinusoid, added
    to the source with ``add_to_input``, else of ``n_out`` dims. In the loop the position is its state
    (RETURNN's ``position``, -1 before step 0); moved out of the loop, the steps' positions at once."""

    stateful = True

    @classmethod
    def out_template(cls, name: str, opts: dict, sources: list[Template], ctx: UnitContext) -> Template:
        add = opts.get("add_to_input", False)
        if not isinstance(add, bool) or len(sources) != 1 or sources[0].sparse:
            raise ConfigError(f"{ctx.where(name)}: positional_encoding takes one dense source and "
                              f"add_to_input True or False, got {add!r}.")
        dim = sources[0].dim if add else positive_int(ctx.where(name), opts, "n_out")
        if add and opts.get("n_out", dim) != dim or dim < 4:
            raise ConfigError(f"{ctx.where(name)}: n_out must be the source's dim with add_to_input and at "
                              "least 4 (the sinusoid divides by n_out // 2 - 1), got "
                              f"{opts.get('n_out', dim)}.")
        return Template(sources[0].axes, dim)

    def __init__(self, name: str, opts: dict, sources: list[Template], template: Template,
                 ctx: UnitContext) -> None:
        super().__init__(name, opts, sources, template)
        self.add = opts.get("add_to_input", False)

    def _signal(self, positions: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
        """The sinusoid at ``positions`` broadcast to ``x``'s leading axes (and added with add_to_input)."""
        signal = tf.gather(sinusoid_signal(tf.reduce_max(positions) + 1, self.template.dim), positions)
        return x + signal if self.add else tf.broadcast_to(signal, tf.concat([tf.shape(x)[:-1],
                                                                             [self.template.dim]], 0))

    def __call__(self, values: list[Value], looped: bool, options: dict[str, Value]) -> tf.Tensor:
        x = values[0].tensor
        if not looped:
            raise AssertionError("a step of positional_encoding runs as ``step``")
        positions = tf.reshape(tf.range(tf.shape(x)[1]), [1, -1] + [1] * len(self.template.axes))
        return self._signal(positions, x)

    def initial_state(self, batch: tf.Tensor) -> tuple[tf.Tensor]:
        return (tf.fill(tf.reshape(batch, [1]), -1),)

    def step(self, values: list[Value], state: tuple[tf.Tensor]) -> tuple[tf.Tensor, tuple]:
        position = state[0] + 1
        x = values[0].tensor
        return self._signal(tf.reshape(position, [-1] + [1] * len(self.template.axes)), x), (position,)


CLASSES: dict[str, type[UnitLayer]] = {
    "layer_norm": LayerNormUnit, "dropout": DropoutUnit, "split_dims": SplitDimsUnit, "dot": DotUnit,
    "self_attention": SelfAttentionUnit, "positional_encoding": PositionalEncodingUnit,
}
