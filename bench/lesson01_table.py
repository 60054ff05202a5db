#!/usr/bin/env python3
"""Prints lesson 01's table from a bench_sync run: per depth, the tensors,
the payload, stage 01's sync_grads (one all-reduce per parameter), one flat
all-reduce of the same bytes, and their ratio. Times are the medians of the
run's repetitions (--benchmark_repetitions=3 or more).

Usage: lesson01_table.py BENCH_SYNC_JSON
(./kit bench 01 runs bench_sync and then this.)
"""
import json
import re
import sys

NAME = re.compile(r"^(BM_Stage01SyncGrads|BM_OneFlatAllreduce)/(\d+)/")


def medians(path):
    """{(benchmark, depth): median record}, from the repetitions' aggregates."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        m = NAME.match(b["name"])
        if m:
            out[(m.group(1), int(m.group(2)))] = b
    return out, data.get("context", {})


def ms(record):
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[record["time_unit"]]
    return record["real_time"] * scale


def main(path):
    rows, context = medians(path)
    depths = sorted({d for (_, d) in rows})
    if not depths:
        sys.exit(f"lesson01_table: no median of BM_Stage01SyncGrads or BM_OneFlatAllreduce in "
                 f"{path}; run bench_sync with --benchmark_repetitions=3")
    reps = next(iter(rows.values()))["repetitions"]
    print(f"\nlesson 01: stage 01's sync vs one flat all-reduce, medians of {reps} repetitions "
          f"({context.get('num_cpus', '?')} CPUs)\n")
    print("| depth D | tensors | payload | stage 01 `sync_grads` | one flat all-reduce | ratio |")
    print("|---|---|---|---|---|---|")
    for d in depths:
        naive = rows.get(("BM_Stage01SyncGrads", d))
        flat = rows.get(("BM_OneFlatAllreduce", d))
        if naive is None or flat is None:
            continue
        print(f"| {d} | {int(naive['allreduces'])} | {naive['MB']:.2f} MB | {ms(naive):.1f} ms | "
              f"{ms(flat):.1f} ms | {ms(naive) / ms(flat):.1f}x |")


if __name__ == "__main__":
    main(sys.argv[1])
