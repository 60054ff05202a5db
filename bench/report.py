#!/usr/bin/env python3
"""Reads the benchmarks' JSON results, fits, compares, and draws them.

Input: a folder of results as `./kit bench` writes them (bench/results/):
  bench_allreduce.w<W>.json   bench/bench_allreduce.cc at W ranks
  bench_sync.w<W>.json        bench/bench_sync.cc at W ranks
  bench_step.w<W>.json        bench/bench_step.cc at W ranks
  bench_hooks.w<W>.json       bench/bench_hooks.cc at W ranks
  hook_losses.json            bench/hook_losses.py: stage 08's loss per step
                              with each comm hook
  bench_zero.w<W>.json        bench/bench_zero.cc at W ranks
  bench_fsdp.w<W>.json        bench/bench_fsdp.cc at W ranks
  zero_memory.json            bench/zero_memory.py: memory per rank of stage
                              08 and stage 09 at W = 1..4
  torch_ddp.w<W>.json         bench/torch_ddp.py (only if PyTorch is installed)
  round<R>.bench_step.json,   short alternating runs of the kit's stage 03
  round<R>.torch_ddp.json     and PyTorch's DDP at 2 ranks, default caps
  link.json                   bench/link_bench.py: stage 02 against stage 03
                              with one rank per host on shaped links
                              (./kit bench --link RATES)
Any of them may be missing: its part of the report says so.

Output, in --out (the input folder unless given):
  summary.md         the tables below and the kit's targets, met or not;
                     also printed
  allreduce.png      one all-reduce against its size: median with p90, the
                     fitted alpha-beta line, bus bandwidth
  sync.png           stage 01 against stage 02 against one flat all-reduce,
                     and stage 02's bucket-cap sweep beside the alpha-beta
                     prediction, the best cap marked
  step.png           a training step without DDP and with stages 01-03 (and
                     PyTorch's DDP), split into its phases; the share of a
                     step spent in sync against the batch
  hooks.png          stage 08's comm hooks: bytes all-reduced per step and
                     rank, and the step's time (interleaved medians)
  hook_losses.png    rank 0's loss per step with each hook against no hook,
                     and the distance between them
  zero.png           stage 09: optimizer state per rank against W (plain
                     DDP against ZeRO, with 1/W of DDP's drawn), and the
                     step time of each optimizer (interleaved medians)
  link.png           stage 02's and stage 03's step against the link's
                     rate, beside compute, sync and the ideal max(compute,
                     sync), loopback at the right, and PyTorch's DDP
                     step where measured (link.json)
  link_caps.png      with --cap-sweep: stage 02's and stage 03's step
                     against both caps on each link, beside the alpha-beta
                     prediction of stage 03's (link_bench.predict_step03)
The figures need python3-matplotlib (./kit installs it); --no-plots skips
them.

The alpha-beta model: one all-reduce of n bytes takes t(n) = alpha + beta*n.
alpha is read off the small sizes, beta off the large ones (fit_alpha_beta),
once from the medians (a typical all-reduce) and once from the means. A
sync that issues k all-reduces of B bytes in all, one after another, takes
about k*alpha + beta*B with the means' fit (a sum of k all-reduces pays
their stalls too): the prediction drawn beside the cap sweep.

--link-only reads link.json alone and writes link.md, link.png and
link_caps.png, leaving summary.md and the other figures as they are (./kit
bench --link: a results folder may hold only some of the other files).

Run: python3 bench/report.py [RESULTS_DIR] [--out DIR] [--no-plots] [--link-only]
"""

import argparse
import json
import math
import os
import re
import sys

from alpha_beta import fit_alpha_beta, median
from atomic_file import load_json, save_figure, write_text
import fsdp_figure
from link_bench import summary as link_summary, table as link_table

# The kit's targets (measured here, never by timed tests).
TARGET_BUCKETED_SPEEDUP = 5.0     # stage 02 sync vs stage 01 sync, depth 64, 2 ranks
TARGET_BUCKETED_VS_FLAT = 1.3     # stage 02 sync vs one flat all-reduce, depth 64, 2 ranks
TARGET_HIDDEN = 0.30              # share of stage 02's sync that stage 03 hides, 2 ranks
TARGET_VS_TORCH = 1.25            # stage 03 step vs PyTorch DDP step, 2 ranks
TARGET_KIT_OVERHEAD = 1.1         # kit all-reduce vs raw Gloo, median

# The targets as the report names them, in the order it lists them; one the
# results do not cover is listed as "not measured".
TARGETS = [
    ("stage 02 sync faster than stage 01, depth 64, 2 ranks", f">= {TARGET_BUCKETED_SPEEDUP:g}x"),
    ("stage 02 sync / one flat all-reduce, depth 64, 2 ranks", f"<= {TARGET_BUCKETED_VS_FLAT}x"),
    ("kit all-reduce / raw Gloo, 2 ranks (median over sizes)", f"<= {TARGET_KIT_OVERHEAD}x"),
    ("stage 03 hides stage 02's sync, 2 ranks, default caps, batch 64",
     f">= {TARGET_HIDDEN * 100:.0f}%"),
    ("kit stage 03 step / PyTorch DDP step, 2 ranks, default caps", f"<= {TARGET_VS_TORCH}x"),
]


# ---- reading ---------------------------------------------------------------

def load(folder):
    """{(program, world_size): {"context": ..., "runs": {name: run}}}."""
    results = {}
    if not os.path.isdir(folder):
        return results
    for file in sorted(os.listdir(folder)):
        m = re.fullmatch(r"(bench_allreduce|bench_sync|bench_step|bench_hooks|bench_zero|bench_fsdp|torch_ddp)\.w(\d+)\.json", file)
        if not m:
            continue
        with open(os.path.join(folder, file)) as f:
            data = json.load(f)
        results[(m.group(1), int(m.group(2)))] = {"context": data.get("context", {}),
                                                  "runs": runs_of(data, file)}
    return results


def runs_of(data, file):
    """{registered name: run} of one program's JSON. With
    --benchmark_repetitions=N a name has N runs (or, with
    --benchmark_report_aggregates_only, only aggregates): each number is then
    the median over the repetitions (the "median" aggregate where it is the
    only thing there)."""
    repetitions = {}
    medians = {}
    for run in data.get("benchmarks", []):
        name = plain_name(run.get("run_name", run["name"]))
        if run.get("run_type", "iteration") == "iteration":
            repetitions.setdefault(name, []).append(run)
        elif run.get("aggregate_name") == "median":
            medians[name] = run
    runs = {}
    for name in set(repetitions) | set(medians):
        reps = repetitions.get(name)
        if not reps:
            runs[name] = medians[name]
        elif len(reps) == 1:
            runs[name] = reps[0]
        else:
            merged = dict(reps[0])
            for key, value in reps[0].items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    merged[key] = median([r.get(key, value) for r in reps])
            runs[name] = merged
    if data.get("benchmarks") and not runs:
        print(f"report.py: {file}: no runs it can read", file=sys.stderr)
    return runs


def plain_name(name):
    """BM_X/64/iterations:40/real_time -> BM_X/64: the name as registered."""
    parts = [p for p in name.split("/") if not re.fullmatch(
        r"iterations:\d+|repeats:\d+|real_time|manual_time|min_time:[\d.]+s?|threads:\d+", p)]
    return "/".join(parts)


def arg(name, key):
    """The value of `key` in a name such as BM_X/cap_kib:0/batch:16 or BM_X/64."""
    parts = name.split("/")[1:]
    for p in parts:
        if ":" in p and p.split(":")[0] == key:
            return int(p.split(":")[1])
    if key is None and parts:
        return int(parts[0])
    return None


def load_rounds(folder):
    """[(round, kit bench_step runs, PyTorch runs)] for each complete round."""
    rounds = []
    for r in range(1, 100):
        pair = []
        for program in ("bench_step", "torch_ddp"):
            path = os.path.join(folder, f"round{r}.{program}.json")
            if not os.path.exists(path):
                return rounds
            with open(path) as f:
                pair.append(runs_of(json.load(f), path))
        rounds.append((r, pair[0], pair[1]))
    return rounds


def runs_named(result, base):
    return {n: r for n, r in result["runs"].items() if n.split("/")[0] == base}


def ms(run, mean=False):
    """A run's median in ms (p50 if it has one), or its mean (Google Benchmark's time)."""
    if "p50_ms" in run and not mean:
        return run["p50_ms"]
    if "p50_us" in run and not mean:
        return run["p50_us"] / 1e3
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[run.get("time_unit", "ns")]
    return run["real_time"] * scale


def allreduce_rows(result):
    """{impl: [(bytes, p50 s, p90 s, busbw GB/s, mean s)]} sorted by size, for
    impl "Kit" and "Gloo" (measured interleaved, in the same runs)."""
    rows = {}
    for name, run in runs_named(result, "BM_Allreduce").items():
        n = arg(name, None)
        w = int(result["context"].get("world_size", 2))
        for impl, key in (("Kit", "kit"), ("Gloo", "gloo")):
            p50 = run[key + "_p50_us"] * 1e-6
            busbw = n / p50 / 1e9 * 2 * (w - 1) / w if w > 1 else 0.0  # the kit's is a counter
            rows.setdefault(impl, []).append((n, p50, run[key + "_p90_us"] * 1e-6, busbw,
                                              run[key + "_mean_us"] * 1e-6))
    for data in rows.values():
        data.sort()
    return rows


def human_bytes(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


# ---- the report ------------------------------------------------------------

class Report:
    def __init__(self):
        self.lines = []
        self.targets = {}  # what -> (measured, met)

    def add(self, *lines):
        self.lines.extend(lines)

    def table(self, header, rows):
        self.add("| " + " | ".join(header) + " |", "|" + "---|" * len(header))
        for row in rows:
            self.add("| " + " | ".join(str(c) for c in row) + " |")
        self.add("")

    def target(self, what, measured, met):
        assert what in dict(TARGETS), what
        self.targets[what] = (measured, "yes" if met else "**no**")

    def text(self):
        out = list(self.lines)
        out += ["## Targets", "", "| target | measured | goal | met |", "|---|---|---|---|"]
        for what, goal in TARGETS:
            measured, met = self.targets.get(what, ("not measured", "-"))
            out.append(f"| {what} | {measured} | {goal} | {met} |")
        return "\n".join(out) + "\n"


def context_line(results):
    for (program, w), result in sorted(results.items()):
        c = result["context"]
        cores = c.get("cores", c.get("num_cpus", "?"))
        return (f"Measured on {cores} core(s) ({c.get('host_name', 'this machine')}, "
                f"{c.get('date', '?')}); ranks share the cores.")
    return "No results found."


def report_allreduce(results, report, fits):
    report.add("## One all-reduce against its size (bench_allreduce)", "")
    found = False
    for (program, w), result in sorted(results.items()):
        if program != "bench_allreduce":
            continue
        found = True
        rows = allreduce_rows(result)
        for impl, data in rows.items():
            fits[(impl, w)] = fit_alpha_beta([d[0] for d in data], [d[1] for d in data])
            fits[(impl, w, "mean")] = fit_alpha_beta([d[0] for d in data], [d[4] for d in data])
        kit = {d[0]: d for d in rows.get("Kit", [])}
        gloo = {d[0]: d for d in rows.get("Gloo", [])}
        torch = {}
        if ("torch_ddp", w) in results:
            for name, run in runs_named(results[("torch_ddp", w)], "BM_TorchAllreduce").items():
                torch[arg(name, None)] = run["p50_us"]
        report.add(f"### {w} ranks", "")
        table = []
        ratios = []
        for n in sorted(kit):
            k = kit[n]
            g = gloo.get(n)
            # The median of the per-iteration ratios (a counter): each pair
            # was measured a moment apart.
            ratio = result["runs"].get(f"BM_Allreduce/{n}", {}).get("kit_over_gloo")
            if ratio:
                ratios.append((n, ratio))
            row = [human_bytes(n), f"{k[1] * 1e6:.1f}", f"{k[2] * 1e6:.1f}", f"{k[3]:.3f}",
                   f"{g[1] * 1e6:.1f}" if g else "-", f"{ratio:.2f}x" if ratio else "-"]
            if torch:
                row += [f"{torch[n]:.1f}" if n in torch else "-",
                        f"{torch[n] / (g[1] * 1e6):.2f}x" if n in torch and g else "-"]
            table.append(row)
        report.table(["size", "kit p50 us", "kit p90 us", "kit busbw GB/s", "Gloo p50 us",
                      "kit/Gloo"] + (["PyTorch p50 us", "PyTorch/Gloo"] if torch else []),
                     table)
        for impl in ("Kit", "Gloo"):
            for key, what in (((impl, w), "medians"), ((impl, w, "mean"), "means")):
                fit = fits.get(key)
                if fit:
                    alpha, beta = fit
                    report.add(f"- alpha-beta fit to the {what}, {impl.lower()}: alpha = "
                               f"{alpha * 1e6:.1f} us per all-reduce, beta = {beta * 1e9:.3f} ns "
                               f"per byte (1/beta = "
                               f"{1 / beta / 1e9 if beta > 0 else float('inf'):.2f} GB/s)")
        handoff = result["runs"].get("BM_KitHandoff")
        if handoff:
            report.add(f"- the kit's hand-off alone (an empty all-reduce: queued, run on the "
                       f"communication thread, waited for; no Gloo): p50 "
                       f"{handoff['p50_us']:.1f} us, p90 {handoff['p90_us']:.1f} us")
        count_check = result["runs"].get("BM_CountCheck")
        if count_check:
            report.add(f"- the collective count check the trainer makes at every step's end "
                       f"(check_collective_count: a mapped file under spawn, one round trip to the "
                       f"TCP store when launched): p50 "
                       f"{count_check['p50_us']:.1f} us, p90 {count_check['p90_us']:.1f} us")
        report.add("- kit and raw Gloo ran interleaved (one of each per iteration); kit/Gloo is "
                   "the median of the per-iteration ratios, fair even when the machine's load "
                   "moves. PyTorch ran in its own process at another time.")
        if ratios:
            worst = max(ratios, key=lambda r: r[1])
            med = median([r for _, r in ratios])
            report.add(f"- kit over Gloo at the median: {med:.2f}x across sizes, "
                       f"worst {worst[1]:.2f}x at {human_bytes(worst[0])}", "")
            if w == 2:
                report.target("kit all-reduce / raw Gloo, 2 ranks (median over sizes)",
                              f"{med:.2f}x (worst {worst[1]:.2f}x at {human_bytes(worst[0])})",
                              med <= TARGET_KIT_OVERHEAD)
        report.add("")
    if not found:
        report.add("Not measured (bench_allreduce.w*.json missing).", "")


def cap_sweep(result, fit):
    """[(cap MiB, measured ms, predicted ms or None, allreduces)]."""
    rows = []
    for name, run in runs_named(result, "BM_Stage02BucketCap").items():
        cap_mib = arg(name, None) / 1024
        k = run.get("allreduces", 0)
        predicted = None
        if fit:
            predicted = (k * fit[0] + fit[1] * run.get("MB", 0) * 1e6) * 1e3
        rows.append((cap_mib, ms(run), predicted, k))
    return sorted(rows)


def report_sync(results, report, fits):
    report.add("## Gradient sync: per parameter, bucketed, flat (bench_sync)", "")
    found = False
    for (program, w), result in sorted(results.items()):
        if program != "bench_sync":
            continue
        found = True
        report.add(f"### {w} ranks", "")
        by = {}
        for base in ("BM_Stage01SyncGrads", "BM_Stage02SyncGrads", "BM_OneFlatAllreduce"):
            for name, run in runs_named(result, base).items():
                by.setdefault(arg(name, None), {})[base] = run
        table = []
        for depth in sorted(by):
            r = by[depth]
            s1, s2, fl = (ms(r[b]) if b in r else None for b in
                          ("BM_Stage01SyncGrads", "BM_Stage02SyncGrads", "BM_OneFlatAllreduce"))
            tensors = int(r["BM_Stage01SyncGrads"]["allreduces"]) if "BM_Stage01SyncGrads" in r else "-"
            mb = r["BM_OneFlatAllreduce"]["MB"] if "BM_OneFlatAllreduce" in r else 0
            table.append([depth, tensors, f"{mb:.2f}", f"{s1:.2f}" if s1 else "-",
                          f"{s2:.2f}" if s2 else "-", f"{fl:.2f}" if fl else "-",
                          f"{s1 / s2:.1f}x" if s1 and s2 else "-",
                          f"{s2 / fl:.2f}x" if s2 and fl else "-"])
            if depth == 64 and w == 2 and s1 and s2 and fl:
                report.target("stage 02 sync faster than stage 01, depth 64, 2 ranks",
                              f"{s1 / s2:.1f}x", s1 / s2 >= TARGET_BUCKETED_SPEEDUP)
                report.target("stage 02 sync / one flat all-reduce, depth 64, 2 ranks",
                              f"{s2 / fl:.2f}x", s2 / fl <= TARGET_BUCKETED_VS_FLAT)
        report.table(["depth", "tensors", "MB", "stage 01 ms", "stage 02 ms", "flat ms",
                      "01/02", "02/flat"], table)
        sweep = cap_sweep(result, fits.get(("Kit", w, "mean")))
        if sweep:
            best = min(sweep, key=lambda r: r[1])
            report.add(f"Bucket-cap sweep (stage 02, depth 64), medians; predicted = "
                       f"all-reduces x alpha + beta x bytes, with the fit to bench_allreduce's "
                       f"means at {w} ranks (a sum of k all-reduces pays k means, stalls "
                       f"included, not k medians):", "")
            report.table(["cap MiB", "all-reduces", "measured ms", "predicted ms"],
                         [[f"{c:.3g}", int(k), f"{m:.2f}" + (" (best)" if c == best[0] else ""),
                           f"{p:.2f}" if p is not None else "-"] for c, m, p, k in sweep])
    if not found:
        report.add("Not measured (bench_sync.w*.json missing).", "")


def report_versus_torch(rounds, report):
    """The kit's stage 03 against PyTorch's DDP, round by round."""
    report.add("## The kit's stage 03 beside PyTorch's DDP (alternating rounds)", "")
    ratios = []
    table = []
    for r, kit, torch in rounds:
        s3, k0 = kit.get("BM_StepStage03/cap_kib:0"), kit.get("BM_StepNoDDP")
        t, t0 = torch.get("BM_TorchStepDDP/cap_kib:0"), torch.get("BM_TorchStepNoDDP")
        if not (s3 and t and k0 and t0):
            continue
        ratios.append(ms(s3) / ms(t))
        table.append([r, f"{ms(k0):.2f}", f"{ms(s3):.2f}", f"{ms(t0):.2f}", f"{ms(t):.2f}",
                      f"{ms(s3) / ms(t):.2f}x"])
    if not ratios:
        report.add("Not measured (python3-torch not installed, or no rounds run).", "")
        return
    report.table(["round", "kit no DDP ms", "kit stage 03 ms", "PyTorch no DDP ms",
                  "PyTorch DDP ms", "stage 03 / PyTorch DDP"], table)
    report.add("Step medians; each round runs bench_step (no DDP, stage 03 at the default caps) "
               "and then bench/torch_ddp.py (the same, PyTorch's), 2 ranks, batch 64.", "")
    med = median(ratios)
    report.target("kit stage 03 step / PyTorch DDP step, 2 ranks, default caps",
                  f"{med:.2f}x (median of {len(ratios)} rounds: "
                  f"{', '.join(f'{x:.2f}' for x in ratios)})",
                  med <= TARGET_VS_TORCH)


def report_step(results, report):
    report.add("## A training step: overlap, and PyTorch beside the kit (bench_step)", "")
    found = False
    for (program, w), result in sorted(results.items()):
        if program != "bench_step":
            continue
        found = True
        report.add(f"### {w} ranks", "")
        runs = result["runs"]
        table = []
        for name in ("BM_StepNoDDP", "BM_StepStage01"):
            if name in runs:
                r = runs[name]
                table.append([name, "-", f"{ms(r):.2f}", f"{r.get('p90_ms', 0):.2f}",
                              f"{r['sync_ms']:.2f}" if "sync_share" in r else "-"])
        caps = sorted({arg(n, "cap_kib") for n in runs if n.startswith("BM_StepStage0")
                       and arg(n, "cap_kib") is not None})
        for cap in caps:
            label = "default caps" if cap == 0 else f"{cap} KiB"
            for stage in ("02", "03"):
                r = runs.get(f"BM_StepStage{stage}/cap_kib:{cap}")
                if r:
                    table.append([f"BM_StepStage{stage} ({label})", int(r.get("buckets", 0)),
                                  f"{ms(r):.2f}", f"{r['p90_ms']:.2f}",
                                  f"{r['sync_ms']:.2f}" if "sync_share" in r else "-"])
        torch = results.get(("torch_ddp", w))
        if torch:
            steps = [(n, r) for n, r in torch["runs"].items() if n.startswith("BM_TorchStep")]
            for name, r in sorted(steps, key=lambda nr: (arg(nr[0], "cap_kib") or -1)):
                table.append([name, "-", f"{ms(r):.2f}", f"{r['p90_ms']:.2f}", "-"])
        if table:
            report.table(["run", "buckets", "step p50 ms", "step p90 ms", "sync_grads ms"],
                         table)

        share = []
        for batch in sorted({arg(n, "batch") for n in runs
                             if n.startswith(("BM_SyncShare", "BM_OverlapPair"))}):
            s1 = runs.get(f"BM_SyncShareStage01/batch:{batch}")
            s2 = runs.get(f"BM_SyncShareStage02/cap_kib:0/batch:{batch}")
            pair = runs.get(f"BM_OverlapPair/cap_kib:0/batch:{batch}")
            share.append([batch,
                          f"{s1['sync_share'] * 100:.0f}%" if s1 else "-",
                          f"{s2['sync_share'] * 100:.0f}%" if s2 else "-",
                          f"{pair['s02_ms']:.2f}" if pair else "-",
                          f"{pair['sync02_ms']:.2f}" if pair else "-",
                          f"{pair['s03_ms']:.2f}" if pair else "-",
                          f"{pair['hidden'] * 100:.0f}%" if pair else "-"])
        if share:
            report.add("The sync's share of the step against the batch (rows per rank; means), "
                       "and what stage 03 hides of stage 02's sync, stage 02 and 03 interleaved "
                       "step by step (BM_OverlapPair, default caps; medians; hidden = the median "
                       "of (stage 02 step - stage 03 step) over stage 02's median sync):", "")
            report.table(["batch", "stage 01 sync share", "stage 02 sync share",
                          "stage 02 step ms", "stage 02 sync ms", "stage 03 step ms",
                          "sync hidden by 03"], share)
        pair = runs.get(f"BM_OverlapPair/cap_kib:0/batch:64")
        if w == 2 and pair:
            report.target("stage 03 hides stage 02's sync, 2 ranks, default caps, batch 64",
                          f"{pair['hidden'] * 100:.0f}%", pair["hidden"] >= TARGET_HIDDEN)

        accumulate = []
        for k in sorted({arg(n, "micro") for n in runs if n.startswith("BM_Accumulate")}):
            none, once, every = (runs.get(f"BM_Accumulate{m}/micro:{k}")
                                 for m in ("NoDDP", "NoSync", "SyncEvery"))
            if not (none and once and every):
                continue
            accumulate.append([k, f"{none['us_per_sample']:.0f}", f"{once['us_per_sample']:.0f}",
                               f"{every['us_per_sample']:.0f}",
                               f"{once['us_per_sample'] - none['us_per_sample']:.0f}",
                               f"{every['us_per_sample'] - none['us_per_sample']:.0f}"])
        if accumulate:
            report.add("Gradient accumulation (stage 04): a step of K micro-batches of 16 rows "
                       "per rank, microseconds per sample (step medians over K x 16 rows); "
                       "the sync's share per sample is the difference from no DDP:", "")
            report.table(["K", "no DDP", "no_sync, one sync per step", "sync every micro-batch",
                          "sync per sample, no_sync", "sync per sample, every micro-batch"],
                         accumulate)
    if not found:
        report.add("Not measured (bench_step.w*.json missing).", "")


# Stage 08's hooks, in the order bench_hooks.cc and hook_losses.py run them.
# PowerSGD's rank is the matrix rank of its low-rank approximation, said in
# full: its labels sit beside world sizes ("2 ranks", "4 ranks").
HOOKS = [("none", "no hook"), ("allreduce", "allreduce_hook"), ("fp16", "fp16_compress_hook"),
         ("powersgd_r1", "PowerSGD, matrix rank 1"), ("powersgd_r4", "PowerSGD, matrix rank 4")]


def variant_runs(result, variants, prefix, round_name):
    """[(label, name, the "<prefix>:<label>" run, interleaved median ms or None,
    interleaved ratio to the first variant or None)] for the variants
    measured, in `variants` order ([(label, name)], the first the one
    `round_name`'s "<label>_over_<first>" ratios divide by: the benchmarks'
    register_step_variants)."""
    runs = result["runs"]
    round_ = runs.get(round_name, {})
    first = variants[0][0]
    rows = []
    for label, name in variants:
        run = runs.get(f"{prefix}:{label}")
        if run:
            rows.append((label, name, run, round_.get(f"{label}_ms"),
                         1.0 if label == first and round_ else round_.get(f"{label}_over_{first}")))
    return rows


def hook_runs(result):
    """variant_runs of bench_hooks: the hooks measured, in HOOKS order."""
    return variant_runs(result, HOOKS, "BM_StepStage08Hook/hook", "BM_HookRound")


def compression(rows, run):
    """bytes(no hook) / bytes(this hook), from the no-hook run when it was
    measured, else from the model's gradient bytes (the same number)."""
    none = next((r for label, _, r, _, _ in rows if label == "none"), None)
    reference = none["allreduce_bytes"] if none else run["grad_bytes"]
    return reference / run["allreduce_bytes"] if run["allreduce_bytes"] else float("inf")


def report_hooks(results, report):
    report.add("## Communication hooks: bytes and step time (bench_hooks, stage 08)", "")
    found = False
    for (program, w), result in sorted(results.items()):
        if program != "bench_hooks":
            continue
        found = True
        rows = hook_runs(result)
        report.add(f"### {w} ranks", "")
        table = []
        for label, name, run, round_ms, over_none in rows:
            table.append([name, f"{run['allreduce_bytes'] / 1e3:.1f}",
                          f"{compression(rows, run):.1f}x", f"{run['allreduces']:.0f}",
                          f"{ms(run):.2f}", f"{run['p90_ms']:.2f}",
                          f"{run['cpu_ms']:.2f}" if "cpu_ms" in run else "-",
                          f"{round_ms:.2f}" if round_ms is not None else "-",
                          f"{over_none:.2f}x" if over_none is not None else "-"])
        report.table(["hook", "kB all-reduced per step and rank", "compression (none / hook)",
                      "all-reduces per step", "step p50 ms", "step p90 ms",
                      "CPU ms per step (all threads)", "interleaved step p50 ms", "interleaved / no hook"], table)
        context = result["context"]
    if found:
        report.add(f"- the deep model (130 tensors, 4.2 MB of gradients), batch "
                   f"{context.get('batch', '?')} rows per rank; PowerSGD starts at iteration "
                   f"{context.get('powersgd_start_iteration', '?')}, and every count is taken "
                   f"after the warm-up, in the compressed regime; the bytes are what a rank hands "
                   f"to its all-reduces, the same at any world size (what crosses the wire "
                   f"depends on Gloo's algorithm)",
                   "- interleaved: the five steps one after another in every iteration "
                   "(BM_HookRound), the order rotated; \"/ no hook\" is the median of the "
                   "per-iteration ratios, the comparison least moved by the machine's load",
                   "- bf16_compress_hook not measured: Gloo has no bfloat16 sum (it runs on "
                   "NCCL only)", "")
    else:
        report.add("Not measured (bench_hooks.w*.json missing).", "")


def report_hook_losses(losses, report):
    report.add("## Communication hooks: loss per step (hook_losses.py, stage 08)", "")
    if not losses:
        report.add("Not measured (hook_losses.json missing).", "")
        return
    c = losses["config"]
    runs = losses["runs"]
    none = next((r["losses"] for r in runs if r["label"] == "none"), None)
    tail = max(1, c["steps"] // 10)  # the last 10% of the steps: a per-step loss is noisy
    table = []
    for run in runs:
        l = run["losses"]
        row = [dict(HOOKS).get(run["label"], run["label"]), f"{l[0]:.4g}", f"{l[-1]:.4g}",
               f"{sum(l[-tail:]) / tail:.4g}"]
        if none:
            diffs = [abs(a - b) for a, b in zip(l, none) if a is not None and b is not None]
            row += [f"{sum(l[-tail:]) / sum(none[-tail:]):.3f}", f"{max(diffs):.3g}"]
        row.append(run["allreduce_bytes_last_step"])
        table.append(row)
    report.add(f"Rank 0's loss, {c['model']} model, {c['world_size']} ranks, {c['steps']} steps, "
               f"batch {c['batch_size']}, lr {c['lr']}; PowerSGD from iteration "
               f"{c['powersgd_start_iteration']}:", "")
    report.table(["hook", "loss, step 0", f"loss, step {c['steps'] - 1}",
                  f"mean of the last {tail} steps"] +
                 (["that / no hook's", "largest difference from no hook's loss"] if none else []) +
                 ["bytes all-reduced, last step"], table)


# ---- the figures -----------------------------------------------------------

# Stage 09's optimizers, in the order bench_zero.cc runs them.
OPTIMIZERS = [("sgd", "plain SGD (every rank steps everything)"),
              ("zero", "ZeRO, composed, all-gather"),
              ("zero_broadcast", "ZeRO, composed, a broadcast per shard"),
              ("zero_rs", "ZeRO, reduce-scatter form")]
FORMS = {"ddp": "DDP (stage 08)", "zero": "ZeRO composed (stage 09)",
         "zero_rs": "ZeRO reduce-scatter form (stage 09)"}


def report_zero_memory(memory, report):
    report.add("## ZeRO: memory per rank (zero_memory.py, stages 08 and 09)", "")
    if not memory:
        report.add("Not measured (zero_memory.json missing).", "")
        return
    ddp = {run["world_size"]: max(r["optimizer_state_bytes"] for r in run["ranks"])
           for run in memory["runs"] if run["form"] == "ddp"}
    table = []
    for run in memory["runs"]:
        state = [r["optimizer_state_bytes"] for r in run["ranks"]]
        peak = [r["peak_model_state_bytes"] for r in run["ranks"]]
        w = run["world_size"]
        table.append([run["world_size"], FORMS.get(run["form"], run["form"]),
                      ", ".join(f"{b / 1024:.1f}" for b in state),
                      f"{max(state) / ddp[w]:.3f}" if ddp.get(w) else "-",
                      f"{1 / w:.3f}", ", ".join(f"{b / 1024:.1f}" for b in peak),
                      "yes" if run["matches_reference"] else "NO"])
    report.table(["W", "optimizer", "optimizer state per rank, KiB", "largest / DDP's",
                  "1/W", "peak params+grads+state per rank, KiB", "matches the reference"], table)
    c = memory["config"]
    report.add(f"- the {c['model']} model, momentum {c['momentum']}, {c['steps']} steps; bytes "
               "counted by the library on the tensor storage (tp::memory), per rank; a shard "
               "holds whole parameters, so ZeRO's largest shard is within one parameter of "
               "1/W of the model", "")


def report_zero(results, report):
    report.add("## ZeRO: step time and bytes per step (bench_zero, stage 09)", "")
    found = False
    for (program, w), result in sorted(results.items()):
        if program != "bench_zero":
            continue
        found = True
        table = []
        for _, name, run, round_ms, over in variant_runs(result, OPTIMIZERS, "BM_StepStage09/opt",
                                                         "BM_ZeroRound"):
            table.append([name, f"{run['state_bytes'] / 1e3:.1f}",
                          f"{run['allreduce_bytes'] / 1e3:.1f}",
                          f"{run['reduce_scatter_bytes'] / 1e3:.1f}",
                          f"{run['allgather_bytes'] / 1e3:.1f}",
                          f"{run['broadcast_bytes'] / 1e3:.1f}", f"{run['collectives']:.0f}",
                          f"{ms(run):.2f}", f"{round_ms:.2f}" if round_ms is not None else "-",
                          f"{over:.2f}x" if over is not None else "-"])
        torch_runs = results.get(("torch_ddp", w), {}).get("runs", {})
        for label, name in (("sgd", "PyTorch: DDP, torch.optim.SGD"),
                            ("zero", "PyTorch: DDP, ZeroRedundancyOptimizer")):
            run = torch_runs.get(f"BM_TorchStepZero/opt:{label}")
            if run:
                table.append([name] + ["-"] * 6 + [f"{ms(run):.2f}", "-", "-"])
        report.add(f"### {w} ranks", "")
        report.table(["optimizer", "state kB", "kB all-reduced", "kB reduce-scattered",
                      "kB all-gathered", "kB broadcast", "collectives per step", "step p50 ms",
                      "interleaved step p50 ms", "interleaved / plain SGD"], table)
    if found:
        report.add("- the deep model of bench_hooks (130 tensors, 4.2 MB), momentum 0.9; the "
                   "bytes are what each collective was handed per step and rank (an all-gather "
                   "or reduce-scatter: the whole flat tensor), not what crosses the wire; "
                   "PyTorch's rows (torch_ddp.py, where python3-torch is installed) are its own "
                   "program's medians, run at another moment than the kit's", "")
    else:
        report.add("Not measured (bench_zero.w*.json missing).", "")


FSDP_SETUPS = [("ddp", "DDP (stage 09, plain SGD)"),
               ("zero_rs", "ZeRO, reduce-scatter form (stage 09)"),
               ("no_shard", "FSDP NO_SHARD, a unit per Linear"),
               ("grad_op", "FSDP SHARD_GRAD_OP, a unit per Linear"),
               ("full_no_prefetch", "FSDP FULL_SHARD, a unit per Linear, no prefetch"),
               ("full", "FSDP FULL_SHARD, a unit per Linear"),
               ("full_fwd_prefetch", "FSDP FULL_SHARD, a unit per Linear, forward_prefetch"),
               ("grad_op_blocks", "FSDP SHARD_GRAD_OP, a unit per block"),
               ("full_blocks_no_prefetch", "FSDP FULL_SHARD, a unit per block, no prefetch"),
               ("full_blocks", "FSDP FULL_SHARD, a unit per block"),
               ("full_blocks_fwd_prefetch", "FSDP FULL_SHARD, a unit per block, forward_prefetch")]


def report_fsdp(results, report):
    report.add("## FSDP: step time, bytes and peak memory (bench_fsdp, stage 10)", "")
    found = False
    for (program, w), result in sorted(results.items()):
        if program != "bench_fsdp":
            continue
        found = True
        table = []
        for _, name, run, _, over in variant_runs(result, FSDP_SETUPS, "BM_StepStage10/setup",
                                                  "BM_FsdpRound"):
            table.append([name, f"{run['peak_model_state_bytes'] / 1e3:.0f}",
                          f"{run['allreduce_bytes'] / 1e3:.0f}",
                          f"{run['allgather_bytes'] / 1e3:.0f}",
                          f"{run['reduce_scatter_bytes'] / 1e3:.0f}",
                          f"{run['collectives']:.0f}", f"{ms(run):.2f}",
                          f"{over:.2f}x" if over is not None else "-"])
        report.add(f"### {w} ranks", "")
        report.table(["set-up", "peak params+grads+state kB", "kB all-reduced",
                      "kB all-gathered", "kB reduce-scattered", "collectives per step",
                      "step p50 ms", "interleaved / DDP"], table)
    if found:
        report.add("- the deep model of bench_hooks (130 tensors, 4.2 MB), momentum 0.9; the "
                   "peak is the most the rank held at once in parameters, gradients and "
                   "optimizer state; the bytes are what each collective was handed per step and "
                   "rank; a block (16 Linears) is one unit: 4 blocks and the last Linear", "")
    else:
        report.add("Not measured (bench_fsdp.w*.json missing).", "")


def plot_zero(results, memory, save, plt):
    """zero.png where zero_memory.json or bench_zero results exist."""
    zero = {w: r["runs"] for (p, w), r in sorted(results.items()) if p == "bench_zero"}
    if not memory and not zero:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    if memory:
        by_form = {}
        for run in memory["runs"]:
            by_form.setdefault(run["form"], []).append(
                (run["world_size"], max(r["optimizer_state_bytes"] for r in run["ranks"]) / 1024))
        for form, points in by_form.items():
            points.sort()
            left.plot([p[0] for p in points], [p[1] for p in points], "o-",
                      label=FORMS.get(form, form))
        ddp = dict(by_form.get("ddp", []))
        if ddp:
            ws = sorted(ddp)
            left.plot(ws, [ddp[w] / w for w in ws], "k:", label="DDP's / W")
        left.set(xlabel="ranks (W)", ylabel="optimizer state per rank, KiB (largest rank)",
                 title="Optimizer state per rank", ylim=(0, None))
        left.set_xticks(sorted({run["world_size"] for run in memory["runs"]}))
        left.legend(fontsize=7)
    if zero:
        width = 0.8 / len(zero)
        for i, (w, runs) in enumerate(sorted(zero.items())):
            round_ = runs.get("BM_ZeroRound", {})
            xs, ys = [], []
            for x, (label, _) in enumerate(OPTIMIZERS):
                run = runs.get(f"BM_StepStage09/opt:{label}")
                if run is None:
                    continue
                xs.append(x + (i - (len(zero) - 1) / 2) * width)
                ys.append(round_.get(f"{label}_ms", ms(run)))
            right.bar(xs, ys, width, label=f"{w} ranks",
                      color={2: "tab:blue", 4: "tab:orange"}.get(w))
        right.set_xticks(range(len(OPTIMIZERS)), ["plain SGD", "ZeRO\nall-gather",
                                                  "ZeRO\nbroadcasts", "ZeRO\nreduce-scatter"],
                         fontsize=8)
        right.set(ylabel="one step, ms (interleaved medians)", title="Step time")
        right.legend(fontsize=7)
    save(fig, "zero.png")


def report_link(link, report):
    report.add("## Stage 02 against stage 03 on a shaped link", "")
    if not link:
        report.add("No link.json: `./kit bench --link 300mbit,1gbit,3gbit` measures it "
                   "(root: network namespaces).", "")
        return
    rows = [link_summary(run) for run in link["runs"]]
    report.add("One rank per host, hosts joined through a bridge, each host's egress limited "
               "to the rate (bench/link_bench.py); loopback: the ranks spawned on this "
               "machine. Medians per step, ms. compute: stage 02's step without its sync; "
               "ideal: max(compute, sync); hidden: (stage 02 - stage 03) / min(bwd, sync), "
               "the share of what overlap can hide at best; PyTorch DDP: its step at its "
               "default caps on the same link (bench/torch_ddp.py). alpha and 1 / beta: the "
               "fit to the kit's all-reduce medians on the link (--alpha-beta); the cap "
               "sweeps (--cap-sweep) set both caps, and their prediction is "
               "link_bench.py's predict_step03 from that fit and the default caps' compute "
               "and bwd.", "")
    report.add(link_table(rows), "")


def plot_link(link, save, plt):
    if not link:
        return
    rows = [link_summary(run) for run in link["runs"]]
    panels = sorted({(r["world_size"], r["batch"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (w, batch) in zip(axes[0], panels):
        mine = [r for r in rows if (r["world_size"], r["batch"]) == (w, batch)]
        linked = sorted((r for r in mine if r["measured_mbit"]), key=lambda r: r["measured_mbit"])
        loop = [r for r in mine if not r["measured_mbit"]]
        x = [r["measured_mbit"] / 1e3 for r in linked]
        for key, style, label in (("s02", "o-", "stage 02 step"), ("s03", "s-", "stage 03 step"),
                                  ("ideal", "k--", "ideal: max(compute, sync)"),
                                  ("compute", ":", "compute"), ("sync", ":", "sync (stage 02)")):
            line, = ax.plot(x, [r[key] for r in linked], style, label=label)
            if loop:  # loopback at the right, one rate step beyond the fastest link
                xl = (x[-1] if x else 1.0) * 3
                ax.plot([xl], [loop[0][key]], style[0] if style[0] in "os" else "x",
                        color=line.get_color())
        ticks = x + ([(x[-1] if x else 1.0) * 3] if loop else [])
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t:.2g}" for t in x] + (["loopback"] if loop else []))
        ax.minorticks_off()
        torch = [r for r in linked if r["torch"]]
        if torch:
            ax.plot([r["measured_mbit"] / 1e3 for r in torch], [r["torch"] for r in torch], "^-",
                    label="PyTorch DDP step")
        ax.set(xlabel="link rate, Gbit/s (measured)", ylabel="per step, ms (medians)",
               ylim=(0, None), title=f"{w} ranks, batch {batch} per rank")
        ax.legend(fontsize=7)
    save(fig, "link.png")
    swept = [r for r in rows if r["sweep"]]
    if not swept:
        return
    # A row per world size, a column per link.
    sizes = sorted({r["world_size"] for r in swept})
    columns = max(sum(r["world_size"] == w for r in swept) for w in sizes)
    fig, axes = plt.subplots(len(sizes), columns, figsize=(4.2 * columns, 3.6 * len(sizes)),
                             squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    placed = {w: 0 for w in sizes}
    for r in swept:
        row = sizes.index(r["world_size"])
        ax = axes[row][placed[r["world_size"]]]
        placed[r["world_size"]] += 1
        ax.set_visible(True)
        caps = [w.cap_kib for w in r["sweep"]]
        ax.plot(caps, [w.s03 for w in r["sweep"]], "s-", label="stage 03, measured")
        ax.plot(caps, [w.s02 for w in r["sweep"]], "o:", label="stage 02, measured")
        if r["sweep"][0].predicted is not None:
            ax.plot(caps, [w.predicted for w in r["sweep"]], "k--", label="stage 03, alpha-beta")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="both caps, KiB", ylabel="per step, ms (medians)", ylim=(0, None),
               title=f"{r['world_size']} ranks, {r['rate']}, batch {r['batch']}")
        ax.legend(fontsize=7)
    save(fig, "link_caps.png")


def plot(results, fits, out, hook_losses=None, zero_memory=None, link=None, fsdp_memory=None,
         link_fsdp=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []

    def save(fig, name):
        path = os.path.join(out, name)
        save_figure(fig, path)
        written.append(path)

    colours = {2: "tab:blue", 4: "tab:orange"}
    allreduce = {w: r for (p, w), r in results.items() if p == "bench_allreduce"}
    if allreduce:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for w, result in sorted(allreduce.items()):
            rows = allreduce_rows(result)
            c = colours.get(w)
            for impl, style in (("Kit", "o-"), ("Gloo", "x--")):
                data = rows.get(impl, [])
                if not data:
                    continue
                n = [d[0] for d in data]
                p50 = [d[1] * 1e6 for d in data]
                p90 = [d[2] * 1e6 for d in data]
                label = f"{'kit' if impl == 'Kit' else 'raw Gloo'}, {w} ranks"
                left.plot(n, p50, style, color=c, label=label + " (p50)", markersize=4,
                          alpha=1.0 if impl == "Kit" else 0.6)
                if impl == "Kit":
                    left.fill_between(n, p50, p90, color=c, alpha=0.15)
                right.plot(n, [d[3] for d in data], style, color=c, label=label, markersize=4,
                           alpha=1.0 if impl == "Kit" else 0.6)
            torch = results.get(("torch_ddp", w))
            if torch:
                data = sorted((arg(n, None), r["p50_us"]) for n, r in
                              runs_named(torch, "BM_TorchAllreduce").items())
                left.plot([d[0] for d in data], [d[1] for d in data], "+:", color=c, alpha=0.6,
                          label=f"PyTorch, {w} ranks (p50)")
            fit = fits.get(("Kit", w))
            if fit:
                n = [d[0] for d in rows["Kit"]]
                left.plot(n, [(fit[0] + fit[1] * x) * 1e6 for x in n], ":", color=c)
                left.annotate(f"{w} ranks: alpha {fit[0] * 1e6:.0f} us, "
                              f"1/beta {1 / fit[1] / 1e9:.2f} GB/s" if fit[1] > 0 else "",
                              xy=(0.02, 0.93 - 0.07 * (w // 2 - 1)), xycoords="axes fraction",
                              fontsize=8, color=c)
        left.set(xscale="log", yscale="log", xlabel="bytes per rank",
                 ylabel="one all-reduce, us (band: p50 to p90)",
                 title="Latency; dotted: fitted alpha + beta*n")
        right.set(xscale="log", xlabel="bytes per rank", ylabel="bus bandwidth, GB/s",
                  title="busbw = n/t * 2(W-1)/W")
        left.legend(fontsize=7, loc="lower right")
        right.legend(fontsize=7)
        save(fig, "allreduce.png")

    sync = {w: r for (p, w), r in results.items() if p == "bench_sync"}
    if sync:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for w, result in sorted(sync.items()):
            c = colours.get(w)
            for base, style, label in (("BM_Stage01SyncGrads", "o-", "stage 01 (per parameter)"),
                                       ("BM_Stage02SyncGrads", "s-", "stage 02 (buckets)"),
                                       ("BM_OneFlatAllreduce", "^:", "one flat all-reduce")):
                data = sorted((arg(n, None), ms(r)) for n, r in runs_named(result, base).items())
                if data:
                    left.plot([d[0] for d in data], [d[1] for d in data], style, color=c,
                              label=f"{label}, {w} ranks", markersize=4)
            sweep = cap_sweep(result, fits.get(("Kit", w, "mean")))
            if sweep:
                right.plot([s[0] for s in sweep], [s[1] for s in sweep], "o-", color=c,
                           label=f"measured, {w} ranks", markersize=4)
                if all(s[2] is not None for s in sweep):
                    right.plot([s[0] for s in sweep], [s[2] for s in sweep], "--", color=c,
                               alpha=0.6, label=f"alpha-beta prediction, {w} ranks")
                best = min(sweep, key=lambda s: s[1])
                right.plot([best[0]], [best[1]], "*", color=c, markersize=14)
                right.annotate(f"best {best[0]:g} MiB", (best[0], best[1]),
                               textcoords="offset points", xytext=(5, 8), fontsize=8, color=c)
        left.set(xscale="log", yscale="log", xlabel="depth D of deep_mlp (2(D+1) tensors)",
                 ylabel="sync_grads(), ms (median)", title="Per parameter vs buckets vs flat")
        depths = sorted({arg(n, None) for r in sync.values()
                         for n in runs_named(r, "BM_Stage01SyncGrads")})
        left.set_xticks(depths, [str(d) for d in depths])
        left.minorticks_off()
        right.set(xscale="log", yscale="log", xlabel="bucket cap, MiB",
                  ylabel="sync_grads(), ms (median)",
                  title="Stage 02 cap sweep, depth 64 (16.9 MB)")
        left.legend(fontsize=7)
        right.legend(fontsize=7)
        save(fig, "sync.png")

    step = results.get(("bench_step", 2)) or next(
        (r for (p, w), r in sorted(results.items()) if p == "bench_step"), None)
    if step:
        runs = step["runs"]
        bars = [("no DDP", runs.get("BM_StepNoDDP")), ("stage 01", runs.get("BM_StepStage01")),
                ("stage 02", runs.get("BM_StepStage02/cap_kib:0")),
                ("stage 03", runs.get("BM_StepStage03/cap_kib:0"))]
        w = int(step["context"].get("world_size", 2))
        torch = results.get(("torch_ddp", w))
        if torch:
            bars += [("PyTorch\nno DDP", torch["runs"].get("BM_TorchStepNoDDP")),
                     ("PyTorch\nDDP", torch["runs"].get("BM_TorchStepDDP/cap_kib:0"))]
        bars = [(label, r) for label, r in bars if r]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2),
                                          gridspec_kw={"width_ratios": [3, 2]})
        bottoms = [0.0] * len(bars)
        labels = [b[0] for b in bars]
        for key, colour, name in (("fwd_ms", "tab:green", "forward"),
                                  ("bwd_ms", "tab:purple", "backward (stage 03: with its sync)"),
                                  ("sync_ms", "tab:red", "sync_grads()")):
            heights = [r.get(key, 0.0) for _, r in bars]
            left.bar(labels, heights, bottom=bottoms, color=colour, label=name)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        rest = [max(0.0, r["real_time"] - b) for (_, r), b in zip(bars, bottoms)]
        left.bar(labels, rest, bottom=bottoms, color="lightgray", label="rest (zero_grad, step)")
        # Linear, so that the phases' heights compare; stage 01's bar is cut
        # (its sync is some ten times the others' whole step) and labelled.
        others = [r["real_time"] for label, r in bars if label != "stage 01"]
        top = 1.6 * max(others) if others else None
        for x, (label, r) in enumerate(bars):
            if top and r["real_time"] > top:
                left.annotate(f"{r['real_time']:.0f} ms", (x, top * 0.97), ha="center",
                              va="top", fontsize=8, color="white", fontweight="bold")
        left.set(ylabel="one step, ms (means)", ylim=(0, top) if top else None,
                 title=f"A training step at {w} ranks, default caps")
        left.set_xticks(range(len(labels)), labels)
        left.legend(fontsize=7)
        share = {}
        for name, r in runs.items():
            if name.startswith("BM_SyncShareStage0") and "sync_share" in r:
                share.setdefault(name.split("/")[0].replace("BM_SyncShareStage", "stage "),
                                 []).append((arg(name, "batch"), r.get("sync_share", 0) * 100))
        for stage, data in sorted(share.items()):
            data.sort()
            right.plot([d[0] for d in data], [d[1] for d in data], "o-",
                       label=stage.replace("Stage", ""))
        right.set(xscale="log", xlabel="batch, rows per rank", ylabel="% of the step in sync",
                  ylim=(0, 100), title="Sync share against batch size")
        right.legend(fontsize=7)
        save(fig, "step.png")
    plot_hooks(results, hook_losses, save, plt)
    plot_zero(results, zero_memory, save, plt)
    plot_link(link, save, plt)
    fsdp_figure.draw(fsdp_memory, link_fsdp, save, plt)
    return written


def moving_mean(values, window):
    """[i]: the mean of values[i - window + 1 .. i] that are not None (None
    where there are none)."""
    out = []
    for i in range(len(values)):
        known = [v for v in values[max(0, i - window + 1):i + 1] if v is not None]
        out.append(sum(known) / len(known) if known else None)
    return out


def plot_hooks(results, losses, save, plt):
    """hooks.png and hook_losses.png, each where its results exist; save(fig,
    name) is plot()'s."""
    hooks = {w: hook_runs(r) for (p, w), r in sorted(results.items()) if p == "bench_hooks"}
    hooks = {w: rows for w, rows in hooks.items() if rows}
    if hooks:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        labels = [name for label, name in HOOKS]
        width = 0.8 / len(hooks)
        for i, (w, rows) in enumerate(sorted(hooks.items())):
            c = {2: "tab:blue", 4: "tab:orange"}.get(w)
            by_label = {label: (run, round_ms, over) for label, _, run, round_ms, over in rows}
            xs = [x + (i - (len(hooks) - 1) / 2) * width for x in range(len(HOOKS))]
            present = [(x, label) for x, (label, _) in zip(xs, HOOKS) if label in by_label]
            kb = [by_label[label][0]["allreduce_bytes"] / 1e3 for _, label in present]
            bars = left.bar([x for x, _ in present], kb, width, color=c, label=f"{w} ranks")
            for bar, (_, label) in zip(bars, present):
                left.annotate(f"{compression(rows, by_label[label][0]):.0f}x", (
                    bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                    va="bottom", fontsize=7)
            # The interleaved medians where BM_HookRound ran; else each hook's own.
            step = [by_label[label][1] if by_label[label][1] is not None
                    else ms(by_label[label][0]) for _, label in present]
            bars = right.bar([x for x, _ in present], step, width, color=c, label=f"{w} ranks")
            for bar, (_, label) in zip(bars, present):
                over = by_label[label][2]
                if over is not None and label != "none":
                    right.annotate(f"{over:.2f}x", (bar.get_x() + bar.get_width() / 2,
                                                    bar.get_height()),
                                   ha="center", va="bottom", fontsize=7)
        for ax in (left, right):
            ax.set_xticks(range(len(HOOKS)), [name.replace(", matrix", "\nmatrix").replace(
                "_compress_hook", "\ncompress").replace("_hook", "\nhook") for name in labels],
                fontsize=8)
            ax.legend(fontsize=7, loc="upper left" if ax is right else "upper right")
        left.set(yscale="log", ylabel="kB all-reduced per step and rank",
                 title="Bytes all-reduced (above a bar: none / hook)")
        right.set(ylabel="one step, ms (interleaved medians)",
                  title="Step time (above a bar: / no hook)")
        save(fig, "hooks.png")
    if losses and losses.get("runs"):
        runs = losses["runs"]
        c = losses["config"]
        none = next((r["losses"] for r in runs if r["label"] == "none"), None)
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        names = dict(HOOKS)
        # Each step's loss is one batch's: noisy. The left panel shows a
        # moving mean; no hook is drawn last, on top.
        window = 10
        for run in sorted(runs, key=lambda r: r["label"] == "none"):
            steps = range(len(run["losses"]))
            name = names.get(run["label"], run["label"])
            style = {"none": "k-", "allreduce": "--"}.get(run["label"], "-")
            left.plot(steps, moving_mean(run["losses"], window), style, label=name,
                      linewidth=0.8 if run["label"] == "none" else 1.5, alpha=0.8)
            if none and run["label"] != "none":
                diff = [abs(a - b) if a is not None and b is not None else None
                        for a, b in zip(run["losses"], none)]
                if all(d == 0 for d in diff if d is not None):
                    name += " (identical: 0)"
                right.plot(steps, [d if d else float("nan") for d in diff], style, label=name,
                           linewidth=1, alpha=0.7)
        left.set(yscale="log", xlabel="step",
                 ylabel=f"rank 0's loss, mean of the last {window} steps",
                 title=f"Loss, {c['model']} model, {c['world_size']} ranks")
        right.set(yscale="log", xlabel="step", ylabel="|loss - no hook's loss|",
                  title="Distance from no hook")
        left.legend(fontsize=7)
        right.legend(fontsize=7)
        save(fig, "hook_losses.png")


def link_only(args, out):
    link = load_json(args.results, "link.json")
    if not link:
        print(f"report.py: no link.json in {args.results}", file=sys.stderr)
        return 1
    report = Report()
    report_link(link, report)
    text = "\n".join(report.lines) + "\n"
    write_text(os.path.join(out, "link.md"), text)
    print(text)
    if not args.no_plots:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        def save(fig, name):
            path = os.path.join(out, name)
            save_figure(fig, path)
            print(f"report.py: wrote {path}")
        plot_link(link, save, plt)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--out", help="where summary.md and the figures go (default: RESULTS)")
    parser.add_argument("--no-plots", action="store_true", help="the summary only")
    parser.add_argument("--link-only", action="store_true",
                        help="link.json alone: link.md, link.png and (with cap sweeps) "
                             "link_caps.png")
    args = parser.parse_args()
    out = args.out or args.results
    os.makedirs(out, exist_ok=True)
    if args.link_only:
        return link_only(args, out)
    results = load(args.results)
    report = Report()
    report.add("# Benchmark results", "", context_line(results), "")
    if any(r["context"].get("smoke") == "1" for r in results.values()):
        report.add("**Smoke run** (one iteration each): the times mean nothing.", "")
    fits = {}
    report_allreduce(results, report, fits)
    report_sync(results, report, fits)
    report_step(results, report)
    report_versus_torch(load_rounds(args.results), report)
    report_hooks(results, report)
    hook_losses = load_json(args.results, "hook_losses.json")
    report_hook_losses(hook_losses, report)
    report_zero(results, report)
    zero_memory = load_json(args.results, "zero_memory.json")
    report_zero_memory(zero_memory, report)
    report_fsdp(results, report)
    link = load_json(args.results, "link.json")
    report_link(link, report)
    text = report.text()
    write_text(os.path.join(out, "summary.md"), text)
    print(text)
    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("report.py: no figures: python3-matplotlib is not installed "
                  "(apt-get install python3-matplotlib, or ./kit setup)", file=sys.stderr)
            return 1
        for path in plot(results, fits, out, hook_losses, zero_memory, link,
                         load_json(args.results, "fsdp_memory.json"),
                         load_json(args.results, "link_fsdp.json")):
            print(f"report.py: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
