"""RETURNN's initialisers of parameters (``forward_weights_init``, ``bias_init``, ``recurrent_weights_init``,
batch_norm's ``gamma_init`` / ``beta_init``) as stateless functions of (``random_seed``, name, shape).

RETURNN hands these options to ``get_initializer`` (``returnn/tf/util/basic.py``), which takes

- a number: a constant;
- a name: ``"glorot_uniform"``, ``"xavier"``, ``"he_normal"``, ``"zeros"``, ... (``<name>_initializer`` is
  tried first, so ``"random_normal"`` means ``random_normal_initializer()``);
- a dict ``{"class": "VarianceScaling", "scale": 0.78, ...}``: a TensorFlow-1 initializer class and its
  constructor arguments;
- a string with ``(``, which RETURNN evaluates with TensorFlow's initializers in scope, such as
  ``"variance_scaling_initializer(mode='fan_in', distribution='uniform', scale=0.78)"``.

The same forms are read here without evaluating anything: a call must name one of ``FORMS`` and give its
arguments as literals; anything else is a ConfigError naming the layer and the option. The values follow
TensorFlow's distribution of that initializer (its fans, its truncation at two standard deviations), not
its random stream: they are drawn by stateless ops keyed by (``random_seed``, a hash of the variable's
name), and an initializer's own ``seed`` argument is folded into that key. Every rank and every run so
builds bit-identical values; ``"glorot_uniform"`` gives exactly ``layers.base.glorot_values``.
"""
from __future__ import annotations

import ast
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import tensorflow as tf

from engine.runtime.errors import ConfigError

_TRUNCATED_STD = 0.87962566103423978  # the std of a standard normal truncated at +-2 (TensorFlow's constant)
_DISTRIBUTIONS = ("normal", "uniform", "truncated_normal", "untruncated_normal")
_MODES = ("fan_in", "fan_out", "fan_avg")


class _Form(NamedTuple):
    """One TensorFlow-1 initializer: what it draws, its constructor's arguments in order, their defaults."""

    kind: str
    arguments: tuple[str, ...]
    defaults: dict[str, Any]


def _scaling(scale: float, mode: str, distribution: str,
             arguments: tuple[str, ...] = ("seed", "dtype")) -> _Form:
    return _Form("variance_scaling", arguments, {"scale": scale, "mode": mode, "distribution": distribution})


_VARIANCE_SCALING = _Form("variance_scaling", ("scale", "mode", "distribution", "seed", "dtype"),
                          {"scale": 1.0, "mode": "fan_in", "distribution": "truncated_normal"})
_GLOROT_UNIFORM = _scaling(1.0, "fan_avg", "uniform")
_GLOROT_NORMAL = _scaling(1.0, "fan_avg", "truncated_normal")
_UNIFORM = _Form("uniform", ("minval", "maxval", "seed", "dtype"), {"minval": 0.0, "maxval": None})
_NORMAL = _Form("normal", ("mean", "stddev", "seed", "dtype"), {"mean": 0.0, "stddev": 1.0})
_TRUNCATED = _Form("truncated_normal", ("mean", "stddev", "seed", "dtype"), {"mean": 0.0, "stddev": 1.0})
_CONSTANT = _Form("constant", ("value", "dtype", "verify_shape"), {"value": 0.0})
_ZEROS = _Form("constant", ("dtype",), {"value": 0.0})
_ONES = _Form("constant", ("dtype",), {"value": 1.0})
_ORTHOGONAL = _Form("orthogonal", ("gain", "seed", "dtype"), {"gain": 1.0})
# TensorFlow-1's initializer classes (what a dict's "class" may name, as RETURNN requires)
CLASSES: dict[str, _Form] = {
    "VarianceScaling": _VARIANCE_SCALING, "GlorotUniform": _GLOROT_UNIFORM, "GlorotNormal": _GLOROT_NORMAL,
    "RandomUniform": _UNIFORM, "RandomNormal": _NORMAL, "TruncatedNormal": _TRUNCATED, "Constant": _CONSTANT,
    "Zeros": _ZEROS, "Ones": _ONES, "Orthogonal": _ORTHOGONAL,
}
# every name RETURNN's evaluation finds an initializer under (the TF-1 functions, their short aliases,
# RETURNN's xavier_initializer and the classes); TensorFlow's ops of the same short name (random_uniform,
# zeros, ...) are no initializers there and are refused
FORMS: dict[str, _Form] = {
    **CLASSES,
    "variance_scaling_initializer": _VARIANCE_SCALING, "variance_scaling": _VARIANCE_SCALING,
    "glorot_uniform_initializer": _GLOROT_UNIFORM, "glorot_uniform": _GLOROT_UNIFORM,
    "glorot_normal_initializer": _GLOROT_NORMAL, "glorot_normal": _GLOROT_NORMAL,
    "xavier_initializer": _Form("xavier", ("uniform", "seed", "dtype"), {"uniform": True}),
    "he_normal": _scaling(2.0, "fan_in", "truncated_normal", ("seed",)),
    "he_uniform": _scaling(2.0, "fan_in", "uniform", ("seed",)),
    "lecun_normal": _scaling(1.0, "fan_in", "truncated_normal", ("seed",)),
    "lecun_uniform": _scaling(1.0, "fan_in", "uniform", ("seed",)),
    "random_uniform_initializer": _UNIFORM, "random_normal_initializer": _NORMAL,
    "truncated_normal_initializer": _TRUNCATED, "constant_initializer": _CONSTANT,
    "zeros_initializer": _ZEROS, "ones_initializer": _ONES,
    "orthogonal_initializer": _ORTHOGONAL, "orthogonal": _ORTHOGONAL,
}
# names RETURNN knows that are refused here, and why
_REFUSED = {
    "random_uniform_abs_initializer": "RETURNN itself fails on it with TensorFlow 2 (it makes a TF-2 "
                                      "initializer, which get_initializer's seed assertion rejects); use "
                                      "random_uniform_initializer(-limit, limit)",
    "identity_initializer": "not implemented in this engine", "Identity": "not implemented in this engine",
    "uniform_unit_scaling_initializer": "not implemented in this engine (TensorFlow deprecated it)",
    "UniformUnitScaling": "not implemented in this engine (TensorFlow deprecated it)",
}


@dataclass(frozen=True)
class Initializer:
    """A parsed initializer: ``kind`` ("constant", "uniform", "normal", "truncated_normal",
    "variance_scaling", "orthogonal"), its arguments, and the seed it was given (None: none)."""

    kind: str
    args: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None

    def values(self, name: str, shape: tuple[int, ...], random_seed: int) -> tf.Tensor:
        """float32 values of ``shape`` for the variable ``name``: a pure function of these and the seed."""
        shape = tuple(int(s) for s in shape)
        key = tf.constant([random_seed, zlib.crc32(name.encode())], tf.int64)
        if self.seed is not None:
            key = tf.random.experimental.stateless_fold_in(key, self.seed)
        args = self.args
        if self.kind == "constant":
            return tf.fill(shape, tf.constant(float(args["value"]), tf.float32))
        if self.kind == "uniform":
            return tf.random.stateless_uniform(shape, seed=key, minval=args["minval"], maxval=args["maxval"])
        if self.kind == "normal":
            return tf.random.stateless_normal(shape, seed=key, mean=args["mean"], stddev=args["stddev"])
        if self.kind == "truncated_normal":
            return tf.random.stateless_truncated_normal(shape, seed=key, mean=args["mean"],
                                                        stddev=args["stddev"])
        if self.kind == "orthogonal":
            return _orthogonal(name, shape, key, args["gain"])
        return _variance_scaling(shape, key, args["scale"], args["mode"], args["distribution"])

    def variable(self, name: str, shape: tuple[int, ...], random_seed: int,
                 trainable: bool = True) -> tf.Variable:
        return tf.Variable(self.values(name, shape, random_seed), name=name, trainable=trainable)


ZEROS = Initializer("constant", {"value": 0.0})
GLOROT_UNIFORM = Initializer("variance_scaling", {"scale": 1.0, "mode": "fan_avg", "distribution": "uniform"})


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) as TensorFlow counts them: a vector's both are its size; a kernel (..., in, out)
    counts its leading (receptive field) sizes in both."""
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive


def _variance_scaling(shape: tuple[int, ...], key: tf.Tensor, scale: float, mode: str,
                      distribution: str) -> tf.Tensor:
    fan_in, fan_out = fans(shape)
    n = max(1.0, {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode])
    if distribution == "uniform":
        limit = (3.0 * scale / n) ** 0.5  # this order gives glorot_values' limit to the bit
        return tf.random.stateless_uniform(shape, seed=key, minval=-limit, maxval=limit)
    if distribution == "untruncated_normal":
        return tf.random.stateless_normal(shape, seed=key, stddev=math.sqrt(scale / n))
    # "normal" is truncated too in TensorFlow-1's VarianceScaling; the divisor restores the std
    return tf.random.stateless_truncated_normal(shape, seed=key, stddev=math.sqrt(scale / n) / _TRUNCATED_STD)


def _orthogonal(name: str, shape: tuple[int, ...], key: tf.Tensor, gain: float) -> tf.Tensor:
    if len(shape) < 2:
        raise ConfigError(f"Parameter '{name}' has shape {shape}: the orthogonal initializer needs at least "
                          "two axes.")
    rows, cols = math.prod(shape[:-1]), shape[-1]
    a = tf.random.stateless_normal((max(rows, cols), min(rows, cols)), seed=key)
    q, r = tf.linalg.qr(a)
    q = q * tf.sign(tf.linalg.diag_part(r))  # TensorFlow's sign fix: a uniform distribution over rotations
    if rows < cols:
        q = tf.transpose(q)
    return gain * tf.reshape(q, shape)


def parse_initializer(layer: str, option: str, value: Any) -> Initializer:
    """The initializer RETURNN's ``get_initializer`` makes of ``value``; ConfigError names the layer and
    option for any form this engine does not take."""
    where = f"Network layer '{layer}': {option!r}"
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be a number, an initializer name, a call or a dict, got {value!r}.")
    if isinstance(value, (int, float)):
        return Initializer("constant", {"value": float(value)})
    if isinstance(value, dict):
        rest = dict(value)
        cls = rest.pop("class", None)
        if cls not in CLASSES:
            raise ConfigError(f"{where}: a dict names a TensorFlow initializer class in 'class'; {cls!r} is "
                              f"not one this engine takes ({', '.join(CLASSES)}).")
        return _made(where, cls, CLASSES[cls], [], rest)
    if isinstance(value, str):
        if "(" in value:
            name, positional, keywords = _call(where, value)
            return _made(where, name, _form(where, name), positional, keywords)
        name = value + "_initializer" if value + "_initializer" in FORMS else value
        return _made(where, name, _form(where, name), [], {})
    raise ConfigError(f"{where} must be a number, an initializer name, a call or a dict, got {value!r}.")


def _form(where: str, name: str) -> _Form:
    if name in _REFUSED:
        raise ConfigError(f"{where}: {name} is refused: {_REFUSED[name]}.")
    if name not in FORMS:
        raise ConfigError(f"{where}: unknown initializer {name!r}; this engine takes numbers, "
                          f"{', '.join(sorted(FORMS, key=str.lower))} (as names, calls with literal "
                          "arguments, or classes in a dict).")
    return FORMS[name]


def _call(where: str, text: str) -> tuple[str, list, dict]:
    """``name(arg, key=arg)`` -> (name, positional, keywords); the arguments must be literals."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        node = None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ConfigError(f"{where}: {text!r} is not a call of an initializer like "
                          "\"variance_scaling_initializer(scale=0.78, mode='fan_in')\".")
    try:
        positional = [ast.literal_eval(arg) for arg in node.args]
        keywords = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    except ValueError:
        raise ConfigError(f"{where}: {text!r}: this engine takes only literal arguments (numbers, strings, "
                          "True/False), not expressions, since it does not evaluate config code.") from None
    if None in keywords:
        raise ConfigError(f"{where}: {text!r}: '**' arguments are not taken.")
    return node.func.id, positional, keywords


def _made(where: str, name: str, form: _Form, positional: list, keywords: dict) -> Initializer:
    if len(positional) > len(form.arguments):
        raise ConfigError(f"{where}: {name} takes at most {len(form.arguments)} arguments "
                          f"({', '.join(form.arguments)}), got {len(positional)}.")
    given = dict(zip(form.arguments, positional))
    for key, value in keywords.items():
        if key not in form.arguments or key in given:
            what = "a repeated" if key in given else "an unknown"
            raise ConfigError(f"{where}: {name} got {what} argument {key!r}; its arguments: "
                              f"{', '.join(form.arguments)}.")
        given[key] = value
    seed = given.pop("seed", None)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"{where}: {name}'s seed must be an int, got {seed!r}.")
    if given.pop("dtype", "float32") not in ("float32", None):
        raise ConfigError(f"{where}: {name}: parameters are float32 here; remove 'dtype'.")
    given.pop("verify_shape", None)  # a single number fills any shape
    args = {**form.defaults, **given}
    kind = form.kind
    if kind == "xavier":  # RETURNN's alias of glorot_uniform (uniform=False: VarianceScaling's "normal")
        kind, args = "variance_scaling", {"scale": 1.0, "mode": "fan_avg",
                                          "distribution": "uniform" if args.pop("uniform") else "normal"}
    _check(where, name, kind, args)
    return Initializer(kind, args, seed)


def _number(where: str, name: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: {name}'s {key} must be a finite number, got {value!r}.")
    return float(value)


def _check(where: str, name: str, kind: str, args: dict) -> None:
    """TensorFlow's own argument checks, as ConfigErrors (args are normalised in place)."""
    if kind == "variance_scaling":
        args["scale"] = _number(where, name, "scale", args["scale"])
        if args["scale"] <= 0:
            raise ConfigError(f"{where}: {name}'s scale must be > 0, got {args['scale']!r}.")
        if args["mode"] not in _MODES:
            raise ConfigError(f"{where}: {name}'s mode must be one of {', '.join(_MODES)}, got "
                              f"{args['mode']!r}.")
        distribution = args["distribution"]
        args["distribution"] = distribution.lower() if isinstance(distribution, str) else distribution
        if args["distribution"] not in _DISTRIBUTIONS:
            raise ConfigError(f"{where}: {name}'s distribution must be one of {', '.join(_DISTRIBUTIONS)}, "
                              f"got {distribution!r}.")
    elif kind == "uniform":
        args["maxval"] = 1.0 if args["maxval"] is None else args["maxval"]  # TensorFlow's default for floats
        for key in ("minval", "maxval"):
            args[key] = _number(where, name, key, args[key])
    elif kind in ("normal", "truncated_normal"):
        args["mean"], args["stddev"] = (_number(where, name, key, args[key]) for key in ("mean", "stddev"))
    elif kind == "constant":
        if isinstance(args["value"], (list, tuple)):
            raise ConfigError(f"{where}: {name} with a list of values is not taken here; give one number.")
        args["value"] = _number(where, name, "value", args["value"])
    else:
        args["gain"] = _number(where, name, "gain", args["gain"])


# what a layer's parameter starts as when its option is not given (RETURNN's defaults of these options)
OPTION_DEFAULTS = {"forward_weights_init": "glorot_uniform", "bias_init": 0.0}


def option_variable(layer: str, opts: dict, option: str, name: str, shape: tuple[int, ...],
                    random_seed: int) -> tf.Variable:
    """The variable ``name`` of ``layer``, initialised as its ``option`` (``forward_weights_init`` or
    ``bias_init``) says, RETURNN's default when the option is absent."""
    init = parse_initializer(layer, option, opts.get(option, OPTION_DEFAULTS[option]))
    return init.variable(name, shape, random_seed)


def check_bias_init(layer: str, opts: dict, params: dict) -> None:
    """A (non-zero) ``bias_init`` on a built layer without bias: RETURNN's linear refuses it, its conv
    ignores it (which its default ``with_bias`` False of behaviour version 0 makes easy to miss); refused."""
    if opts.get("bias_init") and not {"b", "bias"} & set(params):
        raise ConfigError(f"Network layer '{layer}': bias_init is given, but the layer has no bias "
                          f"(with_bias {opts.get('with_bias', 'not given')!r}); set with_bias True, or "
                          "remove bias_init as RETURNN would not use it.")
