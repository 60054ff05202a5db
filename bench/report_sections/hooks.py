"""Stage 08's communication hooks: bytes all-reduced and step time of each
(bench_hooks), and rank 0's loss per step with each (hook_losses.json, from
bench/hook_losses.py); hooks.png and hook_losses.png.
"""

from report_sections.figures import COLOURS
from report_sections.results import by_world_size, ms, variant_runs

# Stage 08's hooks, in the order bench_hooks.cc and hook_losses.py run them.
# PowerSGD's rank is the matrix rank of its low-rank approximation, said in
# full: its labels sit beside world sizes ("2 ranks", "4 ranks").
HOOKS = [("none", "no hook"), ("allreduce", "allreduce_hook"), ("fp16", "fp16_compress_hook"),
         ("powersgd_r1", "PowerSGD, matrix rank 1"), ("powersgd_r4", "PowerSGD, matrix rank 4")]


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
    measured = by_world_size(results, "bench_hooks")
    for w, result in measured:
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
    if measured:
        context = measured[-1][1]["context"]  # the batch and PowerSGD's start: the same in all
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


def plot_hooks(results, save, plt):
    """hooks.png where bench_hooks results exist: bytes all-reduced (with the
    compression above each bar) and step time (with the ratio to no hook)."""
    hooks = {w: hook_runs(r) for w, r in by_world_size(results, "bench_hooks")}
    hooks = {w: rows for w, rows in hooks.items() if rows}
    if not hooks:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [name for label, name in HOOKS]
    width = 0.8 / len(hooks)
    for i, (w, rows) in enumerate(sorted(hooks.items())):
        c = COLOURS.get(w)
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


def moving_mean(values, window):
    """[i]: the mean of values[i - window + 1 .. i] that are not None (None
    where there are none)."""
    out = []
    for i in range(len(values)):
        known = [v for v in values[max(0, i - window + 1):i + 1] if v is not None]
        out.append(sum(known) / len(known) if known else None)
    return out


def plot_hook_losses(losses, save, plt):
    """hook_losses.png where hook_losses.json has runs: each hook's loss (a
    moving mean) and its distance from no hook's, step by step."""
    if not (losses and losses.get("runs")):
        return
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
