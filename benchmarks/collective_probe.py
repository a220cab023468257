"""One reduction through the ``tf`` backend, its result checked on every rank; run by ``gpu_check.py``:

    mpirun -np N python benchmarks/collective_probe.py --device gpu|cpu --gpu-reduction nccl|ring

Each rank starts as training does (``engine.distributed.start``, then ``select_device``: rank r takes
visible GPU ``local_rank``, or the GPU it shares), then reduces inside a ``tf.function`` on its device, as
a training step reduces its gradients (``allreduce_tensors``). Every rank contributes (rank + 1) times a
known float32 vector, so the sum over N ranks is N (N + 1) / 2 times it, exact in float32; a rank that
reduced nothing, or with the wrong peers, gets another value. Soft device placement is off: an op asked
for on the GPU runs there or fails. Each rank prints one line, which ``gpu_check.reduction_verdict`` reads:

    collective-probe: rank R of N: 1 CollectiveReduceV2 on /job:worker/replica:0/task:R/device:GPU:0
    (communication_hint nccl): sum exact

or ``collective-probe: rank R of N: WRONG: ...`` and exits 1. That NCCL itself ran is not visible here:
``gpu_check`` sets ``NCCL_DEBUG=VERSION``, with which NCCL prints its version when it sets up.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the engine

LENGTH = 4099  # not a multiple of any chunking, so a collective that splits it must reassemble it
PREFIX = "collective-probe:"


def contribution(rank: int) -> np.ndarray:
    return ((rank + 1) * (np.arange(LENGTH) % 13 + 1)).astype(np.float32)


def expected_sum(size: int) -> np.ndarray:
    return (size * (size + 1) // 2 * (np.arange(LENGTH) % 13 + 1)).astype(np.float32)


def describe_difference(got: np.ndarray, expected: np.ndarray) -> str:
    """"" when equal, else how they differ."""
    wrong = np.flatnonzero(got != expected)
    if got.shape != expected.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    if not wrong.size:
        return ""
    first = wrong[0]
    return (f"{wrong.size} of {got.size} elements differ (element {first}: {got[first]:g}, expected "
            f"{expected[first]:g})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("gpu", "cpu"), required=True)
    parser.add_argument("--gpu-reduction", choices=("nccl", "ring"), default="nccl")
    args = parser.parse_args()

    from engine.config.loader import Config
    from engine.distributed import start
    from engine.runtime import log
    from engine.runtime.device import select_device

    log.init(verbosity=log.INFO)
    config = Config({"use_horovod": True, "distributed_backend": "tf", "device": args.device,
                     "distributed_tf_gpu_reduction": args.gpu_reduction})
    comm = start(config).comm
    select_device(config)

    import tensorflow as tf

    tf.config.set_soft_device_placement(False)
    kind = args.device.upper()
    where = f"{PREFIX} rank {comm.rank} of {comm.size}:"

    @tf.function
    def reduce(values: tf.Tensor) -> tf.Tensor:
        return comm.allreduce_tensors([values], "sum")[0]

    with tf.device(f"/device:{kind}:0"):
        mine = tf.identity(tf.constant(contribution(comm.rank)))
        result = reduce(mine)
    ops = [op for op in reduce.get_concrete_function(mine).graph.get_operations()
           if op.type == "CollectiveReduceV2"]
    hints = sorted({op.get_attr("communication_hint").decode() for op in ops})
    problems = []
    if not ops:
        problems.append("the reduction holds no CollectiveReduceV2")
    if f"device:{kind}:" not in result.device:
        problems.append(f"the result is on {result.device!r}, not on the {kind}")
    difference = describe_difference(result.numpy(), expected_sum(comm.size))
    if difference:
        problems.append(f"the sum over {comm.size} ranks is wrong: {difference}")
    if problems:
        print(f"{where} WRONG: {'; '.join(problems)}", flush=True)
        return 1
    print(f"{where} {len(ops)} CollectiveReduceV2 on {result.device} "
          f"(communication_hint {', '.join(hints)}): sum exact", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
