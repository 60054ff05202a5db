#!/usr/bin/env python3
"""Lessons 03's, 08's and 09's figures: the rounds of bench_overlap,
bench_hooks and bench_zero on loopback and on shaped links, PyTorch's DDP
beside them.

    rounds_figure.py PROGRAM [RESULTS]     (PROGRAM overlap, hooks or zero;
                                            default RESULTS bench/results)

Draws RESULTS/link_PROGRAM.png from RESULTS/link_PROGRAM.json
(bench/link_rounds.py --program PROGRAM, ./kit bench --link PROGRAM RATES):
one panel per world size; per variant of the round, one bar per link
(loopback, then each rate): the median over the runs of the variant's
median step, the lowest and highest run as a line. Where PyTorch's rounds
ran beside the kit's, its step for the same variant is the hatched bar
next to the kit's (a PyTorch variant the kit's round lacks, such as
zero_per_parameter, is in the table only). ./kit bench --link
overlap|hooks|zero runs it after the measurement.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from atomic_file import load_json, save_figure  # noqa: E402

TITLES = {"overlap": "Stage 03's overlap at two caps (bench_overlap's round)",
          "hooks": "Stage 08's comm hooks (bench_hooks' round)",
          "zero": "Stage 09's ZeRO forms (bench_zero's round)"}


def bars(variants):
    """{label: (median ms, below, above)} of a summary's variants."""
    return {v["label"]: (v["ms"], v["ms"] - min(v["ms_runs"]), max(v["ms_runs"]) - v["ms"])
            for v in variants}


def draw_world_size(axis, shown, world_size):
    """One panel: every variant of the kit's round, a bar per link; PyTorch's
    hatched beside each where it ran."""
    labels = [v["label"] for v in shown[0]["variants"]]
    with_torch = any("torch" in s for s in shown)
    per_link = 2 if with_torch else 1
    width = 0.8 / (len(shown) * per_link)
    colours = [f"C{i}" for i in range(len(shown))]
    for i, s in enumerate(shown):
        series = [(bars(s["variants"]), "", "the kit")]
        if "torch" in s:
            series.append((bars(s["torch"]["variants"]), "//", "PyTorch"))
        for j, (values, hatch, who) in enumerate(series):
            slot = i * per_link + j
            xs = [k + (slot - (len(shown) * per_link - 1) / 2) * width
                  for k, label in enumerate(labels) if label in values]
            got = [values[label] for label in labels if label in values]
            axis.bar(xs, [m for m, _, _ in got], width, yerr=[[b for _, b, _ in got],
                                                              [a for _, _, a in got]],
                     capsize=2, color=colours[i], hatch=hatch, edgecolor="black",
                     linewidth=0.3, label=f"{s['link']['rate']}, {who}")
    axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    axis.set(ylabel="step, ms (median of runs; line: lowest to highest run)",
             title=f"{world_size} ranks, {shown[0]['runs']} runs each")
    axis.legend(fontsize=7)


def draw(program, rounds, save, plt):
    """link_PROGRAM.png from link_PROGRAM.json's contents. `save(fig,
    name)` writes it."""
    summaries = rounds["summary"]
    sizes = sorted({s["link"]["world_size"] for s in summaries})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 4.8), squeeze=False)
    for axis, w in zip(axes[0], sizes):
        draw_world_size(axis, [s for s in summaries if s["link"]["world_size"] == w], w)
    fig.suptitle(TITLES[program])
    fig.tight_layout()
    save(fig, f"link_{program}.png")


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in TITLES:
        sys.exit(f"usage: rounds_figure.py {'|'.join(sorted(TITLES))} [RESULTS]")
    program = sys.argv[1]
    folder = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "results")
    rounds = load_json(folder, f"link_{program}.json")
    if rounds is None:
        sys.exit(f"rounds_figure.py: {folder} has no link_{program}.json (bench/link_rounds.py "
                 f"--program {program} writes it)")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig, name):
        path = os.path.join(folder, name)
        save_figure(fig, path)
        print(f"rounds_figure.py: wrote {path}")
    draw(program, rounds, save, plt)


if __name__ == "__main__":
    main()
