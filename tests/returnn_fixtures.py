"""What the tests of RETURNN's checkpoints share: the fixtures RETURNN wrote (tests/fixtures/returnn_ckpt,
made by benchmarks/returnn_checkpoints.py) and the models, values and outputs the tests compare."""
from __future__ import annotations

import json
import sys

import numpy as np
import tensorflow as tf

from engine.model import build_model
from engine.training.checkpoints.returnn_files import write_checkpoint
from helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "returnn_ckpt"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]
sys.path.insert(0, str(ROOT / "benchmarks"))
# the script that makes the fixtures judges by these
from returnn_checkpoints import (GRADIENTS_NOT_COMPARED, TOLERANCE, compared_parts,  # noqa: E402,F401
                                 engine_gradients, engine_outputs, gradient_differences, layer_lengths)


def model_of(case: dict | str, network: dict | None = None, seed: int = 42):
    case = CASES[case] if isinstance(case, str) else case
    streams = case["extern_data"]
    return build_model(network or case["network"], input_dim=streams["data"]["dim"],
                       input_sparse=bool(streams["data"].get("sparse")),
                       target_dims={k: v["dim"] for k, v in streams.items() if k != "data"}, random_seed=seed)


def fixture(name: str) -> str:
    return str(FIXTURES / name)


def stored(prefix: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def outputs(model, name: str) -> dict[str, np.ndarray]:
    """Every layer's output and ``<layer>:lengths`` on the fixture's inputs."""
    expected = np.load(FIXTURES / f"{name}.npz")
    return engine_outputs(model, expected["data"], expected["lengths"], stream_ids(expected))


def stream_ids(expected) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The streams of class ids RETURNN's side fed (name -> (ids, lengths))."""
    return {key[len("ids:"):]: (expected[key], expected[f"ids_lengths:{key[len('ids:'):]}"])
            for key in expected.files if key.startswith("ids:")}


def assert_outputs_equal_returnns(model, name: str) -> None:
    expected = np.load(FIXTURES / f"{name}.npz")
    got = outputs(model, name)
    for layer in model.layers:  # padded frames differ by design
        lengths = layer_lengths(got, layer, expected["lengths"])
        for b, (have, want) in enumerate(zip(compared_parts(CASES[name], layer, got[layer], lengths),
                                             compared_parts(CASES[name], layer, expected[f"out:{layer}"],
                                                            lengths, returnns=True))):
            np.testing.assert_allclose(have, want, rtol=0, atol=TOLERANCE,
                                       err_msg=f"{name}: layer {layer}, sequence {b}")


def values(model) -> dict[str, np.ndarray]:
    return {name: var.numpy() for name, var in model.named_variables().items()}


def randomise(model, seed: int) -> None:
    rng = np.random.RandomState(seed)
    for var in model.named_variables().values():
        var.assign(rng.standard_normal(var.shape).astype(np.float32))


def write_variant(tmp_path, name: str, drop=(), add=None) -> str:
    variables = {k: v for k, v in stored(fixture(name)).items() if k not in drop and k != "global_step"}
    variables.update(add or {})
    prefix = str(tmp_path / f"variant-{name}")
    write_checkpoint(prefix, variables)
    return prefix
