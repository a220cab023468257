"""RETURNN's ``eval`` layer: a Python expression (or function) over the sources' tensors.

``{"class": "eval", "eval": "0.5 * source(0)", "from": "x"}``. The expression sees, as in RETURNN:
``source(i, auto_convert=True, enforce_batch_major=False, as_data=False)``, ``self`` (``self.network``:
``get_config().typed_value(key)``, ``global_train_step``, ``train_flag``, ``cond_on_train(fn_train,
fn_eval)``), ``tf`` and TFUtil's functions this engine provides (``returnn_tf_util.EVAL_NAMES``), and
``eval_locals``. It must use every source and return a float tensor of (batch, time, n_out) in its layout.

Layout. The engine runs time-major, but configs' expressions (and the SpecAugment functions they call)
index axes as RETURNN laid them out: ``data`` batch-major (B, T, F), an LSTM's output time-major
(T, B, F). So ``source(i)`` gives each tensor in RETURNN's layout (``returnn_time_major``): the eval
layer's output layout (source 0's, or batch-major with ``out_type``'s ``shape``), or with
``auto_convert=False`` source i's own, or batch-major with ``enforce_batch_major``. ``as_data=True``
describes that tensor (``SourceData``: its axes, ``dim``, ``placeholder``, ``get_sequence_lengths()``).
The result, in the output layout, goes back to time-major for the next layers.
"""
from __future__ import annotations

import os
import traceback
from typing import Any, Callable, Collection

import tensorflow as tf

from engine.config import returnn_tf_util
from engine.config.loader import Config
from engine.model.layers.base import Layer
from engine.model.layers.dense import ACTIVATIONS, activation_option
from engine.model.spec import is_stream
from engine.runtime.errors import ConfigError, EngineError

# RETURNN's output layout by class: time-major (T, B, F) or batch-major (B, T, F); every other class
# keeps its first source's layout (RETURNN 1.x, measured). A new class that lays its output out on its own
# belongs in one of these.
TIME_MAJOR_CLASSES = frozenset({"rec", "time_chunking", "time_unchunking"})
BATCH_MAJOR_CLASSES = frozenset({"conv", "pool", "self_attention", "transposed_conv"})

_OUT_TYPE_KEYS = {"dim", "shape", "dtype", "sparse"}
# frames of these folders are not config code (for the line an error names)
_NOT_CONFIG_CODE = (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
                    os.path.dirname(os.path.dirname(os.path.abspath(tf.__file__))) + os.sep)


def returnn_time_major(specs: dict, name: str) -> bool:
    """Whether RETURNN lays the output of layer ``name`` out time-major. ``specs``: name -> LayerSpec."""
    while not is_stream(name):
        spec = specs[name]
        if spec.cls in TIME_MAJOR_CLASSES:
            return True
        shaped = spec.cls == "eval" and "shape" in (spec.opts.get("out_type") or {})
        if spec.cls in BATCH_MAJOR_CLASSES or shaped:
            return False
        name = spec.sources[0]
    return False  # extern data: RETURNN's default layout is batch-major


def _relayout(x: tf.Tensor, from_time_major: bool, to_time_major: bool) -> tf.Tensor:
    """(T, B, ...) <-> (B, T, ...)."""
    if from_time_major == to_time_major:
        return x
    return tf.transpose(x, [1, 0, *range(2, x.shape.rank)]) if x.shape.rank is not None else \
        tf.transpose(x, tf.concat([[1, 0], tf.range(2, tf.rank(x))], axis=0))


class SourceData:
    """``source(i, as_data=True)``: the tensor and the axes it has, named as RETURNN's ``Data`` names them."""

    def __init__(self, name: str, placeholder: tf.Tensor, time_major: bool, dim: int,
                 lengths: tf.Tensor) -> None:
        self.name, self.placeholder, self.dim, self._lengths = name, placeholder, dim, lengths
        self.batch_dim_axis, self.time_dim_axis = (1, 0) if time_major else (0, 1)
        self.feature_dim_axis = 2
        self.is_time_major, self.is_batch_major = time_major, not time_major
        self.batch_ndim, self.ndim = 3, 2
        self.shape, self.batch_shape = (None, dim), (None, None, dim)
        self.sparse, self.dtype = False, placeholder.dtype.name
        self.size_placeholder = {0: lengths}  # RETURNN's: the time axis, counted without the batch axis

    def get_sequence_lengths(self) -> tf.Tensor:
        return self._lengths

    def copy_as_batch_major(self) -> "SourceData":
        return SourceData(self.name, _relayout(self.placeholder, self.is_time_major, False), False, self.dim,
                          self._lengths)

    def copy_as_time_major(self) -> "SourceData":
        return SourceData(self.name, _relayout(self.placeholder, self.is_time_major, True), True, self.dim,
                          self._lengths)

    def get_placeholder_as_batch_major(self) -> tf.Tensor:
        return self.copy_as_batch_major().placeholder

    def get_placeholder_as_time_major(self) -> tf.Tensor:
        return self.copy_as_time_major().placeholder

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ConfigError(f"RETURNN's Data.{name} is not provided for source(i, as_data=True) by this "
                          "engine (provided: placeholder, dim, batch_dim_axis, time_dim_axis, "
                          "feature_dim_axis, shape, batch_shape, ndim, batch_ndim, is_batch_major, "
                          "is_time_major, dtype, sparse, size_placeholder, get_sequence_lengths, "
                          "copy_as_batch_major, copy_as_time_major).")


class ConfigView:
    """``self.network.get_config()``: RETURNN's Config getters over this engine's config."""

    def __init__(self, config: Config) -> None:
        self._config = config

    def typed_value(self, key: str, default: Any = None, index: int | None = None) -> Any:
        value = self._config.typed(key, default)
        return value[index] if index is not None and isinstance(value, (list, tuple)) else value

    def has(self, key: str) -> bool:
        return self._config.has(key)

    def bool(self, key: str, default: Any = None) -> Any:
        return self._config.bool(key, default)

    def int(self, key: str, default: Any = None) -> Any:
        return self._config.int(key, default)

    def float(self, key: str, default: Any = None) -> Any:
        return self._config.float(key, default)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ConfigError(f"RETURNN's Config.{name} is not provided to eval layers by this engine (provided: "
                          "typed_value, has, bool, int, float).")


class NetworkView:
    """``self.network`` (and ``network=self.network`` in config functions): what of RETURNN's TFNetwork an
    expression may ask here."""

    def __init__(self, config: Config, training: bool, train_step: tf.Tensor | None) -> None:
        self._config, self.train_flag, self._step = config, training, train_step

    @property
    def global_train_step(self) -> tf.Tensor:
        """int64: the train steps (batches) done before this one; 0 where no training counts (see the
        network's ``train_step``)."""
        return tf.constant(0, tf.int64) if self._step is None else tf.cast(self._step, tf.int64)

    def get_config(self) -> ConfigView:
        return ConfigView(self._config)

    def cond_on_train(self, fn_train: Callable[[], Any], fn_eval: Callable[[], Any]) -> Any:
        return fn_train() if self.train_flag else fn_eval()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ConfigError(f"RETURNN's TFNetwork.{name} is not provided to eval layers by this engine "
                          "(provided: get_config, global_train_step, train_flag, cond_on_train).")


class LayerView:
    """``self`` in an expression: the layer's ``name`` and ``network``."""

    def __init__(self, name: str, network: NetworkView) -> None:
        self.name, self.network = name, network

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ConfigError(f"RETURNN's layer attribute self.{name} is not provided to eval expressions by "
                          "this engine (provided: self.name, self.network).")


class _Code:
    """The expression (compiled) or function, and its ``eval_locals``; kept off ``tf.Module``'s tracking."""

    def __init__(self, name: str, source: Any, eval_locals: dict) -> None:
        self.text = source if isinstance(source, str) else getattr(source, "__name__", repr(source))
        if isinstance(source, str):
            try:
                self.compiled: Any = compile(source, f"<eval layer '{name}'>", "eval")
            except SyntaxError as exc:
                raise ConfigError(f"Network layer '{name}': eval {source!r} is no Python expression: "
                                  f"{exc.msg}.") from None
        elif callable(source):
            self.compiled = source
        else:
            raise ConfigError(f"Network layer '{name}': 'eval' must be a str (a Python expression) or a "
                              f"function, got {source!r}.")
        self.locals = eval_locals


class Eval(Layer):
    """``eval``: see the module docstring. No parameters."""

    separate_sources = True

    def __init__(self, name: str, opts: dict, source_dims: list[int], source_time_major: list[bool], *,
                 config: Config | None = None, input_sparse_sources: tuple[str, ...] = ()) -> None:
        super().__init__(source_dims[0])
        self.name_ = name
        if opts.get("dropout"):
            raise ConfigError(f"Network layer '{name}': RETURNN's eval layer takes no 'dropout' (it takes "
                              "its sources as they are); put a dropout on a source layer instead.")
        for key, why in (("with_bias", "this engine's eval layer has no parameters; add the bias with a "
                                       "linear or combine layer"),
                         ("eval_for_output_loss", "this engine's layers have no output loss to evaluate on"),
                         ("allow_broadcast_all_sources", "RETURNN then broadcasts differing feature dims "
                                                         "into axes of their own, which this engine's (time, "
                                                         "batch, feature) layers cannot carry")):
            if opts.get(key):
                raise ConfigError(f"Network layer '{name}': eval option {key!r} = True is not supported: "
                                  f"{why}.")
        eval_locals = opts.get("eval_locals") or {}
        if not isinstance(eval_locals, dict) or not all(isinstance(k, str) for k in eval_locals):
            raise ConfigError(f"Network layer '{name}': 'eval_locals' must be a dict of names, got "
                              f"{eval_locals!r}.")
        if "eval" not in opts:
            raise ConfigError(f"Network layer '{name}': 'eval' (the expression) is required for class "
                              "'eval'.")
        self.code = _Code(name, opts["eval"], eval_locals)
        self.source_dims, self.source_time_major = list(source_dims), list(source_time_major)
        self.config = config if config is not None else Config()
        out_type = opts.get("out_type")
        self.ids_output = isinstance(out_type, dict) and out_type.get("sparse") is True
        if self.ids_output:  # class ids to class ids (2022-swb-factored-hybrid's targets)
            self.n_out = _ids_out_type(name, opts, len(source_dims), input_sparse_sources)
            self.out_time_major, self.activation = source_time_major[0], None
            return
        if input_sparse_sources:
            raise ConfigError(f"Network layer '{name}': source '{input_sparse_sources[0]}' is sparse (class "
                              "ids), and out_type does not say 'sparse': True: RETURNN's eval would see the "
                              "ids (batch, time) and give features, which this engine's eval does not "
                              "compute from ids. Put a linear layer (an embedding) in between, or give "
                              "out_type {'dim': D, 'sparse': True} for an output of class ids.")
        shaped = self._out_type(name, opts.get("out_type"))
        if len(set(source_dims)) > 1 and not shaped:
            raise ConfigError(f"Network layer '{name}': its sources have different feature dims "
                              f"{source_dims}; RETURNN's eval needs one dim, or an out_type with 'shape': "
                              "(None, n_out).")
        n_out = opts.get("n_out", self.n_out)
        if n_out != self.n_out:
            raise ConfigError(f"Network layer '{name}': n_out {n_out!r} differs from the output's dim "
                              f"{self.n_out}; RETURNN refuses that too (give out_type {{'shape': (None, "
                              f"{n_out!r})}} for an output of another dim).")
        # RETURNN's output layout: its first source's, or its default (batch-major) for a given shape
        self.out_time_major = False if shaped else source_time_major[0]
        self.activation = ACTIVATIONS[activation_option(name, opts)]

    @classmethod
    def for_network(cls, name: str, specs: dict, layouts: dict, sparse: Collection[str],
                    config: Config | None) -> "Eval":
        """The layer ``name`` of a network: ``specs`` name -> LayerSpec, ``layouts`` name -> ``axes.Layout``
        of the layers built so far (and the data streams), ``sparse`` the streams that hold class ids."""
        sources = specs[name].sources
        return cls(name, specs[name].opts, [layouts[s].feature for s in sources],
                   [returnn_time_major(specs, s) for s in sources], config=config,
                   input_sparse_sources=tuple(s for s in sources if s in sparse))

    def _out_type(self, name: str, out_type: Any) -> bool:
        """Apply ``out_type`` (sets ``n_out``); True when it gives a ``shape``."""
        if out_type is None:
            return False
        if not isinstance(out_type, dict):
            raise ConfigError(f"Network layer '{name}': out_type {out_type!r} is not supported; this engine "
                              "takes a dict with 'dim' and/or 'shape': (None, dim) (a function is refused).")
        unknown = sorted(set(out_type) - _OUT_TYPE_KEYS)
        if unknown:
            raise ConfigError(f"Network layer '{name}': out_type keys {unknown} are not supported; this "
                              "engine's eval output is (time, batch, dim) float, so out_type takes only "
                              "'dim', 'shape': (None, dim), 'dtype': 'float32' and 'sparse': False.")
        if out_type.get("dtype", "float32") != "float32" or out_type.get("sparse", False) is not False:
            raise ConfigError(f"Network layer '{name}': out_type {out_type!r} asks for a sparse or "
                              "non-float32 output; this engine's layers carry float features.")
        dim = out_type.get("dim", self.n_out)
        if "shape" in out_type:
            shape = out_type["shape"]
            if not (isinstance(shape, (tuple, list)) and len(shape) == 2 and shape[0] is None
                    and isinstance(shape[1], int) and shape[1] > 0
                    and out_type.get("dim", shape[1]) == shape[1]):
                raise ConfigError(f"Network layer '{name}': out_type shape {shape!r} is not supported; this "
                                  "engine takes (None, dim): time and features (dim as 'dim', if given).")
            self.n_out = shape[1]
            return True
        if dim != self.n_out:
            raise ConfigError(f"Network layer '{name}': out_type dim {dim!r} differs from the sources' dim "
                              f"{self.n_out}; RETURNN refuses that without a 'shape' too (give 'shape': "
                              f"(None, {dim!r})).")
        return False

    def __call__(self, xs: list[tf.Tensor], lengths: tf.Tensor, training: bool,
                 train_step: tf.Tensor | None = None) -> tf.Tensor:
        """``xs``: the sources, time-major; ``train_step``: RETURNN's global_train_step (None: 0)."""
        used: set[int] = set()
        name = self.name_

        def source(i: int, auto_convert: bool = True, enforce_batch_major: bool = False,
                   as_data: bool = False, as_layer: bool = False) -> Any:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(xs):
                raise ConfigError(f"source({i!r}): the layer has {len(xs)} source(s), source(0) .. "
                                  f"source({len(xs) - 1}).")
            if as_layer:
                raise ConfigError("source(i, as_layer=True): RETURNN's layer objects are not provided by "
                                  "this engine.")
            if as_data and self.ids_output:
                raise ConfigError(f"source({i}, as_data=True): RETURNN's Data of class ids is not provided "
                                  "by this engine; source(i) gives the ids themselves.")
            used.add(i)
            time_major = (self.out_time_major if auto_convert else self.source_time_major[i]) \
                and not enforce_batch_major
            x = _relayout(xs[i], True, time_major)
            return SourceData(f"source({i})", x, time_major, self.source_dims[i], lengths) if as_data else x

        function = callable(self.code.compiled)  # RETURNN passes a function only these names
        names = {} if function else {**returnn_tf_util.EVAL_NAMES, "tf": returnn_tf_util.TfWithV1Names()}
        names.update(source=source, self=LayerView(name, NetworkView(self.config, training, train_step)))
        names.update(self.code.locals)
        try:
            y = self.code.compiled(**names) if function else eval(self.code.compiled, names)
        except Exception as exc:  # user code: name the layer and the expression
            raise ConfigError(f"Network layer '{name}': eval {self.code.text!r} failed{_where(exc)}: "
                              f"{_explained(exc)}") from None
        return self._checked(y, used, xs, len(xs))

    def _checked(self, y: Any, used: set[int], xs: list[tf.Tensor], count: int) -> tf.Tensor:
        where = f"Network layer '{self.name_}': eval {self.code.text!r}"
        if used != set(range(count)):
            raise ConfigError(f"{where} does not use source(s) {sorted(set(range(count)) - used)}; RETURNN "
                              "requires every source to be used.")
        if not tf.is_tensor(y):
            raise ConfigError(f"{where} returned {type(y).__name__}, not a tensor.")
        if self.ids_output:
            return self._checked_ids(y, xs[0], where)
        if not y.dtype.is_floating:
            raise ConfigError(f"{where} returned {y.dtype.name} values; this engine's layers carry float "
                              "features (cast it, e.g. tf.cast(..., tf.float32)).")
        layout = "(time, batch, dim)" if self.out_time_major else "(batch, time, dim)"
        if y.shape.rank not in (None, 3) or (y.shape.rank == 3 and y.shape[-1] not in (None, self.n_out)):
            raise ConfigError(f"{where} returned shape {y.shape}; the output must be {layout} with dim "
                              f"{self.n_out} (RETURNN's layout of source(0), see docs).")
        y = _relayout(tf.ensure_shape(y, [None, None, self.n_out]), self.out_time_major, True)
        check = tf.debugging.assert_equal(tf.shape(y)[:2], tf.shape(xs[0])[:2], message=(
            f"{where}: the output's time and batch axes must be those of source(0), in {layout} layout"))
        with tf.control_dependencies([check]):
            y = tf.identity(tf.cast(y, self.compute_dtype))
        return y if self.activation is None else self.activation(y)

    def _checked_ids(self, y: tf.Tensor, first: tf.Tensor, where: str) -> tf.Tensor:
        """Class ids (time, batch) int32, as the engine carries a sparse stream."""
        layout = "(time, batch)" if self.out_time_major else "(batch, time)"
        if not y.dtype.is_integer or y.shape.rank not in (None, 2):
            raise ConfigError(f"{where} returned {y.dtype.name} of shape {y.shape}; its out_type says class "
                              f"ids, so the output must be integers {layout}, as source(0).")
        y = _relayout(tf.ensure_shape(y, [None, None]), self.out_time_major, True)
        check = tf.debugging.assert_equal(tf.shape(y), tf.shape(first), message=(
            f"{where}: the output's time and batch axes must be those of source(0), in {layout} layout"))
        with tf.control_dependencies([check]):
            return tf.cast(y, tf.int32)


def _ids_out_type(name: str, opts: dict, sources: int, sparse_sources: tuple[str, ...]) -> int:
    """The number of classes of an eval of class ids (``out_type`` sparse), whose sources are class ids."""
    out_type = opts["out_type"]
    where = f"Network layer '{name}'"
    unknown = sorted(set(out_type) - _OUT_TYPE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: out_type keys {unknown} are not supported (taken: dim, sparse, dtype, "
                          "shape).")
    dim = out_type.get("dim")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ConfigError(f"{where}: a sparse out_type needs its number of classes as 'dim' (a positive "
                          f"int), got {dim!r}.")
    if out_type.get("dtype", "int32") not in ("int32", "int64") or tuple(out_type.get("shape", (None,))) \
            != (None,):
        raise ConfigError(f"{where}: a sparse out_type is class ids per frame here: dtype int32 or int64, "
                          f"shape (None,); got {out_type!r}.")
    if len(sparse_sources) != sources:
        raise ConfigError(f"{where}: an eval of class ids (out_type sparse) reads class ids here (data "
                          "streams of class ids, or evals of them); some of its sources are features.")
    for key in ("activation", "n_out"):
        if opts.get(key) not in (None, dim if key == "n_out" else None):
            raise ConfigError(f"{where}: {key} {opts[key]!r} does not go with an output of class ids.")
    return dim


def _where(exc: Exception) -> str:
    """`` at <file> line <n>``: the innermost frame of config code (not this engine's, not TensorFlow's)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_NOT_CONFIG_CODE + ("<eval layer",))]
    return f" at {frames[-1].filename} line {frames[-1].lineno}" if frames else ""


def _explained(exc: Exception) -> str:
    text = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
    missing = str(exc).split("has no attribute ")[-1].strip("'") if isinstance(exc, AttributeError) else ""
    if "module 'tensorflow' has no attribute" in str(exc) and hasattr(tf.compat.v1, missing):
        text += (f" (tf.{missing} is TensorFlow 1's name: import tf as `from returnn.tf.compat import v1 as "
                 "tf`, as RETURNN's configs for TensorFlow 2 do)")
    if isinstance(exc, NameError):
        text += f" (names besides tf, source, self and eval_locals: {', '.join(returnn_tf_util.EVAL_NAMES)})"
    return text.rstrip(".") + "."
