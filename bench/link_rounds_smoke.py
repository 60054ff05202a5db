#!/usr/bin/env python3
"""bench/link_rounds.py runs end to end and its summary is what it measured.

    link_rounds_smoke.py BUILD

First summarise() and table() on made-up runs worked out by hand, with
and without PyTorch's runs beside them. Then
runs `link_rounds.py BUILD --program fsdp --rates 1gbit --world-sizes 2
--runs 2 --smoke --out TMP/link_fsdp.json` (one iteration per run: the
times mean nothing) and checks: a loopback and a 1gbit measurement of 2
runs each, the link's rate measured; every variant bench_fsdp's round
names (its context's "variants", in that order) summarised, the first
(ddp) at 1x, each median ratio the median of its runs' ratios and inside
their range; the .md table beside the JSON; bench/fsdp_figure.py draws
fsdp.png from it, and bench/rounds_figure.py link_hooks.png from the
made-up runs with PyTorch's (where matplotlib is installed). Then that bad flags are
refused before anything runs, and that bench/on_link.py runs demo_10 as
2 ranks on a 1gbit link (its trace written) and refuses a bad command
line. Exits 77 (SKIPPED) where namespaces cannot
be made (not root, no tc). Some seconds.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from smoke import expect_refused, fail, python_with  # noqa: E402

BUILD = sys.argv[1]
SCRIPT = os.path.join(HERE, "link_rounds.py")


def run(args):
    return subprocess.run([sys.executable, SCRIPT, BUILD, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)


def check_refused():
    expect_refused(SCRIPT, [([BUILD, *args], words) for args, words in [
        (["--runs", "0"], "--runs takes 1 to 20"),
        (["--world-sizes", "1"], "--world-sizes takes 2 to 16"),
        (["--rates", "fast"], "fast"),
        (["--program", "step"], "invalid choice"),
        (["--rates", ""], "--rates is empty"),
        (["--no-loopback", "--loopback-only"], "nothing to measure"),
        (["--torch", "--no-torch"], "not allowed with"),
        (["--program", "fsdp", "--torch"], "PyTorch has no round beside bench_fsdp")]], code=2)


made_up_with_torch = {}  # link_rounds' output for rounds_figure.py, filled below


def check_rounds_figure(plot_python, tmp):
    """rounds_figure.py draws link_hooks.png from a link_hooks.json with
    PyTorch's runs beside the kit's (the made-up one above)."""
    with open(os.path.join(tmp, "link_hooks.json"), "w") as f:
        json.dump(made_up_with_torch, f)
    r = subprocess.run([plot_python, os.path.join(HERE, "rounds_figure.py"), "hooks", tmp],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or not os.path.exists(os.path.join(tmp, "link_hooks.png")):
        fail(f"rounds_figure.py hooks exited {r.returncode}:\n{r.stdout}")


def check_summarise_by_hand():
    """summarise and table on three made-up runs, worked out by hand (no
    link, no root needed)."""
    import link_rounds
    runs = [{"context": {"variants": "ddp,full"},
             "counters": {"ddp_ms": ms, "full_ms": full, "full_over_ddp": ratio}}
            for ms, full, ratio in ((10.0, 30.0, 3.0), (12.0, 33.0, 2.5), (11.0, 36.5, 3.25))]
    s = link_rounds.summarise({"link": {"rate": "1gbit", "world_size": 2,
                                        "measured_bits_per_second": 9.6e8}, "runs": runs})
    full = s["variants"][1]
    if [v["label"] for v in s["variants"]] != ["ddp", "full"] or s["first"] != "ddp" or \
            full["ms"] != 33.0 or full["ratio"] != [3.0, 2.5, 3.25] or \
            abs(full["spread"] - 0.25) > 1e-12 or s["variants"][0]["ms"] != 11.0:
        fail(f"summarise of made-up runs: {s}")
    text = link_rounds.table([s])
    for want in ("| full | 33.0 [30.0, 36.5] | 3.00x [2.50, 3.25] | 25.0% (10% or more",
                 "| ddp | 11.0 [10.0, 12.0] | 1.00x [1.00, 1.00] | 0.0% |",
                 "measured 960 Mbit/s, 3 runs"):
        if want not in text:
            fail(f"table lacks {want!r}:\n{text}")
    if link_rounds.outward([1.234, 5.671], 2) != "[1.23, 5.68]":
        fail(f"outward([1.234, 5.671], 2) = {link_rounds.outward([1.234, 5.671], 2)}")
    # PyTorch's runs beside them: its own table, and the kit's step over
    # PyTorch's run by run, for the labels both have (here "full" only).
    torch_runs = [{"context": {"variants": "none,full"},
                   "counters": {"none_ms": 9.0, "full_ms": full, "full_over_none": 1.0}}
                  for full in (15.0, 30.0, 36.5)]
    s = link_rounds.summarise({"link": {"rate": "1gbit", "world_size": 2,
                                        "measured_bits_per_second": 9.6e8}, "runs": runs,
                               "torch_runs": torch_runs})
    # full: 30 / 15 = 2, 33 / 30 = 1.1, 36.5 / 36.5 = 1: median 1.1, spread 1 / 1.1
    if [v["label"] for v in s["versus"]] != ["full"] or \
            [round(x, 12) for x in s["versus"][0]["ratio"]] != [1.1, 1.0, 2.0] or \
            s["torch"]["first"] != "none" or s["torch"]["variants"][1]["ms"] != 30.0:
        fail(f"summarise with PyTorch's runs: {s}")
    made_up_with_torch.update(summary=[s])
    text = link_rounds.table([s])
    for want in ("PyTorch's DDP, same link", "| full | 30.0 [15.0, 36.5] | 1.00x",
                 "| full | 1.10x [1.00, 2.00] | 90.9% (10% or more"):
        if want not in text:
            fail(f"table lacks {want!r}:\n{text}")


def check_summary(data):
    measurements, summaries = data["measurements"], data["summary"]
    rates = [m["link"]["rate"] for m in measurements]
    if rates != ["loopback", "1gbit"]:
        fail(f"measured {rates}, want loopback then 1gbit")
    if not measurements[1]["link"]["measured_bits_per_second"]:
        fail("the link's rate was not measured")
    for m, s in zip(measurements, summaries):
        if len(m["runs"]) != 2 or s["runs"] != 2:
            fail(f"{m['link']['rate']}: {len(m['runs'])} runs, want 2")
        variants = m["runs"][0]["context"]["variants"].split(",")
        if [v["label"] for v in s["variants"]] != variants or variants[0] != "ddp" or \
                len(variants) < 8:
            fail(f"{m['link']['rate']}: summarised {[v['label'] for v in s['variants']]}, "
                 f"the round's variants are {variants}")
        for v in s["variants"]:
            ratios = [1.0 if v["label"] == "ddp" else r["counters"][f"{v['label']}_over_ddp"]
                      for r in m["runs"]]
            middle, low, high = v["ratio"]
            if abs(middle - statistics.median(ratios)) > 1e-12 or low != min(ratios) or \
                    high != max(ratios) or not low <= middle <= high:
                fail(f"{v['label']}: ratio {v['ratio']} from runs {ratios}")
        if s["variants"][0]["ratio"] != [1.0, 1.0, 1.0]:
            fail(f"the first variant is not 1x: {s['variants'][0]}")


def check_on_link(tmp):
    """bench/on_link.py starts a launched demo on a shaped link, its trace
    written, and refuses a bad command line."""
    on_link = os.path.join(HERE, "on_link.py")
    trace = os.path.join(tmp, "trace.json")
    r = subprocess.run([sys.executable, on_link, "1gbit", "2", "--",
                        os.path.join(BUILD, "lessons", "demo_10"), "--init-method", "env://",
                        "--model", "deep", "--depth", "4", "--steps", "2", "--trace", trace],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if r.returncode != 0 or "matches the reference" not in r.stdout or not os.path.exists(trace):
        fail(f"on_link.py 1gbit 2 -- demo_10: exit {r.returncode}, trace written: "
             f"{os.path.exists(trace)}; said:\n{r.stdout[-3000:]}")
    expect_refused(on_link, [(["1gbit", "2", "demo"], "usage: on_link.py"),
                             (["fast", "2", "--", "demo"], "a link rate is"),
                             (["1gbit", "1", "--", "demo"], "W is 2 to 16")])


def main():
    if not os.access(os.path.join(BUILD, "bench", "bench_fsdp"), os.X_OK):
        fail(f"{BUILD}/bench/bench_fsdp is not built")
    check_summarise_by_hand()
    check_refused()
    with tempfile.TemporaryDirectory(prefix="tp-rounds-smoke-") as tmp:
        out = os.path.join(tmp, "link_fsdp.json")
        r = run(["--program", "fsdp", "--rates", "1gbit", "--world-sizes", "2", "--runs", "2",
                 "--smoke", "--out", out])
        if "no shaped link here" in r.stdout:
            print(r.stdout)
            sys.exit(77)
        if r.returncode != 0:
            fail(f"link_rounds.py exited {r.returncode}:\n{r.stdout}")
        with open(out) as f:
            check_summary(json.load(f))
        if not os.path.exists(os.path.join(tmp, "link_fsdp.md")):
            fail("no link_fsdp.md beside the JSON")
        # fsdp_figure.py needs fsdp_memory.json beside it: a small one, of its
        # format (bench/fsdp_memory.py's), two forms at two world sizes.
        with open(os.path.join(tmp, "fsdp_memory.json"), "w") as f:
            json.dump({"runs": [{"form": form, "world_size": w,
                                 "ranks": [{"peak_model_state_bytes": 1000 * k // w}]}
                                for form, k in (("ddp", 3), ("full", 2)) for w in (1, 2)]}, f)
        plot_python = python_with("matplotlib")
        if not plot_python:
            print("no python here imports matplotlib: fsdp_figure.py not tried")
        else:
            r = subprocess.run([plot_python, os.path.join(HERE, "fsdp_figure.py"), tmp],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0 or not os.path.exists(os.path.join(tmp, "fsdp.png")):
                fail(f"fsdp_figure.py exited {r.returncode}:\n{r.stdout}")
            check_rounds_figure(plot_python, tmp)
        check_on_link(tmp)
    print("ok: on_link.py ran demo_10 on a link; link_rounds.py measured loopback and a "
          "1gbit link, 2 runs each, and summarised every variant of bench_fsdp's round")


if __name__ == "__main__":
    main()
