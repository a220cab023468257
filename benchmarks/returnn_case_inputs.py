"""The fixed inputs of ``returnn_checkpoints.py``'s cases, which both programs compute alike: the data, the
streams of class ids, the probe weights of the compared gradient and the random parameter values."""
from __future__ import annotations

import zlib

import numpy as np

from returnn_cases import LENGTHS

PROBE_FRAMES = 64  # at least the frames of any case's output


def inputs(case: dict) -> tuple[np.ndarray, np.ndarray]:
    """The case's fixed input batch (B, T[, F]) and lengths (B,); padding is 0."""
    rng = np.random.RandomState(1)
    stream = case["extern_data"]["data"]
    shape = (len(LENGTHS), max(LENGTHS))
    if stream.get("sparse"):
        data = rng.randint(0, stream["dim"], shape).astype(np.int32)
    else:
        data = rng.standard_normal(shape + (stream["dim"],)).astype(np.float32)
    for b, n in enumerate(LENGTHS):
        data[b, n:] = 0
    return data, np.array(LENGTHS, np.int32)


def stream_ids(case: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The case's streams of class ids besides ``data``: ids (B, T) with padding 0, and lengths; on the
    data's frames (a hybrid's alignment), or one frame per sequence for the case's ``one_frame_streams`` (a
    speaker label). Layers read them as ``data:<stream>``."""
    found = {}
    for index, (key, stream) in enumerate(sorted(case["extern_data"].items())):
        if key == "data" or not stream.get("sparse"):
            continue
        one = key in case.get("one_frame_streams", ())
        lengths = np.array([1] * len(LENGTHS) if one else LENGTHS, np.int32)
        rng = np.random.RandomState(2 if key == "classes" else 3 + index)
        ids = rng.randint(0, stream["dim"], (len(LENGTHS), int(lengths.max()))).astype(np.int32)
        for b, n in enumerate(lengths):
            ids[b, n:] = 0
        found[key] = (ids, lengths)
    return found


def case_seed(name: str) -> int:
    """The seed of a case's random parameter values: the same whichever cases run."""
    return zlib.crc32(name.encode()) % 2**31


def probe(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The weights of the scalar whose gradients a case compares: the sum over the valid frames of
    ``output`` (batch-major) times these. A frame's weights do not depend on how many frames the output
    has: RETURNN's may keep padding frames the engine cuts (``reinterpret_data``)."""
    batch, frames, dim = shape
    drawn = np.random.RandomState(case_seed(name) + 1).standard_normal((batch, PROBE_FRAMES, dim))
    return drawn[:, :frames].astype(np.float32)


def random_values(shapes: dict, seed: int) -> dict[str, np.ndarray]:
    """Values for every parameter, biases included (RETURNN and the engine start those at 0)."""
    rng = np.random.RandomState(seed)
    values = {name: (0.5 * rng.standard_normal(shape)).astype(np.float32)
              for name, shape in sorted(shapes.items())}
    # batch_norm divides by the square root of its running variance (RETURNN's "...variance", the engine's
    # "variance"): a positive one, drawn like the rest so that no other value changes
    return {name: np.abs(value) + np.float32(0.5) if name.endswith("variance") else value
            for name, value in values.items()}
