#!/usr/bin/env python3
"""A benchmark's interleaved round on shaped links, several runs, with its spread.

    link_rounds.py BUILD [--program fsdp] [--rates 1gbit] [--world-sizes 2]
                   [--runs 3] [--batch N] [--no-loopback | --loopback-only]
                   [--torch | --no-torch] [--smoke] [--out bench/results/link_fsdp.json]

bench_fsdp, bench_zero, bench_hooks and bench_overlap each time their
variants of a training step side by side in one benchmark, a round
(BM_FsdpRound, BM_ZeroRound, BM_HookRound, BM_OverlapRound: one step of
each variant per iteration, in an order rotated every iteration;
bench/ranked_benchmark.h). Over loopback
the wire is CPU work sharing the cores with compute; on a shaped link
(bench/shaped_link.py: one host per rank, each host's egress limited to
the rate) a collective waits for the wire while the core is free, which is
where sharding and compression are meant to pay.

For each world size W: the round --runs times on spawned ranks
("loopback", as ./kit bench runs them), then for each rate one link (its
rate measured with 4 to 32 MB over TCP from host 0 to host 1) and the
round --runs times on it, one rank per host, each run a fresh job
(tools/tprun, env://, as link_bench.py starts them). Runs are separate
jobs so that their spread says how far one run can be trusted.

Per variant it prints the median, over the runs, of the round's median
step (ms) and of its ratio to the round's first variant (the round's
"<label>_over_<first>" counter: the median over iterations of the
variant's step over the first's in the same iteration), with the lowest
and highest run, and the spread: (highest - lowest) / median of the
ratios, flagged where it is 10% or more (then run longer or on a quieter
machine before quoting it). --out gets every run's round as measured and
that summary (JSON, whole or not at all); the table goes beside it as
.md. bench/fsdp_figure.py draws link_fsdp.json, bench/report.py
link_hooks.json and link_zero.json, bench/rounds_figure.py also
link_overlap.json.

PyTorch beside the kit (hooks, zero and overlap, where a python imports torch;
--no-torch skips it, --torch insists): each of the kit's runs is followed
by PyTorch's round on the same link (bench/torch_rounds.py: the same steps
with PyTorch 1.13's DDP, at its caps, with its hooks and its
ZeroRedundancyOptimizer,
interleaved the same way), so the two alternate run by run. Printed
beside the kit's: PyTorch's own table, and per variant both have, the
kit's step over PyTorch's, the median over the paired runs (run i of the
kit and run i of PyTorch) with its lowest and highest pair.

Needs root, `ip` and `tc` for the links: without them it says why and
exits 77 before measuring anything (--loopback-only needs neither). A run
that fails ends it: what was measured before is printed, nothing is
written, exit 1. All namespaces go when it ends, also on SIGTERM, SIGHUP
or SIGINT.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))  # namespaces.py, shared with tests/
from atomic_file import write_text  # noqa: E402
import link_bench  # noqa: E402
import shaped_link  # noqa: E402
from namespaces import SKIP, Unavailable, clean_stale  # noqa: E402

# --program: (the benchmark program, its round)
PROGRAMS = {"fsdp": ("bench_fsdp", "BM_FsdpRound"),
            "zero": ("bench_zero", "BM_ZeroRound"),
            "hooks": ("bench_hooks", "BM_HookRound"),
            "overlap": ("bench_overlap", "BM_OverlapRound")}
# --program: PyTorch's round beside it (torch_rounds.py --round PROGRAM)
TORCH_ROUNDS = {"zero": "BM_TorchZeroRound", "hooks": "BM_TorchHookRound",
                "overlap": "BM_TorchOverlapRound"}
SPREAD_LIMIT = 0.10  # a ratio whose runs spread this much or more is flagged


def round_args(build, program, out, options):
    name, round_name = PROGRAMS[program]
    args = [os.path.join(build, "bench", name), f"--benchmark_filter=^{round_name}(/|$)",
            f"--benchmark_out={out}", "--benchmark_out_format=json"]
    if options.batch:
        args.append(f"--batch={options.batch}")
    return args + (["--smoke=1"] if options.smoke else [])


def torch_args(python, program, out, options):
    return [python, os.path.join(HERE, "torch_rounds.py"), "--round", program,
            f"--out={out}"] + ([f"--batch={options.batch}"] if options.batch else []) \
        + (["--smoke"] if options.smoke else [])


def the_round(path, round_name, writer):
    """The round's run (its counters) from rank 0's Google Benchmark JSON."""
    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"{writer} wrote no results for {round_name} ({e})")
    for b in result["benchmarks"]:
        if b["name"].split("/")[0] == round_name:
            return {"counters": {k: v for k, v in b.items() if isinstance(v, (int, float))},
                    "context": result.get("context", {})}
    raise RuntimeError(f"{path} has no {round_name}")


def alternate_runs(options, tmp, run_kit, run_torch):
    """options.runs runs of the kit's round, each followed by PyTorch's when
    options.torch names a python: {"runs": [...], "torch_runs": [...]}.
    run_kit(out) and run_torch(out) run one job writing `out`."""
    program, round_name = PROGRAMS[options.program]
    runs, torch_runs = [], []
    for i in range(options.runs):
        out = os.path.join(tmp, f"run{i}.json")
        run_kit(out)
        runs.append(the_round(out, round_name, program))
        if options.torch:
            out = os.path.join(tmp, f"torch{i}.json")
            run_torch(out)
            torch_runs.append(the_round(out, TORCH_ROUNDS[options.program], "torch_rounds.py"))
    return {"runs": runs, **({"torch_runs": torch_runs} if options.torch else {})}


def run_spawned(args, what):
    r = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        print(r.stderr[-3000:], file=sys.stderr)
        raise RuntimeError(f"{what} failed: exit code {r.returncode}")


def loopback_runs(build, world_size, options):
    program = PROGRAMS[options.program][0]
    with tempfile.TemporaryDirectory(prefix="tp-rounds-") as tmp:
        runs = alternate_runs(
            options, tmp,
            lambda out: run_spawned(round_args(build, options.program, out, options)
                                    + [f"--world-size={world_size}"],
                                    f"{program} at {world_size} spawned ranks"),
            lambda out: run_spawned(torch_args(options.torch, options.program, out, options)
                                    + [f"--world-size={world_size}"],
                                    f"torch_rounds.py at {world_size} spawned ranks"))
    return {"link": {"rate": "loopback", "bits_per_second": None,
                     "measured_bits_per_second": None, "world_size": world_size}, **runs}


def link_runs(build, world_size, rate, options):
    program = PROGRAMS[options.program][0]
    with shaped_link.ShapedLink(world_size, rate) as link, \
            tempfile.TemporaryDirectory(prefix="tp-rounds-") as tmp:
        measured = link_bench.measure_rate(link, options.smoke)
        runs = alternate_runs(
            options, tmp,
            lambda out: link_bench.run_job(
                link, round_args(build, options.program, out, options)
                + ["--init-method=env://"], tmp, f"{program} on a {rate} link"),
            lambda out: link_bench.run_job(
                link, torch_args(options.torch, options.program, out, options)
                + ["--init-method=env://"], tmp, f"torch_rounds.py on a {rate} link"))
    return {"link": {"rate": rate, "bits_per_second": shaped_link.parse_rate(rate),
                     "measured_bits_per_second": measured, "world_size": world_size}, **runs}


def labels_of(run):
    """(the round's variants in its order, from the results' context
    "variants", and the first of them: what the ratios divide by)."""
    labels = run["context"].get("variants", "").split(",")
    if not labels[0] or any(f"{label}_ms" not in run["counters"] for label in labels):
        raise RuntimeError(f"the round's context names variants {labels} and its counters "
                           f"are {sorted(run['counters'])}: not the same program?")
    return labels, labels[0]


def summarise_runs(measured_runs):
    """(first, [{"label", "ms", "ms_runs", "ratio": [median, low, high],
    "spread"}]) of one round's runs: the median over runs of each variant's
    median step and of its ratio to the first variant."""
    labels, first = labels_of(measured_runs[0])
    runs = [r["counters"] for r in measured_runs]
    variants = []
    for label in labels:
        ms = [r[f"{label}_ms"] for r in runs]
        ratios = [1.0 if label == first else r[f"{label}_over_{first}"] for r in runs]
        middle = statistics.median(ratios)
        variants.append({"label": label, "ms": statistics.median(ms),
                         "ms_runs": ms, "ratio": [middle, min(ratios), max(ratios)],
                         "spread": (max(ratios) - min(ratios)) / middle})
    return first, variants


def versus(kit, torch):
    """Per label both rounds have, in the kit's order: the kit's step over
    PyTorch's, run i against run i (the two ran one after the other):
    {"label", "ratio": [median, low, high], "spread"}."""
    out = []
    theirs = {v["label"]: v for v in torch}
    for v in kit:
        if v["label"] not in theirs:
            continue
        ratios = [a / b for a, b in zip(v["ms_runs"], theirs[v["label"]]["ms_runs"])]
        middle = statistics.median(ratios)
        out.append({"label": v["label"], "ratio": [middle, min(ratios), max(ratios)],
                    "spread": (max(ratios) - min(ratios)) / middle})
    return out


def summarise(measurement):
    """{"link", "first", "runs", "variants"} of one link's runs (see
    summarise_runs), and where PyTorch ran beside the kit, "torch":
    {"first", "variants"} of its runs and "versus" (see versus)."""
    first, variants = summarise_runs(measurement["runs"])
    summary = {"link": measurement["link"], "first": first, "runs": len(measurement["runs"]),
               "variants": variants}
    if measurement.get("torch_runs"):
        torch_first, torch_variants = summarise_runs(measurement["torch_runs"])
        summary["torch"] = {"first": torch_first, "variants": torch_variants}
        summary["versus"] = versus(variants, torch_variants)
    return summary


def outward(values, digits):
    """"[low, high]" of `values` rounded outward to `digits` decimals: the
    range printed holds every run."""
    scale = 10 ** digits
    low = math.floor(min(values) * scale + 1e-9) / scale
    high = math.ceil(max(values) * scale - 1e-9) / scale
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def flag(spread):
    return " (10% or more: quote the range)" if spread >= SPREAD_LIMIT else ""


def percent(spread):
    return f"{math.floor(1000 * spread) / 10:.1f}%"


def variant_rows(first, variants):
    lines = [f"| variant | step, ms | / {first} | spread of the ratio |", "|---|---|---|---|"]
    for v in variants:
        middle, low, high = v["ratio"]
        lines.append(f"| {v['label']} | {v['ms']:.1f} {outward(v['ms_runs'], 1)} | "
                     f"{middle:.2f}x {outward([low, high], 2)} | "
                     f"{percent(v['spread'])}{flag(v['spread'])} |")
    return lines


def table(summaries):
    lines = []
    for s in summaries:
        link = s["link"]
        measured = (f", measured {link['measured_bits_per_second'] / 1e6:.0f} Mbit/s"
                    if link["measured_bits_per_second"] else "")
        lines += [f"{link['world_size']} ranks, {link['rate']}{measured}, {s['runs']} runs "
                  f"(medians over runs; [lowest, highest run], rounded outward):", ""]
        lines += variant_rows(s["first"], s["variants"]) + [""]
        if "torch" in s:
            lines += ["PyTorch's DDP, same link, each run right after the kit's:", ""]
            lines += variant_rows(s["torch"]["first"], s["torch"]["variants"]) + [""]
            lines += ["The kit's step over PyTorch's (run i over run i):", "",
                      "| variant | kit / PyTorch | spread |", "|---|---|---|"]
            for v in s["versus"]:
                middle, low, high = v["ratio"]
                lines.append(f"| {v['label']} | {middle:.2f}x {outward([low, high], 2)} | "
                             f"{percent(v['spread'])}{flag(v['spread'])} |")
            lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", help="the build directory (with bench/bench_PROGRAM)")
    parser.add_argument("--program", default="fsdp", choices=sorted(PROGRAMS),
                        help="whose round: bench_fsdp (default), bench_zero, bench_hooks "
                             "or bench_overlap")
    parser.add_argument("--rates", default="1gbit",
                        help="link rates, as tc writes them (default 1gbit)")
    parser.add_argument("--world-sizes", default="2", help="ranks, one per host (default 2)")
    parser.add_argument("--runs", type=int, default=3, help="runs per link (default 3)")
    parser.add_argument("--batch", type=int, help="rows per rank (the program's default)")
    parser.add_argument("--no-loopback", action="store_true",
                        help="skip the runs without a link")
    parser.add_argument("--loopback-only", action="store_true",
                        help="no link: the runs on spawned ranks alone (no root needed)")
    parser.add_argument("--out", help="write the runs and the summary here (JSON; the table "
                        "beside it, .md)")
    parser.add_argument("--smoke", action="store_true",
                        help="one iteration per run (tests): the times mean nothing")
    torch_choice = parser.add_mutually_exclusive_group()
    torch_choice.add_argument("--torch", action="store_true",
                              help="PyTorch's round after each run (hooks, zero, overlap); "
                                   "an error where no python imports torch")
    torch_choice.add_argument("--no-torch", action="store_true",
                              help="the kit's rounds only (by default PyTorch's run beside "
                                   "them where a python imports torch)")
    args = parser.parse_args()
    try:
        rates = [r for r in args.rates.split(",") if r]
        for rate in rates:
            shaped_link.parse_rate(rate)
        sizes = [int(w) for w in args.world_sizes.split(",")]
    except ValueError as e:
        parser.error(str(e))
    if any(not 2 <= w <= 16 for w in sizes):
        parser.error(f"--world-sizes takes 2 to 16; got {sizes}")
    if not 1 <= args.runs <= 20:
        parser.error(f"--runs takes 1 to 20; got {args.runs}")
    if args.batch is not None and not 1 <= args.batch <= 4096:
        parser.error(f"--batch takes 1 to 4096; got {args.batch}")
    if args.loopback_only:
        if args.no_loopback:
            parser.error("--loopback-only and --no-loopback: nothing to measure")
        rates = []
    elif not rates:
        parser.error("--rates is empty (--loopback-only measures without a link)")
    args.torch = pick_torch(parser, args)
    program = PROGRAMS[args.program][0]
    if not os.access(os.path.join(args.build, "bench", program), os.X_OK):
        parser.error(f"{args.build}/bench/{program} is not built "
                     f"(ninja -C {args.build} bench/{program})")
    clean_stale()  # namespaces of runs that were SIGKILLed
    if rates:
        try:  # before minutes of loopback runs: a link that cannot be made is said at once
            with shaped_link.ShapedLink(2, rates[0]):
                pass
        except Unavailable as e:
            print(f"link_rounds: no shaped link here: {e} (--loopback-only measures without one)")
            sys.exit(SKIP)
    measurements, failed = [], None
    try:
        for w in sizes:
            if not args.no_loopback:
                print(f"link_rounds: {program}, {w} ranks, loopback, {args.runs} runs",
                      flush=True)
                measurements.append(loopback_runs(args.build, w, args))
            for rate in rates:
                print(f"link_rounds: {program}, {w} ranks, {rate}, {args.runs} runs", flush=True)
                measurements.append(link_runs(args.build, w, rate, args))
    except (RuntimeError, Unavailable) as e:
        failed = e  # what was measured before is summarised, and nothing is written
    summaries = [summarise(m) for m in measurements]
    text = table(summaries)
    print(text)
    if args.smoke:
        print("(smoke run: one iteration each, the times mean nothing)")
    if failed:
        print(f"link_rounds: {failed}; the runs before it are above, and nothing was written",
              file=sys.stderr)
        sys.exit(1)
    if args.out:
        write_text(args.out, json.dumps({"program": program, "smoke": args.smoke,
                                         "measurements": measurements,
                                         "summary": summaries}, indent=1) + "\n")
        write_text(os.path.splitext(args.out)[0] + ".md",
                   f"# {PROGRAMS[args.program][1]} on loopback and shaped links\n\n"
                   f"Made with `{command_line(args)}`.\n\n" + text)
        print(f"link_rounds: wrote {args.out}")


def pick_torch(parser, args):
    """The python that runs PyTorch's rounds, or None: none for fsdp (PyTorch
    1.13's FSDP needs CUDA) or --no-torch; an error for --torch where
    nothing imports torch."""
    if args.no_torch or (args.program not in TORCH_ROUNDS and not args.torch):
        return None
    if args.program not in TORCH_ROUNDS:
        parser.error(f"--torch: PyTorch has no round beside bench_{args.program} "
                     f"(only {', '.join(sorted(TORCH_ROUNDS))})")
    python = link_bench.torch_python()
    if python is None and args.torch:
        parser.error("--torch: no python here imports torch (Debian: apt-get install "
                     "python3-torch)")
    if python is None:
        print("link_rounds: no python here imports torch: PyTorch's rounds not run")
    return python


def command_line(args):
    """This run's command as a reader would type it in the kit's root: the
    build folder as `build`, without --out (machine paths stay out of the
    committed table)."""
    flags = [f"--program {args.program}"]
    flags += ["--loopback-only"] if args.loopback_only else [f"--rates {args.rates}"]
    flags += [f"--world-sizes {args.world_sizes}", f"--runs {args.runs}"]
    flags += [f"--batch {args.batch}"] if args.batch else []
    flags += ["--no-loopback"] if args.no_loopback else []
    if args.program in TORCH_ROUNDS:
        flags += ["--torch"] if args.torch else ["--no-torch"]
    flags += ["--smoke"] if args.smoke else []
    return "python3 bench/link_rounds.py build " + " ".join(flags)

if __name__ == "__main__":
    main()
