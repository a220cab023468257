"""Which layers may read values that are not frames: values per sequence (``layers/per_sequence.py``,
``layers/time_attention.py``), checked without TensorFlow for ``rnn.py --check`` and the build alike
(``spec.parse_network`` calls ``check_per_sequence_readers``).

RETURNN's such values have no time axis; here each is one frame per sequence. That is the same number only
where a layer computes frame by frame: so a vector per sequence is read by rec units (as ``base:``) and by
frame-wise layers (``VECTOR_READERS``: a speaker classifier on a pooled vector), which give vectors again;
a label per sequence (a ``squeeze`` of a one-frame stream) only as a loss target
(``register_as_extern_data``), of a loss on such vectors. A length is read by ``compare``, whose flag
only rec units read.
"""
from __future__ import annotations

from typing import Any

from engine.model.axes import reduces_time_to_vector
from engine.runtime.errors import ConfigError

# the specs are spec.LayerSpec (cls, sources, opts, after, unit_bases); spec.py imports this module

# classes that compute frame by frame, so that on vectors they compute RETURNN's (B, F) values
VECTOR_READERS = ("linear", "softmax", "copy", "activation", "merge_dims", "dropout")
_WHAT = {"vector": "one vector per sequence (RETURNN's value without a time axis)",
         "flag": "a flag per sequence (a compare of a length)", "length": "a length per sequence",
         "label": "a label per sequence (a squeeze of the time axis)"}
_READERS = {"vector": f"rec units (as 'base:...') and the classes {', '.join(VECTOR_READERS)} read such a "
                      "layer, each on such values alone",
            "flag": "a rec unit (as 'base:...', a switch's condition) reads such a layer",
            "length": "a compare layer reads such a layer",
            "label": "losses read such a layer as their target (register_as_extern_data)"}


def sequence_kinds(specs: dict[str, Any]) -> dict[str, str]:
    """Layer -> the kind of its value per sequence (``_WHAT``); layers of frames are not listed. A frame-wise
    layer on vectors alone gives vectors: passes until nothing changes (chains of such layers are short)."""
    own = {"length": "length", "compare": "flag", "generic_attention": "vector", "squeeze": "label"}
    kinds = {name: own.get(spec.cls, "vector" if spec.cls == "reduce" and reduces_time_to_vector(spec.opts)
                           else "") for name, spec in specs.items()}
    changed = True
    while changed:
        changed = False
        for name, spec in specs.items():
            if not kinds[name] and spec.cls in VECTOR_READERS and spec.sources \
                    and all(kinds.get(src) == "vector" for src in spec.sources):
                kinds[name], changed = "vector", True
    return {name: kind for name, kind in kinds.items() if kind}


def check_per_sequence_readers(specs: dict[str, Any], registered: dict[str, str]) -> None:
    """Each value per sequence is read as ``_READERS`` says; a loss on vectors has a label per sequence as
    its target, and a loss on frames none. ``registered``: stream -> the layer that computes it."""
    kinds = sequence_kinds(specs)
    for name, spec in specs.items():
        if spec.cls == "compare" and (len(spec.sources) != 1 or kinds.get(spec.sources[0]) != "length"):
            raise ConfigError(f"Network layer '{name}': compare at the top level is implemented on one "
                              f"length layer's output (a number per sequence), got {list(spec.sources)}.")
        read = [src for src in spec.sources if src in kinds and not _reads(spec, kinds, kinds[src])]
        read += [base for base in spec.unit_bases if kinds.get(base) in ("length", "label")]
        if read:
            raise ConfigError(f"Network layer '{name}' reads '{read[0]}', {_WHAT[kinds[read[0]]]}; here only "
                              f"{_READERS[kinds[read[0]]]}.")
        _check_loss_target(name, spec, kinds, registered)
    if "output" in kinds:
        raise ConfigError(f"Network layer 'output' is {_WHAT[kinds['output']]}: the output needs the frames.")


def _reads(spec: Any, kinds: dict[str, str], kind: str) -> bool:
    if kind == "vector":
        return spec.cls in VECTOR_READERS and all(kinds.get(src) == "vector" for src in spec.sources)
    return spec.cls == "compare" and kind == "length"


def _check_loss_target(name: str, spec: Any, kinds: dict[str, str], registered: dict[str, str]) -> None:
    target = spec.opts.get("target")
    if not spec.opts.get("loss") or not isinstance(target, str):
        return
    per_sequence = kinds.get(registered.get(target, ""), "") == "label"
    if (kinds.get(name) == "vector") != per_sequence:
        output = "one vector per sequence" if kinds.get(name) == "vector" else "frames"
        given = "a label per sequence" if per_sequence else "labels per frame"
        raise ConfigError(f"Network layer '{name}': its loss compares {output} with target {target!r}, "
                          f"{given}; a loss here reads a label per sequence on vectors per sequence (a "
                          "registered squeeze of a one-frame stream), labels per frame on frames.")
