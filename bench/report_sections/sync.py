"""Gradient sync (bench_sync): stage 01's per-parameter all-reduces against
stage 02's buckets against one flat all-reduce, and stage 02's bucket-cap
sweep beside the alpha-beta prediction; sync.png.

The prediction: a sync that issues k all-reduces of B bytes in all, one
after another, takes about k*alpha + beta*B with the fit to bench_allreduce's
means (a sum of k all-reduces pays their stalls too).
"""

from report_sections.figures import COLOURS
from report_sections.results import arg, by_world_size, ms, runs_named
from report_sections.summary import TARGET_BUCKETED_SPEEDUP, TARGET_BUCKETED_VS_FLAT

SYNCS = ("BM_Stage01SyncGrads", "BM_Stage02SyncGrads", "BM_OneFlatAllreduce")


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
    measured = by_world_size(results, "bench_sync")
    for w, result in measured:
        report.add(f"### {w} ranks", "")
        depth_table(result, w, report)
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
    if not measured:
        report.add("Not measured (bench_sync.w*.json missing).", "")


def depth_table(result, w, report):
    """The three syncs against the model's depth; at depth 64 and 2 ranks,
    the bucketing targets."""
    by = {}
    for base in SYNCS:
        for name, run in runs_named(result, base).items():
            by.setdefault(arg(name, None), {})[base] = run
    table = []
    for depth in sorted(by):
        r = by[depth]
        s1, s2, fl = (ms(r[b]) if b in r else None for b in SYNCS)
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


def plot_sync(results, fits, save, plt):
    """sync.png where bench_sync results exist: the three syncs against
    depth, and the cap sweep beside its prediction, the best cap marked."""
    sync = by_world_size(results, "bench_sync")
    if not sync:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for w, result in sync:
        c = COLOURS.get(w)
        for base, style, label in (("BM_Stage01SyncGrads", "o-", "stage 01 (per parameter)"),
                                   ("BM_Stage02SyncGrads", "s-", "stage 02 (buckets)"),
                                   ("BM_OneFlatAllreduce", "^:", "one flat all-reduce")):
            data = sorted((arg(n, None), ms(r)) for n, r in runs_named(result, base).items())
            if data:
                left.plot([d[0] for d in data], [d[1] for d in data], style, color=c,
                          label=f"{label}, {w} ranks", markersize=4)
        draw_sweep(right, cap_sweep(result, fits.get(("Kit", w, "mean"))), w, c)
    left.set(xscale="log", yscale="log", xlabel="depth D of deep_mlp (2(D+1) tensors)",
             ylabel="sync_grads(), ms (median)", title="Per parameter vs buckets vs flat")
    depths = sorted({arg(n, None) for _, r in sync
                     for n in runs_named(r, "BM_Stage01SyncGrads")})
    left.set_xticks(depths, [str(d) for d in depths])
    left.minorticks_off()
    right.set(xscale="log", yscale="log", xlabel="bucket cap, MiB",
              ylabel="sync_grads(), ms (median)",
              title="Stage 02 cap sweep, depth 64 (16.9 MB)")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    save(fig, "sync.png")


def draw_sweep(ax, sweep, w, colour):
    """One world size's cap sweep: measured, predicted (where every cap has a
    prediction), and the best cap starred."""
    if not sweep:
        return
    ax.plot([s[0] for s in sweep], [s[1] for s in sweep], "o-", color=colour,
            label=f"measured, {w} ranks", markersize=4)
    if all(s[2] is not None for s in sweep):
        ax.plot([s[0] for s in sweep], [s[2] for s in sweep], "--", color=colour,
                alpha=0.6, label=f"alpha-beta prediction, {w} ranks")
    best = min(sweep, key=lambda s: s[1])
    ax.plot([best[0]], [best[1]], "*", color=colour, markersize=14)
    ax.annotate(f"best {best[0]:g} MiB", (best[0], best[1]),
                textcoords="offset points", xytext=(5, 8), fontsize=8, color=colour)
