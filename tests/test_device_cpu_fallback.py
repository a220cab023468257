"""engine.runtime.device without a GPU: the CUDA build of TensorFlow (the GPU install, ``make install
GPU=1``) on a machine with no GPU trains on the CPU and says so in one line; the CPU build says nothing,
and ``device = "gpu"`` is still an error."""
from __future__ import annotations

import pytest
import tensorflow as tf

from engine.config.loader import Config
from engine.runtime import device, log
from engine.runtime.errors import ConfigError

pytestmark = pytest.mark.tf_latest
LINE = "TensorFlow is built with CUDA but sees no GPU (CUDA_VISIBLE_DEVICES="


@pytest.fixture
def no_gpu(monkeypatch):
    """No physical GPU; the thread pools are left alone (TensorFlow in this process has started)."""
    monkeypatch.setattr(device, "configure_threads", lambda config: None)
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [] if kind == "GPU" else real(kind))
    log.init()
    yield monkeypatch
    log.init()


@pytest.mark.parametrize("built_with_cuda", [True, False])
def test_no_gpu_means_the_cpu_with_one_line_in_the_cuda_build(no_gpu, capsys, built_with_cuda):
    no_gpu.setattr(tf.test, "is_built_with_cuda", lambda: built_with_cuda)
    no_gpu.setenv("CUDA_VISIBLE_DEVICES", "0")
    device.select_device(Config({}))
    lines = [line for line in capsys.readouterr().out.splitlines() if LINE in line]
    if built_with_cuda:
        assert lines == [LINE + "'0'): this rank computes on the CPU"]
    else:
        assert lines == []
    assert tf.config.get_visible_devices("GPU") == []


def test_device_gpu_without_a_gpu_is_still_refused(no_gpu):
    no_gpu.setattr(tf.test, "is_built_with_cuda", lambda: True)
    with pytest.raises(ConfigError, match="Config key 'device' is 'gpu', but TensorFlow sees no GPU"):
        device.select_device(Config({"device": "gpu"}))


def test_device_cpu_says_nothing_about_cuda(no_gpu, capsys):
    no_gpu.setattr(tf.test, "is_built_with_cuda", lambda: True)
    device.select_device(Config({"device": "cpu"}))
    assert LINE not in capsys.readouterr().out
