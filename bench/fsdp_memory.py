#!/usr/bin/env python3
"""Memory and bytes per rank of DDP, ZeRO-1 and FSDP's three strategies.

Trains the deep model with momentum 0.9 through the demos of stage 08 (DDP),
stage 09 (ZeRO's reduce-scatter form: ZeRO-1) and stage 10 (FSDP under
NO_SHARD, SHARD_GRAD_OP and FULL_SHARD, each Linear a unit) at each world
size, and records, as the library counted them on the tensor storage
(tp::memory, in each demo's --json): what each rank holds at the end
(parameters, gradients, optimizer state) and at its peak (parameters,
gradients, and the three together); and what the last step handed to each
kind of collective (the counters: an all-gather's gathered output and a
reduce-scatter's input, each the whole unit). These are counts, the same
on any machine. Writes --out (bench/results/fsdp_memory.json by default),
whole or not at all (atomic_file.py); --markdown prints lesson 10's tables
(tests/docs/lesson_tables_test.py checks that the lesson holds them as printed).

Output:
  {"config": {model, steps, momentum, demo_args},
   "runs": [{"form", "stage", "world_size", "matches_reference",
             "model_bytes", "ranks": [{"rank", "parameter_bytes",
             "gradient_bytes", "optimizer_state_bytes",
             "peak_parameter_bytes", "peak_gradient_bytes",
             "peak_model_state_bytes", "allreduce_bytes",
             "allgather_bytes", "reduce_scatter_bytes"}]}]}

Run: python3 bench/fsdp_memory.py build/lessons/demo_08 build/lessons/demo_09
       build/lessons/demo_10 [--out FILE] [--world-sizes 1,2,3,4] [--markdown]
./kit bench runs it (some seconds).
"""

import argparse
import json
import os
import sys
import tempfile

from atomic_file import write_text
from demo_json import run_demo

COMMON = ["--model", "deep", "--momentum", "0.9", "--steps", "4"]
# (form, stage, demo flags, the lesson's name for it)
FORMS = [("ddp", "08", [], "DDP (stage 08)"),
         ("zero1", "09", ["--reduce-scatter"], "ZeRO-1 (stage 09, reduce-scatter form)"),
         ("no_shard", "10", ["--sharding", "none"], "FSDP `NO_SHARD`"),
         ("grad_op", "10", ["--sharding", "grad-op"], "FSDP `SHARD_GRAD_OP` (ZeRO-2)"),
         ("full", "10", ["--sharding", "full"], "FSDP `FULL_SHARD` (ZeRO-3)")]
MEMORY_KEYS = ["parameter_bytes", "gradient_bytes", "optimizer_state_bytes",
               "peak_parameter_bytes", "peak_gradient_bytes", "peak_model_state_bytes"]


def last_step(per_micro, steps):
    """What the last step's micro-batches handed over (one per step here)."""
    per_step = len(per_micro) // steps
    return sum(per_micro[-per_step:]) if per_step else 0


def measure(demos, world_sizes, tmp):
    runs = []
    for w in world_sizes:
        for form, stage, flags, _ in FORMS:
            data = run_demo("fsdp_memory.py", demos[stage],
                            COMMON + ["--world-size", str(w)] + flags,
                            os.path.join(tmp, f"{form}.w{w}.json"))
            steps = data["config"]["steps"]
            ranks = []
            for r in data["ranks"]:
                mem = r.get("memory")
                if mem is None or any(k not in mem for k in MEMORY_KEYS):
                    sys.exit(f"fsdp_memory.py: demo_{stage} reported no memory (or not every "
                             f"kind of it) for rank {r['rank']}")
                ranks.append(dict(rank=r["rank"], **{k: mem[k] for k in MEMORY_KEYS},
                                  allreduce_bytes=last_step(r["allreduce_bytes_per_micro"], steps),
                                  allgather_bytes=last_step(r["allgather_bytes_per_micro"], steps),
                                  reduce_scatter_bytes=last_step(
                                      r["reduce_scatter_bytes_per_micro"], steps)))
            runs.append({"form": form, "stage": stage, "world_size": w,
                         "matches_reference": data["final"]["matches_reference"],
                         "model_bytes": ranks[0]["parameter_bytes"] if form == "ddp" else None,
                         "ranks": ranks})
            print(f"fsdp_memory.py: W = {w}, {form:8s} peak params+grads+state, largest rank: "
                  f"{max(r['peak_model_state_bytes'] for r in ranks) / 1024:.1f} KiB",
                  file=sys.stderr, flush=True)
    return runs


def kib(b):
    return f"{b / 1024:.1f}"


def markdown(runs):
    """Lesson 10's tables: memory and bytes at the largest world size, and
    the peak against W. Each rank's largest value (ranks differ by padding
    at most)."""
    w_max = max(r["world_size"] for r in runs)
    model = next(r["model_bytes"] for r in runs if r["form"] == "ddp" and r["world_size"] == w_max)
    largest = lambda run, key: max(rank[key] for rank in run["ranks"])
    out = [f"| W = {w_max}, KiB per rank (the largest) | params | grads | momentum | peak params "
           f"| peak grads | peak params+grads+state |",
           "|---|---|---|---|---|---|---|"]
    at_w = [r for r in runs if r["world_size"] == w_max]
    names = {form: name for form, _, _, name in FORMS}
    for run in at_w:
        out.append(f"| {names[run['form']]} | " +
                   " | ".join(kib(largest(run, k)) for k in MEMORY_KEYS) + " |")
    out += ["", f"| W = {w_max}, per step and rank | all-reduce | all-gather | reduce-scatter "
            f"| sent on a ring, in models (N = {kib(model)} KiB) |",
            "|---|---|---|---|---|"]
    ring = (w_max - 1) / w_max
    for run in at_w:
        ar, ag, rs = (largest(run, k) for k in ["allreduce_bytes", "allgather_bytes",
                                                "reduce_scatter_bytes"])
        sent = (2 * ar + ag + rs) * ring / model
        out.append(f"| {names[run['form']]} | {kib(ar)} KiB | {kib(ag)} KiB | {kib(rs)} KiB "
                   f"| {sent:.3f} N |")
    sizes = sorted({r["world_size"] for r in runs})
    if len(sizes) > 1:
        out += ["", "| peak params+grads+state, KiB (largest rank) | " +
                " | ".join(f"W = {w}" for w in sizes) + " |",
                "|---|" + "---|" * len(sizes)]
        for form, _, _, name in FORMS:
            cells = [kib(largest(next(r for r in runs if r["form"] == form and r["world_size"] == w),
                                 "peak_model_state_bytes")) for w in sizes]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demo_08", help="the demo_08 program (build/lessons/demo_08)")
    parser.add_argument("demo_09", help="the demo_09 program (build/lessons/demo_09)")
    parser.add_argument("demo_10", help="the demo_10 program (build/lessons/demo_10)")
    parser.add_argument("--world-sizes", default="1,2,3,4", help="default 1,2,3,4")
    parser.add_argument("--markdown", action="store_true",
                        help="print lesson 10's tables on stdout")
    parser.add_argument("--out", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "fsdp_memory.json"),
        help="where the results go (default bench/results/fsdp_memory.json)")
    args = parser.parse_args()
    try:
        world_sizes = [int(x) for x in args.world_sizes.split(",")]
    except ValueError:
        parser.error(f"--world-sizes takes numbers separated by commas, got '{args.world_sizes}'")
    if any(w < 1 for w in world_sizes):
        parser.error(f"--world-sizes: each must be at least 1, got '{args.world_sizes}'")
    demos = {"08": args.demo_08, "09": args.demo_09, "10": args.demo_10}
    with tempfile.TemporaryDirectory(prefix="tp-fsdp-memory-") as tmp:
        runs = measure(demos, world_sizes, tmp)
    bad = [f"{r['form']} at W = {r['world_size']}" for r in runs if not r["matches_reference"]]
    if bad:
        sys.exit(f"fsdp_memory.py: did not match the reference: {', '.join(bad)}")
    result = {"config": {"model": "deep", "steps": 4, "momentum": 0.9, "demo_args": COMMON},
              "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"fsdp_memory.py: wrote {args.out}", file=sys.stderr)
    if args.markdown:
        print(markdown(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
