#!/usr/bin/env python3
"""PyTorch's own DistributedDataParallel on bench_step.cc's workload.

The same training step as bench/bench_step.cc (zero_grad, forward, MSE loss,
backward, SGD step) on the same model, deep_mlp(16, 128, 64, 4): 65 Linear
layers with ReLU between them, 130 parameter tensors, 4.2 MB of float32
gradients; the same batch (64 rows per rank unless --batch says otherwise),
the same number of ranks spawned on this machine, Gloo over loopback, one
compute thread per rank (the kit runs OpenBLAS on one thread per rank), the
same fixed iteration counts, a barrier before each timed loop. Warm-up is 5
steps, not the kit's 2: PyTorch's DDP rebuilds its buckets after its first
step, and that one-off is not what the comparison is about.

  BM_TorchStepNoDDP             the step without DDP: PyTorch's compute.
  BM_TorchStepDDP/cap_kib:C     torch.nn.parallel.DistributedDataParallel
                                over gloo; C = 0 is PyTorch's default caps
                                (first bucket 1 MiB, bucket_cap_mb 25), any
                                other C sets bucket_cap_mb to C KiB (the
                                first bucket stays 1 MiB: PyTorch has no
                                option for it).

  BM_TorchStepZero/opt:O        DDP at its default caps with momentum 0.9 and
                                optimizer O: sgd (torch.optim.SGD, every
                                rank steps everything) or zero
                                (ZeroRedundancyOptimizer over SGD, shards
                                broadcast from their owners): beside
                                bench_zero.cc's BM_StepStage09.

  BM_TorchAllreduce/n           torch.distributed.all_reduce of n bytes of
                                float32 (4 B to 64 MiB, as bench_allreduce.cc),
                                waited for: PyTorch's own hand-off (a work
                                queue and worker threads, as the kit's), to
                                set beside the kit's and raw Gloo's.

Output: Google Benchmark's JSON layout (--out), so bench/report.py reads it
beside the kit's results: real_time is the mean step in ms; p50_ms and
p90_ms the median and 90th percentile of single steps; fwd_ms and bwd_ms the
mean phases. Rank 0 writes and prints; the data is random (the times do not
depend on the values).

Optional: needs Debian's python3-torch; the kit never requires it.
./kit bench runs it when `import torch` works. By hand:
    python3 bench/torch_ddp.py --out bench/results/torch_ddp.w2.json

Launched (--init-method env://): one rank of a job that a launcher started
(tools/tprun, torchrun), as bench_step's --init-method=env://: RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment, nothing
spawned. bench/link_bench.py runs it so, one rank per host of a shaped link.
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

from atomic_file import write_text

# One OpenBLAS thread per rank, as the kit's ranks have (spawn's
# blas_threads, tprun's OPENBLAS_NUM_THREADS): Debian's PyTorch does its
# matrix products in OpenBLAS, which torch.set_num_threads(1) does not
# limit, and OpenBLAS's idle threads spin on the cores the other rank
# needs. Read when OpenBLAS loads, so set before torch is imported, here or
# in a rank this process spawns (torch_rounds.py imports this module
# first). Its step without DDP, 2 spawned ranks, batch 256: 44.8 ms
# without it, 23.4 ms with it (torch_rounds.py --round overlap, one run
# each). As tools/tprun: OPENBLAS_NUM_THREADS or OMP_NUM_THREADS already
# set wins.
if "OPENBLAS_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"

WIDTH = 128
DEPTH = 64
ITERATIONS = 40
WARMUP = 5  # PyTorch rebuilds its buckets after the first step: keep that out
CAPS_KIB = (0, 512, 1024, 2048)  # as bench_step.cc's stage 02 and 03 runs


def quantile(times, q):
    """Nearest-rank quantile, as tp::bench::quantile in ranked_benchmark.h."""
    ordered = sorted(times)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


def deep_mlp(torch):
    layers = [torch.nn.Linear(16, WIDTH), torch.nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(WIDTH, 4))
    return torch.nn.Sequential(*layers)


def run(torch, name, module, batch, iterations, warmup, make_optimizer=None):
    """Times `iterations` steps of `module` after `warmup` untimed ones; SGD
    (lr 1e-3) unless make_optimizer(module) makes another optimizer."""
    dist = torch.distributed
    optimizer = (make_optimizer(module) if make_optimizer
                 else torch.optim.SGD(module.parameters(), lr=1e-3))
    x, y = batch

    def step(phases):
        optimizer.zero_grad()
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(module(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        phases["fwd"] += t1 - t0
        phases["bwd"] += t2 - t1

    for _ in range(warmup):
        step({"fwd": 0.0, "bwd": 0.0})
    dist.barrier()
    phases = {"fwd": 0.0, "bwd": 0.0}
    steps = []
    for _ in range(iterations):
        start = time.perf_counter()
        step(phases)
        steps.append(time.perf_counter() - start)
    ms = [s * 1e3 for s in steps]
    return {
        "name": name, "run_name": name, "run_type": "iteration",
        "iterations": iterations, "time_unit": "ms",
        "real_time": statistics.fmean(ms), "cpu_time": statistics.fmean(ms),
        "p50_ms": quantile(ms, 0.5), "p90_ms": quantile(ms, 0.9),
        "fwd_ms": phases["fwd"] * 1e3 / iterations, "bwd_ms": phases["bwd"] * 1e3 / iterations,
    }


def allreduce_iterations(nbytes):
    """As bench_allreduce.cc's iterations_for: about a quarter second each."""
    estimate = 100e-6 + nbytes / 0.5e9
    return max(5, min(400, int(0.25 / estimate)))


def time_allreduce(torch, nbytes, iterations, warmup):
    dist = torch.distributed
    t = torch.zeros(nbytes // 4, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(t)
    dist.barrier()
    us = []
    for _ in range(iterations):
        start = time.perf_counter()
        dist.all_reduce(t)
        us.append((time.perf_counter() - start) * 1e6)
    name = f"BM_TorchAllreduce/{nbytes}"
    return {"name": name, "run_name": name, "run_type": "iteration", "iterations": iterations,
            "time_unit": "us", "real_time": statistics.fmean(us), "cpu_time": statistics.fmean(us),
            "p50_us": quantile(us, 0.5), "p90_us": quantile(us, 0.9), "bytes": nbytes}


def rank_main(rank, args, init_method):
    import torch
    torch.set_num_threads(1)
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=args.world_size)
    generator = torch.Generator().manual_seed(rank)
    batch = (torch.randn(args.batch, 16, generator=generator),
             torch.randn(args.batch, 4, generator=generator))
    iterations = 1 if args.smoke else ITERATIONS
    warmup = 0 if args.smoke else WARMUP
    results = []

    def report(result):
        results.append(result)
        if rank == 0:
            print(f"{result['name']:<32} {result['real_time']:9.2f} ms  "
                  f"p50 {result['p50_ms']:.2f} ms  p90 {result['p90_ms']:.2f} ms", flush=True)

    torch.manual_seed(0)
    report(run(torch, "BM_TorchStepNoDDP", deep_mlp(torch), batch, iterations, warmup))
    for cap in (0,) if args.only_default_caps else CAPS_KIB:
        torch.manual_seed(0)
        options = {} if cap == 0 else {"bucket_cap_mb": cap / 1024}
        ddp = torch.nn.parallel.DistributedDataParallel(deep_mlp(torch), **options)
        report(run(torch, f"BM_TorchStepDDP/cap_kib:{cap}", ddp, batch, iterations, warmup))
        del ddp
    if not args.only_default_caps:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        makers = {
            "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9),
            "zero": lambda m: ZeroRedundancyOptimizer(m.parameters(),
                                                      optimizer_class=torch.optim.SGD,
                                                      lr=1e-3, momentum=0.9),
        }
        for label, make in makers.items():
            torch.manual_seed(0)
            ddp = torch.nn.parallel.DistributedDataParallel(deep_mlp(torch))
            report(run(torch, f"BM_TorchStepZero/opt:{label}", ddp, batch, iterations, warmup,
                       make))
            del ddp
    nbytes = 4
    while nbytes <= 64 << 20 and not args.only_default_caps:
        result = time_allreduce(torch, nbytes, 1 if args.smoke else allreduce_iterations(nbytes),
                                warmup)
        results.append(result)
        if rank == 0:
            print(f"{result['name']:<32} p50 {result['p50_us']:9.1f} us  "
                  f"p90 {result['p90_us']:9.1f} us", flush=True)
        nbytes *= 4
    if rank == 0 and args.out:
        context = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "num_cpus": os.cpu_count(),
            "library": f"torch {torch.__version__}",
            "world_size": str(args.world_size),
            "cores": str(os.cpu_count()),
            "batch": str(args.batch),
            "smoke": "1" if args.smoke else "0",
        }
        write_text(args.out, json.dumps({"context": context, "benchmarks": results}, indent=2))
    dist.barrier()
    dist.destroy_process_group()


def add_init_method(parser):
    """--init-method env://: one rank of a job a launcher started."""
    parser.add_argument("--init-method", choices=["env://"],
                        help="one rank of a launched job (RANK, WORLD_SIZE, MASTER_ADDR and "
                             "MASTER_PORT from the launcher); --world-size is then WORLD_SIZE")


def launched_rank(parser, args):
    """This process's rank when args.init_method launched it (setting
    args.world_size from WORLD_SIZE), else None; a usage error naming what
    the launcher did not set."""
    if not args.init_method:
        return None
    try:
        rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError) as e:
        parser.error(f"--init-method env:// needs RANK, WORLD_SIZE, MASTER_ADDR and "
                     f"MASTER_PORT from a launcher (tools/tprun): {e!r}")
    return rank


def run_ranks(script, rank_main, args, launched):
    """Runs rank_main(rank, args, init_method) as this process's rank where a
    launcher started it (`launched`, from launched_rank), else as
    args.world_size ranks spawned here, meeting through a file://
    rendezvous. The exit code: 0, or 2 (the reason on stderr) where PyTorch
    does not import. Shared by torch_ddp.py, torch_rounds.py and
    torch_trace.py."""
    try:
        import torch
        import torch.multiprocessing
    except ImportError:
        print(f"{script}: PyTorch is not installed (Debian: apt-get install python3-torch); "
              "nothing to compare with", file=sys.stderr)
        return 2
    if launched is not None:
        rank_main(launched, args, "env://")
        return 0
    print(f"{script}: {args.world_size} rank(s) on {os.cpu_count()} core(s), torch "
          f"{torch.__version__}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix=f"tp-{os.path.splitext(script)[0]}-") as tmp:
        torch.multiprocessing.spawn(rank_main, args=(args, "file://" + os.path.join(tmp, "init")),
                                    nprocs=args.world_size, join=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--batch", type=int, default=64, help="rows per rank (default 64)")
    parser.add_argument("--out", help="write the results here (Google Benchmark's JSON layout)")
    parser.add_argument("--only-default-caps", action="store_true",
                        help="only BM_TorchStepNoDDP and BM_TorchStepDDP/cap_kib:0 (the rounds "
                             "./kit bench alternates with bench_step)")
    parser.add_argument("--smoke", action="store_true",
                        help="one iteration each, no warm-up (tests): the times mean nothing")
    add_init_method(parser)
    args = parser.parse_args()
    launched = launched_rank(parser, args)
    if not 1 <= args.world_size <= 16 or args.batch < 1:
        parser.error("--world-size must be 1 to 16 and --batch at least 1")
    return run_ranks("torch_ddp.py", rank_main, args, launched)


if __name__ == "__main__":
    sys.exit(main())
