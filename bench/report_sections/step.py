"""A whole training step (bench_step): stages 01 to 03 at each cap, how much
of the sync stage 03 hides, the sync's share against the batch, gradient
accumulation (stage 04), and stage 03 beside PyTorch's DDP in alternating
rounds; step.png.
"""

from alpha_beta import median
from report_sections.results import arg, by_world_size, ms
from report_sections.summary import TARGET_HIDDEN, TARGET_VS_TORCH


def cap_or_none(name):
    """A row's sort key: its bucket cap in KiB, -1 for a row without DDP.

    A cap of 0 sorts as 0, after the row without DDP: `cap or -1` tied them,
    and their order then followed Python's hash seed from run to run."""
    cap = arg(name, "cap_kib")
    return -1 if cap is None else cap


def report_step(results, report):
    report.add("## A training step: overlap, and PyTorch beside the kit (bench_step)", "")
    measured = by_world_size(results, "bench_step")
    for w, result in measured:
        report.add(f"### {w} ranks", "")
        runs = result["runs"]
        step_table(runs, results.get(("torch_ddp", w)), report)
        share_table(runs, report)
        pair = runs.get("BM_OverlapPair/cap_kib:0/batch:64")
        if w == 2 and pair:
            report.target("stage 03 hides stage 02's sync, 2 ranks, default caps, batch 64",
                          f"{pair['hidden'] * 100:.0f}%", pair["hidden"] >= TARGET_HIDDEN)
        accumulate_table(runs, report)
    if not measured:
        report.add("Not measured (bench_step.w*.json missing).", "")


def step_table(runs, torch, report):
    """A row per step measured: no DDP, stage 01, stages 02 and 03 at each
    cap, and PyTorch's steps (torch: its results at this world size, or None)."""
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
    if torch:
        steps = [(n, r) for n, r in torch["runs"].items() if n.startswith("BM_TorchStep")]
        for name, r in sorted(steps, key=lambda nr: cap_or_none(nr[0])):
            table.append([name, "-", f"{ms(r):.2f}", f"{r['p90_ms']:.2f}", "-"])
    if table:
        report.table(["run", "buckets", "step p50 ms", "step p90 ms", "sync_grads ms"],
                     table)


def share_table(runs, report):
    """The sync's share of the step against the batch, and what stage 03
    hides of stage 02's sync (BM_OverlapPair)."""
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


def accumulate_table(runs, report):
    """Gradient accumulation (stage 04): microseconds per sample without DDP,
    with one sync per step (no_sync) and with a sync every micro-batch."""
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


def plot_step(results, save, plt):
    """step.png where bench_step results exist (2 ranks', else the first):
    the step split into its phases, and the sync's share against the batch."""
    step = results.get(("bench_step", 2)) or next(
        (r for _, r in by_world_size(results, "bench_step")), None)
    if not step:
        return
    w = int(step["context"].get("world_size", 2))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2),
                                      gridspec_kw={"width_ratios": [3, 2]})
    draw_phases(left, step_bars(step["runs"], results.get(("torch_ddp", w))), w)
    draw_share(right, step["runs"])
    save(fig, "step.png")


def step_bars(runs, torch):
    """[(label, run)]: the steps step.png's bars show, those measured."""
    bars = [("no DDP", runs.get("BM_StepNoDDP")), ("stage 01", runs.get("BM_StepStage01")),
            ("stage 02", runs.get("BM_StepStage02/cap_kib:0")),
            ("stage 03", runs.get("BM_StepStage03/cap_kib:0"))]
    if torch:
        bars += [("PyTorch\nno DDP", torch["runs"].get("BM_TorchStepNoDDP")),
                 ("PyTorch\nDDP", torch["runs"].get("BM_TorchStepDDP/cap_kib:0"))]
    return [(label, r) for label, r in bars if r]


def draw_phases(ax, bars, w):
    """A stacked bar per step: forward, backward, sync and the rest."""
    bottoms = [0.0] * len(bars)
    labels = [b[0] for b in bars]
    for key, colour, name in (("fwd_ms", "tab:green", "forward"),
                              ("bwd_ms", "tab:purple", "backward (stage 03: with its sync)"),
                              ("sync_ms", "tab:red", "sync_grads()")):
        heights = [r.get(key, 0.0) for _, r in bars]
        ax.bar(labels, heights, bottom=bottoms, color=colour, label=name)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    rest = [max(0.0, r["real_time"] - b) for (_, r), b in zip(bars, bottoms)]
    ax.bar(labels, rest, bottom=bottoms, color="lightgray", label="rest (zero_grad, step)")
    # Linear, so that the phases' heights compare; stage 01's bar is cut
    # (its sync is some ten times the others' whole step) and labelled.
    others = [r["real_time"] for label, r in bars if label != "stage 01"]
    top = 1.6 * max(others) if others else None
    for x, (label, r) in enumerate(bars):
        if top and r["real_time"] > top:
            ax.annotate(f"{r['real_time']:.0f} ms", (x, top * 0.97), ha="center",
                        va="top", fontsize=8, color="white", fontweight="bold")
    ax.set(ylabel="one step, ms (means)", ylim=(0, top) if top else None,
           title=f"A training step at {w} ranks, default caps")
    ax.set_xticks(range(len(labels)), labels)
    ax.legend(fontsize=7)


def draw_share(ax, runs):
    """The sync's share of the step against the batch, a line per stage."""
    share = {}
    for name, r in runs.items():
        if name.startswith("BM_SyncShareStage0") and "sync_share" in r:
            share.setdefault(name.split("/")[0].replace("BM_SyncShareStage", "stage "),
                             []).append((arg(name, "batch"), r.get("sync_share", 0) * 100))
    for stage, data in sorted(share.items()):
        data.sort()
        ax.plot([d[0] for d in data], [d[1] for d in data], "o-",
                label=stage.replace("Stage", ""))
    ax.set(xscale="log", xlabel="batch, rows per rank", ylabel="% of the step in sync",
           ylim=(0, 100), title="Sync share against batch size")
    ax.legend(fontsize=7)
