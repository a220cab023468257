"""One log line saying where the model computes and what each layer runs, so that a GPU run shows that
every LSTM runs its GPU kernel (no silent CPU fallback) and a CPU run shows which kernel stands in.

The line names the device (the GPU this rank was given, or the CPU), the compute dtype (``tf_amp``), and
per layer its class, for a ``rec`` layer the LSTM kernel and its op (``layers/lstm_choice.py``). On a GPU
each LSTM's op is also checked against TensorFlow's kernel registry (``check_kernel_on``): an op without
a GPU kernel would be placed on the CPU without a word, so it is refused before training starts.
The other layers are plain TensorFlow ops (matmul, conv, softmax, ...) with GPU kernels in every CUDA
build.
"""
from __future__ import annotations

from engine.model.base import SeqModel
from engine.model.layers.lstm_choice import check_kernel_on, on_gpu
from engine.model.layers.lstm_norm import NormLstmRec
from engine.model.layers.recurrent import Rec


def layer_kernels(model: SeqModel) -> dict[str, str]:
    """Layer name -> what it runs (``rec native (BlockLSTM)``, ``softmax``, ...); {} for get_model's model."""
    specs = getattr(model, "specs", None)
    if specs is None:
        return {}
    out = {}
    for name, layer in model.layers.items():
        if isinstance(layer, Rec):
            out[name] = f"rec {layer.kernel.name} ({layer.kernel.op})"
        elif isinstance(layer, NormLstmRec):
            out[name] = f"rec {layer.runs}"
        else:
            out[name] = specs[name].cls
    return out


def placement_line(model: SeqModel) -> str:
    """The line (see the module docstring); on a GPU, refuses an LSTM op without a GPU kernel first."""
    gpu = on_gpu()
    device = "GPU" if gpu else "CPU"
    for name, layer in getattr(model, "layers", {}).items():
        if isinstance(layer, Rec):
            check_kernel_on(layer.kernel, device, name)
    dtype = getattr(model, "compute_dtype", "float32")
    kernels = layer_kernels(model)
    parts = ", ".join(f"{name}: {what}" for name, what in kernels.items()) or "get_model's own layers"
    return f"model on the {device}, computing in {dtype}: {parts}"
