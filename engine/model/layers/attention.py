"""Attention layers of the ``network`` dict: RETURNN's ``self_attention``, ``positional_encoding`` and
``relative_positional_encoding``."""
from __future__ import annotations

import math

import tensorflow as tf

from engine.model.dropout import stateless_dropout
from engine.model.initializers import option_variable
from engine.model.layers.base import Layer, dense_gather, positive_int, time_mask
from engine.runtime.errors import ConfigError


def sinusoid_signal(n_time: tf.Tensor, n_out: int) -> tf.Tensor:
    """(n_time, n_out): Tensor2Tensor's timing signal as RETURNN's ``get_positional_encoding`` makes it:
    sin(t * r_i) for i < n_out // 2, then cos(t * r_i), then a zero column if n_out is odd, where
    r_i = exp(-i * ln(1e4) / (n_out // 2 - 1))."""
    half = n_out // 2
    inv_timescales = tf.exp(tf.range(half, dtype=tf.float32) * -(math.log(1.0e4) / (half - 1)))
    scaled = tf.cast(tf.range(n_time), tf.float32)[:, None] * inv_timescales[None, :]
    signal = tf.concat([tf.sin(scaled), tf.cos(scaled)], axis=-1)
    return tf.pad(signal, [[0, 0], [0, n_out % 2]])


class PositionalEncoding(Layer):
    """``positional_encoding``: the sinusoid of each frame's position (0, 1, ... in every sequence);
    ``add_to_input`` adds it to the input (n_out = the input dim), otherwise it is the output (``n_out``
    required, the input gives only the time axis). One source, as in RETURNN."""

    def __init__(self, name: str, opts: dict, in_dim: int, sources: tuple[str, ...]) -> None:
        super().__init__(in_dim)
        if len(sources) != 1:
            raise ConfigError(f"Network layer '{name}': positional_encoding takes one source, "
                              f"got {list(sources)}.")
        self.add_to_input = opts.get("add_to_input", False)
        if not isinstance(self.add_to_input, bool):
            raise ConfigError(f"Network layer '{name}': 'add_to_input' must be True or False, got "
                              f"{self.add_to_input!r}.")
        if self.add_to_input:
            if opts.get("n_out", in_dim) != in_dim:
                raise ConfigError(f"Network layer '{name}': with add_to_input, n_out must be the input dim "
                                  f"{in_dim}, got {opts['n_out']!r}.")
        else:
            self.n_out = positive_int(name, opts, "n_out")
        if self.n_out < 4:
            raise ConfigError(f"Network layer '{name}': the encoding needs n_out >= 4 (RETURNN's formula "
                              f"divides by n_out // 2 - 1), got {self.n_out}.")

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        signal = sinusoid_signal(tf.shape(x)[0], self.n_out)[:, None, :]  # (T, 1, n_out)
        signal = tf.cast(signal, self.compute_dtype)  # tf_amp
        if self.add_to_input:
            return x + signal
        return tf.tile(signal, [1, tf.shape(x)[1], 1])


class RelativePositionalEncoding(Layer):
    """``relative_positional_encoding`` (Shaw et al., 2018), read by a ``self_attention`` as ``key_shift``:
    for query frame i and key frame j of its input's padded time axis, row clip(j - i, -clipping, clipping)
    + clipping of ``encoding_matrix`` (2 * clipping + 1, n_out). The output (T, T, n_out) has no batch
    axis (``has_batch_axis``); the input gives only T. ``fixed``: the matrix is ``positional_encoding``'s
    sinusoid of 0 .. 2 * clipping instead of a parameter. ``clipping`` defaults to RETURNN's 16."""

    has_batch_axis = False

    def __init__(self, name: str, opts: dict, in_dim: int, *, random_seed: int) -> None:
        super().__init__(in_dim)
        self.n_out = positive_int(name, opts, "n_out")
        self.clipping = opts.get("clipping", 16)
        if isinstance(self.clipping, bool) or not isinstance(self.clipping, int) or self.clipping < 0:
            raise ConfigError(f"Network layer '{name}': 'clipping' must be an int >= 0, got "
                              f"{self.clipping!r}.")
        self.fixed = opts.get("fixed", False)
        if not isinstance(self.fixed, bool):
            raise ConfigError(f"Network layer '{name}': 'fixed' must be True or False, got {self.fixed!r}.")
        if self.fixed and self.n_out < 4:
            raise ConfigError(f"Network layer '{name}': with fixed, n_out must be >= 4 (RETURNN's sinusoid "
                              f"divides by n_out // 2 - 1), got {self.n_out}.")
        if not self.fixed:
            self.params["encoding_matrix"] = option_variable(name, opts, "forward_weights_init",
                                                             f"{name}/encoding_matrix",
                                                             (2 * self.clipping + 1, self.n_out), random_seed)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        positions = tf.range(tf.shape(x)[0])
        distance = positions[None, :] - positions[:, None]  # (queries, keys): key minus query
        rows = tf.clip_by_value(distance, -self.clipping, self.clipping) + self.clipping
        if self.fixed:
            return tf.gather(tf.cast(sinusoid_signal(2 * self.clipping + 1, self.n_out), self.compute_dtype),
                             rows)
        return dense_gather(self.param("encoding_matrix"), rows)


class SelfAttention(Layer):
    """``self_attention``: multi-head dot-product attention of every frame over the frames of its sequence.

    ``num_heads`` heads, ``total_key_dim`` query/key dims (split evenly over the heads), ``n_out`` value
    dims (likewise; the output, heads concatenated, no output projection). One parameter ``QKV``
    (in, 2 * total_key_dim + n_out) without bias, laid out as RETURNN's: its columns are per head
    [q_h | k_h | v_h], head after head. Queries are scaled by 1/sqrt(total_key_dim / num_heads). Keys past a
    sequence's length get no weight (its padded frames are also zeroed first, so large values there cannot
    overflow); ``attention_left_only`` also hides the keys after the query. ``attention_dropout`` drops
    attention weights in training, with a stateless seed from the network's per-layer seed. ``key_shift``
    names a ``relative_positional_encoding`` layer of n_out = key dims per head: its (query, key) vector
    is added to every head's key for that query, i.e. the scaled query times it is added to the energy.
    """

    needs_seed = True

    def __init__(self, name: str, opts: dict, in_dim: int, *, random_seed: int,
                 key_shift: Layer | None = None) -> None:
        """``key_shift``: the built layer the option names (None for 'data')."""
        super().__init__(in_dim)
        self.heads = positive_int(name, opts, "num_heads")
        key_dim = positive_int(name, opts, "total_key_dim")
        self.n_out = positive_int(name, opts, "n_out")
        for key, value in (("total_key_dim", key_dim), ("n_out", self.n_out)):
            if value % self.heads:
                raise ConfigError(f"Network layer '{name}': {key} {value} is not divisible by num_heads "
                                  f"{self.heads}.")
        self.key_dim, self.value_dim = key_dim // self.heads, self.n_out // self.heads
        self.dropout = opts.get("attention_dropout", 0.0)
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or \
                not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"Network layer '{name}': attention_dropout must be a float in [0, 1), got "
                              f"{self.dropout!r}.")
        self.left_only = opts.get("attention_left_only", False)
        if not isinstance(self.left_only, bool):
            raise ConfigError(f"Network layer '{name}': attention_left_only must be True or False, got "
                              f"{self.left_only!r}.")
        if opts.get("key_shift"):  # RETURNN takes an empty value as none
            _check_key_shift(name, opts["key_shift"], key_shift, self.key_dim)
        self.params["QKV"] = option_variable(name, opts, "forward_weights_init", f"{name}/QKV",
                                             (in_dim, 2 * key_dim + self.n_out), random_seed)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool,
                 seed: tf.Tensor | None = None, key_shift: tf.Tensor | None = None) -> tf.Tensor:
        """``key_shift``: the output (queries, keys, key dims per head) of the layer the option names."""
        n_time, n_batch = tf.shape(x)[0], tf.shape(x)[1]
        per_head = 2 * self.key_dim + self.value_dim
        qkv = tf.matmul(tf.reshape(time_mask(x, lengths), [-1, self.in_dim]), self.param("QKV"))
        qkv = tf.reshape(qkv, [n_time, n_batch, self.heads, per_head])
        q, k, v = tf.split(qkv, [self.key_dim, self.key_dim, self.value_dim], axis=-1)
        q = q * self.key_dim ** -0.5
        # batched matmuls with explicit transposes: TensorFlow's einsum of the same took 1.3-1.5x their time
        heads_first = [1, 2, 0, 3]  # (T, B, H, d) -> (B, H, T, d)
        # float32 from here to the weights: -1e30 below is -inf in float16, and the softmax sums
        energy = tf.matmul(tf.transpose(q, heads_first), tf.transpose(k, heads_first), transpose_b=True)
        energy = tf.cast(energy, tf.float32)  # (B, H, queries, keys)
        if key_shift is not None:  # q . (k + shift) without a (B, H, T, T, d) tensor of shifted keys
            shift = tf.matmul(tf.reshape(q, [n_time, -1, self.key_dim]), tf.cast(key_shift, q.dtype),
                              transpose_b=True)  # (queries, B * H, keys)
            shift = tf.transpose(tf.reshape(shift, [n_time, n_batch, self.heads, -1]), heads_first)
            energy = energy + tf.cast(shift, tf.float32)
        allowed = tf.sequence_mask(lengths, n_time)[:, None, None, :]  # (B, 1, 1, keys)
        if self.left_only:
            causal = tf.linalg.band_part(tf.ones([n_time, n_time], tf.bool), -1, 0)  # key <= query
            allowed = allowed & causal[None, None]
        # a finite floor, not -inf: a sequence of length 0 then gets uniform weights instead of NaN
        energy = tf.where(allowed, energy, tf.fill(tf.shape(energy), -1e30))
        weights = tf.nn.softmax(energy, axis=-1)
        if training and self.dropout > 0.0:
            weights = stateless_dropout(weights, float(self.dropout), seed)
        out = tf.matmul(tf.cast(weights, v.dtype), tf.transpose(v, heads_first))  # (B, H, T, d)
        return tf.reshape(tf.transpose(out, [2, 0, 1, 3]), [n_time, n_batch, self.n_out])


def _check_key_shift(name: str, ref: str, layer: Layer | None, key_dim: int) -> None:
    if not isinstance(layer, RelativePositionalEncoding):
        raise ConfigError(f"Network layer '{name}': key_shift {ref!r} must name a "
                          "relative_positional_encoding layer (RETURNN adds a (queries, keys, key dims) "
                          "tensor without batch axis, which only that class makes).")
    if layer.n_out != key_dim:
        raise ConfigError(f"Network layer '{name}': key_shift layer {ref!r} has n_out {layer.n_out}, but the "
                          f"keys have total_key_dim // num_heads = {key_dim} dims per head.")
