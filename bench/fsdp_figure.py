#!/usr/bin/env python3
"""Lesson 10's figure: what sharding saves in memory, and what it costs in time.

    fsdp_figure.py [RESULTS]        (default bench/results)

Draws RESULTS/fsdp.png from what is there:
  left   fsdp_memory.json (bench/fsdp_memory.py, ./kit bench): the peak of
         parameters, gradients and optimizer state on the rank that holds
         the most, against the world size, for DDP, ZeRO-1 and FSDP's three
         strategies (counts: the same on any machine);
  right  link_fsdp.json (bench/link_rounds.py --program fsdp, ./kit bench
         --link fsdp RATES): each stage 10 set-up's step over DDP's in the
         same round, the median of the runs with the lowest and highest run
         as a bar, on loopback and on each shaped link, at the smallest
         world size measured.
Both files are needed (a figure with an empty panel would replace a whole
one). report.py calls draw(); run alone, it redraws the figure after a link
run (./kit bench --link fsdp does).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from atomic_file import load_json, save_figure  # noqa: E402

# (form, name, line style): NO_SHARD holds what DDP holds, its line on DDP's
FORMS = [("ddp", "DDP (stage 08)", "o-"), ("zero1", "ZeRO-1 (stage 09)", "o-"),
         ("no_shard", "FSDP NO_SHARD (as DDP)", "x--"), ("grad_op", "FSDP SHARD_GRAD_OP", "o-"),
         ("full", "FSDP FULL_SHARD", "o-")]


def draw_memory(axis, memory):
    for form, name, style in FORMS:
        runs = sorted((r["world_size"], max(k["peak_model_state_bytes"] for k in r["ranks"]))
                      for r in memory["runs"] if r["form"] == form)
        if runs:
            axis.plot([w for w, _ in runs], [b / 1024 for _, b in runs], style, label=name)
    axis.set(xlabel="ranks", ylabel="peak params + grads + state, KiB (largest rank)",
             title="Memory per rank (the demos' deep model, momentum; counts)")
    axis.set_xticks(sorted({r["world_size"] for r in memory["runs"]}))
    axis.set_ylim(bottom=0)
    axis.legend(fontsize=7)


def draw_step(axis, rounds):
    summaries = rounds["summary"]
    world_size = min(s["link"]["world_size"] for s in summaries)
    shown = [s for s in summaries if s["link"]["world_size"] == world_size]
    labels = [v["label"] for v in shown[0]["variants"][1:]]  # the first is DDP: 1x
    width = 0.8 / len(shown)
    for i, s in enumerate(shown):
        ratios = {v["label"]: v["ratio"] for v in s["variants"]}
        xs = [k + (i - (len(shown) - 1) / 2) * width for k in range(len(labels))]
        middle = [ratios[label][0] if label in ratios else 0 for label in labels]
        low = [m - ratios[label][1] if label in ratios else 0 for m, label in zip(middle, labels)]
        high = [ratios[label][2] - m if label in ratios else 0
                for m, label in zip(middle, labels)]
        axis.bar(xs, middle, width, yerr=[low, high], capsize=2, label=s["link"]["rate"])
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
    axis.set(ylabel=f"step / {shown[0]['first']} step, same round",
             title=f"Step time at {world_size} ranks ({shown[0]['runs']} runs each)")
    axis.legend(fontsize=7)


def draw(memory, rounds, save, plt):
    """fsdp.png from fsdp_memory.json's and link_fsdp.json's contents, when
    both are there (None where missing): a figure with a panel missing would
    replace a whole one (link_fsdp.json comes only from a link run, as
    root). `save(fig, name)` writes it. Returns whether it drew."""
    if not memory or not rounds:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    draw_memory(left, memory)
    draw_step(right, rounds)
    save(fig, "fsdp.png")
    return True


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "results")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig, name):
        path = os.path.join(folder, name)
        save_figure(fig, path)
        print(f"fsdp_figure.py: wrote {path}")
    missing = [name for name in ("fsdp_memory.json", "link_fsdp.json")
               if load_json(folder, name) is None]
    if missing:
        sys.exit(f"fsdp_figure.py: {folder} has no {' and no '.join(missing)} "
                 f"(bench/fsdp_memory.py and bench/link_rounds.py --program fsdp write them)")
    draw(load_json(folder, "fsdp_memory.json"), load_json(folder, "link_fsdp.json"), save, plt)


if __name__ == "__main__":
    main()
