"""RETURNN's ``time_chunking`` and ``time_unchunking`` layers, as plain TensorFlow ops.

``time_chunking`` (``chunk_size`` C, ``chunk_step`` S) turns a time-major batch (T, B, D) into
n = max(T - C + S - 1, 0) // S + 1 chunks per sequence, a batch (C, B * n, D) whose column b * n + k
holds frames k*S .. k*S + C - 1 of sequence b; a chunk's length is the part of those frames inside
the sequence (0 to C), frames outside are 0. ``time_unchunking`` (``chunking_layer``: that layer)
maps such a batch back to (T, B, D): every frame is the mean of the chunk frames that cover it (the
valid ones), 0 where none does. The gradients follow from the ops (summed over the overlaps when
chunking, spread by the mean when unchunking), which is what RETURNN's native ops compute.
"""
from __future__ import annotations

from typing import Collection

import tensorflow as tf

from engine.model.axes import reduces_time, reduces_time_to_vector
from engine.model.layers.base import Layer, positive_int
from engine.runtime.errors import ConfigError


def num_chunks(n_time: tf.Tensor, size: int, step: int) -> tf.Tensor:
    return tf.maximum(n_time - size + step - 1, 0) // step + 1


def chunk_time(x: tf.Tensor, lengths: tf.Tensor, size: int, step: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(T, B, D), (B,) -> (size, B * n, D) chunks and their (B * n,) lengths."""
    n_time, n_batch = tf.shape(x)[0], tf.shape(x)[1]
    n = num_chunks(n_time, size, step)
    starts = tf.range(n) * step  # (n,)
    frame = starts[None, :] + tf.range(size)[:, None]  # (size, n): the input frame of each chunk position
    padded = tf.concat([x, tf.zeros_like(x[:1])], axis=0)  # frames past T read this zero frame
    chunks = tf.gather(padded, tf.minimum(frame, n_time))  # (size, n, B, D)
    chunk_lengths = tf.clip_by_value(lengths[None, :] - starts[:, None], 0, size)  # (n, B)
    valid = tf.range(size)[:, None, None] < chunk_lengths[None, :, :]  # (size, n, B)
    chunks = tf.where(valid[..., None], chunks, tf.zeros_like(chunks))
    out = tf.reshape(tf.transpose(chunks, [0, 2, 1, 3]), [size, n_batch * n, tf.shape(x)[2]])
    return out, tf.reshape(tf.transpose(chunk_lengths), [-1])


def unchunk_time(y: tf.Tensor, chunk_lengths: tf.Tensor, size: int, step: int,
                 n_time: tf.Tensor) -> tf.Tensor:
    """(size, B * n, D) chunks with (B * n,) lengths -> (n_time, B, D), each frame the mean of its chunks."""
    n = num_chunks(n_time, size, step)
    n_batch = tf.shape(y)[1] // n
    dim = tf.shape(y)[2]
    by_chunk = tf.transpose(tf.reshape(y, [size, n_batch, n, dim]), [0, 2, 1, 3])  # (size, n, B, D)
    lengths = tf.transpose(tf.reshape(chunk_lengths, [n_batch, n]))  # (n, B)
    overlaps = -(-size // step)  # at most this many chunks cover a frame
    t = tf.range(n_time)[:, None]
    k = t // step - tf.range(overlaps)[None, :]  # (T, overlaps): the chunks that may cover frame t
    pos = t - k * step  # the frame's position inside chunk k
    inside = (k >= 0) & (k < n) & (pos < size)
    k_safe, pos_safe = tf.where(inside, k, 0), tf.where(inside, pos, 0)
    frames = tf.gather_nd(by_chunk, tf.stack([pos_safe, k_safe], axis=-1))  # (T, overlaps, B, D)
    valid = inside[..., None] & (pos_safe[..., None] < tf.gather(lengths, k_safe))  # (T, overlaps, B)
    total = tf.reduce_sum(tf.where(valid[..., None], frames, tf.zeros_like(frames)), axis=1)
    count = tf.reduce_sum(tf.cast(valid, y.dtype), axis=1)  # (T, B)
    return total / tf.maximum(count, 1.0)[..., None]


class TimeChunking(Layer):
    """``time_chunking``: ``chunk_size``, ``chunk_step``; no parameters."""

    def __init__(self, name: str, opts: dict, in_dim: int) -> None:
        super().__init__(in_dim)
        self.size = positive_int(name, opts, "chunk_size")
        self.step = positive_int(name, opts, "chunk_step")

    def chunk(self, x: tf.Tensor, lengths: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return chunk_time(x, lengths, self.size, self.step)


class TimeUnchunking(Layer):
    """``time_unchunking``: ``chunking_layer`` names the ``time_chunking`` layer whose chunks come back."""

    def __init__(self, name: str, opts: dict, in_dim: int, chunking_layer: Layer) -> None:
        super().__init__(in_dim)
        if not isinstance(chunking_layer, TimeChunking):
            raise ConfigError(f"Network layer '{name}': 'chunking_layer' must name a time_chunking layer, "
                              f"got {opts.get('chunking_layer')!r}.")
        self.chunking_layer = opts["chunking_layer"]
        self.size, self.step = chunking_layer.size, chunking_layer.step

    def unchunk(self, y: tf.Tensor, chunk_lengths: tf.Tensor, n_time: tf.Tensor) -> tf.Tensor:
        return unchunk_time(y, chunk_lengths, self.size, self.step, n_time)


ONE_FRAME = "one frame"  # the time axis a reduce over time with keep_dims leaves


def check_time_axes(specs: dict, order: list[str], loss_layers: list[str], *,
                    resampling: Collection[str] = (),
                    frame_loss_layers: Collection[str] = (),
                    same_time: Collection[Collection[str]] = ()) -> dict[str, tuple[str, ...]]:
    """Every layer reads sources on one time axis; ``time_unchunking`` undoes the innermost chunking; loss
    layers and ``output`` see the data's own time axis, or one made from it by ``resampling`` layers
    (conv/pool with a stride or "valid" padding), except ``frame_loss_layers`` (one target per input
    frame, or the frames of their target stream, which a ``reinterpret_data`` with ``size_base`` makes);
    layers named by reference options (``key_shift``) share the sources' axis. ``specs``: name ->
    ``spec.LayerSpec``. Returns each layer's time axis: the chunking and resampling layers its frames passed
    (``()`` the data's, ``("data:<stream>",)`` another stream's), which rec units tell apart.
    ``same_time``: groups of streams on one time axis (``extern_data``'s ``same_dim_tags_as``)."""
    axes: dict[str, tuple[str, ...]] = {"data": ()}  # the chunking/resampling layers a layer's frames passed
    for group in same_time:
        names = ["data" if s == "data" else f"data:{s}" for s in group]
        shared = () if "data" in names else (min(names),)
        axes.update({stream: shared for stream in names})
    for name in order:
        cls, sources, opts = specs[name][:3]
        if specs[name].subnetwork and not sources:  # a decoder loop runs over its target's labels
            unit_target = opts.get("target") or opts["unit"]["output"].get("target", "classes")
            axes[name] = (f"data:{unit_target}",)
            continue
        if cls == "dot":  # the first source's frames and one frame of the second (layers/dot.py)
            one = axes.get(sources[-1], ())
            if len(sources) != 2 or one != (ONE_FRAME,):
                raise ConfigError(f"Network layer '{name}': dot's second source must be one frame (a reduce "
                                  "over time with keep_dims), read frame against frame with the first's.")
            axes[name] = axes.get(sources[0], (sources[0],))
            continue
        source_axes = {axes.get(src, (src,)) for src in sources}  # a 'data:<stream>' on its own frames
        if len(source_axes) > 1:
            raise ConfigError(f"Network layer '{name}': its sources {list(sources)} are on different time "
                              "axes (some went through a time_chunking layer, or a conv/pool layer that "
                              "changes the number of frames, that the others did not).")
        axis = source_axes.pop()
        for key, ref in specs[name].references.items():  # e.g. key_shift: read frame against frame
            if axes[ref] != axis:
                raise ConfigError(f"Network layer '{name}': {key} {ref!r} is on another time axis than its "
                                  f"sources {list(sources)} (a time_chunking, or a conv/pool that changes "
                                  "the number of frames, lies between them).")
        if cls == "reinterpret_data" and "size_base" in opts:  # the frames of a layer or a data stream
            base = opts["size_base"]
            axis = axes[base] if base in axes else () if base in ("data", "data:data") else (base,)
        elif (cls == "reduce" and (reduces_time(opts) or reduces_time_to_vector(opts))
              or cls in ("generic_attention", "squeeze")):
            axis = (ONE_FRAME,)  # one frame is one frame, whichever layer made it
        elif cls == "time_chunking" or name in resampling:
            axis = axis + (name,)
        elif cls == "time_unchunking":
            chunking_layer = opts.get("chunking_layer")
            if axis and axis[-1] in resampling:
                raise ConfigError(f"Network layer '{name}': its frames went through '{axis[-1]}' after the "
                                  f"chunking, which changes the number of frames per chunk; unchunking needs "
                                  f"the chunks as they were cut (a conv/pool inside chunks needs stride 1 "
                                  f"and 'same' padding).")
            if not axis or axis[-1] != chunking_layer:
                raise ConfigError(f"Network layer '{name}': chunking_layer {chunking_layer!r} must be the "
                                  f"time_chunking layer its sources were last chunked by "
                                  f"({axis[-1] if axis else 'none'!r}).")
            axis = axis[:-1]
        axes[name] = axis
    for name in set(loss_layers) | {"output"}:
        if axes.get(name) == (ONE_FRAME,):
            raise ConfigError(f"Network layer '{name}' is one frame per sequence (a reduce over time with "
                              "keep_dims): a loss or the output needs the frames.")
        chunked = [layer for layer in axes.get(name, ())
                   if layer not in resampling and not layer.startswith("data:")]  # a stream's frames
        if chunked:
            raise ConfigError(f"Network layer '{name}' is on the time axis of time_chunking layer "
                              f"'{chunked[-1]}': add a time_unchunking layer before a loss or the output.")
    # streams read as input (an LM's 'data:delayed') have one frame per frame of the others: the loss
    # checks at run time that the target's frames are the output's
    read_streams = {(src,) for name in order for src in specs[name].sources if src.startswith("data:")}
    for name in frame_loss_layers:
        target_axis = (f"data:{specs[name].opts.get('target', 'classes')}",)
        if axes.get(name) and axes[name] != target_axis and axes[name] not in read_streams:
            raise ConfigError(f"Network layer '{name}' has a frame-wise loss (one target per input frame), "
                              f"but layer '{axes[name][-1]}' changes the number of frames (a stride or "
                              f"'valid' padding).")
    return axes
