"""The data-parallel settings (every key of distributed-protocol.md, unknown and contradictory values) and
the strategy each mode builds."""
from __future__ import annotations

import pytest

from engine.config.loader import Config
from engine.distributed import DataParallelSettings, GradAllreduce, ParamAverage, Strategy, build_strategy
from engine.distributed.watchdog import StallLimits
from engine.runtime.errors import ConfigError

pytestmark = pytest.mark.tf_latest


def context(**values) -> DataParallelSettings:
    return DataParallelSettings.from_config(Config(values))


class FakeComm:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size


def strategy(rank: int = 2, size: int = 4, **values) -> Strategy:
    return build_strategy(context(**values), FakeComm(rank, size))


def test_off_without_use_horovod():
    assert not context().enabled
    assert not context(use_horovod=False, horovod_reduce_type="param").enabled
    single = strategy(use_horovod=False, horovod_reduce_type="param")
    assert type(single) is Strategy and single.train_shard == (0, 1) and single.lr_scale == 1.0


def test_defaults_follow_the_spec():
    ctx = context(use_horovod=True)
    assert (ctx.reduce_type, ctx.param_sync_step, ctx.param_sync_time_diff, ctx.dataset_distribution,
            ctx.scale_lr, ctx.grad_normalization, ctx.backend_name, ctx.stall) == \
        ("grad", 1, None, "shard", False, "sum", "auto",
         StallLimits(warning=60.0, timeout=300.0, checkpoint=1800.0))
    grad = strategy(use_horovod=True)
    assert isinstance(grad, GradAllreduce) and grad.normalization == "sum"
    assert grad.train_shard == (2, 4) and grad.random_seed_offset == 0 and not grad.differentiates_loss_sum


def test_every_key_is_read_also_from_command_line_strings():
    ctx = context(use_horovod="1", horovod_reduce_type="param", horovod_param_sync_step="100",
                  horovod_dataset_distribution="random_seed_offset", horovod_scale_lr="yes",
                  distributed_backend="mpi", distributed_stall_timeout="600", distributed_stall_warning="20",
                  distributed_checkpoint_timeout="7200")
    assert (ctx.reduce_type, ctx.param_sync_step, ctx.dataset_distribution, ctx.scale_lr, ctx.backend_name,
            ctx.stall) == ("param", 100, "random_seed_offset", True, "mpi", StallLimits(20.0, 600.0, 7200.0))
    timed = context(use_horovod=True, horovod_reduce_type="param", horovod_param_sync_time_diff=30)
    assert timed.param_sync_time_diff == 30.0
    assert context(use_horovod=True, horovod_avg_grad=True).grad_normalization == "average"
    assert context(use_horovod=True, horovod_grad_normalization="global_frames").grad_normalization == \
        "global_frames"
    never = context(use_horovod=True, distributed_stall_timeout=0, distributed_stall_warning=None).stall
    assert never == StallLimits(None, None) and not never.enabled  # no checkpoint limit without a stall one
    saving_forever = context(use_horovod=True, distributed_checkpoint_timeout=None).stall
    assert saving_forever == StallLimits(60.0, 300.0, None) and saving_forever.timeout_for(True) is None


def test_each_mode_builds_its_strategy():
    rso = strategy(use_horovod=True, horovod_reduce_type="param", horovod_param_sync_step=100,
                   horovod_dataset_distribution="random_seed_offset", horovod_scale_lr=True)
    assert isinstance(rso, ParamAverage) and not rso.signal_every_step
    assert rso.train_shard == (0, 1) and rso.random_seed_offset == 2 * 16127 and rso.lr_scale == 4.0
    assert rso.schedule.step_interval == 100 and rso.schedule.time_diff is None
    shard = strategy(use_horovod=True, horovod_reduce_type="param", horovod_param_sync_time_diff=5)
    assert shard.signal_every_step and shard.train_shard == (2, 4) and shard.schedule.time_diff == 5.0
    exact = strategy(use_horovod=True, horovod_grad_normalization="global_frames")
    assert exact.differentiates_loss_sum and exact.normalization == "global_frames"
    assert type(strategy(0, 1, use_horovod=True, horovod_reduce_type="param")) is Strategy  # one rank


def test_unknown_horovod_key_is_named_with_a_suggestion_and_the_known_keys():
    for use in (True, False):  # a typo must not pass silently, whether or not Horovod is on
        with pytest.raises(ConfigError) as info:
            context(use_horovod=use, horovod_reduce_typ="param")
        text = str(info.value)
        assert "'horovod_reduce_typ'" in text and "Did you mean 'horovod_reduce_type'" in text
        assert "horovod_param_sync_time_diff" in text and "horovod_avg_grad" in text


@pytest.mark.parametrize("values, words", [
    ({"horovod_param_sync_time_diff": 10}, ["'horovod_param_sync_time_diff'", "'grad'"]),
    ({"horovod_param_sync_step": 100}, ["'horovod_param_sync_step'", "'grad'"]),
    ({"horovod_reduce_type": "param", "horovod_avg_grad": True}, ["'horovod_avg_grad'", "'param'"]),
    ({"horovod_reduce_type": "param", "horovod_grad_normalization": "average"},
     ["'horovod_grad_normalization'", "'param'"]),
    ({"horovod_grad_normalization": "mean"}, ["'horovod_grad_normalization'", "'mean'", "'global_frames'"]),
    ({"horovod_avg_grad": True, "horovod_grad_normalization": "sum"}, ["contradict", "'sum'"]),
    ({"horovod_reduce_type": "params"}, ["'horovod_reduce_type'", "'params'", "'grad', 'param'"]),
    ({"horovod_dataset_distribution": "random"}, ["'horovod_dataset_distribution'", "'shard'"]),
    ({"horovod_reduce_type": "param", "horovod_param_sync_step": 0}, ["'horovod_param_sync_step'", ">= 1"]),
    ({"horovod_reduce_type": "param", "horovod_param_sync_time_diff": -1}, ["time_diff", "> 0"]),
    ({"distributed_backend": "nccl"}, ["'distributed_backend'", "'nccl'", "'auto', 'horovod', 'mpi'"]),
    ({"distributed_stall_timeout": -5}, ["'distributed_stall_timeout'"]),
    ({"distributed_stall_warning": -1}, ["'distributed_stall_warning'"]),
    ({"horovod_param_sync_step": "often"}, ["'horovod_param_sync_step'", "'often'"]),
])
def test_bad_and_contradictory_settings(values, words):
    with pytest.raises(ConfigError) as info:
        context(use_horovod=True, **values)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_time_diff_takes_precedence_over_the_step_count(capsys):
    ctx = context(use_horovod=True, horovod_reduce_type="param", horovod_param_sync_step=100,
                  horovod_param_sync_time_diff=60)
    assert ctx.param_sync_time_diff == 60.0
    assert "horovod_param_sync_step = 100 is ignored" in capsys.readouterr().err
