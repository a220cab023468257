"""Clusters: the scheduler's host lists as an Open MPI hostfile, the host-to-rank map, GPU placement.

Pure functions (no MPI, no TensorFlow), shared by ``tools/make_hostfile.py``, the job scripts in
``tools/`` and the engine's start-up, and testable without a scheduler or a GPU.

    SGE:   $PE_HOSTFILE lines "node01.example.org 4 all.q@node01.example.org UNDEFINED"
    SLURM: $SLURM_JOB_NODELIST "node[01-03,07]", $SLURM_TASKS_PER_NODE "2(x3),1"
    Open MPI hostfile: "node01 slots=2" per line
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from engine.runtime.errors import DistributedError


@dataclass(frozen=True)
class HostSlots:
    host: str
    slots: int


# ----- SGE -----

def parse_pe_hostfile(text: str, source: str = "$PE_HOSTFILE") -> list[HostSlots]:
    """SGE's ``PE_HOSTFILE``: one ``host slots queue processors`` line per granted queue instance.

    A host granted in several queues appears on several lines; its slots are added up, in the order
    the hosts first appear (SGE lists the master host first)."""
    slots: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 2 or not fields[1].isdigit() or int(fields[1]) < 1:
            raise DistributedError(f"{source}, line {number}: {line.strip()!r} is not a PE_HOSTFILE line; "
                                   "expected 'HOST SLOTS [QUEUE PROCESSORS]' with SLOTS >= 1.")
        slots[fields[0]] = slots.get(fields[0], 0) + int(fields[1])
    if not slots:
        raise DistributedError(f"{source} lists no hosts; expected one 'HOST SLOTS QUEUE PROCESSORS' line "
                               "per host (is the job running in a parallel environment, qsub -pe mpi N?).")
    return [HostSlots(host, n) for host, n in slots.items()]


# ----- SLURM -----

def expand_hostlist(expr: str, source: str = "$SLURM_JOB_NODELIST") -> list[str]:
    """SLURM's compressed host list: ``node[01-03,07],gpu-a1`` -> node01 node02 node03 node07 gpu-a1.

    Ranges keep the zero padding of their lower bound; several bracket groups in one name expand to
    every combination (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2)."""
    if not expr.strip():
        raise DistributedError(f"{source} is empty; expected a SLURM host list such as 'node[01-04]'.")
    hosts: list[str] = []
    for item in _split_outside_brackets(expr.strip(), source):
        names = [""]
        for match in re.finditer(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", item):
            text, ranges = match.group(1), match.group(2)
            numbers = [""] if ranges is None else _expand_ranges(ranges, item, source)
            names = [n + text + r for n in names for r in numbers]
        hosts.extend(names)
    return hosts


def _split_outside_brackets(expr: str, source: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(expr + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            break
        if char == "," and depth == 0:
            items.append(expr[start:i].strip())
            start = i + 1
    if depth != 0 or any(not item for item in items):
        raise DistributedError(f"{source} = {expr!r} is not a valid SLURM host list (unbalanced brackets or "
                               "an empty name); expected e.g. 'node[01-03,07],gpu1'.")
    return items


def _expand_ranges(ranges: str, item: str, source: str) -> list[str]:
    out: list[str] = []
    for part in ranges.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if not match or (match.group(2) is not None and int(match.group(2)) < int(match.group(1))):
            raise DistributedError(f"{source}: the range [{ranges}] in {item!r} is not valid; expected "
                                   "numbers and ascending ranges such as [01-03,07].")
        low, high = match.group(1), match.group(2) or match.group(1)
        out.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return out


def parse_tasks_per_node(text: str, source: str = "$SLURM_TASKS_PER_NODE") -> list[int]:
    """SLURM's per-node counts: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match or int(match.group(1)) < 1:
            raise DistributedError(f"{source} = {text!r} is not understood; expected counts such as "
                                   "'2(x3),1' (2 tasks on each of 3 nodes, then 1).")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def slurm_hosts(nodelist: str, tasks_per_node: str | None = None) -> list[HostSlots]:
    """The allocation as hosts with slots; without ``tasks_per_node`` one slot per node."""
    hosts = expand_hostlist(nodelist)
    counts = parse_tasks_per_node(tasks_per_node) if tasks_per_node else [1] * len(hosts)
    if len(counts) != len(hosts):
        raise DistributedError(f"$SLURM_TASKS_PER_NODE = {tasks_per_node!r} gives counts for {len(counts)} "
                               f"nodes, but $SLURM_JOB_NODELIST = {nodelist!r} names {len(hosts)}; expected "
                               "one count per node.")
    return [HostSlots(host, n) for host, n in zip(hosts, counts)]


# ----- Open MPI -----

def format_openmpi_hostfile(hosts: list[HostSlots]) -> str:
    return "".join(f"{h.host} slots={h.slots}\n" for h in hosts)


def with_slots_per_host(hosts: list[HostSlots], slots: int) -> list[HostSlots]:
    """The same hosts with ``slots`` each (e.g. one rank per GPU, whatever the scheduler counted)."""
    return [HostSlots(h.host, slots) for h in hosts]


def check_enough_slots(hosts: list[HostSlots], num_ranks: int, source: str) -> None:
    total = sum(h.slots for h in hosts)
    if num_ranks > total:
        raise DistributedError(f"{num_ranks} ranks were asked for, but {source} grants only {total} slots on "
                               f"{len(hosts)} host(s) ({', '.join(f'{h.host}:{h.slots}' for h in hosts)}); "
                               "request as many slots as ranks (qsub -pe mpi N, sbatch --ntasks=N).")


# ----- the host-to-rank map -----

def host_rank_map(hostnames: list[str]) -> dict[str, list[int]]:
    """Rank lists by host, hosts in order of their lowest rank (``hostnames[r]`` is rank r's host)."""
    ranks: dict[str, list[int]] = {}
    for rank, host in enumerate(hostnames):
        ranks.setdefault(host, []).append(rank)
    return ranks


def format_rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> ``0-2,5,7-8``."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def format_host_map(hostnames: list[str]) -> str:
    """``2 ranks on 2 hosts: node01 rank 0; node02 rank 1`` (the line the engine logs at start)."""
    by_host = host_rank_map(hostnames)
    parts = [f"{host} rank{'s' if len(r) > 1 else ''} {format_rank_ranges(r)}" for host, r in by_host.items()]
    return (f"{len(hostnames)} rank{'s' if len(hostnames) != 1 else ''} on {len(by_host)} "
            f"host{'s' if len(by_host) != 1 else ''}: " + "; ".join(parts))


# ----- GPU placement -----

@dataclass(frozen=True)
class GpuChoice:
    index: int  # among the GPUs this process sees (TensorFlow numbers them 0..n-1)
    device_id: str  # what that GPU is called in CUDA_VISIBLE_DEVICES (or its index when unset)


def _visible_device_ids(cuda_visible_devices: str | None, num_visible: int) -> list[str]:
    """The physical ids behind visible GPUs 0..n-1, for messages; the indices when the variable is unset."""
    if cuda_visible_devices is None:
        return [str(i) for i in range(num_visible)]
    ids = [d.strip() for d in cuda_visible_devices.split(",") if d.strip()]
    return ids[:num_visible] + [str(i) for i in range(len(ids), num_visible)]


def gpu_for_rank(local_rank: int, local_size: int, num_visible: int, cuda_visible_devices: str | None = None,
                 host: str = "this host") -> GpuChoice | None:
    """Rank r uses visible GPU ``local_rank``; None when no GPU is visible.

    A process that sees exactly one GPU uses it: the scheduler then gave each rank its own (SLURM's
    ``--gpus-per-task=1``) or the ranks on the host share it on purpose. A process that sees several
    GPUs, but fewer than its local rank needs, is an error rather than silently doubling up ranks on a
    GPU (a second model on a GPU mostly runs out of memory, or halves the speed of both)."""
    if num_visible <= 0:
        return None
    ids = _visible_device_ids(cuda_visible_devices, num_visible)
    if num_visible == 1:
        return GpuChoice(0, ids[0])
    if local_rank >= num_visible:
        shown = "unset" if cuda_visible_devices is None else repr(cuda_visible_devices)
        raise DistributedError(
            f"Local rank {local_rank} of {local_size} on {host} has no GPU of its own: {num_visible} GPUs "
            f"are visible (CUDA_VISIBLE_DEVICES {shown}), and rank r uses GPU local_rank. Start at most "
            f"{num_visible} ranks per host (mpirun --map-by ppr:{num_visible}:node, sbatch "
            f"--ntasks-per-node={num_visible}), give each rank one GPU (srun --gpus-per-task=1), or set "
            "device = 'cpu'.")
    return GpuChoice(local_rank, ids[local_rank])
