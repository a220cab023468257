"""Which optimizer a config asks for: the ``optimizer`` dict, or RETURNN's older flags.

RETURNN's flags (for configs without ``optimizer``):
- ``adam = True``: adam;  ``nadam = True``: nadam (both refuse a ``momentum``). nadam is the rule of
  RETURNN's own NadamOptimizer (its ``optimizer = {"class": "nadam"}``; one update equals RETURNN's:
  tests/test_returnn_parity.py), which RETURNN on TensorFlow 1 also ran for the flag (TF 1's
  ``tf.contrib.opt.NadamOptimizer``). RETURNN on TensorFlow 2 gives the flag Keras' Nadam instead, whose
  momentum schedule differs, and on TensorFlow 2.15 (Keras' new optimizers) cannot run it at all: its
  Keras wrapper stops with "'Nadam' object has no attribute '_name'". A line at start says which rule runs;
- ``rmsprop = <float>``: rmsprop with that decay;  ``rmsprop = True``: rmsprop (decay 0.9); both take
  ``momentum`` as rmsprop's momentum;
- ``momentum = <m>`` (not 0): momentum SGD;  none of them: plain gradient descent (RETURNN's default).
``optimizer_epsilon`` [1e-16] is the epsilon of every optimizer that has one (adam, nadam, rmsprop),
also of an ``optimizer`` dict that gives none, as in RETURNN.

Where RETURNN would silently use one setting and drop another (an ``optimizer`` dict beside a flag,
two optimizer flags at once) or stop with an assertion (``adam`` with ``momentum``), this is a
ConfigError that says what to write instead.
"""
from __future__ import annotations

from typing import Any

from engine.runtime import log
from engine.runtime.errors import ConfigError
from engine.training.update.optimizers import Optimizer, optimizer_from_config


def _set_flags(config) -> dict[str, Any]:
    """The flags that select something: ``adam``/``nadam`` true, ``rmsprop`` a float (its decay) or true,
    ``momentum`` not 0."""
    found: dict[str, Any] = {key: True for key in ("adam", "nadam") if config.bool(key)}
    rmsprop = config.typed("rmsprop")
    if isinstance(rmsprop, float):
        found["rmsprop"] = rmsprop
    elif rmsprop is not None and config.bool("rmsprop"):
        found["rmsprop"] = True
    momentum = config.float("momentum") or 0.0
    if momentum:
        found["momentum"] = momentum
    return found


def optimizer_for_config(config) -> Optimizer:
    epsilon = config.float("optimizer_epsilon")
    flags = _set_flags(config)
    value = config.typed("optimizer")
    if value is not None:
        if flags:
            raise ConfigError(f"Config keys {sorted(flags)} and 'optimizer' are both set; give the optimizer "
                              "in one place, e.g. optimizer = {'class': 'rmsprop', 'momentum': 0.9} "
                              "(RETURNN would drop the flags, or take 'momentum' only for optimizers that "
                              "have one).")
        return optimizer_from_config(value, epsilon=epsilon)
    chosen = [key for key in ("adam", "nadam", "rmsprop") if key in flags]
    if len(chosen) > 1:
        raise ConfigError(f"Config keys {chosen} each select an optimizer; set only one (RETURNN would take "
                          f"'{chosen[0]}' and drop the others).")
    momentum = flags.get("momentum", 0.0)
    if chosen and chosen[0] in ("adam", "nadam") and momentum:
        raise ConfigError(f"Config key '{chosen[0]}' does not take 'momentum' (= {momentum}); "
                          "remove one of them.")
    if chosen and chosen[0] == "rmsprop":
        rmsprop = flags["rmsprop"]
        options = {"class": "rmsprop", "momentum": momentum}
        if not isinstance(rmsprop, bool):
            options["decay"] = rmsprop
        return optimizer_from_config(options, epsilon=epsilon)
    if chosen == ["nadam"]:
        log.info("nadam = True: RETURNN's NadamOptimizer (what RETURNN's optimizer = {'class': 'nadam'} "
                 "runs, and the flag ran on TensorFlow 1); RETURNN on TensorFlow 2 maps the flag to Keras' "
                 "Nadam instead, whose momentum schedule differs (and which it cannot run on TensorFlow "
                 "2.15)")
    if chosen:
        return optimizer_from_config(chosen[0], epsilon=epsilon)
    if momentum:
        return optimizer_from_config({"class": "momentum", "momentum": momentum}, epsilon=epsilon)
    return optimizer_from_config(None, epsilon=epsilon)
