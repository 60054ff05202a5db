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
  link_hooks.json,            bench/link_rounds.py: bench_hooks' and
  link_zero.json              bench_zero's rounds on loopback and shaped
                              links, PyTorch's beside them (./kit bench
                              --link hooks|zero RATES)
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
  link_hooks.png,    each hook's (ZeRO form's) step on loopback and on each
  link_zero.png      link, PyTorch's beside it (bench/rounds_figure.py)
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

Each section of the summary, with its figures, is a module of
bench/report_sections/ (allreduce, sync, step, hooks, zero, fsdp, link);
this file reads the folder, calls them in the summary's order and writes
what they made.

Run: python3 bench/report.py [RESULTS_DIR] [--out DIR] [--no-plots] [--link-only]
"""

import argparse
import os
import sys

from atomic_file import load_json, write_text
import fsdp_figure
import rounds_figure
from report_sections.allreduce import plot_allreduce, report_allreduce
from report_sections.figures import pyplot, saver
from report_sections.fsdp import report_fsdp
from report_sections.hooks import plot_hook_losses, plot_hooks, report_hook_losses, report_hooks
from report_sections.link import plot_link, report_link
from report_sections.results import load, load_rounds
from report_sections.step import plot_step, report_step, report_versus_torch
from report_sections.summary import Report, context_line
from report_sections.sync import plot_sync, report_sync
from report_sections.zero import plot_zero, report_zero, report_zero_memory


def plot(results, fits, out, hook_losses=None, zero_memory=None, link=None, fsdp_memory=None,
         link_fsdp=None, link_rounds=None):
    """Draws every figure whose results exist into `out`; returns their paths,
    in the order drawn."""
    plt = pyplot()
    written = []
    save = saver(out, written.append)
    plot_allreduce(results, fits, save, plt)
    plot_sync(results, fits, save, plt)
    plot_step(results, save, plt)
    plot_hooks(results, save, plt)
    plot_hook_losses(hook_losses, save, plt)
    plot_zero(results, zero_memory, save, plt)
    plot_link(link, save, plt)
    fsdp_figure.draw(fsdp_memory, link_fsdp, save, plt)
    for program, rounds in (link_rounds or {}).items():  # {"hooks": link_hooks.json's, ...}
        if rounds:
            rounds_figure.draw(program, rounds, save, plt)
    return written


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
        plot_link(link, saver(out, lambda path: print(f"report.py: wrote {path}")), pyplot())
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
                         load_json(args.results, "link_fsdp.json"),
                         {program: load_json(args.results, f"link_{program}.json")
                          for program in ("hooks", "zero")}):
            print(f"report.py: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
