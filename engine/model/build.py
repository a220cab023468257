"""``build_model``: the model a config describes (see ``engine/model/__init__.py``)."""
from __future__ import annotations

from typing import Any

from engine.config import keys
from engine.config.key_check import ignored_names
from engine.config.loader import Config
from engine.model.base import SeqModel
from engine.model.custom import CustomModel
from engine.model.network import NetworkModel
from engine.model.placement import placement_line
from engine.model.precision import compute_dtype
from engine.runtime import log
from engine.runtime.errors import ConfigError

DEFAULT_RANDOM_SEED = keys.default("random_seed")


def _logged(model: SeqModel) -> SeqModel:
    """The model, after one line says where it computes and which kernel each layer runs."""
    log.info(placement_line(model))
    return model


def with_default_target(network: Any, target: str) -> Any:
    """The network with ``target`` set on each loss layer that names none, as RETURNN fills in its
    ``target`` config key (``ExternData.default_target``) before it builds a layer."""
    if not isinstance(network, dict) or target == "classes":
        return network
    return {name: {**layer, "target": target}
            if isinstance(layer, dict) and layer.get("loss") and "target" not in layer else layer
            for name, layer in network.items()}


def build_model(
    config_or_network: Any,
    *,
    input_dim: int,
    input_sparse: bool,
    target_dims: dict[str, int],
    random_seed: int | None = None,
    epoch: int = 1,
) -> SeqModel:
    """Build the model a config describes, or a network dict given directly.

    From a config, in this order: ``network`` (a dict), ``get_model`` (see ``engine/model/custom.py``
    for its calling convention), ``get_network(epoch=epoch, **kwargs)`` returning a network dict.
    ``random_seed`` defaults to the config's ``random_seed`` (42 when unset). The network's ``eval`` layers
    read the config (``get_config()``); a network dict given directly comes with an empty one.
    """
    if not isinstance(config_or_network, Config):
        seed = DEFAULT_RANDOM_SEED if random_seed is None else random_seed
        return NetworkModel(
            config_or_network,
            input_dim=input_dim,
            input_sparse=input_sparse,
            target_dims=target_dims,
            random_seed=seed,
        )
    config = config_or_network
    seed = config.int("random_seed") if random_seed is None else random_seed
    dims = dict(input_dim=input_dim, input_sparse=input_sparse, target_dims=target_dims, random_seed=seed)
    ignored = ignored_names(config)
    network = config.value("network")
    if callable(network):
        raise ConfigError(
            "Config key 'network' must be a layer dict; a function goes in 'get_model' (returning a "
            "Keras model or tf.Module) or 'get_network' (returning a layer dict)."
        )
    # maximize_grad_norm differentiates the gradient: the network then uses twice-differentiable ops
    twice = (config.float("maximize_grad_norm") or 0.0) > 0.0
    lstm = config.str("lstm_implementation")
    dtype = compute_dtype(config.value("tf_amp"))
    default_target = config.str("target")
    if network is not None:
        network = with_default_target(network, default_target)
        return _logged(NetworkModel(network, ignored=ignored, twice_differentiable=twice,
                                    lstm_implementation=lstm, compute_dtype=dtype, config=config, **dims))
    get_model = config.value("get_model")
    if callable(get_model):
        if default_target != "classes":
            raise ConfigError(f"Config key 'target' is {default_target!r}, but the model comes from "
                              "get_model, which trains against 'classes'; 'target' applies to the loss "
                              "layers of a 'network' dict. Remove 'target' or name the stream 'classes'.")
        if dtype != "float32":
            raise ConfigError(f"Config key 'tf_amp' is {config.value('tf_amp')!r}, but the model comes from "
                              "get_model, whose layers choose their own dtypes (a Keras mixed-precision "
                              "policy, for instance); tf_amp applies to the 'network' dict. Remove tf_amp.")
        return _logged(CustomModel(get_model, epoch=epoch, loss=config.value("model_loss") or "ce",
                                   loss_opts=config.value("model_loss_opts"), **dims))
    get_network = config.value("get_network")
    if callable(get_network):
        network = get_network(epoch=epoch)
        if not isinstance(network, dict):
            raise ConfigError(
                f"get_network(epoch={epoch}) must return a network dict, got {type(network).__name__}."
            )
        return _logged(NetworkModel(with_default_target(network, default_target), ignored=ignored,
                                    twice_differentiable=twice, lstm_implementation=lstm, compute_dtype=dtype,
                                    config=config, **dims))
    raise ConfigError(
        "The config defines no model: set 'network' to a layer dict, or define a config function "
        "'get_model' (returning a Keras model or tf.Module) or 'get_network' (returning a dict)."
    )
