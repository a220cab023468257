#!/usr/bin/env python3
"""Data-parallel training where the network is the bottleneck: 2 simulated hosts (network namespaces
joined by a veth pair, ``tests/cluster/simulated_hosts.py``), one rank each, on a link limited by
``tc tbf`` to 100 Mbit/s and 1 Gbit/s. Run as root (namespaces and tc need it):

    .venv/bin/python benchmarks/bench_multihost.py [--links 100mbit,1gbit] [--models small,large]
        [--runs 3] [--rows REGEX] [--quick] [--allreduce-only] [--full]

Models: "small", 2 LSTM layers of 128 units (0.9 MB of gradients), and "large", 4 BLSTM layers of 512
units (85 MB), input dim 40, 50 classes, generated data (``DummyDataset``), Adam. The batch keeps a
step of the large model near a second on one core.

How a row is timed. rnn.py runs with ``log_verbosity 5``, so rank 0 prints a line after every step;
the benchmark stamps the lines as they arrive. One run of a row covers every link in turn: after a
warm-up (the first steps trace the graph) the benchmark sets the link's rate (``tc qdisc replace``)
when step b's line arrives and takes the wall time from line b to line b+S as S steps on that link
(the rate changes while step b+1 computes, before it sends anything). Segments are multiples of the
row's period (accumulation groups, parameter syncs), so each holds the same share of reductions. The
first segment is on the unlimited veth link: its step time is the row's compute-only time (both ranks
computing on this machine, with a reduction that costs little there). Bytes on the wire: what each
host's end of the link sent during the segment (``ip -s link``), per step, the mean of the two hosts.
Every row runs ``--runs`` times (rows take turns); each figure is the median with the range.

Speed-up: 2 ranks each train on a batch of their own, so speed-up = 2 x (best single-process step
time) / (2-rank step time); the single process trains the same per-rank batch with 1 and 2 threads.
The allreduce alone: the engine's mpi communicator reduces the model's gradient shapes (a
``tf.function`` around ``allreduce_tensors``, as the training step does) in a small mpirun'd worker;
bus bandwidth = bytes x 2(n-1)/n / time.

A row whose config key the engine refuses (a feature not in this checkout) prints "n/a" with the
engine's reason. Verdicts (``timing.compare``): both sides' medians and ranges; PASS or MISS only where
the ranges are apart, else INCONCLUSIVE; FAIL, naming the row, where a row the verdict needs failed or
was refused (for engine vs Horovod: any tagged row of either side).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

from timing import ROOT, Row, Side, compare  # the script's own directory is on sys.path

sys.path.insert(0, os.path.join(ROOT, "tests"))
from cluster.simulated_hosts import SimulatedHosts  # noqa: E402

from multihost_rows import MODELS, Setting, settings  # noqa: E402
from multihost_runs import (LINKS, OPEN_MPI_ALLREDUCE, UNLIMITED, Failed, Refused, Segment,  # noqa: E402
                            allreduce_alone, allreduce_worker, measure_link, set_link, tcp_receive,
                            tcp_send, train_segments)


# ----------------------------------------------------------------------------------------------------
# The benchmark


@dataclass
class Measured:
    setting: Setting
    runs: list[list[Segment]] = field(default_factory=list)
    refused: str = ""
    failure: str = ""

    def row(self, link: str, what: str = "seconds") -> Row:
        """The figures of one link as a ``timing.Row``: step seconds or bytes sent per step."""
        row = Row(f"{self.setting.name} @ {link}", lambda: 0.0, failure=self.failure or self.refused)
        for segments in self.runs:
            for s in segments:
                if s.link == link:
                    row.values.append(s.seconds / s.steps if what == "seconds" else s.sent / s.steps)
        if not row.values and not row.failed:
            row.failure = "no run"
        return row

    def status(self) -> str:
        return f"n/a: {self.refused}" if self.refused else f"FAIL: {self.failure}" if self.failure else ""


def run_rows(model_key: str, rows: list[Setting], links: list[str], runs: int, hosts: SimulatedHosts,
             tmp: str) -> dict[str, Measured]:
    model = MODELS[model_key]
    measured = {s.name: Measured(s) for s in rows}
    for round_ in range(runs):
        order = rows if round_ % 2 == 0 else list(reversed(rows))
        for setting in order:
            m = measured[setting.name]
            if m.refused or m.failure:
                continue
            row_links = [UNLIMITED] if setting.ranks == 1 else [UNLIMITED, *links]
            t0 = time.perf_counter()
            try:
                m.runs.append(train_segments(setting, model, row_links, hosts, tmp))
                note = "  ".join(f"{s.link} {s.seconds / s.steps:.3f}s" for s in m.runs[-1])
            except Refused as exc:
                m.refused, note = str(exc), f"n/a: {exc}"
            except Failed as exc:
                m.failure, note = str(exc).splitlines()[0], f"FAIL: {exc}"
            print(f"  round {round_ + 1}/{runs}: {model_key}: {setting.name}: {note} "
                  f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    return measured


def fmt_range(row: Row, scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    if row.failed:
        return "-"
    low, high = (fmt.format(v * scale) for v in (min(row.values), max(row.values)))
    return f"{fmt.format(row.median * scale)} ({low}..{high})"


def best_single(measured: dict[str, Measured]) -> tuple[str, float]:
    singles = [(m.row(UNLIMITED).median, name) for name, m in measured.items()
               if m.setting.ranks == 1 and not m.status()]
    if not singles:
        return "none", float("nan")
    seconds, name = min(singles)
    return name, seconds


def report_model(model_key: str, measured: dict[str, Measured], links: list[str]) -> None:
    model = MODELS[model_key]
    single_name, single = best_single(measured)
    print(f"\n{model.title} ({model.grad_bytes / 1e6:.1f} MB of gradients, {model.max_seqs} seqs x "
          f"{model.seq_len} frames per rank and step); best single process: {single_name}, "
          f"{single:.3f} s/step")
    print("  s/step: wall time between rank 0's step lines on that link, median of the runs (min..max);\n"
          "  compute-only: the same runs' steps on the unlimited veth link (both ranks computing, the "
          "reduction nearly free);\n  speed-up: 2 x best single / 2-rank step; MB sent: per host and step, "
          "from the link's byte counters")
    print(f"  {'row':44} {'link':9} {'s/step median (min..max)':>27} {'compute-only s/step':>20} "
          f"{'speed-up':>8} {'MB sent/step/host':>18}")
    for name, m in measured.items():
        if m.status():
            print(f"  {name:44} {m.status()}")
            continue
        compute = m.row(UNLIMITED)
        for link in ([UNLIMITED] if m.setting.ranks == 1 else links):
            row = m.row(link)
            speedup = m.setting.ranks * single / row.median
            print(f"  {name:44} {link:9} {fmt_range(row):>27} {fmt_range(compute):>20} {speedup:>7.2f}x "
                  f"{fmt_range(m.row(link, 'bytes'), 1e-6, '{:.2f}'):>18}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", default="100mbit,1gbit", help="comma-separated: " + ", ".join(LINKS))
    parser.add_argument("--models", default="small,large", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--runs", type=int, default=3, help="runs per row (rows take turns), and "
                        "repetitions of each allreduce; default 3, the fewest a verdict decides on")
    parser.add_argument("--rows", default="", help="only rows whose name matches this regular expression "
                        "(the single-process rows always run)")
    parser.add_argument("--full", action="store_true", help="all rows (bf16, more Horovod settings, "
                        "param sync 10/20/50 on both models, every feature alone on the small model)")
    parser.add_argument("--quick", action="store_true", help="1 run per row, the allreduce 1 repetition "
                        "(every verdict then says INCONCLUSIVE)")
    parser.add_argument("--no-allreduce", action="store_true", help="skip the allreduce-alone rows")
    parser.add_argument("--no-quality", action="store_true", help="skip the wire-format quality runs")
    parser.add_argument("--allreduce-only", action="store_true", help="only the link rates and the "
                        "allreduce-alone rows (no training rows, no quality runs)")
    parser.add_argument("--allreduce-worker", help=argparse.SUPPRESS)
    parser.add_argument("--wires", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--tcp-receive", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tcp-send", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.allreduce_worker:
        return allreduce_worker(args.allreduce_worker.split(","), args.reps, args.wires.split(","))
    if args.tcp_receive:
        return tcp_receive(args.tcp_receive)
    if args.tcp_send:
        return tcp_send(args.tcp_send[0], int(args.tcp_send[1]), int(args.tcp_send[2]))

    reason = ("it needs root (network namespaces and tc)" if os.geteuid() != 0 else
              SimulatedHosts.unavailable() or SimulatedHosts.tc_unavailable())
    if reason:
        print(f"bench_multihost: skipped: {reason}")
        return
    links = [link for link in args.links.split(",") if link]
    models = [m for m in args.models.split(",") if m]
    runs = 1 if args.quick else args.runs
    started = time.perf_counter()
    with SimulatedHosts.create() as hosts, tempfile.TemporaryDirectory(prefix="bench_multihost-") as tmp:
        rates = {}
        for link in [UNLIMITED, *links]:
            set_link(hosts, link)
            count = 50_000_000 if link == "100mbit" else 200_000_000
            rates[link] = measure_link(hosts, count)
            limit = (f"; tc tbf rate {LINKS[link] / 1e6:.0f} Mbit/s, "
                     f"{100 * rates[link] / LINKS[link]:.1f}% of it)" if link in LINKS else ")")
            print(f"link {link}: measured {rates[link] / 1e6:.1f} Mbit/s (TCP, {count / 1e6:.0f} MB from "
                  f"host 0 to host 1{limit}", flush=True)
        hosts.unlimit_rate()
        alone = {}
        if not args.no_allreduce:
            for link in links:
                reps = runs
                for result in allreduce_alone(hosts, link, models, reps):
                    alone[(result["model"], link, result["wire"])] = result
                for result in allreduce_alone(hosts, link, models, reps, OPEN_MPI_ALLREDUCE, "float32"):
                    alone[(result["model"], link, "float32, Open MPI's MPI_Allreduce")] = result
            report_allreduce(alone, rates)
        measured = {}
        for key in ([] if args.allreduce_only else models):
            rows = [s for s in settings(key, args.full) if s.ranks == 1 or re.search(args.rows, s.name)]
            measured[key] = run_rows(key, rows, links, runs, hosts, tmp)
            report_model(key, measured[key], links)
    print()
    for line in verdicts(measured, alone, rates, links):
        print(line)
    if not (args.no_quality or args.allreduce_only):
        quality(args.quick)
    print(f"\nbench_multihost: {(time.perf_counter() - started) / 60:.1f} min")


def report_allreduce(alone: dict, rates: dict) -> None:
    print("\nallreduce alone (engine mpi communicator, tf.function around allreduce_tensors, 2 ranks on 2 "
          "hosts): median (min..max) s, bus bandwidth = bytes x 2(n-1)/n / time (fp16, bf16: the float32 "
          "bytes they stand for)")
    for (model, link, wire), r in alone.items():
        if "refused" in r:
            print(f"  {MODELS[model].title:20} {link:8} {wire:38} n/a: {r['refused']}")
            continue
        t = statistics.median(r["times"])
        bus = r["bytes"] * 8 / t  # 2(n-1)/n = 1 for n = 2
        print(f"  {MODELS[model].title:20} {link:8} {wire:38} {t:.3f} ({min(r['times']):.3f}.."
              f"{max(r['times']):.3f}) s  bus {bus / 1e6:.1f} Mbit/s = {100 * bus / rates[link]:.1f}% "
              "of the link")


def alone_side(alone: dict, model: str, link: str, wire: str) -> Side | None:
    """The allreduce-alone times of (model, link, wire) as a verdict side; None when not measured (a
    wire the communicator refuses is a failed side)."""
    r = alone.get((model, link, wire))
    if r is None:
        return None
    name = f"allreduce {wire} s"
    return Side(name, tuple(r["times"])) if "times" in r else Side(name, (), r.get("refused", "no run"))


def verdicts(measured: dict, alone: dict, rates: dict, links: list[str]) -> list[str]:
    """One line per target of issue 20 (the quality target is ``quality``'s), each by ``timing.compare``:
    medians with ranges, INCONCLUSIVE where the ranges overlap."""
    large = measured.get("large", {})
    out = [allreduce_verdict(alone, rates, link) for link in links]
    out.append(overlap_verdict(large, alone, links))
    for link in links:
        f32, f16 = alone_side(alone, "large", link, "float32"), alone_side(alone, "large", link, "fp16")
        if f32 is None or f16 is None:
            out.append(f"n/a: fp16 on the wire, {link}: not measured (--models/--no-allreduce)")
            continue
        ratio = f32.median / f16.median if not (f32.failed or f16.failed) else float("nan")
        out.append(compare(f32, f16, f"fp16 on the wire, {link}, large model: the allreduce {ratio:.2f}x "
                           "faster than float32 (target >= 1.8x: float32's time >= 1.8 x fp16's)",
                           better="higher", factor=1.8))
    if "100mbit" in links and large:
        out.append(horovod_verdict(large))
    for key, rows in measured.items():
        single_name, _ = best_single(rows)
        for name, m in rows.items():
            if not name.startswith("param") or "100mbit" not in links:
                continue
            if m.refused:
                out.append(f"n/a: {key}: {name} at 100mbit: {m.status()}")
                continue
            step = Side.of(m.row("100mbit"), name=f"'{name}' s/step")
            single = Side.of(rows[single_name].row(UNLIMITED), name=f"'{single_name}' s/step") \
                if single_name in rows else Side("best single process", (), "no single-process row")
            speedup = 2 * single.median / step.median if not (step.failed or single.failed) else float("nan")
            out.append(compare(step, single, f"{MODELS[key].title}: {name} at 100mbit: {speedup:.2f}x the "
                               "best single process (target >= 1.8x: the step <= 2/1.8 x the single "
                               "process's)", better="lower", factor=2 / 1.8))
    return out


def allreduce_verdict(alone: dict, rates: dict, link: str) -> str:
    """The 100 MB allreduce reaches >= 85% of the link's measured rate (bus bandwidth): its times against
    the time that 85% would take."""
    side = alone_side(alone, "large", link, "float32")
    if side is None:
        return f"n/a: allreduce of the large model on {link}: not measured (--models/--no-allreduce)"
    mb, bits = MODELS["large"].grad_bytes / 1e6, MODELS["large"].grad_bytes * 8
    bus = f"{100 * bits / side.median / rates[link]:.1f}%" if not side.failed else "FAIL"
    low_high = f" ({100 * bits / side.high / rates[link]:.1f}..{100 * bits / side.low / rates[link]:.1f}%)" \
        if not side.failed else ""
    return compare(side, Side.target("85% of the link's time s", bits / (0.85 * rates[link])),
                   f"allreduce of {mb:.0f} MB on {link}: bus bandwidth {bus}{low_high} of the measured "
                   f"{rates[link] / 1e6:.1f} Mbit/s (target >= 85%)", better="lower")


def overlap_verdict(large: dict, alone: dict, links: list[str]) -> str:
    """On the link where the reduction alone takes about as long as the compute: a bucketed grad step
    takes at most 1.15 x max(compute, reduction)."""
    grad = large.get("grad, mpi, no overlap (bucket 0)")
    buckets = [m for name, m in large.items() if name.startswith("grad, mpi, ") and "bucket" in name
               and "fp16" not in name and m is not grad and not m.refused]
    if grad is None or not buckets or grad.refused:
        return "n/a: overlap target: needs the large model's 'no overlap' row and a bucket row"
    if grad.failure:
        return compare(Side.of(grad.row(UNLIMITED)), Side("-", (0.0,)), "overlap target")
    compute = Side.of(grad.row(UNLIMITED), name="compute-only s/step")
    sides = {link: alone_side(alone, "large", link, "float32") for link in links}
    sides = {link: side for link, side in sides.items() if side is not None and not side.failed}
    if not sides:
        return "n/a: overlap target: no allreduce-alone time"
    link = min(sides, key=lambda k: abs(sides[k].median / compute.median - 1))
    reduction = sides[link]
    larger = max(compute, reduction, key=lambda side: side.median)
    failed = [m for m in buckets if m.failure]
    if failed:  # a bucket row that failed is not left out of "the best bucket row"
        return compare(Side.of(failed[0].row(link)), larger, f"overlap on {link}", better="lower",
                       factor=1.15)
    bucket = min(buckets, key=lambda m: m.row(link).median)
    step = Side.of(bucket.row(link), name=f"'{bucket.setting.name}' s/step")
    return compare(step, larger, f"overlap on {link}, large model: the bucketed step "
                   f"{step.median / larger.median:.2f}x the larger of compute-only ({compute.median:.3f}s) "
                   f"and the reduction alone ({reduction.median:.3f}s) (target <= 1.15x); without buckets "
                   f"{grad.row(link).median:.3f}s/step", better="lower", factor=1.15)


def horovod_verdict(large: dict) -> str:
    """100 Mbit/s, large model: the engine's best row is faster than Horovod's best row. Every tagged row
    counts: one that failed or was refused makes the verdict FAIL, naming it (a side's best row is only
    its best when every row of it was measured)."""
    tagged = {tag: [m for m in large.values() if m.setting.tag == tag] for tag in ("engine", "horovod")}
    if not (tagged["engine"] and tagged["horovod"]):
        return "n/a: engine vs Horovod at 100mbit, large model: a side has no row (--rows)"
    unmeasured = [m for rows in tagged.values() for m in rows if m.status()]
    if unmeasured:
        return ("FAIL: engine vs Horovod at 100mbit, large model: "
                + "; ".join(f"'{m.setting.name}' {m.status()}" for m in unmeasured))
    best = {tag: min(rows, key=lambda m: m.row("100mbit").median) for tag, rows in tagged.items()}
    ours, theirs = (Side.of(best[tag].row("100mbit"), name=f"{tag} '{best[tag].setting.name}' s/step")
                    for tag in ("engine", "horovod"))
    return compare(ours, theirs, f"100mbit, large model: engine best vs Horovod best = "
                   f"{theirs.median / ours.median:.2f}x (target > 1x: the engine's step shorter)",
                   better="lower")


def quality(quick: bool) -> None:
    """fp16/bf16's dev score against float32's seed-to-seed spread: helper "wire"'s
    ``benchmarks/wire_quality.py``, when this checkout has it."""
    try:
        from wire_quality import quality_lines, wire_format_quality
    except ImportError:
        print("n/a: fp16 quality (dev score within the seed-to-seed spread of float32): needs "
              "benchmarks/wire_quality.py (wire_format_quality), not in this checkout")
        return
    epochs = 2 if quick else 5
    runs = wire_format_quality(formats=(None, "fp16"), seeds=(1, 2) if quick else (1, 2, 3), epochs=epochs)
    print("\n".join(quality_lines(runs, epochs)))


if __name__ == "__main__":
    main()
