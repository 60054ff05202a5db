#!/usr/bin/env python3
"""Stage 02 against stage 03 on a shaped link: where overlap pays.

    link_bench.py BUILD [--rates 300mbit,1gbit,3gbit] [--world-sizes 2,4]
                  [--batches 64,256] [--alpha-beta] [--cap-sweep] [--no-torch]
                  [--out bench/results/link.json] [--smoke]

For each world size W and rate, makes W hosts joined through a switch,
each host's egress limited to the rate (bench/shaped_link.py), starts one
rank on each with tools/tprun and env://, and runs
BUILD/bench/bench_step --benchmark_filter='BM_StepNoDDP|BM_OverlapPair...'
--batch=B (stage 02 and stage 03 interleaved, one step of each per
iteration: bench_step.cc). Rank 0's Google Benchmark JSON is collected, with
the link's rate as asked and as measured (4 to 32 MB over TCP from host 0 to
host 1 before the run). Without a link ("loopback": the ranks spawned on
this machine, as ./kit bench runs them) the same benchmarks run once per W
for comparison.

Per run it prints and writes (--out, JSON: {"runs": [...]}; bench/report.py
draws it) the medians per step of
  compute     stage 02's step without its sync (forward, backward, SGD):
              what a rank computes
  fwd, bwd    stage 02's forward and backward
  sync        stage 02's sync_grads(): every bucket's all-reduce, waited for
  s02, s03    the two stages' steps
  ideal       max(compute, sync): a step whose communication all hid
              behind compute, or whose compute all hid behind it
  hidden      (s02 - s03) / min(bwd, sync): the share of what overlap can
              hide at best (stage 03 hides the sync behind backward only:
              forward and the optimizer step wait for it)

On the same link, as separate jobs after bench_step:
  torch       PyTorch's DDP step at its default caps (bench/torch_ddp.py
              --init-method env:// --only-default-caps), where /usr/bin/python3
              (or this python) imports torch; --no-torch skips it.
  alpha-beta  (--alpha-beta) bench_allreduce's kit all-reduce, 4 B to 64 MiB,
              fitted as report.py fits loopback: t(n) = alpha + beta * n.
  cap sweep   (--cap-sweep) BM_CapSweep: stages 02 and 03 at both caps
              64 KiB to 4 MiB, interleaved, beside what the alpha-beta fit
              predicts for each cap (predict_step03: the buckets of bench_step's model,
              filled as its gradients become ready during backward, sent one
              after the other on the communication thread).

Needs root, `ip` and `tc` (namespaces); without them it says why and exits
77. All namespaces go when it ends, also on SIGTERM, SIGHUP or SIGINT.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))  # namespaces.py, shared with tests/
from alpha_beta import fit_alpha_beta  # noqa: E402
from atomic_file import write_text  # noqa: E402
import shaped_link  # noqa: E402
from namespaces import SKIP, Unavailable, clean_stale  # noqa: E402

ROOT = os.path.dirname(HERE)
TPRUN = os.path.join(ROOT, "tools", "tprun")
PORT = 29500  # rank 0's store on host 0: the namespaces are fresh, nothing else listens
DEADLINE = 900.0  # seconds for one run of bench_step on a link


def filter_for(batch, cap_sweep):
    # BM_OverlapPair is registered at batches 1, 16, 64 and 256 (bench_step.cc),
    # BM_StepNoDDP and BM_CapSweep (--cap-sweep=1) at --batch.
    return f"BM_StepNoDDP|BM_OverlapPair/cap_kib:0/batch:{batch}/" + \
        ("|BM_CapSweep/" if cap_sweep else "")


def bench_args(build, batch, out, smoke, cap_sweep=False):
    args = [os.path.join(build, "bench", "bench_step"),
            f"--benchmark_filter={filter_for(batch, cap_sweep)}", f"--batch={batch}",
            f"--benchmark_out={out}", "--benchmark_out_format=json"]
    return args + (["--cap-sweep=1"] if cap_sweep else []) + (["--smoke=1"] if smoke else [])


def torch_python():
    """A python that imports torch (Debian's python3-torch is for
    /usr/bin/python3), or None."""
    for python in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
        if os.access(python, os.X_OK) and subprocess.run(
                [python, "-c", "import torch"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL).returncode == 0:
            return python
    return None


def run_job(link, command, tmp, what):
    """`command` (argv, run as one rank per host by tools/tprun over env://)
    on every host of `link`; raises naming the hosts that failed."""
    world_size = len(link.hosts)
    procs, logs = [], []
    job = f"link-{os.getpid()}-{len(os.listdir(tmp))}"
    for node, host in enumerate(link.hosts):
        log = open(os.path.join(tmp, f"{job}.host{node}.log"), "w+")
        logs.append(log)
        argv = [sys.executable, TPRUN, "--nnodes", str(world_size), "--node-rank", str(node),
                "--nproc-per-node", "1", "--master-addr", link.hosts[0].address,
                "--master-port", str(PORT), "--job-id", job, "--grace", "2", "--", *command]
        env = dict(os.environ, GLOO_SOCKET_IFNAME=shaped_link.INTERFACE)
        procs.append(host.popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env))
    start = time.monotonic()
    late = False
    # Until every host is done: past the deadline, or once a host failed
    # (its peers would wait for it until their collective timeout), the
    # others are ended after a grace.
    while any(p.poll() is None for p in procs):
        late = time.monotonic() - start > DEADLINE
        if late or any(p.poll() not in (None, 0) for p in procs):
            end(procs, grace=0 if late else 10)
            break
        time.sleep(0.2)
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        for i, _ in failed:
            logs[i].seek(0)
            print(f"--- host {i} ---\n{logs[i].read()[-3000:]}", file=sys.stderr)
        raise RuntimeError(f"{what} at {world_size} ranks failed: host (exit code): {failed}" +
                           (f" (ran past the {DEADLINE:.0f} s deadline)" if late else ""))


def end(procs, grace):
    """Waits up to `grace` s for `procs` to end, then SIGTERMs what is left
    (tprun ends its rank and says so) and, 10 s later, SIGKILLs it."""
    def wait_for(seconds):
        deadline = time.monotonic() + seconds
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)

    wait_for(grace)
    for stop in (subprocess.Popen.terminate, subprocess.Popen.kill):
        for p in procs:
            if p.poll() is None:
                stop(p)
        wait_for(10)


def measure_rate(link, smoke):
    """The link's rate as a transfer host 0 -> host 1 sees it, bits/s: a
    second of the rate (4 to 32 MB), or 4 MB in a smoke run."""
    nbytes = 4 << 20 if smoke else max(4 << 20, min(32 << 20, int(link.bits_per_second / 8)))
    return shaped_link.throughput(link, 0, 1, nbytes)


def run_on_link(build, world_size, rate, batch, options):
    """bench_step (and torch_ddp.py, bench_allreduce as `options` ask), one
    rank per host of a fresh shaped link."""
    smoke = options.smoke
    with shaped_link.ShapedLink(world_size, rate) as link, \
            tempfile.TemporaryDirectory(prefix="tp-link-") as tmp:
        measured = measure_rate(link, smoke)
        out = os.path.join(tmp, "rank0.json")
        run_job(link, [*bench_args(build, batch, out, smoke, options.cap_sweep),
                       "--init-method=env://"], tmp, f"bench_step on a {rate} link")
        with open(out) as f:
            result = json.load(f)
        if options.torch:
            out = os.path.join(tmp, "torch.json")
            run_job(link, [options.torch, os.path.join(HERE, "torch_ddp.py"), "--init-method",
                           "env://", "--only-default-caps", "--batch", str(batch), "--out", out]
                    + (["--smoke"] if smoke else []), tmp, f"torch_ddp.py on a {rate} link")
            with open(out) as f:
                result["torch"] = json.load(f)
        if options.alpha_beta:
            out = os.path.join(tmp, "allreduce.json")
            run_job(link, [os.path.join(build, "bench", "bench_allreduce"),
                           "--benchmark_filter=BM_Allreduce", f"--benchmark_out={out}",
                           "--benchmark_out_format=json", "--init-method=env://"]
                    + (["--smoke=1"] if smoke else []), tmp, f"bench_allreduce on a {rate} link")
            with open(out) as f:
                result["allreduce"] = json.load(f)
    result["link"] = {"rate": rate, "bits_per_second": shaped_link.parse_rate(rate),
                      "measured_bits_per_second": measured, "world_size": world_size,
                      "batch": batch}
    return result


def run_loopback(build, world_size, batch, smoke):
    """The same benchmarks, ranks spawned on this machine (no link)."""
    with tempfile.TemporaryDirectory(prefix="tp-link-") as tmp:
        out = os.path.join(tmp, "loopback.json")
        # Its context lines (stderr) are shown only when it fails.
        r = subprocess.run(bench_args(build, batch, out, smoke) + [f"--world-size={world_size}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            raise RuntimeError(f"bench_step at {world_size} spawned ranks failed: exit code "
                               f"{r.returncode}")
        with open(out) as f:
            result = json.load(f)
    result["link"] = {"rate": "loopback", "bits_per_second": None,
                      "measured_bits_per_second": None, "world_size": world_size,
                      "batch": batch}
    return result


# ---- the alpha-beta prediction of stage 03's step at a cap -------------------

# bench_step's model (bench_step.cc): deep_mlp(16, 128, 64, 4) in float32,
# its Linear layers as (fan_in, fan_out), first to last.
MODEL_LAYERS = [(16, 128)] + [(128, 128)] * 63 + [(128, 4)]


def model_tensors():
    """[(bytes, work)] of the model's parameters in registration order (each
    layer's weight, then its bias): work is the share of backward done when
    the gradient is ready, taken as the weight's element count (a Linear's
    backward is two products of that size per row); a bias adds none."""
    out = []
    for fan_in, fan_out in MODEL_LAYERS:
        out += [(4 * fan_in * fan_out, fan_in * fan_out), (4 * fan_out, 0)]
    return out


def buckets_for(cap_bytes):
    """[(bytes, work done when its last gradient is ready)] of the kit's
    buckets at both caps = cap_bytes: the parameters in reverse registration
    order (the order backward reaches them), a bucket closed once it holds at
    least the cap (PyTorch's _compute_bucket_assignment_by_size, as the
    stages follow it)."""
    buckets, size, done = [], 0, 0
    for nbytes, work in reversed(model_tensors()):
        size += nbytes
        done += work
        if size >= cap_bytes:
            buckets.append((size, done))
            size = 0
    if size:
        buckets.append((size, done))
    return buckets


def predict_sync_end(alpha, beta, bwd, buckets):
    """When stage 03's last all-reduce ends, in ms from the start of backward:
    backward's work spread over `bwd` ms, each bucket's all-reduce (alpha +
    beta * bytes) started on the one communication thread once the bucket is
    complete and the one before it has ended."""
    total = sum(w for _, w in model_tensors())
    end = 0.0
    for nbytes, done in buckets:
        ready = bwd * done / total
        end = max(ready, end) + (alpha + beta * nbytes) * 1e3
    return end


def predict_step03(alpha, beta, compute, bwd, cap_bytes):
    """Stage 03's step at a cap: compute, plus what of the sync outlasts
    backward."""
    return compute + max(0.0, predict_sync_end(alpha, beta, bwd, buckets_for(cap_bytes)) - bwd)


def allreduce_fit(result):
    """(alpha s, beta s/B) fitted to the kit's medians on the link, or None."""
    runs = [b for b in result.get("benchmarks", []) if b["name"].startswith("BM_Allreduce/")]
    sizes = [int(b["name"].split("/")[1]) for b in runs]
    return fit_alpha_beta(sizes, [b["kit_p50_us"] * 1e-6 for b in runs])


def sweep_caps(run):
    """{cap KiB: {"s02_ms": ..., "s03_ms": ..., "buckets": ...}} of a
    BM_CapSweep run's counters ("s03_ms_cap512" and so on)."""
    caps = {}
    for key, value in run.items():
        m = re.fullmatch(r"(\w+?)_cap(\d+)", key)
        if m:
            caps.setdefault(int(m.group(2)), {})[m.group(1)] = value
    return caps


# One cap of a sweep: the stages' bucket count there, the measured medians
# (ms) of both steps and of stage 02's sync, and the predicted stage 03 step
# (None without a fit).
SweepRow = collections.namedtuple("SweepRow", "cap_kib buckets s02 s03 sync02 predicted")


def sweep_rows(result, fit, compute, bwd):
    """[SweepRow] of BM_CapSweep, by cap; raises where the stages' bucket
    count is not the one buckets_for models."""
    rows = []
    for b in result["benchmarks"]:
        if not b["name"].startswith("BM_CapSweep/"):
            continue
        for cap_kib, c in sweep_caps(b).items():
            modelled = len(buckets_for(cap_kib << 10))
            if c["buckets"] != modelled:
                raise RuntimeError(f"at a cap of {cap_kib} KiB the stages built "
                                   f"{c['buckets']:.0f} buckets and link_bench.py's model of "
                                   f"them {modelled}: MODEL_LAYERS or buckets_for no longer "
                                   f"match bench_step.cc")
            predicted = predict_step03(*fit, compute, bwd, cap_kib << 10) if fit else None
            rows.append(SweepRow(cap_kib, modelled, c["s02_ms"], c["s03_ms"], c["sync02_ms"],
                                 predicted))
    return sorted(rows)


def per_bucket_ms(rows):
    """The slope, ms per bucket, of stage 02's sync against its number of
    buckets over a sweep's rows (least squares; the bytes are the same at
    every cap): what one more all-reduce costs inside a step, to set beside
    the fit's alpha. None with fewer than two bucket counts."""
    if len({r.buckets for r in rows}) < 2:
        return None
    mk = sum(r.buckets for r in rows) / len(rows)
    mt = sum(r.sync02 for r in rows) / len(rows)
    return (sum((r.buckets - mk) * (r.sync02 - mt) for r in rows) /
            sum((r.buckets - mk) ** 2 for r in rows))


def summary(result):
    """The per-step medians of one run (see the module's doc), in ms."""
    pair = next(b for b in result["benchmarks"] if b["name"].startswith("BM_OverlapPair"))
    no_ddp = next(b for b in result["benchmarks"] if b["name"].startswith("BM_StepNoDDP"))
    sync, s02, s03 = pair["sync02_ms"], pair["s02_ms"], pair["s03_ms"]
    fwd, bwd = pair["fwd02_ms"], pair["bwd02_ms"]
    compute = s02 - sync
    torch = {b["name"]: b["p50_ms"] for b in result.get("torch", {}).get("benchmarks", [])}
    fit = allreduce_fit(result["allreduce"]) if "allreduce" in result else None
    sweep = sweep_rows(result, fit, compute, bwd)
    return {"rate": result["link"]["rate"], "world_size": result["link"]["world_size"],
            "batch": result["link"]["batch"],
            "measured_mbit": (result["link"]["measured_bits_per_second"] or 0) / 1e6,
            "no_ddp": no_ddp["p50_ms"], "fwd": fwd, "bwd": bwd, "compute": compute,
            "sync": sync, "s02": s02, "s03": s03, "bwd03": pair["bwd03_ms"],
            "ideal": max(compute, sync),
            "hidden": (s02 - s03) / min(bwd, sync) if min(bwd, sync) > 0 else 0.0,
            "s03_over_ideal": s03 / max(compute, sync),
            "torch": torch.get("BM_TorchStepDDP/cap_kib:0"),
            "torch_no_ddp": torch.get("BM_TorchStepNoDDP"),
            "fit": fit, "sweep": sweep, "per_bucket_ms": per_bucket_ms(sweep)}


def best_caps(row):
    """(measured best cap KiB, predicted best cap KiB or None, grid steps
    between them or None) of a run's cap sweep, or None without one."""
    sweep = row["sweep"]
    if not sweep:
        return None
    caps = [r.cap_kib for r in sweep]
    measured = min(sweep, key=lambda r: r.s03).cap_kib
    if sweep[0].predicted is None:
        return measured, None, None
    predicted = min(sweep, key=lambda r: r.predicted).cap_kib
    return measured, predicted, abs(caps.index(measured) - caps.index(predicted))


def table(rows):
    lines = ["| ranks | link | measured | batch | compute | fwd | bwd | sync | stage 02 | "
             "stage 03 | ideal | hidden of min(bwd, sync) | stage 03 / ideal | no DDP | "
             "PyTorch no DDP | PyTorch DDP | stage 03 / PyTorch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = f"{r['measured_mbit']:.0f} Mbit/s" if r["measured_mbit"] else "-"
        torch = (f"{r['torch_no_ddp']:.1f} | {r['torch']:.1f} | {r['s03'] / r['torch']:.2f}"
                 if r["torch"] and r["torch_no_ddp"] else "- | - | -")
        lines.append(f"| {r['world_size']} | {r['rate']} | {measured} | {r['batch']} | "
                     f"{r['compute']:.1f} | {r['fwd']:.1f} | {r['bwd']:.1f} | {r['sync']:.1f} | "
                     f"{r['s02']:.1f} | {r['s03']:.1f} | {r['ideal']:.1f} | "
                     f"{100 * r['hidden']:.0f}% | {r['s03_over_ideal']:.2f} | "
                     f"{r['no_ddp']:.1f} | {torch} |")
    fitted = [r for r in rows if r["fit"]]
    if fitted:
        lines += ["", "| ranks | link | alpha | 1 / beta |", "|---|---|---|---|"]
        lines += [f"| {r['world_size']} | {r['rate']} | {r['fit'][0] * 1e6:.0f} us | "
                  f"{8e-6 / r['fit'][1]:.0f} Mbit/s |" for r in fitted]
    for r in rows:
        best = best_caps(r)
        if not best:
            continue
        lines += ["", f"Cap sweep, {r['world_size']} ranks, {r['rate']}, batch {r['batch']} "
                  f"(both caps; medians per step, ms):", "",
                  "| cap KiB | buckets | stage 02 | stage 03 | predicted stage 03 |",
                  "|---|---|---|---|---|"]
        lines += [f"| {w.cap_kib} | {w.buckets} | {w.s02:.1f} | {w.s03:.1f}"
                  f"{' (best)' if w.cap_kib == best[0] else ''} | "
                  + (f"{w.predicted:.1f}{' (best)' if w.cap_kib == best[1] else ''}"
                     if w.predicted is not None else "-")
                  + " |" for w in r["sweep"]]
        if best[1] is not None:
            lines += ["", f"Best cap: measured {best[0]} KiB, predicted {best[1]} KiB, "
                      f"{best[2]} grid step(s) apart. Stage 02's sync grows by "
                      f"{r['per_bucket_ms']:.2f} ms per bucket across the sweep, against the "
                      f"fit's alpha of {r['fit'][0] * 1e3:.2f} ms."]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", help="the build directory (with bench/bench_step)")
    parser.add_argument("--rates", default="300mbit,1gbit,3gbit",
                        help="link rates, as tc writes them (default 300mbit,1gbit,3gbit)")
    parser.add_argument("--world-sizes", default="2", help="ranks, one per host (default 2)")
    parser.add_argument("--batches", default="256", help="rows per rank: 64 or 256 "
                        "(BM_OverlapPair's; default 256)")
    parser.add_argument("--out", help="write every run's results here (JSON)")
    parser.add_argument("--no-loopback", action="store_true",
                        help="skip the comparison run without a link")
    parser.add_argument("--alpha-beta", action="store_true",
                        help="also fit the kit's all-reduce on each link (bench_allreduce)")
    parser.add_argument("--cap-sweep", action="store_true",
                        help="also sweep both caps, 64 KiB to 4 MiB, beside the fit's "
                             "prediction (implies --alpha-beta)")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip PyTorch's DDP on each link")
    parser.add_argument("--smoke", action="store_true",
                        help="one iteration of each benchmark (tests): the times mean nothing")
    args = parser.parse_args()
    args.alpha_beta = args.alpha_beta or args.cap_sweep
    args.torch = None if args.no_torch else torch_python()
    try:
        rates = args.rates.split(",")
        for rate in rates:
            shaped_link.parse_rate(rate)
        sizes = [int(w) for w in args.world_sizes.split(",")]
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError as e:
        parser.error(str(e))
    if any(b not in (1, 16, 64, 256) for b in batches):
        parser.error(f"--batches takes 1, 16, 64 or 256 (BM_OverlapPair's); got {batches}")
    if any(not 2 <= w <= 16 for w in sizes):
        parser.error(f"--world-sizes takes 2 to 16; got {sizes}")
    for program in ["bench_step"] + (["bench_allreduce"] if args.alpha_beta else []):
        if not os.access(os.path.join(args.build, "bench", program), os.X_OK):
            parser.error(f"{args.build}/bench/{program} is not built "
                         f"(ninja -C {args.build} bench/{program})")
    clean_stale()  # namespaces of runs that were SIGKILLed
    results = []
    try:
        for w in sizes:
            for batch in batches:
                if not args.no_loopback:
                    print(f"link_bench: {w} ranks, batch {batch}, loopback", flush=True)
                    results.append(run_loopback(args.build, w, batch, args.smoke))
                for rate in rates:
                    print(f"link_bench: {w} ranks, batch {batch}, {rate}", flush=True)
                    results.append(run_on_link(args.build, w, rate, batch, args))
    except Unavailable as e:
        print(f"link_bench: no shaped link here: {e}")
        sys.exit(SKIP)
    if not args.no_torch and not args.torch:
        print("link_bench: no python here imports torch: PyTorch's DDP not measured")
    try:
        rows = [summary(r) for r in results]
    except Exception:
        if args.out:  # minutes of measurement are not thrown away with the summary
            kept = args.out + ".unsummarised"
            write_text(kept, json.dumps({"runs": results}, indent=1) + "\n")
            print(f"link_bench: summarising failed; the runs are in {kept}", file=sys.stderr)
        raise
    print(table(rows))
    if args.smoke:
        print("(smoke run: one iteration each, the times mean nothing)")
    if args.out:
        write_text(args.out, json.dumps({"runs": results, "summary": rows}, indent=1) + "\n")
        print(f"link_bench: wrote {args.out}")


if __name__ == "__main__":
    main()
