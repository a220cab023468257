"""The cost model of docs/scaling.md: step time and scaling efficiency of each data-parallel setting from
the compute time of one step, the gradient bytes and the network, for a ring allreduce.

    python benchmarks/scaling_model.py --compute 0.05 --mb 85 [--busbw-share 0.9]

prints the projection for 8, 64 and 256 GPUs on 25 and 100 Gbit/s. docs/scaling.md checks the model
for n = 2 against ``bench_multihost.py``'s measured rows (its inputs taken from that run).

A ring allreduce of S bytes over n ranks sends 2 (n - 1) / n * S bytes per rank, in 2 (n - 1) messages
per bucket: time = 2 (n - 1) / n * S / (share * B) + 2 (n - 1) * latency * buckets. ``share`` is the
measured bus bandwidth over the link rate (how close the collective gets to the wire).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

BACKWARD_SHARE = 2 / 3  # of a step's compute: the backward pass costs about twice the forward pass
LATENCY_S = 20e-6  # one message's latency on a data-centre Ethernet (an assumption: not measurable here)


@dataclass(frozen=True)
class Network:
    gbit: float  # link rate per rank, Gbit/s
    busbw_share: float = 0.9  # measured bus bandwidth / link rate
    latency_s: float = LATENCY_S

    @property
    def bytes_per_s(self) -> float:
        return self.gbit * 1e9 / 8 * self.busbw_share


def allreduce_seconds(nbytes: float, ranks: int, net: Network, buckets: int = 1) -> float:
    """The ring allreduce of ``nbytes`` in ``buckets`` equal buckets, one after the other."""
    if ranks < 2 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / net.bytes_per_s + 2 * (ranks - 1) * net.latency_s * buckets


@dataclass(frozen=True)
class Setting:
    name: str
    wire_bytes_per_float: int = 4  # 2: fp16 or bf16 on the wire
    bucket_mb: float = 0.0  # overlap: buckets reduced while the backward pass runs (0: after it)
    accum_steps: int = 1  # accum_grad_multiple_step: one reduction per k steps
    param_sync_step: int = 0  # > 0: param mode, an average every N steps
    param_overlap: bool = False  # distributed_param_sync_overlap


SETTINGS = (
    Setting("grad"),
    Setting("grad + overlap 1 MB", bucket_mb=1),
    Setting("grad + overlap 25 MB", bucket_mb=25),
    Setting("grad + fp16", wire_bytes_per_float=2),
    Setting("grad + overlap + fp16", wire_bytes_per_float=2, bucket_mb=25),
    Setting("grad + accum 4", accum_steps=4),
    Setting("param every 20", param_sync_step=20),
    Setting("param every 20 + overlap", param_sync_step=20, param_overlap=True),
)


def exposed_reduction_seconds(setting: Setting, compute_s: float, model_bytes: float, ranks: int,
                              net: Network) -> float:
    """Per step: the reduction time that training waits for (the rest runs behind computation)."""
    nbytes = model_bytes * setting.wire_bytes_per_float / 4
    if setting.param_sync_step:
        reduction = allreduce_seconds(nbytes, ranks, net)
        behind = setting.param_sync_step * compute_s if setting.param_overlap else 0.0
        return max(0.0, reduction - behind) / setting.param_sync_step
    if not setting.bucket_mb:
        return allreduce_seconds(nbytes, ranks, net) / setting.accum_steps
    buckets = max(1, math.ceil(nbytes / (setting.bucket_mb * 1e6)))
    total = allreduce_seconds(nbytes, ranks, net, buckets)
    # the first bucket is ready after 1/buckets of the backward pass; the last can only start at its end
    backward_after_first = compute_s * BACKWARD_SHARE * (1 - 1 / buckets)
    exposed = max(total / buckets, total - backward_after_first)
    return exposed / setting.accum_steps


def efficiency(setting: Setting, compute_s: float, model_bytes: float, ranks: int, net: Network) -> float:
    """Speedup over one GPU divided by the number of GPUs (1.0: perfect scaling)."""
    return compute_s / (compute_s + exposed_reduction_seconds(setting, compute_s, model_bytes, ranks, net))


def projection_table(compute_s: float, model_bytes: float, gpus=(8, 64, 256), gbits=(25, 100),
                     busbw_share: float = 0.9) -> list[str]:
    lines = [f"{'setting':<28}" + "".join(f"{f'{n} GPUs {g:g} Gbit/s':>20}" for g in gbits for n in gpus)]
    for setting in SETTINGS:
        cells = [efficiency(setting, compute_s, model_bytes, n, Network(g, busbw_share))
                 for g in gbits for n in gpus]
        lines.append(f"{setting.name:<28}" + "".join(f"{100 * e:>19.0f}%" for e in cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compute", type=float, required=True, help="compute seconds of one step on one GPU")
    parser.add_argument("--mb", type=float, required=True, help="float32 gradient MB (1e6 bytes)")
    parser.add_argument("--busbw-share", type=float, default=0.9, help="measured bus bandwidth / link rate")
    args = parser.parse_args()
    print(f"Projected scaling efficiency (a projection from the model in docs/scaling.md, not a measurement):"
          f" {args.compute * 1e3:g} ms compute per step, {args.mb:g} MB of gradients, bus bandwidth "
          f"{100 * args.busbw_share:.0f}% of the link, latency {LATENCY_S * 1e6:g} us per message")
    print("\n".join(projection_table(args.compute, args.mb * 1e6, busbw_share=args.busbw_share)))


if __name__ == "__main__":
    main()
