"""One all-reduce against its size (bench_allreduce): the kit's against raw
Gloo's (and PyTorch's), the alpha-beta fits, and what the kit adds per
collective; allreduce.png.

The alpha-beta model: one all-reduce of n bytes takes t(n) = alpha + beta*n,
fitted once to the medians (a typical all-reduce) and once to the means.
report_allreduce puts the fits in `fits`, {(impl, W): (alpha, beta)} and
{(impl, W, "mean"): ...}, from which the sync section predicts its cap sweep.
"""

from alpha_beta import fit_alpha_beta, median
from report_sections.figures import COLOURS
from report_sections.results import arg, by_world_size, runs_named
from report_sections.summary import TARGET_KIT_OVERHEAD


def allreduce_rows(result):
    """{impl: [(bytes, p50 s, p90 s, busbw GB/s, mean s)]} sorted by size, for
    impl "Kit" and "Gloo" (measured interleaved, in the same runs)."""
    rows = {}
    for name, run in runs_named(result, "BM_Allreduce").items():
        n = arg(name, None)
        w = int(result["context"].get("world_size", 2))
        for impl, key in (("Kit", "kit"), ("Gloo", "gloo")):
            p50 = run[key + "_p50_us"] * 1e-6
            busbw = n / p50 / 1e9 * 2 * (w - 1) / w if w > 1 else 0.0  # the kit's is a counter
            rows.setdefault(impl, []).append((n, p50, run[key + "_p90_us"] * 1e-6, busbw,
                                              run[key + "_mean_us"] * 1e-6))
    for data in rows.values():
        data.sort()
    return rows


def human_bytes(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def report_allreduce(results, report, fits):
    report.add("## One all-reduce against its size (bench_allreduce)", "")
    measured = by_world_size(results, "bench_allreduce")
    for w, result in measured:
        rows = allreduce_rows(result)
        for impl, data in rows.items():
            fits[(impl, w)] = fit_alpha_beta([d[0] for d in data], [d[1] for d in data])
            fits[(impl, w, "mean")] = fit_alpha_beta([d[0] for d in data], [d[4] for d in data])
        report.add(f"### {w} ranks", "")
        ratios = size_table(results, w, result, rows, report)
        fit_lines(fits, w, report)
        kit_cost_lines(result, report)
        if ratios:
            overhead_line(ratios, w, report)
        report.add("")
    if not measured:
        report.add("Not measured (bench_allreduce.w*.json missing).", "")


def size_table(results, w, result, rows, report):
    """The table of one world size, a row per size; returns [(size, kit/Gloo)]
    where the run has the ratio."""
    kit = {d[0]: d for d in rows.get("Kit", [])}
    gloo = {d[0]: d for d in rows.get("Gloo", [])}
    torch = {}
    if ("torch_ddp", w) in results:
        for name, run in runs_named(results[("torch_ddp", w)], "BM_TorchAllreduce").items():
            torch[arg(name, None)] = run["p50_us"]
    table = []
    ratios = []
    for n in sorted(kit):
        k = kit[n]
        g = gloo.get(n)
        # The median of the per-iteration ratios (a counter): each pair
        # was measured a moment apart.
        ratio = result["runs"].get(f"BM_Allreduce/{n}", {}).get("kit_over_gloo")
        if ratio:
            ratios.append((n, ratio))
        row = [human_bytes(n), f"{k[1] * 1e6:.1f}", f"{k[2] * 1e6:.1f}", f"{k[3]:.3f}",
               f"{g[1] * 1e6:.1f}" if g else "-", f"{ratio:.2f}x" if ratio else "-"]
        if torch:
            row += [f"{torch[n]:.1f}" if n in torch else "-",
                    f"{torch[n] / (g[1] * 1e6):.2f}x" if n in torch and g else "-"]
        table.append(row)
    report.table(["size", "kit p50 us", "kit p90 us", "kit busbw GB/s", "Gloo p50 us",
                  "kit/Gloo"] + (["PyTorch p50 us", "PyTorch/Gloo"] if torch else []),
                 table)
    return ratios


def fit_lines(fits, w, report):
    """The alpha-beta fits of one world size, the kit's and Gloo's, to the
    medians and to the means."""
    for impl in ("Kit", "Gloo"):
        for key, what in (((impl, w), "medians"), ((impl, w, "mean"), "means")):
            fit = fits.get(key)
            if fit:
                alpha, beta = fit
                report.add(f"- alpha-beta fit to the {what}, {impl.lower()}: alpha = "
                           f"{alpha * 1e6:.1f} us per all-reduce, beta = {beta * 1e9:.3f} ns "
                           f"per byte (1/beta = "
                           f"{1 / beta / 1e9 if beta > 0 else float('inf'):.2f} GB/s)")


def kit_cost_lines(result, report):
    """What the kit adds per collective, measured on its own: the hand-off to
    the communication thread and the count check."""
    handoff = result["runs"].get("BM_KitHandoff")
    if handoff:
        report.add(f"- the kit's hand-off alone (an empty all-reduce: queued, run on the "
                   f"communication thread, waited for; no Gloo): p50 "
                   f"{handoff['p50_us']:.1f} us, p90 {handoff['p90_us']:.1f} us")
    count_check = result["runs"].get("BM_CountCheck")
    if count_check:
        report.add(f"- the collective count check the trainer makes at every step's end "
                   f"(check_collective_count: a mapped file under spawn, one round trip to the "
                   f"TCP store when launched): p50 "
                   f"{count_check['p50_us']:.1f} us, p90 {count_check['p90_us']:.1f} us")
    report.add("- kit and raw Gloo ran interleaved (one of each per iteration); kit/Gloo is "
               "the median of the per-iteration ratios, fair even when the machine's load "
               "moves. PyTorch ran in its own process at another time.")


def overhead_line(ratios, w, report):
    """kit/Gloo across sizes: its median (the target, at 2 ranks) and its worst."""
    worst = max(ratios, key=lambda r: r[1])
    med = median([r for _, r in ratios])
    report.add(f"- kit over Gloo at the median: {med:.2f}x across sizes, "
               f"worst {worst[1]:.2f}x at {human_bytes(worst[0])}", "")
    if w == 2:
        report.target("kit all-reduce / raw Gloo, 2 ranks (median over sizes)",
                      f"{med:.2f}x (worst {worst[1]:.2f}x at {human_bytes(worst[0])})",
                      med <= TARGET_KIT_OVERHEAD)


def plot_allreduce(results, fits, save, plt):
    """allreduce.png where bench_allreduce results exist: latency against
    size (p50 to p90, the fitted line) and bus bandwidth."""
    allreduce = by_world_size(results, "bench_allreduce")
    if not allreduce:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for w, result in allreduce:
        rows = allreduce_rows(result)
        c = COLOURS.get(w)
        for impl, style in (("Kit", "o-"), ("Gloo", "x--")):
            data = rows.get(impl, [])
            if not data:
                continue
            n = [d[0] for d in data]
            p50 = [d[1] * 1e6 for d in data]
            p90 = [d[2] * 1e6 for d in data]
            label = f"{'kit' if impl == 'Kit' else 'raw Gloo'}, {w} ranks"
            left.plot(n, p50, style, color=c, label=label + " (p50)", markersize=4,
                      alpha=1.0 if impl == "Kit" else 0.6)
            if impl == "Kit":
                left.fill_between(n, p50, p90, color=c, alpha=0.15)
            right.plot(n, [d[3] for d in data], style, color=c, label=label, markersize=4,
                       alpha=1.0 if impl == "Kit" else 0.6)
        torch = results.get(("torch_ddp", w))
        if torch:
            data = sorted((arg(n, None), r["p50_us"]) for n, r in
                          runs_named(torch, "BM_TorchAllreduce").items())
            left.plot([d[0] for d in data], [d[1] for d in data], "+:", color=c, alpha=0.6,
                      label=f"PyTorch, {w} ranks (p50)")
        draw_fit(left, fits.get(("Kit", w)), rows, w, c)
    left.set(xscale="log", yscale="log", xlabel="bytes per rank",
             ylabel="one all-reduce, us (band: p50 to p90)",
             title="Latency; dotted: fitted alpha + beta*n")
    right.set(xscale="log", xlabel="bytes per rank", ylabel="bus bandwidth, GB/s",
              title="busbw = n/t * 2(W-1)/W")
    left.legend(fontsize=7, loc="lower right")
    right.legend(fontsize=7)
    save(fig, "allreduce.png")


def draw_fit(ax, fit, rows, w, colour):
    """The kit's fitted alpha + beta*n at `w` ranks, dotted, and its numbers."""
    if not fit:
        return
    n = [d[0] for d in rows["Kit"]]
    ax.plot(n, [(fit[0] + fit[1] * x) * 1e6 for x in n], ":", color=colour)
    ax.annotate(f"{w} ranks: alpha {fit[0] * 1e6:.0f} us, "
                f"1/beta {1 / fit[1] / 1e9:.2f} GB/s" if fit[1] > 0 else "",
                xy=(0.02, 0.93 - 0.07 * (w // 2 - 1)), xycoords="axes fraction",
                fontsize=8, color=colour)
