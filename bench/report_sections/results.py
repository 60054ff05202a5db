"""Reading the benchmarks' results: Google Benchmark's JSON, as report.py's
sections use it.

load() reads every PROGRAM.wW.json of the programs bench/programs.txt lists
(and torch_ddp.wW.json) into {(program, W): {"context", "runs"}}; runs are
keyed by the name a benchmark was registered under (plain_name), and
repetitions are merged into their median (runs_of). The rest picks runs and
numbers out of them.
"""

import json
import os
import re
import sys

from alpha_beta import median
from programs import programs


def results_pattern():
    """PROGRAM.wW.json for the programs that run on ranks, and PyTorch's
    torch_ddp.wW.json (bench/torch_ddp.py, where PyTorch is installed)."""
    names = [p.name for p in programs() if p.world_sizes] + ["torch_ddp"]
    return re.compile("(" + "|".join(re.escape(n) for n in names) + r")\.w(\d+)\.json")


def load(folder):
    """{(program, world_size): {"context": ..., "runs": {name: run}}}."""
    results = {}
    if not os.path.isdir(folder):
        return results
    pattern = results_pattern()
    for file in sorted(os.listdir(folder)):
        m = pattern.fullmatch(file)
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


def by_world_size(results, program):
    """[(world size, result)] of one program, the smallest world size first."""
    return [(w, result) for (p, w), result in sorted(results.items()) if p == program]


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
