"""TensorFlow's CPU threads for this rank, chosen before TensorFlow starts: intra-op threads (one op splits
its work over them) and inter-op threads (independent ops run at the same time).

Who decides, for each of the two numbers on its own, first match wins:

1. the environment: ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS`` (what a job script or
   ``mpirun -x`` sets for one run);
2. the config: ``intra_op_threads`` / ``inter_op_threads``, or RETURNN's ``tf_session_opts`` with
   ``intra_op_parallelism_threads`` / ``inter_op_parallelism_threads``;
3. automatic (``AUTO_RULE``), from the cores this rank may use (``cores_for_rank``) and the task:
   training and inference (``forward``, ``eval``) take different rules.

0 anywhere means TensorFlow's own choice: every core of the machine, whatever the scheduler granted.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Mapping, Sequence

from engine.runtime import log, process
from engine.runtime.cluster import parse_pe_hostfile
from engine.runtime.config_view import ConfigView
from engine.runtime.errors import ConfigError, EngineError

ENV_VARS = {"intra": "TF_NUM_INTRAOP_THREADS", "inter": "TF_NUM_INTEROP_THREADS"}
CONFIG_KEYS = {"intra": "intra_op_threads", "inter": "inter_op_threads"}
SESSION_OPTS = {"intra": "intra_op_parallelism_threads", "inter": "inter_op_parallelism_threads"}
# TensorFlow 1 session options that exist but mean nothing without a session; accepted and reported.
SESSION_OPTS_WITHOUT_EFFECT = ("log_device_placement", "allow_soft_placement", "gpu_options",
                               "graph_options", "use_per_session_threads", "operation_timeout_in_ms")
# Read elsewhere: which devices a rank may use (``device.py``).
SESSION_OPTS_ELSEWHERE = ("device_count",)
AUTO_RULE = {  # search takes the training rule
    "train": "1 intra-op thread up to 2 cores, else cores - 1; inter-op threads: 1 on 1 core, else 2",
    "train without a time loop": "a network without a time loop (rec, rnn_cell): all cores intra-op; "
                                 "inter-op threads: 1 on 1 core, else 2",
    "inference": "all cores intra-op, 1 inter-op thread",
}
INFERENCE_TASKS = ("forward", "eval")
# layer classes that run a loop over time steps (an LSTM, a decoder unit): chains of small ops
TIME_LOOP_CLASSES = ("rec", "rnn_cell")


@dataclass(frozen=True)
class CoreGrant:
    """The cores this rank may use, and which limit decided that."""

    cores: int
    why: str


@dataclass(frozen=True)
class ThreadChoice:
    intra: int
    inter: int
    why: str


def cores_for_rank(local_cpus: Sequence[frozenset[int]], local_rank: int, environ: Mapping[str, str],
                   host: str) -> CoreGrant:
    """The cores of this rank: the smallest of what the CPU affinity, SLURM and SGE grant.

    ``local_cpus``: the CPU affinity of every rank on this host, by local rank. Where the ranks' sets
    do not overlap, the launcher bound each rank to its own cores; where they do, the ranks share them
    and each gets an equal part. SLURM's ``SLURM_CPUS_PER_TASK`` is per rank already; SGE's slots
    (``PE_HOSTFILE``'s line for this host, else ``NSLOTS``) are for all ranks on the host.
    """
    local_size = max(1, len(local_cpus))
    own = local_cpus[local_rank] if local_cpus else frozenset()
    if not own:  # affinity unknown (no sched_getaffinity): the machine's size
        grants = [CoreGrant(max(1, (os.cpu_count() or 1) // local_size),
                            f"{os.cpu_count()} CPUs of the machine for {local_size} rank(s)")]
    elif local_size == 1 or _disjoint(local_cpus):
        grants = [CoreGrant(len(own), f"CPU affinity of this rank: {len(own)} cores")]
    else:
        shared = frozenset().union(*local_cpus)
        grants = [CoreGrant(max(1, len(shared) // local_size),
                            f"CPU affinity of {len(shared)} cores shared by {local_size} ranks on this host")]
    slurm = _positive_int(environ, "SLURM_CPUS_PER_TASK")
    if slurm:
        grants.append(CoreGrant(slurm, f"SLURM_CPUS_PER_TASK={slurm}"))
    sge = _sge_slots(environ, host)
    if sge:
        slots, source = sge
        grants.append(CoreGrant(max(1, slots // local_size),
                                f"{source}: {slots} slots for {local_size} rank(s)"))
    return min(grants, key=lambda grant: grant.cores)


def _disjoint(sets: Sequence[frozenset[int]]) -> bool:
    return sum(map(len, sets)) == len(frozenset().union(*sets))


def _positive_int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _sge_slots(environ: Mapping[str, str], host: str) -> tuple[int, str] | None:
    """SGE's slots on this host: its PE_HOSTFILE line, else NSLOTS (a job on one host)."""
    path = environ.get("PE_HOSTFILE")
    if path:
        try:
            with open(path) as f:
                hosts = parse_pe_hostfile(f.read(), f"PE_HOSTFILE {path}")
        except (OSError, EngineError) as exc:
            log.warning(f"threads: cannot read the SGE slots of this host ({exc}); using NSLOTS if set")
        else:
            short = host.split(".")[0]
            for entry in hosts:
                if entry.host == host or entry.host.split(".")[0] == short:
                    return entry.slots, f"PE_HOSTFILE ({entry.host})"
    nslots = _positive_int(environ, "NSLOTS")
    return (nslots, "NSLOTS") if nslots else None


def loops_over_time(network: object) -> bool:
    """Whether a ``network`` dict has a layer (at any depth: subnetworks, units) of a class in
    ``TIME_LOOP_CLASSES``; a network given otherwise (none, a function) counts as one that has."""
    if not isinstance(network, dict):
        return True

    def has_loop(value: object) -> bool:
        if isinstance(value, dict):
            return value.get("class") in TIME_LOOP_CLASSES or any(has_loop(v) for v in value.values())
        return isinstance(value, (list, tuple)) and any(has_loop(v) for v in value)
    return has_loop(network)


def automatic_threads(cores: int, task: str = "train", time_loop: bool = True) -> tuple[int, int]:
    """(intra, inter) for a rank with ``cores`` cores running ``task`` (``AUTO_RULE``; measurements:
    docs/performance.md).

    Training: on 2 cores a second intra-op thread cost a quarter more CPU for the same work (Eigen
    splits each time step's small products and its workers spin between them), a second inter-op thread
    2%, and it runs independent ops (one layer's weight gradients beside the next layer's backward pass)
    at once. From 3 cores on, the intra-op pool takes all cores but one, which the second inter-op
    thread's op may use: large products (long batches, wide layers) gain from the pool.
    Inference (``forward``, ``eval``): no backward pass, so few independent ops; on 2 cores every core in
    the intra-op pool forwarded a 4x512 BLSTM 1.4x faster than the training rule, a 2x128 LSTM 5% slower
    (ranges overlapping).
    Search takes the training rule: a decoder step is a chain of small ops (one label for beam x batch
    hypotheses) between which an intra-op pool's workers spin. On 2 cores, beam 12 (3 interleaved runs
    each): RETURNN's LSTM attention system reduced, 1 / 2 49.0k frames/s (47.9k-49.6k), 1 / 1 44.2k, 2 / 1
    34.0k; the reduced Transformer 1 / 2 28.6k (28.4k-29.0k), 1 / 1 30.8k, 2 / 1 19.9k.
    Training a network without a loop over time (``time_loop`` False: convolutions, self-attention, wide
    products and thousands of output classes) splits its large ops well: on 2 cores RETURNN's Conformer
    hybrid reduced to 4 x 256 trained 2 / 2 at 2,482 frames/s (2,435-2,590, 3 interleaved runs), 2 / 1
    2,437, 1 / 2 2,140."""
    if cores <= 1:
        return 1, 1
    if task in INFERENCE_TASKS:
        return cores, 1
    if not time_loop and task == "train":
        return cores, 2
    if cores == 2:
        return 1, 2
    return cores - 1, 2


def choose_threads(config: ConfigView, grant: CoreGrant, environ: Mapping[str, str]) -> ThreadChoice:
    """The environment over the config over the automatic choice, for intra and inter on their own."""
    from_config = _from_config(config)
    task = config.str("task") or "train"
    try:
        time_loop = loops_over_time(config.dict("network"))
    except ConfigError:  # a network that is no dict: its own check names it later
        time_loop = True
    auto = dict(zip(("intra", "inter"), automatic_threads(grant.cores, task, time_loop)))
    numbers, sources = {}, {}
    for kind in ("intra", "inter"):
        env_value = _env_threads(environ, ENV_VARS[kind])
        if env_value is not None:
            numbers[kind], sources[kind] = env_value, ENV_VARS[kind]
        elif from_config[kind] is not None:
            numbers[kind], sources[kind] = from_config[kind]
        else:
            numbers[kind], sources[kind] = auto[kind], "automatic"
    parts = [f"{kind}-op from {source}" for kind, source in sources.items() if source != "automatic"]
    if "automatic" in sources.values():
        rule = "inference" if task in INFERENCE_TASKS else "train" if time_loop or task != "train" \
            else "train without a time loop"
        parts.append(f"automatic for {grant.cores} core(s) ({grant.why}), task {task!r}: {AUTO_RULE[rule]}")
    return ThreadChoice(numbers["intra"], numbers["inter"], "; ".join(parts))


def _env_threads(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None or value.strip() == "":
        return None
    if not value.strip().isdigit():
        raise ConfigError(f"Environment variable {name}={value!r} is not a thread count; expected an integer "
                          ">= 0 (0: TensorFlow's default), or unset it for the engine's choice.")
    return int(value)


def _from_config(config: ConfigView) -> dict[str, tuple[int, str] | None]:
    """Thread counts the config sets: its keys, or tf_session_opts; both for one number must agree."""
    session = config.dict("tf_session_opts") or {}
    unknown = sorted(set(session) - set(SESSION_OPTS.values()) - set(SESSION_OPTS_WITHOUT_EFFECT)
                     - set(SESSION_OPTS_ELSEWHERE))
    if unknown:
        raise ConfigError(
            f"Config key 'tf_session_opts' has {', '.join(map(repr, unknown))}, which this engine does not "
            f"know; it reads {', '.join(SESSION_OPTS.values())} (thread counts) and device_count ({{'GPU': "
            f"0}}: the CPU), and accepts {', '.join(SESSION_OPTS_WITHOUT_EFFECT)} (no effect without a "
            "session).")
    ignored = sorted(set(session) & set(SESSION_OPTS_WITHOUT_EFFECT))
    if ignored:
        log.info(f"tf_session_opts: {', '.join(ignored)} have no effect here: TensorFlow 2 has no session "
                 "(GPU memory grows as needed; placement is automatic)")
    result: dict[str, tuple[int, str] | None] = {}
    for kind in ("intra", "inter"):
        key, opt = CONFIG_KEYS[kind], SESSION_OPTS[kind]
        values = {name: _config_threads(name, value) for name, value in
                  ((key, config.int(key)), (f"tf_session_opts['{opt}']", session.get(opt)))
                  if value is not None}
        if len(set(values.values())) > 1:
            raise ConfigError(f"Config keys {' and '.join(values)} set different thread counts "
                              f"({', '.join(map(str, values.values()))}); keep one.")
        result[kind] = next(((n, name) for name, n in values.items()), None)
    return result


def _config_threads(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"Config key {name} is {value!r}; expected a thread count, an integer >= 0 "
                          "(0: TensorFlow's default).")
    return value


def configure_threads(config: ConfigView) -> ThreadChoice:
    """Choose this rank's threads and hand them to TensorFlow; call before TensorFlow runs anything."""
    import tensorflow as tf

    comm = process.communicator()
    local_cpus = comm.local_cpus if comm is not None and comm.local_cpus else (_own_affinity(),)
    local_rank = comm.local_rank if comm is not None and comm.local_cpus else 0
    grant = cores_for_rank(local_cpus, local_rank, os.environ, socket.gethostname())
    choice = choose_threads(config, grant, os.environ)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(choice.intra)
        tf.config.threading.set_inter_op_parallelism_threads(choice.inter)
    except RuntimeError as exc:  # TensorFlow already started: its pools are fixed
        log.warning(f"threads: TensorFlow already runs, its thread pools stay as they are ({exc})")
        return choice
    log.info(f"threads: {_shown(choice.intra)} intra-op, {_shown(choice.inter)} inter-op ({choice.why})")
    return choice


def _shown(threads: int) -> str:
    return str(threads) if threads else "TensorFlow's default number of"


def _own_affinity() -> frozenset[int]:
    return frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
