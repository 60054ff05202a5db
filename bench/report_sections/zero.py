"""Stage 09's ZeRO: step time and bytes per step of each optimizer
(bench_zero), and the optimizer state a rank holds against W
(zero_memory.json, from bench/zero_memory.py); zero.png.
"""

from report_sections.figures import COLOURS
from report_sections.results import by_world_size, ms, variant_runs

# Stage 09's optimizers, in the order bench_zero.cc runs them.
OPTIMIZERS = [("sgd", "plain SGD (every rank steps everything)"),
              ("zero", "ZeRO, composed, all-gather"),
              ("zero_broadcast", "ZeRO, composed, a broadcast per shard"),
              ("zero_rs", "ZeRO, reduce-scatter form")]
# zero_memory.py's forms.
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
    measured = by_world_size(results, "bench_zero")
    for w, result in measured:
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
    if measured:
        report.add("- the deep model of bench_hooks (130 tensors, 4.2 MB), momentum 0.9; the "
                   "bytes are what each collective was handed per step and rank (an all-gather "
                   "or reduce-scatter: the whole flat tensor), not what crosses the wire; "
                   "PyTorch's rows (torch_ddp.py, where python3-torch is installed) are its own "
                   "program's medians, run at another moment than the kit's", "")
    else:
        report.add("Not measured (bench_zero.w*.json missing).", "")


def plot_zero(results, memory, save, plt):
    """zero.png where zero_memory.json or bench_zero results exist."""
    zero = {w: r["runs"] for w, r in by_world_size(results, "bench_zero")}
    if not memory and not zero:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    if memory:
        draw_state(left, memory)
    if zero:
        draw_step_times(right, zero)
    save(fig, "zero.png")


def draw_state(ax, memory):
    """The largest rank's optimizer state against W, a line per form, and
    DDP's divided by W."""
    by_form = {}
    for run in memory["runs"]:
        by_form.setdefault(run["form"], []).append(
            (run["world_size"], max(r["optimizer_state_bytes"] for r in run["ranks"]) / 1024))
    for form, points in by_form.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-",
                label=FORMS.get(form, form))
    ddp = dict(by_form.get("ddp", []))
    if ddp:
        ws = sorted(ddp)
        ax.plot(ws, [ddp[w] / w for w in ws], "k:", label="DDP's / W")
    ax.set(xlabel="ranks (W)", ylabel="optimizer state per rank, KiB (largest rank)",
           title="Optimizer state per rank", ylim=(0, None))
    ax.set_xticks(sorted({run["world_size"] for run in memory["runs"]}))
    ax.legend(fontsize=7)


def draw_step_times(ax, zero):
    """Each optimizer's step (the interleaved medians where BM_ZeroRound
    ran), a bar per world size."""
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
        ax.bar(xs, ys, width, label=f"{w} ranks", color=COLOURS.get(w))
    ax.set_xticks(range(len(OPTIMIZERS)), ["plain SGD", "ZeRO\nall-gather",
                                           "ZeRO\nbroadcasts", "ZeRO\nreduce-scatter"],
                  fontsize=8)
    ax.set(ylabel="one step, ms (interleaved medians)", title="Step time")
    ax.legend(fontsize=7)
