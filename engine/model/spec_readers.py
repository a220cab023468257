"""Which layers may read values that are not frames: values per sequence (``layers/per_sequence.py``,
a ``reduce`` over time without ``keep_dims``), checked without TensorFlow for ``rnn.py --check`` and the
build alike (``spec.parse_network`` calls ``check_per_sequence_readers``).
"""
from __future__ import annotations

from typing import Any

from engine.model.axes import reduces_time_to_vector
from engine.runtime.errors import ConfigError

# the specs are spec.LayerSpec (cls, sources, opts, unit_bases); spec.py imports this module


def check_per_sequence_readers(specs: dict[str, Any]) -> None:
    """Values per sequence, not per frame (``layers/per_sequence.py``): one vector per sequence (a reduce
    over time without keep_dims: RETURNN's (B, F)) and a ``compare`` flag are read by rec units only, as
    ``base:`` (``rec/loop_run.py``); a ``length`` by a ``compare`` only. The layers here otherwise read
    frames."""
    kinds = {name: kind for name, spec in specs.items() if (kind := per_sequence_kind(spec))}
    readers = {"vector": "a rec unit (as 'base:...') reads such a layer (with keep_dims it is one frame, "
                         "which more layers read)",
               "flag": "a rec unit (as 'base:...', a switch's condition) reads such a layer",
               "length": "a compare layer reads such a layer"}
    what = {"vector": "one vector per sequence (a reduce over time without keep_dims)",
            "flag": "a flag per sequence (a compare of a length)", "length": "a length per sequence"}
    for name, spec in specs.items():
        if spec.cls == "compare" and (len(spec.sources) != 1 or kinds.get(spec.sources[0]) != "length"):
            raise ConfigError(f"Network layer '{name}': compare at the top level is implemented on one "
                              f"length layer's output (a number per sequence), got {list(spec.sources)}.")
        read = [src for src in spec.sources if src in kinds and not (spec.cls == "compare"
                                                                     and kinds[src] == "length")]
        read += [base for base in spec.unit_bases if kinds.get(base) == "length"]
        if read:
            raise ConfigError(f"Network layer '{name}' reads '{read[0]}', {what[kinds[read[0]]]}; here only "
                              f"{readers[kinds[read[0]]]}.")
    if "output" in kinds:
        raise ConfigError(f"Network layer 'output' is {what[kinds['output']]}: the output needs the frames.")


def per_sequence_kind(spec: Any) -> str | None:
    if spec.cls == "reduce" and reduces_time_to_vector(spec.opts):
        return "vector"
    return {"length": "length", "compare": "flag"}.get(spec.cls)
