"""Which LSTM kernel a ``rec`` layer runs (config key ``lstm_implementation``), and the check that it has a
kernel on the device it is meant for (no silent CPU fallback).

- ``auto`` (default): on a GPU cuDNN (``lstm_cudnn.cudnn_lstm``), on a CPU our own kernel
  (``lstm.fused_lstm``: BlockLSTM forward; backward our own from ``n_out`` 65 on, else BlockLSTMGrad).
- ``cudnn``: cuDNN on a GPU; on a CPU its twin (``lstm_cudnn.cudnn_twin``, the same math in plain ops), which
  is how the GPU path is tested on machines without one.
- ``native``: ``lstm.fused_lstm`` everywhere (on a GPU TensorFlow's BlockLSTM and BlockLSTMGrad).
With ``maximize_grad_norm`` the gradient is differentiated again: every choice then runs
``lstm.scan_lstm`` except ``cudnn``, which is refused (cuDNN's backward op has no gradient).
On ROCm builds ``auto`` takes ``native``: MIOpen orders the gates otherwise, and no test covers it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tensorflow as tf

from engine.model.layers.lstm import fused_lstm, scan_lstm
from engine.model.layers.lstm_cudnn import cudnn_lstm, cudnn_twin
from engine.runtime.errors import ConfigError

CHOICES = ("auto", "cudnn", "native")


@dataclass(frozen=True)
class LstmKernel:
    """A kernel (x, lengths, W, b, n_out) -> h and how the log names it: ``name`` (``cudnn``,
    ``cudnn-twin``, ``native``, ``native-scan``) and the op that runs the recurrence; ``gpu_ops``: the ops
    it runs on a GPU that need a GPU kernel of their own (plain ops have one in every CUDA build)."""

    name: str
    op: str
    run: Callable
    gpu_ops: tuple[str, ...] = ()


CUDNN = LstmKernel("cudnn", "CudnnRNNV3", cudnn_lstm, ("CudnnRNNV3", "CudnnRNNBackpropV3"))
CUDNN_TWIN = LstmKernel("cudnn-twin", "plain ops (tf.scan)", cudnn_twin)
NATIVE = LstmKernel("native", "BlockLSTM", fused_lstm, ("BlockLSTM", "BlockLSTMGrad"))
NATIVE_SCAN = LstmKernel("native-scan", "plain ops (tf.scan)", scan_lstm)


def on_gpu() -> bool:
    """Whether this process computes on a GPU (after ``runtime.device.select_device``)."""
    return bool(tf.config.list_logical_devices("GPU"))


def _rocm() -> bool:
    return bool(tf.sysconfig.get_build_info().get("is_rocm_build"))


def choose_lstm(setting: str | None, *, gpu: bool, twice_differentiable: bool = False) -> LstmKernel:
    """The kernel for ``lstm_implementation`` = ``setting`` (None: auto) on a GPU or not."""
    setting = "auto" if setting is None else str(setting).lower()
    if setting not in CHOICES:
        raise ConfigError(f"Config key 'lstm_implementation' is {setting!r}; expected one of "
                          f"{', '.join(map(repr, CHOICES))} (auto: cuDNN on a GPU, the engine's own "
                          "kernel on a CPU).")
    if setting == "cudnn" and twice_differentiable:
        raise ConfigError("Config key 'lstm_implementation' is 'cudnn', but maximize_grad_norm "
                          "differentiates the gradient, and cuDNN's LSTM gradient has no gradient of its "
                          "own. Set lstm_implementation = 'auto' (then a twice-differentiable LSTM runs) or "
                          "maximize_grad_norm = 0.")
    if twice_differentiable:
        return NATIVE_SCAN
    if setting == "cudnn" and gpu and _rocm():
        raise ConfigError("Config key 'lstm_implementation' is 'cudnn', but this TensorFlow is a ROCm build, "
                          "whose MIOpen orders the LSTM gates otherwise (untested here). Use 'auto' or "
                          "'native'.")
    if setting == "cudnn" or (setting == "auto" and gpu and not _rocm()):
        return CUDNN if gpu else CUDNN_TWIN
    return NATIVE


def kernel_devices(op: str) -> set[str]:
    """The device types TensorFlow has a kernel of ``op`` for (``GPU``, ``CPU``)."""
    from tensorflow.python.framework import kernels  # the registry of the loaded TensorFlow

    return {k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel}


def check_kernel_on(kernel: LstmKernel, device: str, layer: str) -> None:
    """Refuse a kernel whose ops TensorFlow would quietly move to the CPU: on a ``GPU`` each of its
    ``gpu_ops`` must have a GPU kernel."""
    missing = [op for op in kernel.gpu_ops if "GPU" not in kernel_devices(op)] if device == "GPU" else []
    if missing:
        raise ConfigError(f"Network layer '{layer}': its LSTM ({kernel.name}) runs TensorFlow's "
                          f"{' and '.join(missing)}, which this TensorFlow has no GPU kernel for, so it "
                          "would silently run on the CPU. Set lstm_implementation = 'native', or install a "
                          "TensorFlow built with CUDA/cuDNN.")
