#!/usr/bin/env python3
"""Stage 02 against stage 03 on a shaped link: where overlap pays.

    link_bench.py BUILD [--rates 300mbit,1gbit,3gbit] [--world-sizes 2,4]
                  [--batches 64,256] [--out bench/results/link.json] [--smoke]

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

Needs root, `ip` and `tc` (namespaces); without them it says why and exits
77. All namespaces go when it ends, also on SIGTERM, SIGHUP or SIGINT.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from atomic_file import write_text  # noqa: E402
import shaped_link  # noqa: E402
from namespaces import SKIP, Unavailable, clean_stale  # noqa: E402

ROOT = os.path.dirname(HERE)
TPRUN = os.path.join(ROOT, "tools", "tprun")
PORT = 29500  # rank 0's store on host 0: the namespaces are fresh, nothing else listens
DEADLINE = 900.0  # seconds for one run of bench_step on a link


def filter_for(batch):
    # BM_OverlapPair is registered at batches 1, 16, 64 and 256 (bench_step.cc),
    # BM_StepNoDDP at --batch.
    return f"BM_StepNoDDP|BM_OverlapPair/cap_kib:0/batch:{batch}/"


def bench_args(build, batch, out, smoke):
    args = [os.path.join(build, "bench", "bench_step"), f"--benchmark_filter={filter_for(batch)}",
            f"--batch={batch}", f"--benchmark_out={out}", "--benchmark_out_format=json"]
    return args + (["--smoke=1"] if smoke else [])


def run_on_link(build, world_size, rate, batch, smoke):
    """One bench_step run, one rank per host of a fresh shaped link."""
    with shaped_link.ShapedLink(world_size, rate) as link, \
            tempfile.TemporaryDirectory(prefix="tp-link-") as tmp:
        nbytes = 4 << 20 if smoke else max(4 << 20, min(32 << 20, int(link.bits_per_second / 8)))
        measured = shaped_link.throughput(link, 0, 1, nbytes)
        out = os.path.join(tmp, "rank0.json")
        procs, logs = [], []
        job = f"link-{os.getpid()}-{world_size}-{rate}-{batch}"
        for node, host in enumerate(link.hosts):
            log = open(os.path.join(tmp, f"host{node}.log"), "w+")
            logs.append(log)
            argv = [sys.executable, TPRUN, "--nnodes", str(world_size), "--node-rank", str(node),
                    "--nproc-per-node", "1", "--master-addr", link.hosts[0].address,
                    "--master-port", str(PORT), "--job-id", job, "--grace", "2", "--",
                    *bench_args(build, batch, out, smoke), "--init-method=env://"]
            env = dict(os.environ, GLOO_SOCKET_IFNAME=shaped_link.INTERFACE)
            procs.append(host.popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env))
        start = time.monotonic()
        while any(p.poll() is None for p in procs):
            if time.monotonic() - start > DEADLINE:
                break
            time.sleep(0.2)
        failed = [(i, p.poll()) for i, p in enumerate(procs) if p.poll() != 0]
        if failed:
            for i, _ in failed:
                logs[i].seek(0)
                tail = logs[i].read()[-3000:]
                print(f"--- host {i} ---\n{tail}", file=sys.stderr)
            raise RuntimeError(f"bench_step on a {rate} link at {world_size} ranks failed: "
                               f"host (exit code): {failed}" +
                               (" (ran past the deadline)" if None in dict(failed).values()
                                else ""))
        with open(out) as f:
            result = json.load(f)
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


def summary(result):
    """The per-step medians of one run (see the module's doc), in ms."""
    pair = next(b for b in result["benchmarks"] if b["name"].startswith("BM_OverlapPair"))
    no_ddp = next(b for b in result["benchmarks"] if b["name"].startswith("BM_StepNoDDP"))
    sync, s02, s03 = pair["sync02_ms"], pair["s02_ms"], pair["s03_ms"]
    fwd, bwd = pair["fwd02_ms"], pair["bwd02_ms"]
    compute = s02 - sync
    return {"rate": result["link"]["rate"], "world_size": result["link"]["world_size"],
            "batch": result["link"]["batch"],
            "measured_mbit": (result["link"]["measured_bits_per_second"] or 0) / 1e6,
            "no_ddp": no_ddp["p50_ms"], "fwd": fwd, "bwd": bwd, "compute": compute,
            "sync": sync, "s02": s02, "s03": s03, "bwd03": pair["bwd03_ms"],
            "ideal": max(compute, sync),
            "hidden": (s02 - s03) / min(bwd, sync) if min(bwd, sync) > 0 else 0.0,
            "s03_over_ideal": s03 / max(compute, sync)}


def table(rows):
    lines = ["| ranks | link | measured | batch | compute | fwd | bwd | sync | stage 02 | "
             "stage 03 | ideal | hidden of min(bwd, sync) | stage 03 / ideal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = f"{r['measured_mbit']:.0f} Mbit/s" if r["measured_mbit"] else "-"
        lines.append(f"| {r['world_size']} | {r['rate']} | {measured} | {r['batch']} | "
                     f"{r['compute']:.1f} | {r['fwd']:.1f} | {r['bwd']:.1f} | {r['sync']:.1f} | "
                     f"{r['s02']:.1f} | {r['s03']:.1f} | {r['ideal']:.1f} | "
                     f"{100 * r['hidden']:.0f}% | {r['s03_over_ideal']:.2f} |")
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
    parser.add_argument("--smoke", action="store_true",
                        help="one iteration of each benchmark (tests): the times mean nothing")
    args = parser.parse_args()
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
    if not os.access(os.path.join(args.build, "bench", "bench_step"), os.X_OK):
        parser.error(f"{args.build}/bench/bench_step is not built "
                     f"(ninja -C {args.build} bench/bench_step)")
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
                    results.append(run_on_link(args.build, w, rate, batch, args.smoke))
    except Unavailable as e:
        print(f"link_bench: no shaped link here: {e}")
        sys.exit(SKIP)
    rows = [summary(r) for r in results]
    print(table(rows))
    if args.smoke:
        print("(smoke run: one iteration each, the times mean nothing)")
    if args.out:
        write_text(args.out, json.dumps({"runs": results, "summary": rows}, indent=1) + "\n")
        print(f"link_bench: wrote {args.out}")


if __name__ == "__main__":
    main()
