"""Stage 02 against stage 03 on a shaped link (link.json, from
bench/link_bench.py: ./kit bench --link RATES): link.md's section, link.png
and, with cap sweeps, link_caps.png. The rows are link_bench.py's summary of
each run.
"""

from link_bench import summary as link_summary, table as link_table


def report_link(link, report):
    report.add("## Stage 02 against stage 03 on a shaped link", "")
    if not link:
        report.add("No link.json: `./kit bench --link 300mbit,1gbit,3gbit` measures it "
                   "(root: network namespaces).", "")
        return
    rows = [link_summary(run) for run in link["runs"]]
    report.add("One rank per host, hosts joined through a bridge, each host's egress limited "
               "to the rate (bench/link_bench.py); loopback: the ranks spawned on this "
               "machine. Medians per step, ms. compute: stage 02's step without its sync; "
               "ideal: max(compute, sync); hidden: (stage 02 - stage 03) / min(bwd, sync), "
               "the share of what overlap can hide at best; PyTorch DDP: its step at its "
               "default caps on the same link (bench/torch_ddp.py). alpha and 1 / beta: the "
               "fit to the kit's all-reduce medians on the link (--alpha-beta); the cap "
               "sweeps (--cap-sweep) set both caps, and their prediction is "
               "link_bench.py's predict_step03 from that fit and the default caps' compute "
               "and bwd.", "")
    report.add(link_table(rows), "")


def plot_link(link, save, plt):
    """link.png, a panel per (world size, batch); then link_caps.png where
    the runs swept caps."""
    if not link:
        return
    rows = [link_summary(run) for run in link["runs"]]
    panels = sorted({(r["world_size"], r["batch"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (w, batch) in zip(axes[0], panels):
        draw_rates(ax, [r for r in rows if (r["world_size"], r["batch"]) == (w, batch)], w, batch)
    save(fig, "link.png")
    swept = [r for r in rows if r["sweep"]]
    if swept:
        plot_caps(swept, save, plt)


def draw_rates(ax, mine, w, batch):
    """One panel of link.png: the steps, compute, sync and the ideal against
    the link's measured rate; loopback at the right, one rate step beyond
    the fastest link; PyTorch's DDP step where measured."""
    linked = sorted((r for r in mine if r["measured_mbit"]), key=lambda r: r["measured_mbit"])
    loop = [r for r in mine if not r["measured_mbit"]]
    x = [r["measured_mbit"] / 1e3 for r in linked]
    for key, style, label in (("s02", "o-", "stage 02 step"), ("s03", "s-", "stage 03 step"),
                              ("ideal", "k--", "ideal: max(compute, sync)"),
                              ("compute", ":", "compute"), ("sync", ":", "sync (stage 02)")):
        line, = ax.plot(x, [r[key] for r in linked], style, label=label)
        if loop:  # loopback at the right, one rate step beyond the fastest link
            xl = (x[-1] if x else 1.0) * 3
            ax.plot([xl], [loop[0][key]], style[0] if style[0] in "os" else "x",
                    color=line.get_color())
    ticks = x + ([(x[-1] if x else 1.0) * 3] if loop else [])
    ax.set_xscale("log")
    ax.set_xticks(ticks, [f"{t:.2g}" for t in x] + (["loopback"] if loop else []))
    ax.minorticks_off()
    torch = [r for r in linked if r["torch"]]
    if torch:
        ax.plot([r["measured_mbit"] / 1e3 for r in torch], [r["torch"] for r in torch], "^-",
                label="PyTorch DDP step")
    ax.set(xlabel="link rate, Gbit/s (measured)", ylabel="per step, ms (medians)",
           ylim=(0, None), title=f"{w} ranks, batch {batch} per rank")
    ax.legend(fontsize=7)


def plot_caps(swept, save, plt):
    """link_caps.png: each swept run's steps against both caps, beside the
    alpha-beta prediction of stage 03's; a row per world size, a column per
    link."""
    sizes = sorted({r["world_size"] for r in swept})
    columns = max(sum(r["world_size"] == w for r in swept) for w in sizes)
    fig, axes = plt.subplots(len(sizes), columns, figsize=(4.2 * columns, 3.6 * len(sizes)),
                             squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    placed = {w: 0 for w in sizes}
    for r in swept:
        row = sizes.index(r["world_size"])
        ax = axes[row][placed[r["world_size"]]]
        placed[r["world_size"]] += 1
        ax.set_visible(True)
        caps = [w.cap_kib for w in r["sweep"]]
        ax.plot(caps, [w.s03 for w in r["sweep"]], "s-", label="stage 03, measured")
        ax.plot(caps, [w.s02 for w in r["sweep"]], "o:", label="stage 02, measured")
        if r["sweep"][0].predicted is not None:
            ax.plot(caps, [w.predicted for w in r["sweep"]], "k--", label="stage 03, alpha-beta")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="both caps, KiB", ylabel="per step, ms (medians)", ylim=(0, None),
               title=f"{r['world_size']} ranks, {r['rate']}, batch {r['batch']}")
        ax.legend(fontsize=7)
    save(fig, "link_caps.png")
