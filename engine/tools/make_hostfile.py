"""Write the scheduler's host allocation as an Open MPI hostfile (``HOST slots=N`` per line).

    make-hostfile [-o HOSTFILE] [--ranks N] [--slots-per-host N]                  # from the environment
    make-hostfile --sge PE_HOSTFILE [-o HOSTFILE] ...                             # SGE's $PE_HOSTFILE
    make-hostfile --slurm 'node[01-03]' [--tasks-per-node '2(x3)'] [-o HOSTFILE] ...   # SLURM's lists

(or ``python tools/make_hostfile.py ...``).

Without --sge/--slurm it reads $PE_HOSTFILE (SGE) or $SLURM_JOB_NODELIST and $SLURM_TASKS_PER_NODE
(SLURM). ``--ranks N`` checks that the allocation has at least N slots. The hostfile is written under a
temporary name and renamed; without -o it goes to stdout. A summary line goes to stderr.
"""
from __future__ import annotations

import argparse
import os
import sys

from engine.runtime.atomic_file import write_text_atomically
from engine.runtime.cluster import (HostSlots, check_enough_slots, format_openmpi_hostfile, parse_pe_hostfile,
                                    slurm_hosts, with_slots_per_host)
from engine.runtime.errors import DistributedError, EngineError


def read_allocation(sge: str | None, slurm: str | None,
                    tasks_per_node: str | None) -> tuple[list[HostSlots], str]:
    """The hosts, and where they came from (for messages); the environment when neither is given."""
    env = os.environ
    if sge is None and slurm is None:
        if env.get("PE_HOSTFILE"):
            sge = env["PE_HOSTFILE"]
        elif env.get("SLURM_JOB_NODELIST"):
            slurm = env["SLURM_JOB_NODELIST"]
            tasks_per_node = tasks_per_node or env.get("SLURM_TASKS_PER_NODE")
        else:
            raise DistributedError("No host allocation found: neither $PE_HOSTFILE (SGE) nor "
                                   "$SLURM_JOB_NODELIST (SLURM) is set. Run this inside a job, or pass "
                                   "--sge FILE or --slurm NODELIST.")
    if sge is not None:
        try:
            with open(sge, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise DistributedError(f"Cannot read the SGE PE_HOSTFILE {sge}: {exc.strerror}.") from exc
        return parse_pe_hostfile(text, source=f"PE_HOSTFILE {sge}"), f"PE_HOSTFILE {sge}"
    return slurm_hosts(slurm, tasks_per_node), f"SLURM node list {slurm!r}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--sge", metavar="PE_HOSTFILE", help="SGE's host file (default: $PE_HOSTFILE)")
    source.add_argument("--slurm", metavar="NODELIST", help="SLURM host list (default: $SLURM_JOB_NODELIST)")
    parser.add_argument("--tasks-per-node", metavar="COUNTS",
                        help="with --slurm: e.g. '2(x3),1' (default: $SLURM_TASKS_PER_NODE, else 1 per node)")
    parser.add_argument("--slots-per-host", type=int, metavar="N",
                        help="give every host N slots, whatever the scheduler counted (e.g. GPUs per host)")
    parser.add_argument("--ranks", type=int, metavar="N", help="fail unless the hosts have >= N slots")
    parser.add_argument("-o", "--output", metavar="HOSTFILE", help="where to write it (default: stdout)")
    args = parser.parse_args(argv)
    try:
        hosts, where = read_allocation(args.sge, args.slurm, args.tasks_per_node)
        if args.slots_per_host is not None:
            if args.slots_per_host < 1:
                raise DistributedError(f"--slots-per-host is {args.slots_per_host}; expected >= 1.")
            hosts = with_slots_per_host(hosts, args.slots_per_host)
        if args.ranks is not None:
            check_enough_slots(hosts, args.ranks, where)
        text = format_openmpi_hostfile(hosts)
        if args.output:
            write_text_atomically(args.output, text)
        else:
            sys.stdout.write(text)
    except EngineError as exc:
        print(f"make_hostfile: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"make_hostfile: cannot write {args.output}: {exc.strerror}.", file=sys.stderr)
        return 1
    total = sum(h.slots for h in hosts)
    print(f"make_hostfile: {len(hosts)} host(s), {total} slot(s) from {where}"
          + (f" -> {args.output}" if args.output else ""), file=sys.stderr)
    return 0
