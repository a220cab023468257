"""Names RETURNN defines that change nothing in this engine, by design, and why (``key_check.py`` gives
each one info line instead of an error).

A name is listed only where it makes no difference to what is trained: hardware and process layout of
RETURNN's Theano era, RETURNN-only logging, options for components this engine does not have. Some are
harmless only at one value (``truncation = -1`` is full backpropagation through time, which is what runs
here; ``truncation = 50`` would train differently and is refused); ``when`` says which values, given the
value and its context (the config's values for a key, the layer dict for a layer option, the dataset
dict for a dataset option).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from engine.config.loader import parse_bool


@dataclass(frozen=True)
class NoEffect:
    why: str
    when: Callable[[Any, dict], bool] = lambda value, context: True
    only: str = ""  # the values ``when`` accepts, for messages ("-1"); empty: any value


def _is(expected: Any) -> Callable[[Any, dict], bool]:
    """The value is ``expected``: a bool as RETURNN's ``config.bool`` reads it, a number as itself, a str
    (a ``++key value`` override of a key the files do not set) as it would parse."""
    def check(value: Any, context: dict) -> bool:
        if isinstance(expected, bool):
            value = parse_bool(value) if isinstance(value, str) else value
            return value in (0, 1) and not isinstance(value, float) and bool(value) == expected
        if isinstance(value, str):
            return value.strip() == str(expected)
        return not isinstance(value, bool) and value == expected
    return check


CONFIG_KEYS: dict[str, NoEffect] = {
    "use_tensorflow": NoEffect("selects RETURNN's TensorFlow backend over Theano; this engine is TensorFlow",
                               _is(True), "True"),
    "backend": NoEffect("selects RETURNN's backend; this engine is TensorFlow",
                        lambda value, context: value == "tensorflow", '"tensorflow"'),
    "multiprocessing": NoEffect("Theano era: ran the device in a subprocess; a process layout, not a "
                                "computation"),
    "update_on_device": NoEffect("Theano era: applied the updates on the GPU (RETURNN stopped reading it in "
                                 "2015); TensorFlow places the update itself"),
    "truncation": NoEffect("Theano-era truncated backpropagation; -1 is the full gradient through time, "
                           "which is what is computed here", _is(-1), "-1"),
    "window": NoEffect("a sliding window of neighbouring input frames; 1 is each frame alone, as here",
                       _is(1), "1"),
    "tf_log_memory_usage": NoEffect("RETURNN logs GPU memory after building the graph; not logged here"),
    "log_batch_size": NoEffect("RETURNN logs each batch's size at verbosity 5; not logged here"),
    "sprint_trainer_exec_path": NoEffect("the RASR (Sprint) trainer binary for Sprint datasets; there are "
                                         "none here (such a dataset is refused by itself)"),
    "sprint_interface_dataset_opts": NoEffect("options for RASR (Sprint) calling RETURNN through its Python "
                                              "interface; rnn.py is never called that way"),
    "loss": NoEffect("RETURNN's default loss for a network built from hidden_size/hidden_type; with a "
                     "'network' dict each layer's own 'loss' decides",
                     lambda value, context: context.get("network") is not None, "with a 'network'"),
    "description": NoEffect("a free-text description of the experiment"),
    # set in hundreds of published configs: a network built as written must not stop at them
    "debug_print_layer_output_template": NoEffect("RETURNN prints each layer's output template (its dims) "
                                                  "while it builds the network; a log, not a computation"),
    "dropout": NoEffect("RETURNN's default dropout of a network built from hidden_size/hidden_type (a "
                        "Theano-era description RETURNN removed in 2022); with a 'network' dict each layer's "
                        "own 'dropout' decides, and configs use the name for their own constant",
                        lambda value, context: context.get("network") is not None, "with a 'network'"),
    "store_metadata_mod_step": NoEffect("RETURNN stores TensorFlow's run metadata (a profile) every N "
                                        "steps; a profile, not a computation"),
    "debug_grad_summaries": NoEffect("RETURNN writes TensorBoard summaries of the gradients; a log, not a "
                                     "computation"),
    "start_batch": NoEffect("RETURNN's first batch of the epoch training resumes at; 'auto', its only "
                            "value, starts each epoch at its first batch after the newest checkpoint, as "
                            "start_epoch 'auto' does here", _is("auto"), '"auto"'),
    "context_window": NoEffect("RETURNN's default context window of the datasets' frames; 1 is each frame "
                               "alone, as here", _is(1), "1"),
    "patch_atfork": NoEffect("RETURNN patches the C library's fork handlers of its own process; a process "
                             "detail, not a computation"),
    "decouple_constraints_factor": NoEffect(
        "RETURNN's TensorFlow updater still computes a factor from it, but since 2022-11 no update uses "
        "it: the decoupled decay is 2 * L2 * w per step at any value, as here (decouple_constraints)"),
}

LAYER_OPTIONS: dict[str, NoEffect] = {
    "unroll": NoEffect("RETURNN unrolls the loop statically, an implementation detail: the same LSTM "
                       "computation"),
    "max_seq_len": NoEffect("with 'unroll', RETURNN's static loop length: the same computation (RETURNN "
                            "also stops on a longer sequence, this engine trains it)",
                            lambda value, context: bool(context.get("unroll")), "with 'unroll'"),
    "param_device": NoEffect("where RETURNN places the layer's parameters; a placement, not a computation"),
    "optimize_move_layers_out": NoEffect("RETURNN's graph optimisation of rec subnetworks; a rec layer with "
                                         "a unit name has nothing to move (a subnetwork honours it)"),
    "auto_use_channel_first": NoEffect(
        "RETURNN puts a conv layer's channels first only when a GPU is in its session: a memory layout of "
        "the output; layers here address axes by their role, so the values are the same",
        lambda value, context: context.get("class") == "conv", "on a conv layer"),
    "use_channel_first": NoEffect(
        "RETURNN puts a pool layer's channels first only when a GPU is in its session: a memory layout of "
        "the output; layers here address axes by their role, so the values are the same",
        lambda value, context: context.get("class") == "pool", "on a pool layer"),
    "batch_norm": NoEffect("RETURNN's default: no batch norm of the layer's output (a batch norm is a "
                           "'batch_norm' layer here)", _is(False), "False"),
}

DATASET_OPTIONS: dict[str, NoEffect] = {
    "use_cache_manager": NoEffect("copies the files to a node-local cache first (RWTH's cluster tool); the "
                                  "same data is read from where the files are"),
    "estimated_num_seqs": NoEffect("a hint for progress output before an epoch's size is known"),
    "window": NoEffect("a sliding window of neighbouring input frames; 1 is each frame alone, as here",
                       _is(1), "1"),
}
