"""Dense layers of the ``network`` dict: ``linear``, ``softmax`` (with its ``ce`` loss), and ``copy`` /
``dropout`` (the input itself)."""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from engine.model.initializers import option_variable
from engine.model.layers.base import Layer, dense_gather, positive_int
from engine.model.losses.cross_entropy import CrossEntropy
from engine.model.losses.ctc import CtcLoss
from engine.model.losses import check_loss_name
from engine.model.losses.edit_distance import EditDistance
from engine.runtime.errors import ConfigError

ACTIVATIONS: dict[Any, Callable[[tf.Tensor], tf.Tensor] | None] = {
    None: None,
    "linear": None,
    "identity": None,
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
    "sigmoid": tf.sigmoid,
    "elu": tf.nn.elu,
    "softmax": tf.nn.softmax,
    "log_softmax": tf.nn.log_softmax,
    # RETURNN looks any other name up in tf.nn, then tf / tf.math: these are the common ones
    "gelu": tf.nn.gelu,  # tf.nn.gelu's default: the exact (erf) form, as RETURNN gets it
    "swish": tf.nn.swish,
    "silu": tf.nn.silu,
    "softplus": tf.nn.softplus,
    "softsign": tf.nn.softsign,
    "relu6": tf.nn.relu6,
    "selu": tf.nn.selu,
    "log_sigmoid": tf.math.log_sigmoid,
    "abs": tf.abs,
    "exp": tf.exp,
    "log": tf.math.log,
    "sqrt": tf.sqrt,
    "square": tf.square,
    "sin": tf.sin,
    "cos": tf.cos,
    "neg": tf.negative,
    "negative": tf.negative,
}


def activation_option(layer: str, opts: dict) -> Any:
    """The layer's ``activation`` (a key of ``ACTIVATIONS``); an unknown name is a ConfigError."""
    activation = opts.get("activation")
    if not isinstance(activation, (str, type(None))) or activation not in ACTIVATIONS:
        known = ", ".join(repr(k) for k in ACTIVATIONS)
        raise ConfigError(f"Network layer '{layer}': unknown activation {activation!r}; known: {known}.")
    return activation


class Copy(Layer):
    """``copy`` and ``dropout``: the (concatenated, maybe dropped-out) input itself.

    A ``copy`` layer may carry the ``edit_distance`` loss (``losses.EditDistance``) against ``target``
    (default ``classes``); its input then has the target's dim + 1 (the CTC blank last)."""

    def __init__(self, name: str, opts: dict, in_dim: int, target_dims: dict[str, int]) -> None:
        super().__init__(in_dim)
        self.loss = opts.get("loss")
        self.takes_spatial = not self.loss
        self.target = opts.get("target", "classes")
        self.only_on_eval = opts.get("only_on_eval", False)
        self.criterion = None
        if not self.loss:
            if opts.get("loss_opts") or self.only_on_eval:
                raise ConfigError(f"Network layer '{name}': loss_opts or only_on_eval are given, but the "
                                  "layer has no loss.")
            return
        check_loss_name(f"Network layer '{name}'", "copy", self.loss)
        if not isinstance(self.only_on_eval, bool):
            raise ConfigError(f"Network layer '{name}': only_on_eval must be True or False.")
        target_dim = target_dims.get(self.target) if isinstance(self.target, str) else None
        if target_dim is None:
            raise ConfigError(f"Network layer '{name}': loss target {self.target!r} is not a data stream; "
                              f"known targets: {sorted(target_dims)}.")
        if in_dim != target_dim + 1:
            raise ConfigError(f"Network layer '{name}': the edit_distance loss with ctc_decode needs the "
                              f"target's dim {target_dim} + 1 (the blank) as input dim, but it is {in_dim}.")
        self.criterion = EditDistance.from_layer_options(name, opts)


class Linear(Layer):
    """``linear``: x W + b and an activation. Sparse input (ids) selects rows of W (an embedding). Static
    axes besides the features are kept (the features of each position are mapped).
    ``use_transposed_weights``: W is kept as (n_out, in), as RETURNN keeps it then (an output layer that
    shares its matrix with an embedding's)."""

    takes_spatial = True

    def __init__(self, name: str, opts: dict, in_dim: int, *, sparse_input: bool, random_seed: int) -> None:
        super().__init__(in_dim)
        self.n_out = positive_int(name, opts, "n_out")
        self.activation = ACTIVATIONS[activation_option(name, opts)]
        self.sparse_input = sparse_input
        self.transposed = opts.get("use_transposed_weights", False)
        if not isinstance(self.transposed, bool):
            raise ConfigError(f"Network layer '{name}': use_transposed_weights must be True or False, got "
                              f"{self.transposed!r}.")
        # forward_weights_init [glorot_uniform], bias_init [0.0]: engine/model/initializers.py
        shape = (self.n_out, in_dim) if self.transposed else (in_dim, self.n_out)
        self.params["W"] = option_variable(name, opts, "forward_weights_init", f"{name}/W", shape,
                                           random_seed)
        if opts.get("with_bias", True):
            self.params["b"] = option_variable(name, opts, "bias_init", f"{name}/b", (self.n_out,),
                                               random_seed)

    def __call__(self, x: tf.Tensor, lengths: tf.Tensor, training: bool) -> tf.Tensor:
        weights = self.param("W")
        if self.sparse_input:
            y = dense_gather(tf.transpose(weights) if self.transposed else tf.convert_to_tensor(weights), x)
            if "b" in self.params:
                y = tf.nn.bias_add(y, self.param("b"))
        else:
            # One (T*B*..., in) x (in, out) matmul: a broadcast batched matmul would run T small ones. Its
            # bias added before the reshape: oneDNN fuses the two (and BiasAddGrad is 4x a Sum's speed).
            y = tf.matmul(tf.reshape(x, [-1, self.in_dim]), weights, transpose_b=self.transposed)
            if "b" in self.params:
                y = tf.nn.bias_add(y, self.param("b"))
            y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [self.n_out]], axis=0))
        return y if self.activation is None else self.activation(y)


class Softmax(Linear):
    """``softmax``: a linear layer whose call returns the logits; the network adds the probabilities.

    With ``loss: "ce"`` it is trained with cross-entropy against ``target`` (default ``classes``), with
    ``loss_scale`` and ``loss_opts`` as in ``losses.CrossEntropy``; with ``loss: "ctc"`` by CTC
    (``losses.CtcLoss``), and then it has one class more than the target: the blank, the last.
    ``only_on_eval``: the loss is scored in eval only, not trained on.
    """

    takes_spatial = False  # its losses and outputs are per frame

    def __init__(
        self,
        name: str,
        opts: dict,
        in_dim: int,
        *,
        sparse_input: bool,
        random_seed: int,
        target_dims: dict[str, int],
    ) -> None:
        self.target = opts.get("target", "classes")
        self.loss = opts.get("loss")
        check_loss_name(f"Network layer '{name}'", "softmax", self.loss)
        self.only_on_eval = opts.get("only_on_eval", False)
        if not isinstance(self.only_on_eval, bool) or (self.only_on_eval and not self.loss):
            raise ConfigError(f"Network layer '{name}': only_on_eval must be True or False, and True needs a "
                              f"loss; got {self.only_on_eval!r}.")
        if not self.loss and opts.get("loss_opts"):
            raise ConfigError(f"Network layer '{name}': loss_opts are given, but the layer has no loss.")
        target_dim = target_dims.get(self.target) if isinstance(self.target, str) else None
        # the blank: one class more than the target (RETURNN's CtcLoss.get_auto_output_layer_dim)
        out_dim = target_dim + 1 if self.loss == "ctc" and target_dim is not None else target_dim
        n_out = opts.get("n_out", out_dim)
        if n_out is None:
            raise ConfigError(
                f"Network layer '{name}': 'n_out' is not given and target {self.target!r} is not a known "
                f"data stream (known: {sorted(target_dims)}); set 'n_out' or 'target'."
            )
        if self.loss and target_dim is None:
            raise ConfigError(
                f"Network layer '{name}': loss target {self.target!r} is not a data stream; "
                f"known targets: {sorted(target_dims)}."
            )
        if self.loss and n_out != out_dim:
            blank = " plus 1 for the ctc loss's blank" if self.loss == "ctc" else ""
            raise ConfigError(
                f"Network layer '{name}': n_out {n_out} does not match the dim {target_dim} of "
                f"its target {self.target!r}{blank}."
            )
        self.criterion: CrossEntropy | CtcLoss = (
            CtcLoss.from_layer_options(name, opts) if self.loss == "ctc"
            else CrossEntropy.from_layer_options(name, opts, n_out))
        super().__init__(
            name,
            {**opts, "n_out": n_out, "activation": None},
            in_dim,
            sparse_input=sparse_input,
            random_seed=random_seed,
        )
