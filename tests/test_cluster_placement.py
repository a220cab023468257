"""GPU placement (rank r -> visible GPU local_rank) and the host-to-rank map at start, without a GPU or
MPI: the rule in engine/runtime/cluster.py, and its use in engine/runtime/device.py with stand-in devices."""
from __future__ import annotations

import re
import socket

import pytest

from engine.config.loader import Config
from engine.runtime.cluster import GpuChoice, gpu_for_rank
from engine.runtime.errors import ConfigError, DistributedError
from engine.runtime.process import set_communicator

pytestmark = pytest.mark.tf_latest


@pytest.mark.parametrize("local_rank, local_size, visible, cuda, expected", [
    (0, 1, 0, None, None),  # no GPU: the CPU
    (0, 1, 0, "", None),
    (1, 4, 4, None, GpuChoice(1, "1")),  # rank r pins GPU local_rank
    (3, 4, 4, None, GpuChoice(3, "3")),
    (1, 2, 2, "4,6", GpuChoice(1, "6")),  # of those CUDA_VISIBLE_DEVICES leaves; named by physical id
    (2, 4, 8, "GPU-aa, GPU-bb,GPU-cc,GPU-dd,4,5,6,7", GpuChoice(2, "GPU-cc")),
    (3, 4, 1, "3", GpuChoice(0, "3")),  # the scheduler gave each rank one GPU (srun --gpus-per-task=1)
    (1, 2, 1, None, GpuChoice(0, "0")),  # one GPU shared on purpose
])
def test_gpu_for_rank(local_rank, local_size, visible, cuda, expected):
    assert gpu_for_rank(local_rank, local_size, visible, cuda) == expected


def test_more_ranks_than_gpus_on_a_host_is_an_error_with_the_fixes():
    with pytest.raises(DistributedError) as info:
        gpu_for_rank(2, 4, 2, "0,1", host="node07")
    message = str(info.value)
    assert "Local rank 2 of 4 on node07 has no GPU of its own: 2 GPUs are visible " \
           "(CUDA_VISIBLE_DEVICES '0,1')" in message
    for fix in ("--map-by ppr:2:node", "--ntasks-per-node=2", "--gpus-per-task=1", "device = 'cpu'"):
        assert fix in message


class FakeComm:
    """Rank 0 of 2 on one host: what select_device and distributed.start ask of a communicator."""

    name, rank, size, watchdog, local_cpus = "fake", 0, 2, None, ()

    def __init__(self, local_rank: int = 0, local_size: int = 2) -> None:
        self.local_rank, self.local_size = local_rank, local_size
        self.gathered: list = []

    def allgather_object(self, obj):
        self.gathered.append(obj)
        return [obj, obj]

    def stall_guard(self, what):
        import contextlib

        return contextlib.nullcontext()


@pytest.fixture
def fake_gpus(monkeypatch):
    """Four stand-in GPUs for TensorFlow; records what select_device makes visible."""
    import tensorflow as tf

    gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(4)]
    chosen: dict = {}
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: gpus if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices",
                        lambda devices, kind=None: chosen.update(visible=devices))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth",
                        lambda device, on: chosen.update(growth=(device, on)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,4,5")
    yield gpus, chosen
    set_communicator(None)


def test_select_device_pins_the_gpu_of_the_local_rank(fake_gpus):
    from engine.runtime.device import select_device

    gpus, chosen = fake_gpus
    set_communicator(FakeComm(local_rank=1, local_size=4))
    select_device(Config({}))
    assert chosen == {"visible": [gpus[1]], "growth": (gpus[1], True)}


def test_select_device_cpu_hides_the_gpus_and_too_many_ranks_fail(fake_gpus):
    from engine.runtime.device import select_device

    gpus, chosen = fake_gpus
    set_communicator(FakeComm(local_rank=5, local_size=6))
    select_device(Config({"device": "cpu"}))
    assert chosen == {"visible": []}
    with pytest.raises(DistributedError, match="Local rank 5 of 6 on .* 4 GPUs are visible"):
        select_device(Config({}))


def test_select_device_gpu_without_gpus_names_cuda_visible_devices(monkeypatch):
    import tensorflow as tf

    from engine.runtime.device import select_device

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match="sees no GPU \\(CUDA_VISIBLE_DEVICES=''\\)"):
        select_device(Config({"device": "gpu"}))


def test_start_logs_the_host_to_rank_map(monkeypatch, capsys):
    from engine.runtime import log
    from engine.distributed import startup as start_module

    log.init()  # rank 0 prints level info on stdout, whatever earlier tests configured
    comm = FakeComm()
    monkeypatch.setattr(start_module, "create_communicator", lambda name, stall, device, **options: comm)
    monkeypatch.setattr(start_module, "install_failure_handler", lambda: None)
    monkeypatch.setattr(start_module, "check_config_consistency", lambda comm, items: None)
    try:
        start_module.start(Config({"use_horovod": True}))
    finally:
        set_communicator(None)
        log.init()
    host = socket.gethostname()
    assert comm.gathered[-1] == host  # every rank sends its hostname
    assert f"hosts: 2 ranks on 1 host: {host} ranks 0-1" in capsys.readouterr().out


def test_device_count_gpu_0_hides_the_gpus_before_tensorflow_uses_them(fake_gpus, capsys):
    """RETURNN users force the CPU with tf_session_opts = {"device_count": {"GPU": 0}}."""
    from engine.runtime import log
    from engine.runtime.device import select_device

    log.init()
    gpus, chosen = fake_gpus
    set_communicator(FakeComm(local_rank=1, local_size=4))
    select_device(Config({"tf_session_opts": {"device_count": {"GPU": 0}}}))
    assert chosen == {"visible": []}
    out = capsys.readouterr().out
    assert "tf_session_opts['device_count'] = {'GPU': 0}: the GPUs are hidden, this rank computes on the " \
           "CPU" in out
    assert "device_count" not in out.split("the GPUs are hidden")[1]  # not also listed as without effect


def test_device_count_with_gpus_or_cpus_changes_nothing(fake_gpus):
    from engine.runtime.device import select_device

    gpus, chosen = fake_gpus
    set_communicator(FakeComm(local_rank=1, local_size=4))
    select_device(Config({"tf_session_opts": {"device_count": {"GPU": 1, "CPU": 4}}}))
    assert chosen == {"visible": [gpus[1]], "growth": (gpus[1], True)}


@pytest.mark.parametrize("config, words", [
    ({"device_count": {"XLA_GPU": 0}}, "has 'XLA_GPU', which this engine does not know"),
    ({"device_count": {"CPU": 0}}, "has 'CPU': 0, but TensorFlow always has its CPU device"),
    ({"device_count": {"GPU": "none"}}, "has 'GPU': 'none'; expected a number of devices"),
    ({"device_count": {"GPU": False}}, "has 'GPU': False; expected a number of devices"),
    ({"device_count": 0}, "is 0; expected a dict such as {'GPU': 0}"),
])
def test_device_count_entries_that_cannot_be_honoured_are_refused(config, words):
    from engine.runtime.device import requested_device

    with pytest.raises(ConfigError, match=re.escape(f"Config key tf_session_opts['device_count'] {words}")):
        requested_device(Config({"tf_session_opts": config}))


def test_device_count_gpu_0_contradicting_device_gpu_is_an_error():
    from engine.runtime.device import requested_device

    with pytest.raises(ConfigError, match="'device' = 'gpu' and tf_session_opts\\['device_count'\\] = "
                                          "\\{'GPU': 0\\} contradict each other"):
        requested_device(Config({"device": "gpu", "tf_session_opts": {"device_count": {"GPU": 0}}}))
    both = Config({"device": "cpu", "tf_session_opts": {"device_count": {"GPU": 0}}})
    assert requested_device(both) == "cpu"
    assert requested_device(Config({})) == ""


def test_the_backend_choice_sees_device_count_gpu_0_as_the_cpu(monkeypatch):
    """distributed_backend = "auto" picks Horovod for GPU training: not when the GPUs are hidden."""
    from engine.distributed import startup as start_module

    devices = []

    def create(name, stall, device, **options):
        devices.append(device)
        raise ConfigError("stop here")

    monkeypatch.setattr(start_module, "create_communicator", create)
    with pytest.raises(ConfigError, match="stop here"):
        start_module.start(Config({"use_horovod": True, "tf_session_opts": {"device_count": {"GPU": 0}}}))
    assert devices == ["cpu"]
