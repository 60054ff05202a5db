#!/usr/bin/env python3
"""A benchmark's interleaved round on shaped links, several runs, with its spread.

    link_rounds.py BUILD [--program fsdp] [--rates 1gbit] [--world-sizes 2]
                   [--runs 3] [--batch N] [--no-loopback | --loopback-only] [--smoke]
                   [--out bench/results/link_fsdp.json]

bench_fsdp, bench_zero and bench_hooks each time their variants of a
training step side by side in one benchmark, a round (BM_FsdpRound,
BM_ZeroRound, BM_HookRound: one step of each variant per iteration, in an
order rotated every iteration; bench/ranked_benchmark.h). Over loopback
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
.md. bench/fsdp_figure.py draws link_fsdp.json.

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
            "hooks": ("bench_hooks", "BM_HookRound")}
SPREAD_LIMIT = 0.10  # a ratio whose runs spread this much or more is flagged


def round_args(build, program, out, options):
    name, round_name = PROGRAMS[program]
    args = [os.path.join(build, "bench", name), f"--benchmark_filter=^{round_name}(/|$)",
            f"--benchmark_out={out}", "--benchmark_out_format=json"]
    if options.batch:
        args.append(f"--batch={options.batch}")
    return args + (["--smoke=1"] if options.smoke else [])


def the_round(path, program):
    """The round's run (its counters) from rank 0's Google Benchmark JSON."""
    round_name = PROGRAMS[program][1]
    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"{PROGRAMS[program][0]} wrote no results for {round_name} ({e})")
    for b in result["benchmarks"]:
        if b["name"].split("/")[0] == round_name:
            return {"counters": {k: v for k, v in b.items() if isinstance(v, (int, float))},
                    "context": result.get("context", {})}
    raise RuntimeError(f"{path} has no {round_name}")


def loopback_runs(build, world_size, options):
    runs = []
    with tempfile.TemporaryDirectory(prefix="tp-rounds-") as tmp:
        for i in range(options.runs):
            out = os.path.join(tmp, f"run{i}.json")
            r = subprocess.run(round_args(build, options.program, out, options)
                               + [f"--world-size={world_size}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                print(r.stderr[-3000:], file=sys.stderr)
                raise RuntimeError(f"{PROGRAMS[options.program][0]} at {world_size} spawned "
                                   f"ranks failed: exit code {r.returncode}")
            runs.append(the_round(out, options.program))
    return {"link": {"rate": "loopback", "bits_per_second": None,
                     "measured_bits_per_second": None, "world_size": world_size},
            "runs": runs}


def link_runs(build, world_size, rate, options):
    runs = []
    with shaped_link.ShapedLink(world_size, rate) as link, \
            tempfile.TemporaryDirectory(prefix="tp-rounds-") as tmp:
        measured = link_bench.measure_rate(link, options.smoke)
        for i in range(options.runs):
            out = os.path.join(tmp, f"run{i}.json")
            link_bench.run_job(link, round_args(build, options.program, out, options)
                               + ["--init-method=env://"], tmp,
                               f"{PROGRAMS[options.program][0]} on a {rate} link")
            runs.append(the_round(out, options.program))
    return {"link": {"rate": rate, "bits_per_second": shaped_link.parse_rate(rate),
                     "measured_bits_per_second": measured, "world_size": world_size},
            "runs": runs}


def labels_of(run):
    """(the round's variants in its order, from the results' context
    "variants", and the first of them: what the ratios divide by)."""
    labels = run["context"].get("variants", "").split(",")
    if not labels[0] or any(f"{label}_ms" not in run["counters"] for label in labels):
        raise RuntimeError(f"the round's context names variants {labels} and its counters "
                           f"are {sorted(run['counters'])}: not the same program?")
    return labels, labels[0]


def summarise(measurement):
    """{"link", "first", "variants": [{"label", "ms", "ratio": [median, low,
    high], "spread"}]} of one link's runs: the median over runs of each
    variant's median step and of its ratio to the first variant."""
    labels, first = labels_of(measurement["runs"][0])
    runs = [r["counters"] for r in measurement["runs"]]
    variants = []
    for label in labels:
        ms = [r[f"{label}_ms"] for r in runs]
        ratios = [1.0 if label == first else r[f"{label}_over_{first}"] for r in runs]
        middle = statistics.median(ratios)
        variants.append({"label": label, "ms": statistics.median(ms),
                         "ms_runs": ms, "ratio": [middle, min(ratios), max(ratios)],
                         "spread": (max(ratios) - min(ratios)) / middle})
    return {"link": measurement["link"], "first": first, "runs": len(runs),
            "variants": variants}


def outward(values, digits):
    """"[low, high]" of `values` rounded outward to `digits` decimals: the
    range printed holds every run."""
    scale = 10 ** digits
    low = math.floor(min(values) * scale + 1e-9) / scale
    high = math.ceil(max(values) * scale - 1e-9) / scale
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def table(summaries):
    lines = []
    for s in summaries:
        link = s["link"]
        measured = (f", measured {link['measured_bits_per_second'] / 1e6:.0f} Mbit/s"
                    if link["measured_bits_per_second"] else "")
        lines += [f"{link['world_size']} ranks, {link['rate']}{measured}, {s['runs']} runs "
                  f"(medians over runs; [lowest, highest run], rounded outward):", "",
                  f"| variant | step, ms | / {s['first']} | spread of the ratio |",
                  "|---|---|---|---|"]
        for v in s["variants"]:
            middle, low, high = v["ratio"]
            flag = " (10% or more: quote the range)" if v["spread"] >= SPREAD_LIMIT else ""
            lines.append(f"| {v['label']} | {v['ms']:.1f} {outward(v['ms_runs'], 1)} | "
                         f"{middle:.2f}x {outward([low, high], 2)} | "
                         f"{math.floor(1000 * v['spread']) / 10:.1f}%{flag} |")
        lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", help="the build directory (with bench/bench_PROGRAM)")
    parser.add_argument("--program", default="fsdp", choices=sorted(PROGRAMS),
                        help="whose round: bench_fsdp (default), bench_zero or bench_hooks")
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


def command_line(args):
    """This run's command as a reader would type it in the kit's root: the
    build folder as `build`, without --out (machine paths stay out of the
    committed table)."""
    flags = [f"--program {args.program}"]
    flags += ["--loopback-only"] if args.loopback_only else [f"--rates {args.rates}"]
    flags += [f"--world-sizes {args.world_sizes}", f"--runs {args.runs}"]
    flags += [f"--batch {args.batch}"] if args.batch else []
    flags += ["--no-loopback"] if args.no_loopback else []
    flags += ["--smoke"] if args.smoke else []
    return "python3 bench/link_rounds.py build " + " ".join(flags)

if __name__ == "__main__":
    main()
